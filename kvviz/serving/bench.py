"""A load test against a live server, point by point, each point run as `vllm bench serve` runs one.

A point is a request rate (∞: all at once) and an optional cap on requests in flight (--max-concurrency):
concurrency 1, 2, 4 at rate ∞ is a closed-loop sweep; rates 1, 2, 4 req/s an open-loop one. Each point sends
its warm-ups (vLLM's benchmark(): the first request sent again --num-warmups times, default 0, left out of the
numbers), reads /metrics, sends its requests at their arrival times
(kvviz.serving.workload.arrival_times), waits for every one of them, reads /metrics again, and summarizes
with vLLM's definitions (vllm/benchmarks/serve.py @009e6d4a, calculate_metrics and benchmark()):

- duration: from just before the first request is sent until every request, failed ones included, finished;
- request_throughput = completed / duration; output_throughput = output tokens / duration;
  total_token_throughput = (input + output tokens) / duration; input tokens: usage's prompt_tokens, else the
  request's own count (the dataset's prompt_len); output tokens: usage's completion_tokens, else the generated
  text tokenized (the server's /tokenize standing in for vLLM's local tokenizer), else token messages counted
  (where vLLM without a tokenizer counts 1);
- TPOT per request = (E2E − TTFT) / (N − 1) for N > 1; ITL = every gap between token messages, pooled;
- mean, median, std (population) and the chosen percentiles (numpy's linear interpolation; default 99 as
  vLLM's --metric-percentiles) of TTFT, TPOT, ITL and E2E, in ms, under vLLM's key names (mean_ttft_ms,
  median_tpot_ms, p99_itl_ms, …); kvviz adds E2E's, which vLLM writes only when --percentile-metrics names it;
- request_goodput = requests meeting every SLO of --goodput (ttft, tpot, e2el in ms; a request with N ≤ 1 has
  TPOT 0 for this) / duration (the DistServe definition vLLM cites).
Where vLLM writes 0 for a metric with no samples, kvviz writes None (unknown).

Between the two scrapes the server's counters give the point's window (kvviz.serving.prom.window), and a thread
reads its gauges every `scrape_every_s`. A point whose requests all failed stops the run with the reason; so
does a server that can no longer be reached, before the rest of its point is sent. Cancel stops at the next
chunk and keeps every request already measured.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from kvviz.engine.metrics import within_spread
from kvviz.errors import InputError
from kvviz.serving import client as api
from kvviz.serving.prom import MetricsSnapshot, scrape, window
from kvviz.serving.workload import (
    SampleRequest,
    Workload,
    arrival_times,
    dataset_requests,
    length_bounds,
    random_requests,
)

INF = math.inf
PERCENTILES = (99.0,)  # vLLM's --metric-percentiles default; with the median, which is always reported
METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # vllm/benchmarks/serve.py check_goodput_args VALID_NAMES


@dataclass(frozen=True)
class Limits:
    """Caps on what one run may ask of a server (a hosted demo lowers them)."""

    max_points: int = 8
    max_requests: int = 64  # per point
    max_concurrency: int = 64  # requests in flight
    max_tokens: int = 1024
    max_prompt_tokens: int = 8192
    max_warmups: int = 8


@dataclass(frozen=True)
class Point:
    """One load: a request rate (requests/s, ∞ = all at time 0) and an optional cap on requests in flight."""

    request_rate: float = INF
    max_concurrency: int | None = None

    def to_dict(self) -> dict:
        return {"request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
                "max_concurrency": self.max_concurrency}

    @classmethod
    def from_dict(cls, d: dict) -> Point:
        return cls(float(d["request_rate"]), d.get("max_concurrency"))


def closed_loop(concurrency: Sequence[int]) -> tuple[Point, ...]:
    """Requests sent all at once with at most c in flight: a new one starts when one finishes."""
    return tuple(Point(INF, c) for c in concurrency)


def open_loop(rates: Sequence[float], max_concurrency: int | None = None) -> tuple[Point, ...]:
    """Requests arriving at each rate whatever the server's pace (optionally capped in flight)."""
    return tuple(Point(r, max_concurrency) for r in rates)


def parse_goodput(pairs: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """`ttft:500 tpot:50` -> (("ttft", 500.0), ("tpot", 50.0)), checked as vLLM's parse_goodput and
    check_goodput_args check them (names ttft, tpot, e2el; values ≥ 0 ms)."""
    out = []
    for pair in pairs:
        name, sep, value = pair.partition(":")
        try:
            ms = float(value) if sep else None
        except ValueError:
            ms = None
        if name not in GOODPUT_METRICS or ms is None or not ms >= 0 or math.isinf(ms):
            raise InputError("serving.bad_goodput", pair=pair)
        out.append((name, ms))
    return tuple(out)


@dataclass(frozen=True)
class BenchPlan:
    """Everything a run needs except the API key (which travels apart from it, never written down)."""

    url: str
    model: str = ""
    points: tuple[Point, ...] = closed_loop((1, 2, 4))
    num_prompts: int = 8  # per point
    workload: Workload = field(default_factory=Workload)
    endpoint: str = "completions"
    timeout_s: float = 60.0
    burstiness: float = 1.0
    num_warmups: int = 0  # vLLM's --num-warmups default
    goodput: tuple[tuple[str, float], ...] = ()  # (metric, ms)
    percentiles: tuple[float, ...] = PERCENTILES
    ignore_eos: bool = True
    scrape_every_s: float = 0.5
    # each request's prompt as the server's cache sees it (token ids), kept for its attribution to cached blocks
    # (kvviz.serving.kv_run); only when asked: a long run's ids would weigh on every state the worker writes
    keep_cache_ids: bool = False

    def to_dict(self) -> dict:
        return {"url": self.url, "model": self.model, "points": [p.to_dict() for p in self.points],
                "num_prompts": self.num_prompts, "workload": self.workload.to_dict(), "endpoint": self.endpoint,
                "timeout_s": self.timeout_s, "burstiness": "inf" if math.isinf(self.burstiness) else self.burstiness,
                "num_warmups": self.num_warmups, "goodput": dict(self.goodput),
                "percentiles": list(self.percentiles), "ignore_eos": self.ignore_eos,
                "scrape_every_s": self.scrape_every_s, "keep_cache_ids": self.keep_cache_ids}

    @classmethod
    def from_dict(cls, d: dict) -> BenchPlan:
        return cls(url=d["url"], model=d.get("model", ""), points=tuple(Point.from_dict(p) for p in d["points"]),
                   num_prompts=int(d["num_prompts"]), workload=Workload(**d.get("workload", {})),
                   endpoint=d.get("endpoint", "completions"), timeout_s=float(d.get("timeout_s", 60.0)),
                   burstiness=float(d.get("burstiness", 1.0)), num_warmups=int(d.get("num_warmups", 0)),
                   goodput=tuple((k, float(v)) for k, v in (d.get("goodput") or {}).items()),
                   percentiles=tuple(float(p) for p in d.get("percentiles", PERCENTILES)),
                   ignore_eos=bool(d.get("ignore_eos", True)), scrape_every_s=float(d.get("scrape_every_s", 0.5)),
                   keep_cache_ids=bool(d.get("keep_cache_ids", False)))


def check_plan(plan: BenchPlan, limits: Limits) -> None:
    """Every setting in range and under the caps, before anything is sent."""
    if not plan.points:
        raise InputError("serving.no_points")
    if len(plan.points) > limits.max_points:
        raise InputError("serving.too_many_points", n=len(plan.points), cap=limits.max_points)
    plan.workload.check()
    if plan.burstiness <= 0:
        raise InputError("serving.bad_burstiness", value=plan.burstiness)
    _, out_high = length_bounds(plan.workload.output_len, plan.workload.range_ratio, at_least=1)
    _, in_high = length_bounds(plan.workload.input_len, plan.workload.range_ratio, at_least=1)
    in_flight = max(p.max_concurrency or plan.num_prompts for p in plan.points)
    for name, value, cap in (("requests", plan.num_prompts, limits.max_requests),
                             ("concurrency", in_flight, limits.max_concurrency),
                             ("max_tokens", out_high, limits.max_tokens),
                             ("prompt_tokens", in_high + plan.workload.prefix_len, limits.max_prompt_tokens)):
        if value < 1:
            raise InputError("positive_int", name=name, value=value)
        if value > cap:
            raise InputError("serving.over_cap", name=name, value=value, cap=cap)
    if not 0 <= plan.num_warmups <= limits.max_warmups:
        raise InputError("serving.over_cap", name="num_warmups", value=plan.num_warmups, cap=limits.max_warmups)
    for p in plan.points:
        if not p.request_rate > 0:
            raise InputError("serving.bad_rate", value=p.request_rate)
        if p.max_concurrency is not None and p.max_concurrency < 1:
            raise InputError("positive_int", name="max_concurrency", value=p.max_concurrency)


def _stats(values: Sequence[float], percentiles: Sequence[float], name: str) -> dict:
    """mean/median/std and percentiles in ms under vLLM's keys (serve.py process_one_metric); None when empty."""
    arr = np.asarray(values, dtype=float) * 1e3
    empty = arr.size == 0
    out = {f"mean_{name}_ms": None if empty else float(arr.mean()),
           f"median_{name}_ms": None if empty else float(np.median(arr)),
           f"std_{name}_ms": None if empty else float(arr.std())}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = None if empty else float(np.percentile(arr, p))
    return out


def _peaks(ok: Sequence[api.RequestResult]) -> tuple[float, int]:
    """vLLM's max_output_tokens_per_s (token messages per one-second bucket from the first send) and
    max_concurrent_requests (a sweep over [start, end) intervals), from calculate_metrics."""
    if not ok:
        return 0.0, 0
    t0 = min(r.start_s for r in ok)
    end = max(r.start_s + r.e2e_s for r in ok)  # type: ignore[operator]
    buckets = np.zeros(int(np.ceil(end - t0)) + 1)
    for r in ok:
        for t in r.chunk_times_s:
            b = int(r.start_s + t - t0)
            if 0 <= b < buckets.size:
                buckets[b] += 1
    events = sorted([(r.start_s, 1) for r in ok] + [(r.start_s + r.e2e_s, -1) for r in ok])  # type: ignore[operator]
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return float(buckets.max()), peak


def calculate_metrics(results: Sequence[api.RequestResult], duration_s: float,
                      percentiles: Sequence[float] = PERCENTILES,
                      goodput: Sequence[tuple[str, float]] = ()) -> dict:
    """A point's numbers from its sent requests, as vllm/benchmarks/serve.py calculate_metrics computes them."""
    sent = [r for r in results if not r.cancelled]
    ok = [r for r in sent if r.ok]
    output_lens = [r.n_tokens for r in ok]
    total_input = sum(r.input_len or 0 for r in ok)
    ttfts = [r.ttft_s for r in ok]
    e2els = [r.e2e_s for r in ok]
    tpots = [r.tpot_s for r in ok if r.n_tokens > 1]
    all_tpots = [r.tpot_s if r.n_tokens > 1 else 0.0 for r in ok]
    itls = [x for r in ok for x in r.itl_s]
    good = None
    if goodput:
        slo = dict(goodput)
        per_metric = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        good = sum(all(per_metric[m][i] <= slo[m] / 1e3 for m in slo) for i in range(len(ok)))
    peak_tps, peak_conc = _peaks(ok)
    total_output = sum(output_lens)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: None)  # noqa: E731
    out = {"duration": duration_s, "completed": len(ok), "failed": len(sent) - len(ok),
           "total_input_tokens": total_input, "total_output_tokens": total_output,
           "request_throughput": per_s(len(ok)), "request_goodput": None if good is None else per_s(good),
           "output_throughput": per_s(total_output), "total_token_throughput": per_s(total_input + total_output),
           "max_output_tokens_per_s": peak_tps, "max_concurrent_requests": peak_conc}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out |= _stats(values, percentiles, name)
    return out


def server_crosscheck(ok: Sequence[api.RequestResult], metrics: dict, server_window: dict | None) -> dict:
    """The client's mean TTFT and TPOT beside the server's own clock: llama.cpp's per-request timings
    (prompt_ms: its prefill, without queue or HTTP; predicted_per_token_ms: its decode per token), and the
    engine's TTFT/ITL histograms over the window (vLLM, SGLang)."""
    prefill = [r.server_prefill_s for r in ok if r.server_prefill_s is not None]
    tpot = [r.server_tpot_s for r in ok if r.server_tpot_s is not None]
    both = [(r.tpot_s, r.server_tpot_s) for r in ok if r.tpot_s is not None and r.server_tpot_s is not None]
    w = server_window or {}
    return {"client_mean_ttft_ms": metrics.get("mean_ttft_ms"), "client_mean_tpot_ms": metrics.get("mean_tpot_ms"),
            "client_mean_itl_ms": metrics.get("mean_itl_ms"),
            "server_mean_prefill_ms": float(np.mean(prefill)) * 1e3 if prefill else None,
            "server_mean_tpot_ms": float(np.mean(tpot)) * 1e3 if tpot else None,
            "server_mean_ttft_ms": w.get("server_mean_ttft_ms"), "server_mean_itl_ms": w.get("server_mean_itl_ms"),
            "n_with_server_timings": len(prefill),
            # the client's TPOT against the server's own, request by request: equal within their spread means
            # the time was the server's (a slow server, not a slow measurement)
            "tpot_agree": within_spread([c for c, _ in both], [s for _, s in both]) if both else None}


def error_dict(exc: InputError) -> dict:
    return {"key": exc.key, "params": {k: v if isinstance(v, (int, float, str)) or v is None else str(v)
                                       for k, v in exc.params.items()}}


def error_from(d: dict | None) -> InputError | None:
    return None if d is None else InputError(d["key"], **d["params"])


class BenchRun:
    """Runs a plan (in the calling thread: the CLI's process, or the page's worker process) and keeps a
    JSON-ready picture of where it is, handed to `on_update` as it goes."""

    def __init__(self, plan: BenchPlan, server: api.Server, *, model: str, engine: str | None = None,
                 on_update: Callable[[dict], None] | None = None, cancel: threading.Event | None = None,
                 update_every_s: float = 1.0) -> None:
        self.plan, self.server, self.model, self.engine = plan, server, model, engine
        self.cancel_event = cancel or threading.Event()
        self.on_update, self.update_every_s = on_update, update_every_s
        self.points: list[dict] = []
        self.current: dict | None = None
        self.error: InputError | None = None
        self.notes: dict[str, InputError] = {}  # distinct non-fatal problems, by English text
        self.exact_prompts: bool | None = None
        self.usage_fallback = self.eos_may_stop = False
        self.status = "running"
        self._include_usage, self._ignore_eos = True, plan.ignore_eos
        self._metrics_ok = True
        self._stop_point = False
        self._lock = threading.Lock()
        self._last_update = 0.0
        self._t0 = time.perf_counter()
        # Each request's leading tokens: new every run, so no prompt finds an earlier run's in the cache.
        self._lead_rng = np.random.default_rng(time.time_ns())

    # ---- what the caller reads ----------------------------------------------------------------------
    @property
    def total(self) -> int:
        return len(self.plan.points) * self.plan.num_prompts

    @property
    def done(self) -> int:
        with self._lock:
            live = sum(1 for r in (self.current or {}).get("requests", []))
        return sum(len(p["requests"]) for p in self.points) + live

    def snapshot(self) -> dict:
        with self._lock:
            current = None if self.current is None else {**self.current, "requests": list(self.current["requests"]),
                                                          "gauges": list(self.current["gauges"])}
            return {"status": self.status, "plan": self.plan.to_dict(), "url": self.server.base_url,
                    "model": self.model, "engine": self.engine, "exact_prompts": self.exact_prompts,
                    "usage_fallback": self.usage_fallback, "eos_may_stop": self.eos_may_stop,
                    "points": list(self.points), "current": current,
                    "progress": {"done": sum(len(p["requests"]) for p in self.points)
                                 + (len(current["requests"]) if current else 0), "total": self.total},
                    "completed": sum(p["completed"] for p in self.points),
                    "error": None if self.error is None else error_dict(self.error),
                    "notes": [error_dict(e) for e in self.notes.values()]}

    def _update(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.on_update is not None and (force or now - self._last_update >= self.update_every_s):
            self._last_update = now
            self.on_update(self.snapshot())

    def _note(self, exc: InputError) -> None:
        with self._lock:
            self.notes.setdefault(str(exc), exc)

    # ---- the run ------------------------------------------------------------------------------------
    def run(self) -> BenchRun:
        try:
            in_flight = max(p.max_concurrency or self.plan.num_prompts for p in self.plan.points)
            with self.server.client(max_connections=in_flight + 4) as http:
                for index, point in enumerate(self.plan.points):
                    if self.cancel_event.is_set():
                        break
                    self._run_point(http, index, point)
                    if self.error is not None:
                        break
        except InputError as exc:
            self.error = exc
        finally:
            self.status = "cancelled" if self.cancel_event.is_set() else "done"
            self._update(force=True)
        return self

    def cancel(self) -> None:
        self.cancel_event.set()

    def _requests(self, http: httpx.Client, index: int, n: int) -> list[SampleRequest]:
        rng = np.random.default_rng(self.plan.workload.seed + index)  # each point its own, reproducible draw
        if self.plan.workload.dataset_path:
            reqs = dataset_requests(self.server, self.model, n, self.plan.workload, client=http)
            self.exact_prompts = all(r.prompt_len is not None for r in reqs)
            return reqs
        reqs, exact = random_requests(self.server, self.model, n, self.plan.workload, self.plan.endpoint,
                                      rng=rng, lead_rng=self._lead_rng, client=http)
        self.exact_prompts = exact
        return reqs

    def _run_point(self, http: httpx.Client, index: int, point: Point) -> None:
        plan = self.plan
        n = plan.num_prompts
        measured = self._requests(http, index, n)
        # vLLM's warm-up sends the first request again (its test_input), so that request may find its prompt cached
        warmups = measured[:1] * plan.num_warmups
        with self._lock:
            self.current = {"index": index, **point.to_dict(), "burstiness": plan.to_dict()["burstiness"],
                            "phase": "warmup", "requests": [], "gauges": []}
        self._update(force=True)
        if warmups:
            with ThreadPoolExecutor(max_workers=min(len(warmups), point.max_concurrency or len(warmups))) as pool:
                list(pool.map(lambda r: self._send(http, r, cancel=self.cancel_event), warmups))
        if self.cancel_event.is_set():
            return
        before = self._scrape(http)
        stop_poll = threading.Event()
        poller = threading.Thread(target=self._poll, args=(http, stop_poll), daemon=True, name="kvviz-metrics")
        rng = np.random.default_rng(plan.workload.seed + 1000 + index)
        arrivals = arrival_times(n, point.request_rate, plan.burstiness, rng)
        results: list[api.RequestResult] = []
        self._stop_point = False
        with self._lock:
            self.current["phase"] = "measuring"  # type: ignore[index]
        poller.start()
        start = time.perf_counter()
        start_unix = time.time()  # the same instant on the wall clock, which a server's KV events carry
        with self._lock:
            self.current["start_unix_s"] = start_unix  # type: ignore[index]
        with ThreadPoolExecutor(max_workers=point.max_concurrency or n) as pool:
            futures = []
            for i, (req, at) in enumerate(zip(measured, arrivals, strict=True)):
                wait = start + at - time.perf_counter()
                if wait > 0 and self.cancel_event.wait(wait):
                    break
                if self.cancel_event.is_set() or self._stop_point:
                    break
                futures.append(pool.submit(self._one, http, req, start + at, start, results, i))
            for f in futures:
                f.result()
        duration = time.perf_counter() - start  # until every request, failed ones too, has finished
        stop_poll.set()
        poller.join(5)
        after = self._scrape(http) if before is not None else None
        self._count_text_tokens(http, results)
        sent = [r for r in results if not r.cancelled]
        ok = [r for r in sent if r.ok]
        metrics = calculate_metrics(results, duration, plan.percentiles, plan.goodput)
        server_window = window(before, after, duration) if before is not None and after is not None else None
        with self._lock:
            gauges = list(self.current["gauges"])  # type: ignore[index]
            # rows were appended with their results, in the same order; N may have been counted since
            rows = [{**row, **r.to_dict()} for row, r in zip(self.current["requests"], results, strict=True)]  # type: ignore[index]
        if plan.keep_cache_ids:
            self._cache_ids(http, measured, rows)
        result = {**point.to_dict(), "burstiness": plan.to_dict()["burstiness"], "num_prompts": n,
                  "sent": len(sent), **metrics, "server": server_window,
                  "server_timings": server_crosscheck(ok, metrics, server_window),
                  "tokens_from_usage": all(r.tokens_from_usage for r in ok) if ok else None,
                  "tokens_from": sorted({r.tokens_from for r in ok}),
                  "start_perf_counter_s": start,  # the point's clock zero: vLLM's start_times are perf_counter()
                  "start_unix_s": start_unix,  # and on the wall clock
                  "cancelled": self.cancel_event.is_set(), "requests": rows, "gauges": gauges}
        with self._lock:
            self.points.append(result)
            self.current = None
        if self._stop_point or (sent and not ok):
            first = next((r.error for r in sent if r.error is not None), None)
            self.error = first or InputError("serving.all_failed", reason="?")
        self._update(force=True)

    def _send(self, http: httpx.Client, req: SampleRequest, *, cancel: threading.Event | None = None,
              clock_zero: float | None = None) -> api.RequestResult:
        r = api.stream_request(self.server, self.model, req.prompt, req.expected_output_len,
                               endpoint=self.plan.endpoint, include_usage=self._include_usage,
                               ignore_eos=self._ignore_eos, client=http, cancel=cancel,
                               clock_zero=self._t0 if clock_zero is None else clock_zero, prompt_len=req.prompt_len)
        if "stream_options" in r.refused:
            self._include_usage, self.usage_fallback = False, True  # N counted from messages, and said so
        if "ignore_eos" in r.refused:
            self._ignore_eos, self.eos_may_stop = False, True  # a request may end before its output length
        return r

    def _one(self, http: httpx.Client, req: SampleRequest, arrival: float, start: float,
             results: list[api.RequestResult], index: int = 0) -> None:
        if self.cancel_event.is_set() or self._stop_point:
            return
        sent_at = time.perf_counter()
        r = self._send(http, req, cancel=self.cancel_event, clock_zero=start)
        if r.cancelled:
            return
        if r.stream_cut:
            self._note(InputError("serving.stream_cut", url=self.server.base_url, n_chunks=r.n_chunks))
        if r.error is not None:
            self._note(r.error)
            if r.error.key in ("serving.unreachable", "serving.auth", "serving.unknown_model"):
                self._stop_point = True  # the server is gone, or will refuse every request alike
        row = {**r.to_dict(), "request": index, "arrival_s": arrival - start, "queue_s": sent_at - arrival,
               "expected_output_len": req.expected_output_len, "expected_prompt_len": req.prompt_len}
        with self._lock:
            results.append(r)
            if self.current is not None:
                self.current["requests"].append(row)
        self._update()

    def _count_text_tokens(self, http: httpx.Client, results: Sequence[api.RequestResult]) -> None:
        """N of a finished request without usage: its generated text tokenized without special tokens, after the
        point as vLLM's calculate_metrics does (the server's /tokenize; where it has none, messages counted)."""
        for r in results:
            if r.ok and not r.completion_tokens and r.text_tokens is None:
                ids = api.tokenize(self.server, self.model, r.text, http)
                r.text_tokens = None if ids is None else len(ids)

    def _cache_ids(self, http: httpx.Client, measured: Sequence[SampleRequest], rows: list[dict]) -> None:
        """Each request's prompt as the server's cache sees it (api.cache_ids), after the point as
        _count_text_tokens asks, so no tokenizing competes with the measured requests."""
        for row in rows:
            ids, source = api.cache_ids(self.server, self.model, self.plan.endpoint, measured[row["request"]].prompt,
                                        http)
            row["cache_ids"], row["cache_ids_from"] = ids, source

    def _scrape(self, http: httpx.Client) -> MetricsSnapshot | None:
        if not self._metrics_ok:
            return None
        try:
            return scrape(self.server, http, t_s=time.perf_counter() - self._t0)
        except InputError as exc:
            self._metrics_ok = False  # no /metrics: latency is still measured
            self._note(exc)
            return None

    def _poll(self, http: httpx.Client, stop: threading.Event) -> None:
        while not stop.is_set():
            snap = self._scrape(http)
            if snap is None:
                return
            with self._lock:
                if self.current is not None:
                    self.current["gauges"].append({"t_s": snap.t_s, "gauges": snap.gauges})
            stop.wait(self.plan.scrape_every_s)



def vllm_result(run: dict, point: dict, date: str) -> dict:
    """One point as `vllm bench serve --save-result --save-detailed` writes its JSON (serve.py main_async:
    setup keys, then benchmark()'s result dict), so files from both tools load in the same readers key for key:
    per-request lists over every sent request (a failed one: output length 0, TTFT and latency 0.0 as vLLM's
    RequestFuncOutput defaults, its error text), start_times on the sender's perf_counter() clock, rtfx 0.0 (no
    audio). kvviz's own additions (the server's window and clock) are under "kvviz"."""
    rows = point["requests"]
    plan = run["plan"]
    backend = "openai-chat" if plan["endpoint"] == "chat" else "openai"
    skip = {"requests", "gauges", "server", "server_timings", "sent", "cancelled", "tokens_from_usage", "tokens_from",
            "start_perf_counter_s", "start_unix_s"}
    zero = point.get("start_perf_counter_s", 0.0)
    return {"date": date, "endpoint_type": backend, "backend": backend, "label": None, "model_id": run["model"],
            "tokenizer_id": None, "num_prompts": point["num_prompts"], "request_rate": point["request_rate"],
            "burstiness": point["burstiness"], "max_concurrency": point["max_concurrency"],
            **{k: v for k, v in point.items() if k not in skip and k not in ("request_rate", "burstiness",
                                                                              "max_concurrency", "num_prompts")},
            "input_lens": [r.get("input_len") or 0 for r in rows],
            "output_lens": [r["n_tokens"] if r["ok"] else 0 for r in rows],
            "ttfts": [r["ttft_s"] or 0.0 for r in rows], "itls": [r.get("itl_s", []) for r in rows],
            "latencies": [r["e2e_s"] if r["ok"] else 0.0 for r in rows],
            "start_times": [zero + r["start_s"] for r in rows],
            "queue_times": [r["queue_s"] for r in rows], "generated_texts": [r.get("text", "") for r in rows],
            "errors": [r["error"] or "" for r in rows], "rtfx": 0.0,
            "kvviz": {"url": run["url"], "engine": run["engine"], "server": point["server"],
                      "server_timings": point["server_timings"], "workload": plan["workload"],
                      "tokens_from": point.get("tokens_from")}}


def result_filename(run: dict, point: dict, date: str) -> str:
    """vLLM's compute_result_filename: {label}-{rate}qps[-concurrency{c}]-{model}-{date}.json, label = backend."""
    backend = "openai-chat" if run["plan"]["endpoint"] == "chat" else "openai"
    rate = point["request_rate"]
    conc = f"-concurrency{point['max_concurrency']}" if point["max_concurrency"] is not None else ""
    return f"{backend}-{rate}qps{conc}-{run['model'].rstrip('/').split('/')[-1]}-{date}.json"


def write_results(run: dict, directory: str | Path) -> list[Path]:
    """One vLLM-format result file per measured point, in `directory` (created if missing)."""
    import json
    from datetime import datetime

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    paths = []
    for point in run["points"]:
        path = out / result_filename(run, point, date)
        path.write_text(json.dumps(vllm_result(run, point, date)), encoding="utf-8")
        paths.append(path)
    return paths
