"""Serving latency metrics from token timestamps: TTFT, TPOT = (E2E − TTFT)/(N − 1), ITL, percentiles.

Timestamps are seconds since the request arrived. From engine events they are model time only: the
queue wait plus the device-synchronized seconds of each pass, so nothing the UI does between passes
(rendering, the fragment's tick) counts as latency.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from kvviz.engine.generation import StepEvent


def ttft(request_s: float, token_times_s: Sequence[float]) -> float:
    """Time to first token: from the request to the first emitted token."""
    return token_times_s[0] - request_s


def e2e(request_s: float, token_times_s: Sequence[float]) -> float:
    """End-to-end response time: from the request to the last emitted token."""
    return token_times_s[-1] - request_s


def tpot(ttft_s: float, e2e_s: float, n_tokens: int) -> float | None:
    """Time per output token after the first: (E2E − TTFT) / (N − 1); None for a single token."""
    return (e2e_s - ttft_s) / (n_tokens - 1) if n_tokens > 1 else None


def inter_token_latencies(token_times_s: Sequence[float]) -> list[float]:
    """Gaps between consecutive tokens (ITL): N − 1 values whose mean is TPOT."""
    return np.diff(np.asarray(token_times_s, dtype=float)).tolist()


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100), linear interpolation between order statistics; None if empty."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def token_times(events: Sequence[StepEvent]) -> tuple[float, list[float]]:
    """(request time, emit time of each token) from engine events: 0, then queue + prefill, + each step."""
    if not events:
        return 0.0, []
    times = np.cumsum([events[0].queue_s + events[0].seconds] + [e.seconds for e in events[1:]])
    return 0.0, times.tolist()


@dataclass(frozen=True)
class LatencySummary:
    n_tokens: int
    queue_s: float
    prefill_s: float  # the prefill pass, which also emits token #1
    ttft_s: float  # queue + prefill
    e2e_s: float  # measured T_response: request to last token
    tpot_s: float | None  # (E2E − TTFT) / (N − 1), the mean inter-token latency
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tokens_per_s: float | None  # N / E2E, as a user sees it
    decode_tokens_per_s: float | None  # 1 / TPOT, the steady decode rate

    @property
    def predicted_e2e_s(self) -> float | None:
        """TTFT + (N − 1)·TPOT with TPOT the median gap: the usual back-of-envelope estimate."""
        return None if self.tpot_p50_s is None else self.ttft_s + (self.n_tokens - 1) * self.tpot_p50_s

    def to_dict(self) -> dict:
        return {**asdict(self), "predicted_e2e_s": self.predicted_e2e_s}


def summarize(events: Sequence[StepEvent]) -> LatencySummary | None:
    """Every metric of one request's events (batch rows share a pass, so N counts passes); None if empty."""
    if not events:
        return None
    request_s, times = token_times(events)
    first, total, n = ttft(request_s, times), e2e(request_s, times), len(times)
    itl = inter_token_latencies(times)
    per_token = tpot(first, total, n)
    return LatencySummary(
        n_tokens=n,
        queue_s=events[0].queue_s,
        prefill_s=events[0].seconds,
        ttft_s=first,
        e2e_s=total,
        tpot_s=per_token,
        tpot_p50_s=percentile(itl, 50),
        tpot_p90_s=percentile(itl, 90),
        tokens_per_s=n / total if total > 0 else None,
        decode_tokens_per_s=1 / per_token if per_token else None,
    )


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares fit log y = k·log x + c: (k, c). k ≈ 0 constant, 1 linear, 2 quadratic growth."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = (xs > 0) & (ys > 0)
    if np.unique(xs[keep]).size < 2:
        return None
    k, c = np.polyfit(np.log(xs[keep]), np.log(ys[keep]), 1)
    return float(k), float(c)


def linear_fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares y = a·x + b: (a, b), e.g. seconds per prompt token and a fixed cost."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.unique(xs).size < 2:
        return None
    a, b = np.polyfit(xs, ys, 1)
    return float(a), float(b)
