"""Latency metrics on synthetic timestamps (binary-exact values, so equality is exact)."""
import math

import pytest

from kvviz.engine import metrics
from kvviz.engine.generation import StepEvent

TIMES = [0.5, 0.625, 0.875, 1.0, 1.25]  # request at 0; 5 tokens


def test_ttft_e2e_tpot_itl_from_timestamps():
    ttft, e2e = metrics.ttft(0.0, TIMES), metrics.e2e(0.0, TIMES)
    assert ttft == 0.5 and e2e == 1.25
    assert metrics.tpot(ttft, e2e, len(TIMES)) == (1.25 - 0.5) / 4 == 0.1875
    assert metrics.inter_token_latencies(TIMES) == [0.125, 0.25, 0.125, 0.25]
    assert metrics.tpot(0.5, 0.5, 1) is None  # one token: no gap to average


def test_percentiles_interpolate_linearly():
    itl = metrics.inter_token_latencies(TIMES)
    assert metrics.percentile(itl, 50) == 0.1875  # between 0.125 and 0.25
    assert metrics.percentile(itl, 90) == 0.25
    assert metrics.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == 4.6
    assert metrics.percentile([], 50) is None


def _event(phase: str, seconds: float, queue_s: float = 0.0) -> StepEvent:
    return StepEvent(phase=phase, index=0, position=0, n_input_tokens=1, token_id=0, token_ids=[0], token_text="",
                     top_k=[], seconds=seconds, cache_lengths=[0], live_bytes=0, allocated_bytes=0,
                     formula_bytes=0, attn_scores=0, queue_s=queue_s)


def test_summary_from_engine_events():
    events = [_event("prefill", 0.375, queue_s=0.125)] + [_event("decode", s) for s in (0.125, 0.25, 0.125, 0.25)]
    assert metrics.token_times(events) == (0.0, TIMES)
    s = metrics.summarize(events)
    assert (s.queue_s, s.prefill_s, s.ttft_s, s.e2e_s) == (0.125, 0.375, 0.5, 1.25)
    assert s.tpot_s == 0.1875 and s.tpot_p50_s == 0.1875 and s.tpot_p90_s == 0.25
    assert s.tokens_per_s == 5 / 1.25 and s.decode_tokens_per_s == 1 / 0.1875
    # T ≈ TTFT + (N − 1)·TPOT: exact with the mean, and here with the median too
    assert s.ttft_s + (s.n_tokens - 1) * s.tpot_s == s.e2e_s == s.predicted_e2e_s
    assert metrics.summarize([]) is None


def test_single_token_has_no_tpot():
    s = metrics.summarize([_event("prefill", 0.5)])
    assert s.tpot_s is None and s.predicted_e2e_s is None and s.ttft_s == s.e2e_s == 0.5


def test_fits_recover_known_powers():
    x = [8, 16, 64, 256, 1024]
    k, c = metrics.loglog_slope(x, [3e-6 * v**2 for v in x])
    assert k == pytest.approx(2.0, abs=1e-9) and c == pytest.approx(math.log(3e-6), abs=1e-9)
    assert metrics.loglog_slope(x, [0.004] * 5)[0] == pytest.approx(0.0, abs=1e-12)
    a, b = metrics.linear_fit(x, [2e-4 * v + 0.01 for v in x])
    assert a == pytest.approx(2e-4) and b == pytest.approx(0.01)
    assert metrics.loglog_slope([4, 4], [1.0, 2.0]) is None

