"""Sweeps on the real engine: one row per setting with the expected columns, repeats interleaved in rounds;
Cancel stops within one run and keeps the rows complete."""
import json
import threading

import pytest

from kvviz.cli import main
from kvviz.engine import sweep_stats as stats
from kvviz.engine import sweeps
from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import load_backend
from kvviz.errors import InputError

SHAPE = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=300, max_seq_len=96)


@pytest.fixture(scope="module")
def backend():
    return load_backend("random", shape=SHAPE)


def _check(rows, kind, n):
    assert len(rows) == n
    assert all(set(r) - {"runs"} == set(stats.COLUMNS[kind]) for r in rows)


def test_prompt_length_sweep(backend):
    rows = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [32, 8, 16], n_new=3)).run()
    _check(rows, "prompt-length", 3)
    assert [r["prompt_tokens"] for r in rows] == [8, 16, 32]
    assert all(r["ttft_s"] > 0 and r["tpot_s"] > 0 and r["e2e_s"] > r["ttft_s"] for r in rows)
    s = stats.summary("prompt-length", rows)
    assert {"ttft_fixed_s", "ttft_s_per_token", "ttft_s_per_token_se", "ttft_s_per_token_pair", "ttft_line_fixed_s",
            "tpot_fixed_s", "tpot_s_per_token", "ttft_verdict", "tpot_verdict"} <= set(s)
    assert s["n_runs"] == 3 * stats.DEFAULT_REPEATS["prompt-length"]


def test_rows_are_medians_of_whole_runs_and_fits_use_every_run(backend):
    rows = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [8, 16, 32], n_new=3, repeats=3)).run()
    for r in rows:
        runs = r["runs"]
        assert len(runs) == r["repeats"] == 3
        # each run is whole: its own TTFT, TPOT and E2E, consistent with each other
        assert all(run["e2e_s"] == pytest.approx(run["ttft_s"] + 2 * run["tpot_s"]) for run in runs)
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            values = sorted(run[key] for run in runs)
            assert (r[key], r[key[:-2] + "_min_s"], r[key[:-2] + "_max_s"]) == (values[1], values[0], values[2])
    x, y = stats.runs_xy(rows, "prompt_tokens", "ttft_s")
    assert x == [8] * 3 + [16] * 3 + [32] * 3 and y == [run["ttft_s"] for r in rows for run in r["runs"]]
    s = stats.summary("prompt-length", rows)
    fit = stats.poly_fit(x, y, 2, relative=True)  # TTFT: fixed + per token + per pair, fitted to every run
    assert s["n_runs"] == 9 and (s["ttft_fixed_s"], s["ttft_s_per_token"], s["ttft_s_per_token_pair"]) == fit.coef
    assert s["ttft_s_per_token_se"] == fit.se(1) and s["ttft_line_fixed_s"] == stats.linear_fit(x, y).intercept


def test_cache_sweep_rows_and_inputs(backend):
    rows = sweeps.SweepRun(sweeps.cache_sweep(backend, [4, 16, 64], repeats=2)).run()
    _check(rows, "cache", 6)
    assert [(r["mode"], r["context_tokens"], r["input_tokens"]) for r in rows] == [
        ("cache", 4, 1), ("no_cache", 4, 4), ("cache", 16, 1), ("no_cache", 16, 16), ("cache", 64, 1),
        ("no_cache", 64, 64)]
    assert all(r["repeats"] == 2 == len(r["runs"]) for r in rows)
    s = stats.summary("cache", rows)
    assert s["cache"]["total_s"] > 0 and s["no_cache"]["step_s_per_token_pair"] is not None
    assert s["contexts"] == [4, 64] and s["verdict"] in stats.CACHE_VERDICTS


def test_batch_sweep_measures_cache_bytes(backend):
    rows = sweeps.SweepRun(sweeps.batch_sweep(backend, [1, 4, 2], n_prompt=10, n_new=3)).run()
    _check(rows, "batch", 3)
    per_request = 2 * 2 * (10 + 2) * 2 * 16 * 4  # K,V · layers · cached positions · KV heads · d_head · fp32
    assert [r["kv_bytes"] for r in rows] == [per_request, 2 * per_request, 4 * per_request]
    assert all(r["kv_bytes"] == r["kv_formula_bytes"] for r in rows)
    assert all(r["tokens_per_s"] == pytest.approx(r["batch"] / r["tpot_s"]) for r in rows)


def test_dtype_sweep_bytes_follow_element_size():
    def load(dtype):
        if dtype == "float16":
            raise RuntimeError("no float16 kernel on this device\nmore")
        return load_backend("random", shape=SHAPE, dtype=dtype)

    rows = sweeps.SweepRun(sweeps.dtype_sweep(load, ["float32", "bfloat16", "float16"], n_prompt=8, n_new=3)).run()
    _check(rows, "dtype", 3)
    n_params = load("float32").spec.n_params
    assert [r["weight_bytes"] for r in rows[:2]] == [4 * n_params, 2 * n_params]
    assert rows[0]["kv_bytes"] == 2 * rows[1]["kv_bytes"]
    assert rows[2]["supported"] is False and rows[2]["error"] == "no float16 kernel on this device"


def test_cancel_stops_and_keeps_the_rounds_done(backend):
    run = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [4, 8, 16, 32], n_new=2, repeats=2))
    assert run.sweep.total == 3 * 4 and run.sweep.settings == 4  # a warm-up round, then 2 rounds
    assert run.advance() == 1 and run.progress == 1 / 12 and run.rows == []
    while run.done < 8:  # the warm-up round and the first measured round
        run.advance()
    assert [r["prompt_tokens"] for r in run.rows] == [4, 8, 16, 32] and all(r["repeats"] == 1 for r in run.rows)
    run.advance()  # one run of the next round: the rows stay those of the complete rounds
    run.cancel()
    assert run.cancelled and run.finished and run.done == 9 and all(r["repeats"] == 1 for r in run.rows)
    assert run.advance() == 0 and run.done == 9
    with pytest.raises(StopIteration):
        next(run.sweep.runs)  # the generator is closed: nothing more runs


class _Gate:
    """A backend wrapper whose forward blocks while `hold` is set: a sweep caught mid-setting in another thread."""

    def __init__(self, backend):
        self._backend, self.hold, self.inside = backend, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def forward(self, *args, **kwargs):
        if self.hold.is_set():
            self.inside.set()
            while self.hold.is_set():
                threading.Event().wait(0.005)
        return self._backend.forward(*args, **kwargs)


def test_cancel_and_rerun_while_another_thread_measures(backend):
    """Issue 19.1: Cancel (or any rerun) while a script thread is inside the sweep raised 'generator already
    executing'. Now: no error, the run under way finishes, the rows complete are kept, nothing runs after."""
    gated = _Gate(backend)
    run = sweeps.SweepRun(sweeps.prompt_length_sweep(gated, [4, 8], n_new=2, repeats=2))
    while run.done < 4:  # the warm-up round and one measured round: a row per length
        run.advance()
    gated.hold.set()
    worker = threading.Thread(target=run.advance, args=(60.0,))  # a tick that would measure for a minute
    worker.start()
    assert gated.inside.wait(10)
    assert run.advance() == 0  # a second rerun does not re-enter the generator
    run.cancel()  # the Cancel callback
    assert run.cancelled and not run.finished  # the other thread still measures its run
    gated.hold.clear()
    worker.join(10)
    assert run.finished and run.error is None and run.done == 5  # the run under way finished, no other after it
    assert [r["repeats"] for r in run.rows] == [1, 1]  # the rows of the complete round
    assert run.advance() == 0
    with pytest.raises(StopIteration):
        next(run.sweep.runs)


def test_cancel_stops_within_one_run_of_a_long_setting(backend):
    """Issue 29.1: after Cancel, measuring went on to the end of the setting (14 → 15 of 16 rows, then more): the
    flag was read between settings only. Now a cancelled sweep stops after the run under way: forward passes
    after the Cancel are at most one run's (a prefill and n_new − 1 steps)."""
    gated = _Gate(backend)
    passes = []
    forward = gated.forward
    gated.forward = lambda *a, **k: (passes.append(1), forward(*a, **k))[1]
    run = sweeps.SweepRun(sweeps.prompt_length_sweep(gated, [40], n_new=6, repeats=9))
    run.advance()  # the warm-up and the first run
    gated.hold.set()
    worker = threading.Thread(target=run.advance, args=(600.0,))
    worker.start()
    assert gated.inside.wait(10)
    run.cancel()
    before = len(passes)
    gated.hold.clear()
    worker.join(30)
    assert run.finished and run.cancelled and not worker.is_alive()
    assert len(passes) - before <= 6  # at most the rest of the run under way
    assert run.done == 2  # the first run and the one under way: not the setting's 10


def test_repeats_are_interleaved_in_rounds_and_the_first_round_dropped(backend, monkeypatch):
    """Issue 29.2: one setting's repeats measured back to back let a load change tilt the curve (the cached step's
    slope −0.23 in one run, +0.15 in the next). Every round visits every setting, in alternating order."""
    seen, one_step = [], sweeps._one_step

    def recorded(backend, context, use_cache):
        seen.append(("cache" if use_cache else "no_cache", context))
        return one_step(backend, context, use_cache)

    monkeypatch.setattr(sweeps, "_one_step", recorded)
    run = sweeps.SweepRun(sweeps.cache_sweep(backend, [8, 32], repeats=2))
    rows = run.run()
    forward = [("cache", 8), ("no_cache", 8), ("cache", 32), ("no_cache", 32)]
    assert seen == forward + forward[::-1] + forward  # a warm-up round, then two measured rounds
    assert run.done == run.sweep.total == len(seen)
    assert [(r["mode"], r["context_tokens"]) for r in rows] == forward
    assert all(r["repeats"] == 2 and len(r["runs"]) == 2 for r in rows)  # the warm-up round is not in the rows


def test_settings_that_do_not_fit_are_refused(backend):
    with pytest.raises(InputError, match="96"):
        sweeps.prompt_length_sweep(backend, [90], n_new=8)
    with pytest.raises(InputError):
        sweeps.cache_sweep(backend, [1, 8])
    assert stats.parse_sizes("64, 8,16,8", max_value=64) == [8, 16, 64]
    for bad in ("", "a, 2", "0, 4", "65"):
        with pytest.raises(InputError, match="whole numbers"):
            stats.parse_sizes(bad, max_value=64)


def test_defaults_fit_the_context():
    assert max(stats.default_prompt_lengths(1024, 8)) == 1016
    assert max(stats.default_contexts(256)) == 255 and min(stats.default_contexts(256)) == 8
    # a hosted demo's KV budget can leave room for almost nothing: still valid settings, never an error
    assert stats.default_contexts(1) == [2] and stats.default_prompt_lengths(3, 8) == [1]


def test_sweep_cli_json(capsys):
    flags = ["--model", "random", "--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2",
             "--vocab-size", "300", "--max-seq-len", "128"]
    args = ["sweep", "batch", "--batches", "1,3", "--prompt-tokens", "8", "--new-tokens", "2", "--json"]
    assert main([*args, *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sweep"] == "batch" and [r["batch"] for r in out["rows"]] == [1, 3]
    assert out["columns"] == list(stats.COLUMNS["batch"])
    assert main(["sweep", "cache", "--contexts", "4,200", *flags]) == 2
    assert "context of 128" in capsys.readouterr().err
    assert main(["sweep", "batch", "--batches", "1,x", *flags]) == 2


# ---- what the cache sweep says about its lesson (issue 29.2), on synthetic steps with a known truth ------------
CONTEXTS = [8, 18, 39, 86, 190, 420, 927, 2047]  # default_contexts(2048)


def _cache_rows(cached, uncached, rel_noise=0.03, repeats=5, seed=0):
    """Rows as cache_sweep makes them, each step's seconds from a cost function with relative noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for n in CONTEXTS:
        for mode, cost in (("cache", cached), ("no_cache", uncached)):
            runs = [{"seconds": cost(n) * (1 + rel_noise * rng.standard_normal())} for _ in range(repeats)]
            rows.append({"mode": mode, "context_tokens": n, "runs": runs,
                         "seconds": sorted(r["seconds"] for r in runs)[repeats // 2]})
    return rows


def _recompute(n):  # the tiny model's measured recompute step: 8.4 ms + 172 µs per token + 0.25 µs per pair
    return 8.4e-3 + 1.72e-4 * n + 2.5e-7 * n * n


def test_cache_verdicts_follow_the_intervals():
    flat_then_linear = _cache_rows(lambda n: 7e-3 + 3.6e-6 * n, _recompute)
    s = stats.summary("cache", flat_then_linear)
    assert s["verdict"] == "consistent" and s["no_cache"]["verdict"] == "rising"
    assert s["cache"]["verdict"] in ("flat", "rising")
    # A cached step too noisy to tell from flat still says the lesson when recomputing rises far more.
    noisy_cache = _cache_rows(lambda n: 20e-3, _recompute, rel_noise=0.3, seed=3)
    s = stats.summary("cache", noisy_cache)
    assert s["cache"]["verdict"] == "too_noisy" and s["verdict"] == "consistent"
    lo, hi = s["no_cache"]["rise_ci95_s"]
    assert lo < _recompute(2047) - _recompute(8) < hi  # the interval holds the truth
    # 40% scatter per step hides a difference of 0.2 ms between the two rises: the page says it cannot tell.
    small = _cache_rows(lambda n: 7e-3 + 1e-7 * n, lambda n: 7e-3 + 2e-7 * n, rel_noise=0.4, seed=1)
    assert stats.summary("cache", small)["verdict"] == "too_noisy"
    # A cached step that falls with context is the machine's load changing: never called consistent.
    falling = _cache_rows(lambda n: 12e-3 - 4e-6 * n, _recompute, rel_noise=0.01)
    s = stats.summary("cache", falling)
    assert s["cache"]["verdict"] == "falling" and s["verdict"] == "too_noisy"
    # The cached step rising faster than recomputing contradicts the lesson, and the page says so.
    backwards = _cache_rows(_recompute, lambda n: 7e-3 + 3.6e-6 * n)
    assert stats.summary("cache", backwards)["verdict"] == "contradicts"


def test_cache_fits_are_the_cost_models():
    rows = _cache_rows(lambda n: 7e-3 + 3.6e-6 * n, _recompute, rel_noise=0.0)
    fits = stats.model_fits("cache", rows)
    assert len(fits["cache"].coef) == 2 and len(fits["no_cache"].coef) == 3  # linear; quadratic
    assert fits["cache"].coef == pytest.approx((7e-3, 3.6e-6)) and fits["no_cache"].coef == pytest.approx(
        (8.4e-3, 1.72e-4, 2.5e-7))


def test_a_runs_state_as_the_page_names_it(backend):
    """running → done; a cancel before one whole round keeps nothing (cancelled_none), after one keeps its rows."""
    run = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [4, 8], n_new=2, repeats=1))
    assert run.state == "running"
    run.run()
    assert run.state == "done" and run.progress == 1.0
    early = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [4, 8], n_new=2, repeats=2))
    early.advance()  # one warm-up run: no whole round yet
    early.cancel()
    assert early.state == "cancelled_none" and early.rows == []
    late = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [4, 8], n_new=2, repeats=2))
    while late.done < 4:  # the warm-up round and one measured round
        late.advance()
    late.cancel()
    assert late.state == "cancelled" and len(late.rows) == 2
    done = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [4], n_new=2, repeats=1))
    done.run()
    done.cancel()  # a Cancel that arrives after the last run: still done
    assert done.state == "done"


def test_the_csv_holds_every_whole_run(backend):
    import csv
    import io

    rows = sweeps.SweepRun(sweeps.cache_sweep(backend, [4, 16], repeats=2)).run()
    records = list(csv.DictReader(io.StringIO(stats.records_csv(rows))))
    assert len(records) == 2 * 2 * 2  # contexts × modes × runs
    assert list(records[0]) == ["mode", "context_tokens", "input_tokens", "repeats", "run", "seconds"]
    runs = [run for r in rows for run in r["runs"]]
    assert [float(r["seconds"]) for r in records] == [run["seconds"] for run in runs]  # repr round-trips exactly
    assert [r["run"] for r in records] == ["1", "2"] * 4 and {r["mode"] for r in records} == {"cache", "no_cache"}
