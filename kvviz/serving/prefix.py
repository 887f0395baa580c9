"""The prefix-cache experiment: requests that share a long prefix, against what kvviz predicts is reused.

Predictions (tokens of an n-token prompt whose first p tokens match a cached request):
- vLLM caches whole blocks of B tokens, found by hashing each full block with its prefix, and always
  recomputes at least the last prompt token (it needs its logits): ⌊min(p, n − 1) / B⌋ · B.
  (docs.vllm.ai, "Automatic Prefix Caching"; vllm/v1/core/kv_cache_manager.py get_computed_blocks)
- llama.cpp (a slot's common token prefix, tools/server) and SGLang (a radix tree over tokens) match
  per token, also keeping the last one to recompute: at most min(p, n − 1). llama.cpp reuses a slot's cache
  only when the prompt is similar enough to it (--slot-prompt-similarity, 0.1 by default), so a few tokens
  shared by chance may land on another slot and be recomputed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx

from kvviz.engine.metrics import percentile
from kvviz.errors import InputError
from kvviz.serving import client as api
from kvviz.serving.bench import FILLER

BLOCK_ENGINES = ("vllm",)
TOKEN_ENGINES = ("llama.cpp", "sglang")
SUFFIXES = ("Question one: what does the cache hold?", "Question two: why is decode memory-bound?")


def predicted_cached_tokens(engine: str | None, n_prompt: int, n_shared: int,
                            block_size: int | None = None) -> int | None:
    """Prompt tokens a warm prefix cache serves; None when the engine (or vLLM's block size) is unknown."""
    if n_prompt < 1 or n_shared < 0:
        raise InputError("positive_int", name="n_prompt", value=n_prompt)
    usable = min(n_shared, n_prompt - 1)
    if engine in BLOCK_ENGINES:
        if not block_size:
            return None
        return usable // block_size * block_size
    if engine in TOKEN_ENGINES:
        return usable
    return None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class PrefixTrial:
    """One repeat: a cold request (new prefix), a warm one (same prefix, new suffix), and a control (another
    new prefix of the same length, the same suffix as the warm one)."""

    cold: api.RequestResult
    warm: api.RequestResult
    control: api.RequestResult
    # Per request: the longest token prefix it shares with any prompt sent before it in this experiment,
    # by the server's own tokenizer (None where the server has no /tokenize). Warm shares the whole prefix
    # with cold; cold and control may still share a token or two ("Session") with earlier trials.
    n_shared: dict[str, int | None]


@dataclass
class PrefixResult:
    engine: str | None
    block_size: int | None
    prefix_tokens: int
    trials: list[PrefixTrial] = field(default_factory=list)

    def rows(self) -> list[dict]:
        out = []
        for i, t in enumerate(self.trials):
            for kind, r in (("cold", t.cold), ("warm", t.warm), ("control", t.control)):
                n = r.prompt_tokens
                shared = t.n_shared[kind]
                pred = (predicted_cached_tokens(self.engine, n, shared, self.block_size)
                        if n is not None and shared is not None else None)
                out.append({"trial": i + 1, "request": kind, "prompt_tokens": n, "shared_tokens": shared,
                            "cached_tokens": r.cached_tokens, "predicted_cached_tokens": pred,
                            "ttft_s": r.ttft_s, "error": str(r.error) if r.error else None})
        return out

    def summary(self) -> dict:
        def med(kind: str) -> float | None:
            times = [r["ttft_s"] for r in self.rows() if r["request"] == kind and r["ttft_s"] is not None]
            return percentile(times, 50)

        cold, warm, control = med("cold"), med("warm"), med("control")
        return {"ttft_cold_p50_s": cold, "ttft_warm_p50_s": warm, "ttft_control_p50_s": control,
                "ttft_saved_s": (control - warm) if control is not None and warm is not None else None}


def run_prefix_experiment(server: api.Server, model: str, *, prefix_tokens: int, max_tokens: int = 4,
                          repeats: int = 3, engine: str | None = None, block_size: int | None = None,
                          on_trial=None) -> PrefixResult:  # noqa: ANN001 - a callback(PrefixResult)
    """Each repeat uses a fresh prefix (a new number first), so nothing earlier can be cached."""
    result = PrefixResult(engine, block_size, prefix_tokens)
    words = (FILLER * (prefix_tokens // 10 + 2)).split()
    seen: list[list[int]] = []  # every prompt sent so far, as the server tokenized it
    with server.client() as http:
        for _ in range(repeats):
            tag = time.time_ns() % 10**9
            prefix = f"Session {tag}. " + " ".join(words[:prefix_tokens])
            other = f"Session {tag + 1}. " + " ".join(words[:prefix_tokens])
            cold_p, warm_p, control_p = (prefix + "\n" + SUFFIXES[0], prefix + "\n" + SUFFIXES[1],
                                         other + "\n" + SUFFIXES[1])
            sent, shared = {}, {}
            for kind, text in (("cold", cold_p), ("warm", warm_p), ("control", control_p)):
                ids = api.tokenize(server, model, text, http)
                shared[kind] = None if ids is None else max((common_prefix(ids, s) for s in seen), default=0)
                if ids is not None:
                    seen.append(ids)
                sent[kind] = _send(server, model, text, max_tokens, http)
            result.trials.append(PrefixTrial(sent["cold"], sent["warm"], sent["control"], shared))
            cold, warm, control = sent["cold"], sent["warm"], sent["control"]
            if on_trial is not None:
                on_trial(result)
            if all(r.error is not None for r in (cold, warm, control)):
                raise cold.error  # type: ignore[misc]
    return result


def _send(server: api.Server, model: str, prompt: str, max_tokens: int, http: httpx.Client) -> api.RequestResult:
    return api.stream_request(server, model, prompt, max_tokens, client=http)
