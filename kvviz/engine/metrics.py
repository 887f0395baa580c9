"""Serving latency metrics from token timestamps: TTFT, TPOT = (E2E − TTFT)/(N − 1), ITL, percentiles.

Timestamps are seconds since the request arrived. From engine events they are model time only: the
queue wait plus the device-synchronized seconds of each pass, so nothing the UI does between passes
(rendering, the fragment's tick) counts as latency.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the events' type only: the metrics themselves need no torch (a page draws them without it)
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


# ---- fits and verdicts: what the data can and cannot say ------------------------------------------------
# Two-sided 95% Student-t quantiles t(0.975, dof) for dof 1..30 (any statistics table, e.g. NIST/SEMATECH
# e-Handbook §1.3.6.7.2); beyond 30 the normal 1.96 is within 4%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(dof: int) -> float:
    """The two-sided 95% Student-t quantile for `dof` degrees of freedom (≥ 1)."""
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


@dataclass(frozen=True)
class PolyFit:
    """Least squares y = c₀ + c₁·x (+ c₂·x²) over n points, with the coefficients' covariance.

    For a model pass timed at n tokens: c₀ is its fixed cost, c₁ its cost per token (the weights applied to
    each token, or one query reading each cached position) and c₂ its cost per pair of tokens (n queries each
    attending to the tokens before it, in a pass over n tokens at once).
    """

    coef: tuple[float, ...]  # constant first
    cov: tuple[tuple[float, ...], ...] | None  # None without residual degrees of freedom (the curve is exact)
    n: int

    def __call__(self, x: float) -> float:
        return float(sum(c * x**i for i, c in enumerate(self.coef)))

    @property
    def intercept(self) -> float:
        return self.coef[0]

    @property
    def slope(self) -> float:
        return self.coef[1]

    def se(self, i: int) -> float | None:
        """The standard error of coefficient i (None with no residual degrees of freedom)."""
        return None if self.cov is None else float(np.sqrt(max(self.cov[i][i], 0.0)))

    @property
    def slope_se(self) -> float | None:
        return self.se(1)

    def _t(self) -> float:
        return t95(self.n - len(self.coef))

    def slope_ci95(self) -> tuple[float, float] | None:
        """The slope's 95% confidence interval (Student t with n − (degree + 1) degrees of freedom)."""
        if self.slope_se is None:
            return None
        half = self._t() * self.slope_se
        return self.slope - half, self.slope + half

    def change_ci95(self, x0: float, x1: float) -> tuple[float, float] | None:
        """The 95% interval of y(x1) − y(x0): how much the fitted curve rises over [x0, x1], with its uncertainty
        (the gradient of the change through the coefficients' covariance)."""
        if self.cov is None:
            return None
        g = np.array([x1**i - x0**i for i in range(len(self.coef))], dtype=float)
        change = float(g @ np.asarray(self.coef))
        half = self._t() * float(np.sqrt(max(g @ np.asarray(self.cov) @ g, 0.0)))
        return change - half, change + half


def poly_fit(x: Sequence[float], y: Sequence[float], degree: int = 1, *, relative: bool = False) -> PolyFit | None:
    """Least-squares y = c₀ + c₁·x (+ c₂·x²…) with the coefficients' covariance; None with too few distinct x.

    Give every repeat as its own point (x repeated): the errors then reflect the measured spread. `relative`
    weighs each point by 1 / the median y at its x, so that the fit minimises relative errors: timings scatter in
    proportion to their size, and on a log axis a 1 ms miss at 2 ms shows as much as 100 ms at 200 ms.
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.unique(xs).size <= degree:
        return None
    w = None
    if relative:
        scale = {v: float(np.median(ys[xs == v])) for v in np.unique(xs)}
        if min(scale.values()) <= 0:
            return None
        w = np.array([1 / scale[v] for v in xs])
    n = xs.size
    if n > degree + 1:
        c, cov = np.polyfit(xs, ys, degree, w=w, cov=True)
        cov = cov[::-1, ::-1]  # polyfit puts the highest power first
        cov_t = tuple(tuple(float(v) for v in row) for row in cov)
    else:
        c, cov_t = np.polyfit(xs, ys, degree, w=w), None
    return PolyFit(tuple(float(v) for v in c[::-1]), cov_t, n)


def linear_fit(x: Sequence[float], y: Sequence[float]) -> PolyFit | None:
    """Least-squares y = a·x + b (an ordinary straight line), with a's standard error."""
    return poly_fit(x, y, 1)


def loglog_fit(x: Sequence[float], y: Sequence[float]) -> PolyFit | None:
    """log y = k·log x + c (k with its standard error): k ≈ 0 constant, 1 linear, 2 quadratic; points ≤ 0 left out."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = (xs > 0) & (ys > 0)
    return linear_fit(np.log(xs[keep]), np.log(ys[keep]))


TREND_VERDICTS = ("rising", "flat", "falling", "too_noisy")


def trend_verdict(fit: PolyFit | None, x_range: tuple[float, float], y_level: float, *,
                  flat_fraction: float = 0.1) -> str:
    """What a fitted curve supports over x_range, from the 95% interval of its rise (never a sign the data cannot
    back): rising / falling: the whole interval is above / below zero; flat: it holds zero and even its ends
    change y by less than `flat_fraction` of `y_level`; too_noisy: anything else (the spread is larger than the
    effect, or too few points to estimate a spread).
    """
    ci = fit.change_ci95(*x_range) if fit is not None else None
    if ci is None:
        return "too_noisy"
    lo, hi = ci
    if lo > 0:
        return "rising"
    if hi < 0:
        return "falling"
    if max(abs(lo), abs(hi)) <= flat_fraction * abs(y_level):
        return "flat"
    return "too_noisy"


@dataclass(frozen=True)
class FormulaCheck:
    """T = TTFT + (N − 1)·mean TPOT holds exactly; does the p50 form hold within the noise?"""

    measured_s: float  # T, request to last token
    exact_s: float  # TTFT + (N − 1)·mean gap: equals measured_s up to float rounding, by definition
    p50_form_s: float  # TTFT + (N − 1)·median gap
    sampling_s: float  # 2 standard errors of the median gap, times N − 1
    run_spread_s: float | None = None  # max − min of T over identical whole runs (None from one run)

    @property
    def tolerance_s(self) -> float:
        """The larger of the two: what the median's sampling error explains, and how much T itself varied."""
        return max(self.sampling_s, self.run_spread_s or 0.0)

    @property
    def error_s(self) -> float:
        return self.p50_form_s - self.measured_s

    @property
    def within(self) -> bool:
        return abs(self.error_s) <= self.tolerance_s


def formula_check(s: LatencySummary, gaps_s: Sequence[float], run_totals_s: Sequence[float] = ()
                  ) -> FormulaCheck | None:
    """Compare TTFT + (N − 1)·TPOT_p50 with the measured T, against a tolerance from the measured spread.

    Two spreads, the larger one counts:
    - the median gap estimates the mean gap with standard error ≈ 1.2533·σ/√m for m gaps (the sampling
      error of a median); σ is taken robustly as IQR / 1.349, so one spike does not widen it;
    - the same request's T over repeated whole runs (`run_totals_s`) varies by max − min: an estimate that
      misses T by less predicts it as well as one run predicts the next.
    Outside both, the steps are skewed by more than the machine's own repeatability (spikes): only the
    mean form holds.
    """
    m = len(gaps_s)
    if m < 2 or s.tpot_s is None or s.tpot_p50_s is None:
        return None
    q25, q75 = np.percentile(np.asarray(gaps_s, dtype=float), [25, 75])
    sigma = float(q75 - q25) / 1.349
    sampling = 2 * 1.2533 * sigma / np.sqrt(m) * m
    spread = float(max(run_totals_s) - min(run_totals_s)) if len(run_totals_s) >= 2 else None
    return FormulaCheck(s.e2e_s, s.ttft_s + m * s.tpot_s, s.ttft_s + m * s.tpot_p50_s, float(sampling), spread)


@dataclass(frozen=True)
class Spread:
    """Median and range of one quantity over repeated whole runs."""

    median: float
    low: float
    high: float
    n: int

    @property
    def relative(self) -> float:
        """(high − low) / median: 0 for identical runs."""
        return (self.high - self.low) / self.median if self.median else float("inf")


def spread(values: Sequence[float | None]) -> Spread | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return Spread(float(np.median(vals)), float(min(vals)), float(max(vals)), len(vals))
