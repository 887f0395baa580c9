"""Sweeps on the real engine: one row per setting with the expected columns; Cancel keeps the rows done."""
import json
import threading

import pytest

from kvviz.cli import main
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
    assert all(set(r) - {"runs"} == set(sweeps.COLUMNS[kind]) for r in rows)


def test_prompt_length_sweep(backend):
    rows = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [32, 8, 16], n_new=3)).run()
    _check(rows, "prompt-length", 3)
    assert [r["prompt_tokens"] for r in rows] == [8, 16, 32]
    assert all(r["ttft_s"] > 0 and r["tpot_s"] > 0 and r["e2e_s"] > r["ttft_s"] for r in rows)
    s = sweeps.summary("prompt-length", rows)
    assert {"ttft_loglog_slope", "ttft_loglog_slope_se", "ttft_s_per_prompt_token", "ttft_s_per_prompt_token_se",
            "ttft_fixed_s", "ttft_verdict", "tpot_verdict"} <= set(s)
    assert s["n_runs"] == 3 * sweeps.DEFAULT_REPEATS["prompt-length"]


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
    x, y = sweeps.runs_xy(rows, "prompt_tokens", "ttft_s")
    assert x == [8] * 3 + [16] * 3 + [32] * 3 and y == [run["ttft_s"] for r in rows for run in r["runs"]]
    s = sweeps.summary("prompt-length", rows)
    fit = sweeps.linear_fit(x, y)
    assert s["n_runs"] == 9 and s["ttft_s_per_prompt_token"] == fit.slope
    assert s["ttft_s_per_prompt_token_se"] == fit.slope_se


def test_cache_sweep_rows_and_inputs(backend):
    rows = sweeps.SweepRun(sweeps.cache_sweep(backend, [4, 16, 64], repeats=2)).run()
    _check(rows, "cache", 6)
    assert [(r["mode"], r["context_tokens"], r["input_tokens"]) for r in rows] == [
        ("cache", 4, 1), ("no_cache", 4, 4), ("cache", 16, 1), ("no_cache", 16, 16), ("cache", 64, 1),
        ("no_cache", 64, 64)]
    s = sweeps.summary("cache", rows)
    assert s["cache"]["total_s"] > 0 and s["no_cache"]["loglog_slope"] is not None


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


def test_cancel_stops_and_keeps_rows(backend):
    run = sweeps.SweepRun(sweeps.prompt_length_sweep(backend, [4, 8, 16, 32], n_new=2))
    assert len(run.advance()) == 1 and run.progress == 0.25
    run.cancel()
    assert run.cancelled and run.finished and len(run.rows) == 1
    assert run.advance() == [] and len(run.rows) == 1
    with pytest.raises(StopIteration):
        next(run.sweep.rows)  # the generator is closed: nothing more runs


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
    executing'. Now: no error, the setting under way finishes, the rows done are kept, nothing runs after."""
    gated = _Gate(backend)
    run = sweeps.SweepRun(sweeps.prompt_length_sweep(gated, [4, 8, 16, 32], n_new=2, repeats=1))
    run.advance()
    gated.hold.set()
    worker = threading.Thread(target=run.advance)
    worker.start()
    assert gated.inside.wait(10)
    assert run.advance() == []  # a second rerun does not re-enter the generator
    run.cancel()  # the Cancel callback
    assert run.cancelled
    gated.hold.clear()
    worker.join(10)
    assert run.finished and run.error is None and len(run.rows) == 2  # the setting under way was kept
    assert run.advance() == [] and len(run.rows) == 2
    with pytest.raises(StopIteration):
        next(run.sweep.rows)


def test_settings_that_do_not_fit_are_refused(backend):
    with pytest.raises(InputError, match="96"):
        sweeps.prompt_length_sweep(backend, [90], n_new=8)
    with pytest.raises(InputError):
        sweeps.cache_sweep(backend, [1, 8])
    assert sweeps.parse_sizes("64, 8,16,8", max_value=64) == [8, 16, 64]
    for bad in ("", "a, 2", "0, 4", "65"):
        with pytest.raises(InputError, match="whole numbers"):
            sweeps.parse_sizes(bad, max_value=64)


def test_defaults_fit_the_context():
    assert max(sweeps.default_prompt_lengths(1024, 8)) == 1016
    assert max(sweeps.default_contexts(256, 3)) == 253 and min(sweeps.default_contexts(256, 3)) == 8


def test_sweep_cli_json(capsys):
    flags = ["--model", "random", "--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2",
             "--vocab-size", "300", "--max-seq-len", "128"]
    args = ["sweep", "batch", "--batches", "1,3", "--prompt-tokens", "8", "--new-tokens", "2", "--json"]
    assert main([*args, *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sweep"] == "batch" and [r["batch"] for r in out["rows"]] == [1, 3]
    assert out["columns"] == list(sweeps.COLUMNS["batch"])
    assert main(["sweep", "cache", "--contexts", "4,200", *flags]) == 2
    assert "context of 128" in capsys.readouterr().err
    assert main(["sweep", "batch", "--batches", "1,x", *flags]) == 2
