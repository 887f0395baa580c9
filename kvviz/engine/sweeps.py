"""Latency sweeps over the real engine: prompt length, cache vs no cache, batch size, dtype.

Each sweep is a generator of rows (one per setting), so a page can draw progress between settings and
a Cancel can stop it there, keeping the rows already measured. Times are the engine's
device-synchronized pass seconds, measured in quiet (`timing.quiet`: nothing is drawn while a row is
measured); each sweep warms the model up first so the first setting does not pay one-off costs
(allocator growth, kernel selection). A setting is measured as several whole runs: its row gives
each quantity's median and range over them and keeps the runs themselves, and the fits use every run.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvviz.engine.backends.base import Backend
from kvviz.engine.generation import Generation
from kvviz.engine.metrics import linear_fit, loglog_fit, spread, summarize, trend_verdict
from kvviz.engine.timing import quiet, warm_up
from kvviz.errors import InputError

KINDS = ("prompt-length", "cache", "batch", "dtype")

# Prompts are this text repeated to the wanted length: real words for a trained model, any length.
FILLER = (
    "Once computed, the keys and values of earlier tokens never change under a causal mask, "
    "so the decoder stores them and each new token only computes its own. "
)

# Defaults that make a point stable on a shared laptop: the median of this many whole runs.
DEFAULT_REPEATS = {"prompt-length": 5, "cache": 5, "batch": 3, "dtype": 3}

COLUMNS: dict[str, tuple[str, ...]] = {
    "prompt-length": ("prompt_tokens", "new_tokens", "repeats", "ttft_s", "ttft_min_s", "ttft_max_s", "prefill_s",
                      "prefill_min_s", "prefill_max_s", "tpot_s", "tpot_min_s", "tpot_max_s", "e2e_s", "e2e_min_s",
                      "e2e_max_s"),
    "cache": ("mode", "context_tokens", "input_tokens", "repeats", "seconds", "seconds_min", "seconds_max"),
    "batch": ("batch", "repeats", "ttft_s", "ttft_min_s", "ttft_max_s", "tpot_s", "tpot_min_s", "tpot_max_s",
              "tokens_per_s", "kv_bytes", "kv_formula_bytes", "device_memory_bytes"),
    "dtype": ("dtype", "supported", "ttft_s", "tpot_s", "tokens_per_s", "weight_bytes", "kv_bytes", "error"),
}


def prompt_ids(backend: Backend, n_tokens: int) -> list[int]:
    base = backend.tokenizer.encode(FILLER)
    return (base * (n_tokens // len(base) + 1))[:n_tokens]


@dataclass
class Sweep:
    kind: str
    total: int  # settings, so progress = rows done / total
    rows: Iterator[dict]


@dataclass
class SweepRun:
    """A sweep in progress: advance it a little per UI tick; cancel keeps the rows done.

    Safe across threads: a Streamlit callback (Cancel) or a newer rerun can arrive while an older
    script thread is still inside advance(). cancel() only raises a flag, which advance() obeys
    between settings; an advance() that finds another one running returns at once instead of
    re-entering the generator ("generator already executing").
    """

    sweep: Sweep
    rows: list[dict] = field(default_factory=list)
    finished: bool = False
    cancelled: bool = False
    error: Exception | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def progress(self) -> float:
        return min(1.0, len(self.rows) / self.sweep.total) if self.sweep.total else 1.0

    @property
    def busy(self) -> bool:
        """Another thread is measuring right now."""
        return self._lock.locked()

    def advance(self, budget_s: float = 0.0) -> list[dict]:
        """Measure at least one more setting, then more until budget_s of wall time has passed."""
        new: list[dict] = []
        if not self._lock.acquire(blocking=False):
            return new  # another thread is inside the generator: leave it to finish its setting
        try:
            start = time.perf_counter()  # scheduling only: the rows carry the engine's own timings
            while not self.finished and (not new or time.perf_counter() - start < budget_s):
                if self._cancel.is_set():
                    self._stop()
                    break
                try:
                    with quiet():  # nothing else of this process competes while the setting is measured
                        row = next(self.sweep.rows)
                except StopIteration:
                    self.finished = True
                    break
                except InputError as exc:  # e.g. a setting that does not fit the context: stop, say why
                    self.error, self.finished = exc, True
                    break
                self.rows.append(row)
                new.append(row)
            if self._cancel.is_set() and not self.finished:
                self._stop()
        finally:
            self._lock.release()
        return new

    def cancel(self) -> None:
        """Stop after the setting being measured (if any); the rows done are kept."""
        self._cancel.set()
        self.cancelled = True
        if self._lock.acquire(blocking=False):  # nobody measuring: stop now
            try:
                self._stop()
            finally:
                self._lock.release()

    def _stop(self) -> None:
        if not self.finished:
            self.sweep.rows.close()
        self.cancelled = self.finished = True

    def run(self) -> list[dict]:
        while not self.finished:
            self.advance()
        if self.error:
            raise self.error
        return self.rows


def _measure(backend: Backend, n_prompt: int, n_new: int, *, batch: int = 1, use_cache: bool = True) -> Generation:
    gen = Generation(backend, max_new_tokens=n_new, use_cache=use_cache, batch_size=batch, stop_at_eos=False)
    gen.run(prompt_ids(backend, n_prompt))
    return gen


def _check_fits(backend: Backend, n_tokens: int) -> None:
    if n_tokens > backend.spec.max_context:
        raise InputError("latency.too_long", n_tokens=n_tokens, max_len=backend.spec.max_context)


def _median_row(runs: Sequence[dict], keys: Sequence[str]) -> dict:
    """Median, min and max of each key over whole runs (the runs themselves are kept beside)."""
    out: dict = {"repeats": len(runs)}
    for key in keys:
        s = spread([r[key] for r in runs])
        out[key] = s.median if s else None
        out[f"{key[:-2]}_min_s" if key.endswith("_s") else f"{key}_min"] = s.low if s else None
        out[f"{key[:-2]}_max_s" if key.endswith("_s") else f"{key}_max"] = s.high if s else None
    return out


def prompt_length_sweep(backend: Backend, prompt_lengths: Sequence[int], *, n_new: int = 8,
                        repeats: int = DEFAULT_REPEATS["prompt-length"]) -> Sweep:
    """TTFT and TPOT for each prompt length: the median (and range) of `repeats` whole runs."""
    lengths = sorted(set(prompt_lengths))
    _check_fits(backend, max(lengths) + n_new)

    def rows() -> Iterator[dict]:
        warm_up(backend)
        for n in lengths:
            runs = []
            for _ in range(repeats):
                s = summarize(_measure(backend, n, n_new).events)
                runs.append({"ttft_s": s.ttft_s, "prefill_s": s.prefill_s, "tpot_s": s.tpot_s, "e2e_s": s.e2e_s})
            yield {"prompt_tokens": n, "new_tokens": n_new,
                   **_median_row(runs, ("ttft_s", "prefill_s", "tpot_s", "e2e_s")), "runs": runs}

    return Sweep("prompt-length", len(lengths), rows())


def cache_sweep(backend: Backend, contexts: Sequence[int], *, repeats: int = DEFAULT_REPEATS["cache"]) -> Sweep:
    """Decode-step seconds at each context length, with the KV cache and recomputing the whole prefix.

    With the cache a step feeds 1 token and reads the cached prefix; without it the step runs all
    `context` tokens again. Each row is the median (and range) of `repeats` consecutive steps starting there.
    """
    points = sorted(set(contexts))
    if points[0] < 2:
        raise InputError("latency.context_min")
    _check_fits(backend, points[-1] + repeats)

    def rows() -> Iterator[dict]:
        warm_up(backend)
        cached = Generation(backend, max_new_tokens=points[-1] + repeats, stop_at_eos=False)
        cached.prefill(prompt_ids(backend, 1))
        for n in points:
            while cached.events[-1].position + 2 < n:  # the next step would see context n
                cached.step()
            steps = [{"seconds": cached.step().seconds} for _ in range(repeats)]
            yield {"mode": "cache", "context_tokens": n, "input_tokens": 1, **_median_row(steps, ("seconds",)),
                   "runs": steps}
            fresh = Generation(backend, max_new_tokens=repeats + 1, use_cache=False, stop_at_eos=False)
            fresh.prefill(prompt_ids(backend, n - 1))
            steps = [{"seconds": fresh.step().seconds} for _ in range(repeats)]
            yield {"mode": "no_cache", "context_tokens": n, "input_tokens": n, **_median_row(steps, ("seconds",)),
                   "runs": steps}

    return Sweep("cache", 2 * len(points), rows())


def batch_sweep(backend: Backend, batches: Sequence[int], *, n_prompt: int = 64, n_new: int = 16,
                repeats: int = DEFAULT_REPEATS["batch"]) -> Sweep:
    """TPOT, tokens/s and measured KV bytes per batch size (all rows share each pass); medians of `repeats` runs."""
    sizes = sorted(set(batches))
    _check_fits(backend, n_prompt + n_new)

    def rows() -> Iterator[dict]:
        warm_up(backend)
        for b in sizes:
            runs = []
            for _ in range(repeats):
                gen = _measure(backend, n_prompt, n_new, batch=b)
                s, last = summarize(gen.events), gen.events[-1]
                runs.append({"ttft_s": s.ttft_s, "tpot_s": s.tpot_s})
            med = _median_row(runs, ("ttft_s", "tpot_s"))
            yield {
                "batch": b,
                **med,
                "tokens_per_s": b / med["tpot_s"] if med["tpot_s"] else None,  # every row emits a token per pass
                "kv_bytes": last.live_bytes,
                "kv_formula_bytes": last.formula_bytes,
                "device_memory_bytes": last.device_memory_bytes,
                "runs": runs,
            }

    return Sweep("batch", len(sizes), rows())


def dtype_sweep(
    load: Callable[[str], Backend], dtypes: Sequence[str], *, n_prompt: int = 64, n_new: int = 16
) -> Sweep:
    """The same model in each dtype; a dtype the device cannot run gives a row with supported=False."""

    def rows() -> Iterator[dict]:
        for name in dtypes:
            row = {"dtype": name, "supported": True, "error": ""}
            try:
                backend = load(name)
                _check_fits(backend, n_prompt + n_new)
                warm_up(backend)
                gen = _measure(backend, n_prompt, n_new)
            except (RuntimeError, TypeError) as exc:  # e.g. a kernel missing for this dtype on this device
                yield {**row, "supported": False, "ttft_s": None, "tpot_s": None, "tokens_per_s": None,
                       "weight_bytes": None, "kv_bytes": None, "error": str(exc).splitlines()[0]}
                continue
            s = summarize(gen.events)
            yield {**row, "ttft_s": s.ttft_s, "tpot_s": s.tpot_s,
                   "tokens_per_s": 1 / s.tpot_s if s.tpot_s else None,
                   "weight_bytes": backend.spec.n_params * backend.dtype.itemsize,
                   "kv_bytes": gen.events[-1].live_bytes}

    return Sweep("dtype", len(dtypes), rows())


# ---- what a finished (or cancelled) sweep says ---------------------------------------------------------
def summary(kind: str, rows: Sequence[dict]) -> dict:
    """Fitted slopes (each with its standard error and what it supports) and totals, over every run kept."""
    if kind == "prompt-length":
        x, ttft = runs_xy(rows, "prompt_tokens", "ttft_s")
        xt, tpot = runs_xy(rows, "prompt_tokens", "tpot_s")
        lin, tpot_lin = linear_fit(x, ttft), linear_fit(xt, tpot)
        return {
            **_loglog("ttft", x, ttft), **_loglog("tpot", xt, tpot),
            "ttft_s_per_prompt_token": lin.slope if lin else None,
            "ttft_s_per_prompt_token_se": lin.slope_se if lin else None,
            "ttft_fixed_s": lin.intercept if lin else None,
            "ttft_verdict": _verdict(lin, x, ttft),
            "tpot_verdict": _verdict(tpot_lin, xt, tpot),
            "n_runs": len(x),
        }
    if kind == "cache":
        out = {}
        for mode in ("cache", "no_cache"):
            mine = [r for r in rows if r["mode"] == mode]
            x, y = runs_xy(mine, "context_tokens", "seconds")
            fit = loglog_fit(x, y)
            out[mode] = {"loglog_slope": fit.slope if fit else None, "loglog_slope_se": fit.slope_se if fit else None,
                         "total_s": total_seconds([r["context_tokens"] for r in mine], [r["seconds"] for r in mine])}
        return out
    if kind == "batch":
        x, y = runs_xy(rows, "batch", "tpot_s")
        return _loglog("tpot", x, y)
    return {}


def runs_xy(rows: Sequence[dict], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    """(x, y) with one point per whole run kept in each row (a row without runs counts as one run)."""
    xs, ys = [], []
    for r in rows:
        for run in r.get("runs") or [r]:
            if run.get(y_key) is not None:
                xs.append(r[x_key])
                ys.append(run[y_key])
    return xs, ys


def run_records(rows: Sequence[dict]) -> list[dict]:
    """One record per whole run (the CSV): the setting's own columns, the run's number, and the run's values."""
    out = []
    for r in rows:
        runs = r.get("runs") or [{}]
        spread_cols = ("_min_s", "_max_s", "_min", "_max")
        setting = {k: v for k, v in r.items() if k != "runs" and k not in runs[0] and not k.endswith(spread_cols)}
        for i, run in enumerate(runs, 1):
            out.append({**setting, "run": i, **run})
    return out


def _loglog(name: str, x: Sequence[float], y: Sequence[float]) -> dict:
    fit = loglog_fit(x, y) if x else None
    return {f"{name}_loglog_slope": fit.slope if fit else None,
            f"{name}_loglog_slope_se": fit.slope_se if fit else None}


def _verdict(fit, x: Sequence[float], y: Sequence[float]) -> str:  # noqa: ANN001 - a LineFit or None
    if not x:
        return "too_noisy"
    return trend_verdict(fit, max(x) - min(x), float(np.median(y)))


def total_seconds(contexts: Sequence[int], seconds: Sequence[float]) -> float | None:
    """Decode time summed over every context from the first to the last measured one (linear interpolation)."""
    if len(contexts) < 2:
        return None
    every = np.arange(contexts[0], contexts[-1] + 1)
    return float(np.interp(every, contexts, seconds).sum())


def default_prompt_lengths(max_seq_len: int, n_new: int, points: int = 6) -> list[int]:
    """Geometric steps from 16 tokens to the longest prompt that leaves room for n_new tokens."""
    top = max_seq_len - n_new
    return sorted({int(round(v)) for v in np.geomspace(min(16, top), top, points)})


def default_contexts(max_seq_len: int, repeats: int, points: int = 8) -> list[int]:
    top = max_seq_len - repeats
    return sorted({int(round(v)) for v in np.geomspace(min(8, top), top, points)})


def parse_sizes(text: str, *, max_value: int) -> list[int]:
    """'16, 64, 256' → [16, 64, 256]; anything else is an InputError that says what to type."""
    try:
        values = [int(part) for part in text.replace(";", ",").split(",") if part.strip()]
    except ValueError:
        raise InputError("latency.bad_list", text=text, max_value=max_value) from None
    if not values or min(values) < 1 or max(values) > max_value:
        raise InputError("latency.bad_list", text=text, max_value=max_value)
    return sorted(set(values))
