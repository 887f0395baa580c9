"""Speculative against plain decoding on the same prompt, in one run: tokens, passes, time per token; and what the
same steps would cost on a GPU by kvviz's roofline.

Measured: both are run `repeats` times, alternating plain and speculative, after an untimed warm-up, inside
timing.quiet() (nothing drawn meanwhile); TPOT is each run's decode time / (N − 1), the median and range kept.
On a small CPU a verify over k + 1 positions costs about k + 1 decode steps (compute-bound), so little or no
speed-up may appear; the roofline says what the same sequence of passes costs where a pass is memory-bound.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvviz.engine.backends.native import NativeBackend
from kvviz.engine.generation import Generation
from kvviz.engine.metrics import Spread, spread
from kvviz.engine.shape import native_spec
from kvviz.engine.spec.decoding import SpeculativeGeneration
from kvviz.engine.spec.drafts import Draft, EarlyExitDraft, ModelDraft, NgramDraft, default_exit_layer, load_draft
from kvviz.engine.spec.ngram import NgramConfig
from kvviz.engine.timing import quiet, warm_up
from kvviz.kv.formula import KVSpec
from kvviz.kv.hardware import Hardware
from kvviz.kv.roofline import Roofline


@dataclass
class Comparison:
    spec: SpeculativeGeneration  # the last speculative run
    plain: Generation  # the last plain run
    tpot_s: Spread | None  # speculative: decode seconds / (N − 1), over the repeats
    tpot_plain_s: Spread | None

    @property
    def tokens_equal_plain(self) -> bool | None:
        """Greedy: the same tokens as plain decoding. Under sampling not expected token for token (the draws
        differ); there the distribution is what is lossless (tests/engine/spec/test_speculative.py, chi-square)."""
        if self.spec.temperature > 0:
            return None
        return self.spec.generated == self.plain.generated[0]

    @property
    def speedup(self) -> float | None:
        """Plain TPOT / speculative TPOT (medians): above 1 when speculation is faster here."""
        if self.tpot_s is None or self.tpot_plain_s is None or not self.tpot_s.median:
            return None
        return self.tpot_plain_s.median / self.tpot_s.median


def compare(backend: NativeBackend, make_draft: Callable[[], Draft], prompt: str | list[int], *, k: int,
            max_new_tokens: int, temperature: float = 0.0, seed: int = 0, repeats: int = 3,
            stop_at_eos: bool = False) -> Comparison:
    """Plain and speculative decoding of the same prompt, alternated `repeats` times in quiet."""
    spec_runs, plain_runs = [], []
    with quiet():
        warm_up(backend)
        for _ in range(repeats):
            plain = Generation(backend, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                               stop_at_eos=stop_at_eos)
            plain.run(prompt)
            plain_runs.append(plain)
            gen = SpeculativeGeneration(backend, make_draft(), k=k, max_new_tokens=max_new_tokens,
                                        temperature=temperature, seed=seed, stop_at_eos=stop_at_eos)
            gen.run(prompt)
            spec_runs.append(gen)
    return Comparison(spec_runs[-1], plain_runs[-1], spread([g.tpot_s for g in spec_runs]),
                      spread([g.tpot_s for g in plain_runs]))


@dataclass(frozen=True)
class GpuPrediction:
    """The same passes bounded on one GPU (kvviz.kv.roofline): weights and KV in bf16, batch 1."""

    gpu: str
    plain_s: float  # one decode step per token after the first
    spec_s: float  # each verify pass over its k + 1 positions, plus the draft's passes
    verify_over_decode: float  # the mean verify pass / a decode step at the same context

    @property
    def speedup(self) -> float:
        return self.plain_s / self.spec_s


def draft_spec(gen: SpeculativeGeneration) -> KVSpec | None:
    """What the draft's own passes read: the early exit's first m layers (and the head), a draft model, or none."""
    if isinstance(gen.draft, EarlyExitDraft):
        return native_spec(replace(gen.backend.model.cfg, n_layers=gen.draft.shared_layers))
    if isinstance(gen.draft, ModelDraft):
        return gen.draft.backend.spec
    return None


def gpu_prediction(gen: SpeculativeGeneration, hw: Hardware, dtype: str = "bfloat16") -> GpuPrediction:
    """Plain decoding: a decode step for every token after the first. Speculative: each step's verify over its
    newest token and drafts (bounded as a whole pass; an early exit's verify runs fewer layers) and one draft pass
    per drafted token (nothing for n-gram)."""
    target = Roofline(gen.backend.spec, hw, dtype, dtype)
    dspec = draft_spec(gen)
    draft = Roofline(dspec, hw, dtype, dtype) if dspec is not None else None
    n_prompt = len(gen.prompt_ids)
    plain = sum(target.decode_bound(batch=1, n_context=n_prompt + i + 1).seconds for i in range(gen.n_generated - 1))
    spec, ratios = 0.0, []
    for e in gen.events[1:]:
        verify = target.verify_bound(n_past=e.position, n_new=len(e.drafted) + 1).seconds
        spec += verify
        ratios.append(verify / target.decode_bound(batch=1, n_context=e.position + 1).seconds)
        if draft is not None:
            spec += sum(draft.decode_bound(batch=1, n_context=e.position + i + 1).seconds
                        for i in range(len(e.drafted)))
    return GpuPrediction(hw.name, plain, spec, sum(ratios) / len(ratios) if ratios else 1.0)


def speculate_report(backend: NativeBackend, prompt: str, *, method: str, k: int, max_new_tokens: int, hw: Hardware,
                     temperature: float = 0.0, seed: int = 0, repeats: int = 3, exit_layer: int | None = None,
                     draft: str | None = None, prompt_lookup_min: int | None = None,
                     prompt_lookup_max: int | None = None) -> dict:
    """`compare` with the draft of `method` ("ngram": prompt lookup within the bounds; "early-exit": the target's
    first exit_layer layers, 3/4 by default; "draft": the model `draft` names, see drafts.load_draft), and the
    roofline prediction on `hw`: the counts, acceptance and timings of `kvviz speculate`, with the context its
    text output shows."""
    exit_layer = exit_layer or default_exit_layer(backend.spec.n_layers)
    lookup = NgramConfig.from_bounds(prompt_lookup_min, prompt_lookup_max)
    if method == "ngram":
        make = lambda: NgramDraft(lookup)  # noqa: E731
    elif method == "early-exit":
        make = lambda: EarlyExitDraft(exit_layer)  # noqa: E731
    else:
        loaded = load_draft(draft, backend, seed=seed)
        make = lambda: ModelDraft(loaded.backend)  # noqa: E731
    result = compare(backend, make, prompt, k=k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                     repeats=repeats)
    gen, stats = result.spec, result.spec.stats
    predicted = gpu_prediction(gen, hw)
    return {
        "token_ids": gen.generated,
        "text": gen.text,
        "tokens_equal_plain": result.tokens_equal_plain,
        "acceptance_length_mean": stats.mean_acceptance_length,
        "accepted_per_position": stats.acceptance_rate_per_pos,
        "target_passes": gen.target_passes,
        "plain_passes": gen.plain_passes,
        "rollback_tokens": gen.rollback_tokens,
        "draft_kv_bytes": max(e.draft_peak_formula_bytes for e in gen.events),  # right after drafting
        "tpot_s": result.tpot_s.median if result.tpot_s else None,
        "tpot_plain_s": result.tpot_plain_s.median if result.tpot_plain_s else None,
        # the context of the text output
        "model": backend.spec.name, "method": method, "k": k, "temperature": temperature,
        "draft_name": gen.draft.backend.spec.name if isinstance(gen.draft, ModelDraft) else None,
        "exit_layer": exit_layer if method == "early-exit" else None,
        "lookup": (lookup.prompt_lookup_min, lookup.prompt_lookup_max), "repeats": repeats,
        "drafts": stats.num_drafts, "draft_tokens": stats.num_draft_tokens, "accepted": stats.num_accepted_tokens,
        "tpot_range": (result.tpot_s.low, result.tpot_s.high) if result.tpot_s else None,
        "tpot_plain_range": (result.tpot_plain_s.low, result.tpot_plain_s.high) if result.tpot_plain_s else None,
        "gpu": predicted.gpu, "gpu_speedup": predicted.speedup, "gpu_verify_over_decode": predicted.verify_over_decode,
        "bytes_equal_formula": all(e.live_bytes == e.formula_bytes for e in gen.events),
    }
