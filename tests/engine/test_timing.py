"""Measuring in quiet: the timed region's settings, whole repeated runs, the noise indicator's levels."""
import gc

import pytest
import torch

from kvviz.engine import timing
from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import load_backend

SHAPE = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=300, max_seq_len=64)


@pytest.fixture(scope="module")
def backend():
    return load_backend("random", shape=SHAPE)


def test_quiet_fixes_threads_pauses_gc_and_restores_both():
    before = torch.get_num_threads()
    assert gc.isenabled() and not timing.in_quiet()
    with timing.quiet(threads=1):
        assert torch.get_num_threads() == 1 and not gc.isenabled() and timing.in_quiet()
        with timing.quiet(threads=1):  # nested: still quiet after the inner one closes
            pass
        assert timing.in_quiet() and not gc.isenabled()
    assert torch.get_num_threads() == before and gc.isenabled() and not timing.in_quiet()
    with pytest.raises(RuntimeError), timing.quiet(threads=1):
        raise RuntimeError("a failing pass")
    assert torch.get_num_threads() == before and gc.isenabled() and not timing.in_quiet()


def test_measure_threads_leaves_a_core_to_the_browser():
    assert [timing.measure_threads(c) for c in (1, 2, 4, 16)] == [1, 1, 3, 15]


def test_repeated_request_measures_whole_runs_in_chunks(backend, monkeypatch):
    seen = []
    quiet = timing.quiet

    def watched(*args, **kwargs):
        seen.append("enter")
        return quiet(*args, **kwargs)

    monkeypatch.setattr(timing, "quiet", watched)
    request = timing.RepeatedRequest(backend, list(range(10)), 5, repeats=3)
    assert request.passes_total == 15
    request.advance(budget_s=0.0)  # one pass (the warm-up is untimed and first)
    assert request.warmed and request.passes_done == 1 and not request.done
    while not request.done:
        request.advance(budget_s=0.0)
    assert len(seen) == 15  # every pass ran inside quiet()
    assert [len(g.events) for g in request.finished_runs] == [5, 5, 5]
    assert all(g.prompt_ids == list(range(10)) and g.events[0].phase == "prefill" for g in request.runs)
    # the same prompt, greedy: every run emits the same tokens
    assert len({tuple(g.generated[0]) for g in request.runs}) == 1


def test_noise_levels():
    def level(p50, p90, load, cores=2):
        return timing.Noise(30, p50, p90, load, cores).level

    assert level(1.0, 1.1, 0.5) == "quiet"
    assert level(1.0, 1.3, 0.5) == "busy" and level(1.0, 1.1, 2.5) == "busy"
    assert level(1.0, 2.5, 0.5) == "noisy" and level(1.0, 1.1, 4.0) == "noisy"
    assert level(1.0, 1.1, None, None) == "quiet"  # no load average on this system: the passes decide


def test_noise_probe_times_identical_passes(backend):
    noise = timing.noise_probe(backend, n_passes=10)
    assert noise.n_passes == 10 and 0 < noise.p50_s <= noise.p90_s and noise.p90_over_p50 >= 1
    assert noise.level in ("quiet", "busy", "noisy")


def test_settle_stops_at_the_first_steady_window_and_keeps_going_while_passes_vary(backend, monkeypatch):
    windows = []
    real = timing._one_token_passes
    monkeypatch.setattr(timing, "_one_token_passes", lambda b, n: windows.append(n) or real(b, n))
    timing.settle(backend, budget_s=60, steady=float("inf"))  # any window is steady
    assert windows == [8]
    windows.clear()
    timing.settle(backend, budget_s=0.05, window=4, steady=0.5)  # max ≤ ½·min never holds: runs to the budget
    assert len(windows) >= 1 and set(windows) == {4}


def test_repeated_request_settles_before_its_first_timed_run(backend, monkeypatch):
    order = []
    monkeypatch.setattr(timing, "settle", lambda b, *a, **k: order.append("settle") or 0.0)
    monkeypatch.setattr(timing, "warm_up", lambda b: order.append("warm"))
    real_prefill = timing.Generation.prefill
    monkeypatch.setattr(timing.Generation, "prefill",
                        lambda self, ids: order.append("prefill") or real_prefill(self, ids))
    req = timing.RepeatedRequest(backend, [1, 2, 3], 4, repeats=2)
    while not req.done:
        req.advance(60)
    assert order == ["warm", "settle", "prefill", "prefill"]
