"""The prefix-cache experiment: requests that share a long prefix, against what kvviz predicts is reused, with
the saving measured over several trials and judged against its own spread.

Predictions (tokens of an n-token prompt whose first p tokens match a cached request; n and p count the tokens
the server itself adds, such as a Llama model's BOS, because its cache holds them too):
- vLLM caches whole blocks of B tokens, found by hashing each full block with its prefix, and always
  recomputes at least the last prompt token (it needs its logits): ⌊min(p, n − 1) / B⌋ · B.
  (docs.vllm.ai, "Automatic Prefix Caching"; vllm/v1/core/kv_cache_manager.py get_computed_blocks)
- llama.cpp (a slot's common token prefix, tools/server) and SGLang (a radix tree over tokens) match
  per token, also keeping the last one to recompute: at most min(p, n − 1). llama.cpp reuses a slot's cache
  only when the prompt is similar enough to it (--slot-prompt-similarity, 0.1 by default), so a few tokens
  shared by chance may land on another slot and be recomputed.

A trial sends a cold request (a new prefix), a warm one (the same prefix, another question) and a control
(another new prefix of the same length, the warm one's question). The order rotates from trial to trial (cold
always before warm, which needs its prefix cached), after one warm-up request, so a drift of the machine does
not land on one kind. The saving of a trial is control − warm, by the client's TTFT and by the server's own
prompt time (llama.cpp's per-request timings.prompt_ms; else the change of the engine's prefill-seconds counter
around the request). The result is the median saving with its spread (lowest and highest trial): "saved" when
every trial saved time, "slower" when every trial lost it, "within noise" when the spread covers zero.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from kvviz.engine.metrics import percentile, spread
from kvviz.errors import InputError
from kvviz.serving import client as api
from kvviz.serving.prom import MetricsSnapshot, scrape
from kvviz.serving.workload import FILLER

BLOCK_ENGINES = ("vllm",)
TOKEN_ENGINES = ("llama.cpp", "sglang")
SUFFIXES = ("Question one: what does the cache hold?", "Question two: why is decode memory-bound?")
KINDS = ("cold", "warm", "control")
# The orders trials rotate through: every kind takes each place it can (warm always after cold).
ORDERS = (("cold", "warm", "control"), ("cold", "control", "warm"), ("control", "cold", "warm"))
VERDICTS = ("saved", "slower", "within_noise", "one_trial")


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


def saving_verdict(savings: list[float | None]) -> dict:
    """Median saving with its spread over trials and what it supports (see VERDICTS)."""
    s = spread(savings)
    if s is None:
        return {"median_s": None, "low_s": None, "high_s": None, "n": 0, "verdict": None}
    if s.n < 2:
        verdict = "one_trial"
    elif s.low > 0:
        verdict = "saved"
    elif s.high < 0:
        verdict = "slower"
    else:
        verdict = "within_noise"
    return {"median_s": s.median, "low_s": s.low, "high_s": s.high, "n": s.n, "verdict": verdict}


@dataclass
class PrefixTrial:
    order: tuple[str, ...]
    results: dict[str, api.RequestResult]
    # Per request: the longest token prefix it shares with any prompt sent before it in this experiment, by the
    # server's own tokenizer with the tokens it adds (None where the server has no /tokenize).
    n_shared: dict[str, int | None]
    server_prefill_s: dict[str, float | None]


@dataclass
class PrefixResult:
    engine: str | None
    block_size: int | None
    prefix_tokens: int
    trials: list[PrefixTrial] = field(default_factory=list)

    def rows(self) -> list[dict]:
        out = []
        for i, t in enumerate(self.trials):
            for kind in KINDS:
                r = t.results[kind]
                n, shared = r.prompt_tokens, t.n_shared[kind]
                pred = (predicted_cached_tokens(self.engine, n, shared, self.block_size)
                        if n is not None and shared is not None else None)
                out.append({"trial": i + 1, "request": kind, "position": t.order.index(kind) + 1,
                            "prompt_tokens": n, "shared_tokens": shared, "cached_tokens": r.cached_tokens,
                            "predicted_cached_tokens": pred, "ttft_s": r.ttft_s,
                            "server_prefill_s": t.server_prefill_s[kind],
                            "error": str(r.error) if r.error else None})
        return out

    def summary(self) -> dict:
        rows = self.rows()

        def med(kind: str, key: str) -> float | None:
            return percentile([r[key] for r in rows if r["request"] == kind and r[key] is not None], 50)

        def savings(key: str) -> list[float | None]:
            out = []
            for t in range(1, len(self.trials) + 1):
                pair = {r["request"]: r[key] for r in rows if r["trial"] == t}
                out.append(pair["control"] - pair["warm"] if None not in (pair["control"], pair["warm"]) else None)
            return out

        return {**{f"ttft_{k}_p50_s": med(k, "ttft_s") for k in KINDS},
                **{f"server_prefill_{k}_p50_s": med(k, "server_prefill_s") for k in KINDS},
                "saving": saving_verdict(savings("ttft_s")),
                "server_saving": saving_verdict(savings("server_prefill_s"))}

    def to_dict(self) -> dict:
        return {"prefix_tokens": self.prefix_tokens, "engine": self.engine, "block_size": self.block_size,
                "rows": self.rows(), "summary": self.summary()}


def _prefill_delta(before: MetricsSnapshot | None, after: MetricsSnapshot | None) -> float | None:
    if before is None or after is None:
        return None
    a, b = after.counters.get("prefill_seconds"), before.counters.get("prefill_seconds")
    return None if a is None or b is None else a - b


def run_prefix_experiment(server: api.Server, model: str, *, prefix_tokens: int, max_tokens: int = 4,
                          repeats: int = 5, engine: str | None = None, block_size: int | None = None,
                          warmups: int = 1, on_trial: Callable[[PrefixResult], None] | None = None,
                          cancel: Callable[[], bool] | None = None) -> PrefixResult:
    """Each trial uses a fresh prefix (a new number first), so nothing earlier can be cached."""
    result = PrefixResult(engine, block_size, prefix_tokens)
    words = (FILLER * (prefix_tokens // 10 + 2)).split()
    seen: list[list[int]] = []  # every prompt sent so far, as the server's cache sees it
    with server.client() as http:
        for w in range(warmups):
            _send(server, model, f"Warm-up {time.time_ns() % 10**9}-{w}. " + " ".join(words[:prefix_tokens]),
                  max_tokens, http)
        for i in range(repeats):
            if cancel is not None and cancel():
                break
            tag = time.time_ns() % 10**9
            prefix = f"Session {tag}. " + " ".join(words[:prefix_tokens])
            other = f"Session {tag + 1}. " + " ".join(words[:prefix_tokens])
            texts = {"cold": prefix + "\n" + SUFFIXES[0], "warm": prefix + "\n" + SUFFIXES[1],
                     "control": other + "\n" + SUFFIXES[1]}
            order = ORDERS[i % len(ORDERS)]
            sent, shared, prefill = {}, {}, {}
            for kind in order:
                ids = api.tokenize(server, model, texts[kind], http, add_special=True)
                shared[kind] = None if ids is None else max((common_prefix(ids, s) for s in seen), default=0)
                if ids is not None:
                    seen.append(ids)
                before = _quiet_scrape(server, http)
                sent[kind] = _send(server, model, texts[kind], max_tokens, http)
                prefill[kind] = sent[kind].server_prefill_s
                if prefill[kind] is None:
                    prefill[kind] = _prefill_delta(before, _quiet_scrape(server, http) if before else None)
            result.trials.append(PrefixTrial(order, sent, shared, prefill))
            if on_trial is not None:
                on_trial(result)
            if all(r.error is not None for r in sent.values()):
                raise sent["cold"].error  # type: ignore[misc]
    return result


def _quiet_scrape(server: api.Server, http: httpx.Client) -> MetricsSnapshot | None:
    try:
        return scrape(server, http)
    except InputError:
        return None


def _send(server: api.Server, model: str, prompt: str, max_tokens: int, http: httpx.Client) -> api.RequestResult:
    return api.stream_request(server, model, prompt, max_tokens, client=http)
