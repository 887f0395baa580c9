"""A bounded concurrency sweep against a live server, with Cancel, and its summary per concurrency.

Each point sends `requests` streamed requests with at most `concurrency` in flight (as
`vllm bench serve --max-concurrency`), while a thread reads /metrics every `scrape_every_s`. It runs
in background threads so a page can draw progress between ticks; cancel() stops at the next chunk and
keeps every request already measured.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from kvviz.engine.metrics import percentile
from kvviz.errors import InputError
from kvviz.serving import client as api
from kvviz.serving.prom import MetricsSnapshot, scrape

FILLER = ("The keys and values of earlier tokens never change under a causal mask, so a serving engine "
          "keeps them in a paged cache and each new token only computes its own. ")

SUMMARY_COLUMNS = ("concurrency", "requests", "ok", "failed", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s",
                   "tpot_p90_s", "itl_p50_s", "e2e_p50_s", "output_tokens", "duration_s", "output_tokens_per_s",
                   "requests_per_s", "tokens_from_usage", "prompt_tokens_mean")


@dataclass(frozen=True)
class Limits:
    """Caps on what one sweep may ask of a server (a hosted demo lowers them)."""

    max_points: int = 8
    max_requests: int = 64  # per point
    max_concurrency: int = 64
    max_tokens: int = 1024
    max_prompt_tokens: int = 8192


def check_plan(concurrency: list[int], requests: int, max_tokens: int, prompt_tokens: int, limits: Limits) -> None:
    if not concurrency:
        raise InputError("serving.no_points")
    if len(concurrency) > limits.max_points:
        raise InputError("serving.too_many_points", n=len(concurrency), cap=limits.max_points)
    for name, value, cap in (("concurrency", max(concurrency), limits.max_concurrency),
                             ("requests", requests, limits.max_requests), ("max_tokens", max_tokens, limits.max_tokens),
                             ("prompt_tokens", prompt_tokens, limits.max_prompt_tokens)):
        if value < 1:
            raise InputError("positive_int", name=name, value=value)
        if value > cap:
            raise InputError("serving.over_cap", name=name, value=value, cap=cap)


def make_prompts(server: api.Server, model: str, n: int, prompt_tokens: int, endpoint: str, *,
                 tag: str = "", client: httpx.Client | None = None) -> tuple[list[str | list[int]], bool]:
    """n distinct prompts of prompt_tokens tokens (each starts with its own number, so no two share a
    cached prefix). Exact token ids where the server tokenizes for us, else text of about that many words;
    the second value says which."""
    texts = [f"{tag}{i}. " + (FILLER * (prompt_tokens // 10 + 2)) for i in range(n)]
    if endpoint == "completions":
        ids = [api.tokenize(server, model, text, client) for text in texts]
        if all(x is not None and len(x) >= prompt_tokens for x in ids):
            return [x[:prompt_tokens] for x in ids], True  # type: ignore[index]
    words = [" ".join(text.split()[:prompt_tokens]) for text in texts]
    return words, False


def summarize(concurrency: int, results: list[api.RequestResult]) -> dict:
    """The point's row: p50/p90 of TTFT, TPOT, ITL and E2E over the requests that finished, and throughput
    = output tokens / (last chunk − first send), as vllm bench serve reports it."""
    ok = [r for r in results if r.ok]
    row: dict = {"concurrency": concurrency, "requests": len(results), "ok": len(ok), "failed": len(results) - len(ok)}
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    itl = [x for r in ok for x in r.itl_s]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    row |= {"ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p90_s": percentile(tpot, 90),
            "itl_p50_s": percentile(itl, 50), "e2e_p50_s": percentile(e2e, 50)}
    out_tokens = sum(r.n_tokens for r in ok)
    if ok:
        duration = max(r.start_s + r.e2e_s for r in ok) - min(r.start_s for r in ok)  # type: ignore[operator]
    else:
        duration = None
    row |= {"output_tokens": out_tokens, "duration_s": duration,
            "output_tokens_per_s": out_tokens / duration if duration else None,
            "requests_per_s": len(ok) / duration if duration else None,
            "tokens_from_usage": all(r.tokens_from_usage for r in ok) if ok else None,
            "prompt_tokens_mean": (sum(r.prompt_tokens for r in ok if r.prompt_tokens is not None) /
                                   max(1, sum(r.prompt_tokens is not None for r in ok))) if ok else None}
    return row


@dataclass
class SweepJob:
    """A concurrency sweep running in background threads; read its fields between ticks."""

    server: api.Server
    model: str
    concurrency: list[int]
    requests: int
    prompt_tokens: int
    max_tokens: int
    endpoint: str = "completions"
    include_usage: bool = True
    scrape_every_s: float = 0.5
    results: dict[int, list[api.RequestResult]] = field(default_factory=dict)
    metrics: list[MetricsSnapshot] = field(default_factory=list)
    metrics_error: InputError | None = None
    error: InputError | None = None
    exact_prompts: bool | None = None
    finished: bool = False
    cancelled: bool = False
    usage_fallback: bool = False  # the server refused stream_options: N counted from chunks
    ignore_eos: bool = True
    eos_may_stop: bool = False  # the server refused ignore_eos: requests may stop early at EOS

    def __post_init__(self) -> None:
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._thread: threading.Thread | None = None

    # ---- control -------------------------------------------------------------------------------
    def start(self) -> SweepJob:
        self._thread = threading.Thread(target=self._run, daemon=True, name="kvviz-serve-sweep")
        self._thread.start()
        threading.Thread(target=self._poll_metrics, daemon=True, name="kvviz-metrics").start()
        return self

    def cancel(self) -> None:
        self.cancelled = True
        self._cancel.set()

    def wait(self, timeout_s: float | None = None) -> SweepJob:
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self

    @property
    def total(self) -> int:
        return len(self.concurrency) * self.requests

    @property
    def done(self) -> int:
        with self._lock:
            return sum(not r.cancelled for v in self.results.values() for r in v)  # sent and answered (or failed)

    @property
    def progress(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 1.0

    def rows(self) -> list[dict]:
        with self._lock:
            kept = {c: [r for r in rs if not r.cancelled] for c, rs in self.results.items()}
            return [summarize(c, rs) for c, rs in kept.items() if rs]

    def request_rows(self) -> list[dict]:
        with self._lock:
            return [{"concurrency": c, **r.to_dict()} for c, rs in self.results.items() for r in rs if not r.cancelled]

    def errors(self) -> list[InputError]:
        """Distinct failures of individual requests, in the order they happened."""
        seen, out = set(), []
        with self._lock:
            for rs in self.results.values():
                for r in rs:
                    if r.error is not None and str(r.error) not in seen:
                        seen.add(str(r.error))
                        out.append(r.error)
        return out

    # ---- work ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with self.server.client() as http:
                n_prompts = self.requests * len(self.concurrency)
                prompts, self.exact_prompts = make_prompts(self.server, self.model, n_prompts,
                                                           self.prompt_tokens, self.endpoint, client=http,
                                                           tag=f"{time.time_ns() % 100000}-")
                for i, c in enumerate(self.concurrency):
                    if self._cancel.is_set():
                        break
                    with self._lock:
                        self.results[c] = []
                    batch = prompts[i * self.requests:(i + 1) * self.requests]
                    with ThreadPoolExecutor(max_workers=c) as pool:
                        for fut in [pool.submit(self._one, http, p) for p in batch]:
                            result = fut.result()
                            with self._lock:
                                self.results[c].append(result)
                    if self._fatal():
                        break
        except InputError as exc:
            self.error = exc
        finally:
            self.finished = True

    def _fatal(self) -> bool:
        """A point where every request failed the same way (server down, wrong model): stop, say why."""
        with self._lock:
            last = list(self.results.values())[-1] if self.results else []
        if last and all(r.error is not None for r in last):
            self.error = last[0].error
            return True
        return False

    def _one(self, http: httpx.Client, prompt: str | list[int]) -> api.RequestResult:
        if self._cancel.is_set():
            return api.RequestResult(start_s=time.perf_counter() - self._t0, cancelled=True)
        r = api.stream_request(self.server, self.model, prompt, self.max_tokens, endpoint=self.endpoint,
                               include_usage=self.include_usage, ignore_eos=self.ignore_eos, client=http,
                               cancel=self._cancel, clock_zero=self._t0)
        if "stream_options" in r.refused:
            self.include_usage, self.usage_fallback = False, True  # N counted from chunks, and said so
        if "ignore_eos" in r.refused:
            self.ignore_eos, self.eos_may_stop = False, True  # a request may end before max_tokens
        return r

    def _poll_metrics(self) -> None:
        with self.server.client() as http:
            while not self.finished:
                try:
                    snap = scrape(self.server, http, t_s=time.perf_counter() - self._t0)
                except InputError as exc:
                    self.metrics_error = exc  # no /metrics: the sweep goes on without it
                    return
                with self._lock:
                    self.metrics.append(snap)
                self._cancel.wait(self.scrape_every_s)
