"""Why K/V can be cached, shown with the real decoder (pure torch, no streamlit).

- `parallel_vs_sequential`: one masked parallel pass (training / prefill) versus prefill + one-token
  decode steps give the same K/V in every layer and the same logits at every position.
- `past_kv_drift`: append one token and compare the past positions' K/V. Under the causal mask they do
  not move; with bidirectional attention they do, in every layer above the first, so a cache would be wrong.
- `attention_rows`: the full causal attention matrix next to the one row a decode step computes.
- `demo_ids`, `drift_verdict`, `overall`: what the Training page runs and the verdicts it states.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvviz.engine.cache import KVCache
from kvviz.engine.model import Decoder
from kvviz.engine.tolerance import Agreement, agreement, magnitude
from kvviz.errors import InputError


@dataclass(frozen=True)
class KVPass:
    """One way of running a sequence: every layer's K/V [n_kv_heads, T, d_head] and every position's logits [T, V]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor


@dataclass(frozen=True)
class ParallelVsSequential:
    n_prompt: int  # positions run in the prefill of the sequential path
    n_tokens: int
    k_max_diff: list[float]  # per layer, max |K_parallel − K_sequential|
    v_max_diff: list[float]
    logits_max_diff: list[float]  # per position, max |Δlogits| over the vocabulary
    parallel_argmax: list[int]  # greedy next token at every position, both paths
    sequential_argmax: list[int]
    k_magnitude: float = 0.0  # max |K|, |V|, |logits| of the parallel pass: the scale rounding is relative to
    v_magnitude: float = 0.0
    logits_magnitude: float = 0.0

    @property
    def max_diff(self) -> float:
        return max(self.k_max_diff + self.v_max_diff + self.logits_max_diff)

    def agreements(self, dtype: torch.dtype, n_terms: int) -> dict[str, Agreement]:
        """K, V and logits, each judged against the rounding tolerance at its own magnitude."""
        return {
            "K": agreement(max(self.k_max_diff), dtype, self.k_magnitude, n_terms),
            "V": agreement(max(self.v_max_diff), dtype, self.v_magnitude, n_terms),
            "logits": agreement(max(self.logits_max_diff), dtype, self.logits_magnitude, n_terms),
        }

    @property
    def same_argmax(self) -> int:
        """Positions where both paths pick the same greedy next token."""
        return sum(a == b for a, b in zip(self.parallel_argmax, self.sequential_argmax, strict=True))

    def logits_note(self, tolerance: float) -> dict:
        """What the logits chart's caption states: whether every position is within `tolerance`, how many prefill
        positions agree exactly, and the largest difference among the prefill and among the decode positions."""
        prefill, decode = self.logits_max_diff[: self.n_prompt], self.logits_max_diff[self.n_prompt :]
        return {"note": "within" if max(self.logits_max_diff) <= tolerance else "beyond",
                "n_exact": sum(d == 0 for d in prefill), "n_prefill": len(prefill), "prefill_max": max(prefill),
                "decode_max": max(decode)}


@dataclass(frozen=True)
class PastDrift:
    causal: bool
    n_past: int  # positions that existed before the appended token
    k_max_diff: list[float]  # per layer, max |ΔK| over the past positions after one token is appended
    v_max_diff: list[float]
    k_scale: list[float]  # per layer, max |K| of the past positions: how big the change is relative to K
    logits_max_diff: float  # max |Δlogits| over the past positions
    v_scale: list[float] = ()  # per layer, max |V| of the past positions
    logits_scale: float = 0.0  # max |logits| of the past positions

    def kv_agreements(self, dtype: torch.dtype, n_terms: int) -> list[Agreement]:
        """Per layer, the larger of the K and V changes against the rounding tolerance at that layer's magnitude
        (the larger of max |K| and max |V|)."""
        return [agreement(max(dk, dv), dtype, max(sk, sv), n_terms)
                for dk, dv, sk, sv in zip(self.k_max_diff, self.v_max_diff, self.k_scale, self.v_scale, strict=True)]

    def max_change(self, start: int = 0, stop: int | None = None) -> float:
        """The largest K or V change over layers start … stop − 1 (0 when there are none)."""
        return max(self.k_max_diff[start:stop] + self.v_max_diff[start:stop], default=0.0)


def drift_verdict(agreements: Sequence[Agreement]) -> tuple[list[Agreement], Agreement]:
    """The layers whose past K/V changed beyond rounding, and the largest change to state: the largest of those,
    or of every layer when none did."""
    changed = [a for a in agreements if not a.within]
    return changed, max(changed or agreements, key=lambda a: a.diff)


def overall(agreements: Sequence[Agreement]) -> str:
    """"exact" when every difference is zero, "within" when every one is within its tolerance, else "beyond"."""
    return "exact" if all(a.exact for a in agreements) else "within" if all(a.within for a in agreements) else "beyond"


def _check_ids(model: Decoder, ids: list[int], min_len: int) -> None:
    if len(ids) < min_len:
        raise InputError("training.too_short", n_tokens=len(ids), min_len=min_len)
    if len(ids) > model.cfg.max_seq_len:
        raise InputError("sequence_too_long", n_tokens=len(ids), max_len=model.cfg.max_seq_len)


def _device(model: Decoder) -> torch.device:
    return model.lm_head.weight.device


def _collect(cache: KVCache, logits: torch.Tensor) -> KVPass:
    return KVPass(
        keys=[cache.keys(i)[0].float().clone() for i in range(cache.n_layers)],
        values=[cache.values(i)[0].float().clone() for i in range(cache.n_layers)],
        logits=logits[0].float(),
    )


@torch.inference_mode()
def run_parallel(model: Decoder, ids: list[int], *, causal: bool = True) -> KVPass:
    """The whole sequence in one forward pass (as in training or prefill), K/V read from a fresh cache."""
    cache = model.new_cache(1, len(ids))
    out = model(torch.tensor([ids], device=_device(model)), cache, causal=causal)
    return _collect(cache, out.logits)


@torch.inference_mode()
def run_sequential(model: Decoder, ids: list[int], n_prompt: int) -> KVPass:
    """Prefill the first n_prompt tokens, then feed the rest one token per pass through the cache."""
    cache = model.new_cache(1, len(ids))
    x = torch.tensor([ids], device=_device(model))
    logits = [model(x[:, :n_prompt], cache).logits]
    for pos in range(n_prompt, len(ids)):
        logits.append(model(x[:, pos : pos + 1], cache).logits)  # only the new token goes in
    return _collect(cache, torch.cat(logits, dim=1))


def _layer_max(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
    return [float((x - y).abs().max()) for x, y in zip(a, b, strict=True)]


def parallel_vs_sequential(model: Decoder, ids: list[int], n_prompt: int) -> ParallelVsSequential:
    _check_ids(model, ids, 2)
    if not 1 <= n_prompt < len(ids):
        raise InputError("training.bad_prompt_len", n_prompt=n_prompt, n_tokens=len(ids))
    return compare_passes(run_parallel(model, ids), run_sequential(model, ids, n_prompt), n_prompt)


def compare_passes(par: KVPass, seq: KVPass, n_prompt: int) -> ParallelVsSequential:
    return ParallelVsSequential(
        n_prompt=n_prompt,
        n_tokens=len(par.logits),
        k_max_diff=_layer_max(par.keys, seq.keys),
        v_max_diff=_layer_max(par.values, seq.values),
        logits_max_diff=(par.logits - seq.logits).abs().amax(dim=-1).tolist(),
        parallel_argmax=par.logits.argmax(dim=-1).tolist(),
        sequential_argmax=seq.logits.argmax(dim=-1).tolist(),
        k_magnitude=magnitude(*par.keys),
        v_magnitude=magnitude(*par.values),
        logits_magnitude=magnitude(par.logits),
    )


def past_kv_drift(model: Decoder, ids: list[int], *, causal: bool) -> PastDrift:
    """Run ids[:-1], then ids (one token appended), and compare the past positions' K/V layer by layer."""
    _check_ids(model, ids, 2)
    n_past = len(ids) - 1
    before, after = run_parallel(model, ids[:-1], causal=causal), run_parallel(model, ids, causal=causal)
    return PastDrift(
        causal=causal,
        n_past=n_past,
        k_max_diff=_layer_max(before.keys, [k[:, :n_past] for k in after.keys]),
        v_max_diff=_layer_max(before.values, [v[:, :n_past] for v in after.values]),
        k_scale=[float(k.abs().max()) for k in before.keys],
        logits_max_diff=float((before.logits - after.logits[:n_past]).abs().max()),
        v_scale=[float(v.abs().max()) for v in before.values],
        logits_scale=magnitude(before.logits),
    )


@dataclass(frozen=True)
class AttentionRows:
    full: torch.Tensor  # [n_heads, T, T]: every query's row, as a parallel pass computes them
    decode_row: torch.Tensor  # [n_heads, T]: the only row the last decode step computes
    row_max_diff: float  # max |full[:, -1] − decode_row|


@torch.inference_mode()
def attention_rows(model: Decoder, ids: list[int], layer: int) -> AttentionRows:
    """A decode step computes one query row; past rows are never needed again, so Q is not cached."""
    _check_ids(model, ids, 2)
    if not 0 <= layer < model.cfg.n_layers:
        raise InputError("training.bad_layer", layer=layer, n_layers=model.cfg.n_layers)
    x = torch.tensor([ids], device=_device(model))
    full = model(x, None, capture_attention=True).attentions[layer][0].float()
    cache = model.new_cache(1, len(ids))
    model(x[:, :-1], cache)
    step = model(x[:, -1:], cache, capture_attention=True).attentions[layer][0, :, -1].float()
    return AttentionRows(full=full, decode_row=step, row_max_diff=float((full[:, -1] - step).abs().max()))


def causal_mask(n: int) -> torch.Tensor:
    """[n, n] booleans: query i may attend to key j exactly when j ≤ i."""
    return torch.ones(n, n, dtype=torch.bool).tril()


# Texts the demo runs (language-neutral on purpose: the same link gives the same tokens in every UI language).
PRESETS: dict[str, str] = {
    "cat": "The cat sat on the mat because it was warm.",
    "kv": "Past keys and values never change.",
    "code": "def add(a, b):\n    return a + b",
    "korean": "고양이가 따뜻한 매트 위에 앉았다.",
}
MAX_DEMO_TOKENS = 64  # one decode pass per token on a shared CPU: keep the live demo quick


def demo_ids(tokenizer, text: str) -> list[int]:  # noqa: ANN001 - any kvviz tokenizer
    """The text's token ids as the demo runs them: at most MAX_DEMO_TOKENS, and at least 2 (a prompt and one decode
    step), else InputError."""
    ids = tokenizer.encode(text)[:MAX_DEMO_TOKENS]
    if len(ids) < 2:
        raise InputError("training.too_short", n_tokens=len(ids), min_len=2)
    return ids
