"""Latency sweeps over the real engine: prompt length, cache vs no cache, batch size, dtype.

A sweep measures whole runs (a request, or one decode step) one at a time, so a page can draw progress between
them and a Cancel stops it within one run, keeping every row already complete. Times are the engine's
device-synchronized pass seconds, measured in quiet (`timing.quiet`: nothing is drawn while a run is measured);
each sweep warms the model up first so the first setting does not pay one-off costs (allocator growth, kernel
selection).

Repeats are interleaved: every setting is measured once per round, each round in the opposite order to the last,
and the first round (each setting's first pass at its size) is dropped. A load that changes during the sweep then
spreads over every setting as noise, which the fits' uncertainty shows, instead of tilting the curve (measured one
setting after another, a sweep that began while the browser was still drawing fell with context length). Each
row gives each quantity's median and range over its runs and keeps the runs themselves; the fits use every run.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from kvviz.engine.backends.base import Backend
from kvviz.engine.device_names import DTYPE_NAMES
from kvviz.engine.generation import Generation
from kvviz.engine.metrics import spread, summarize
from kvviz.engine.sweep_stats import COLUMNS, DEFAULT_REPEATS, default_contexts, default_prompt_lengths, summary
from kvviz.engine.timing import quiet, warm_up
from kvviz.errors import InputError

# Prompts are this text repeated to the wanted length: real words for a trained model, any length.
FILLER = (
    "Once computed, the keys and values of earlier tokens never change under a causal mask, "
    "so the decoder stores them and each new token only computes its own. "
)

def prompt_ids(backend: Backend, n_tokens: int) -> list[int]:
    base = backend.tokenizer.encode(FILLER)
    return (base * (n_tokens // len(base) + 1))[:n_tokens]


@dataclass
class Sweep:
    kind: str
    total: int  # whole runs to measure: progress = runs done / total
    settings: int  # rows it ends with
    runs: Iterator[list]  # measures one whole run per next(), and yields the rows complete so far (dicts, or
    # kvviz.compression's Quality rows)


@dataclass
class SweepRun:
    """A sweep in progress: advance it a little per UI tick; cancel keeps the rows complete so far.

    Safe across threads: a Streamlit callback (Cancel) or a newer rerun can arrive while an older
    script thread is still inside advance(). cancel() only raises a flag, which advance() obeys
    after the run it is measuring; an advance() that finds another one running returns at once instead of
    re-entering the generator ("generator already executing").
    """

    sweep: Sweep
    rows: list = field(default_factory=list)
    done: int = 0  # whole runs measured
    finished: bool = False
    cancelled: bool = False
    error: Exception | None = None
    seconds: float = 0.0  # wall time spent inside the runs so far (not the UI's time between ticks)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def progress(self) -> float:
        return min(1.0, self.done / self.sweep.total) if self.sweep.total else 1.0

    @property
    def state(self) -> str:
        """Where the run stands, as a page names it: running, done, cancelled, or cancelled_none (cancelled before
        one whole round, so no row to keep)."""
        if self.cancelled:
            return "cancelled" if self.rows else "cancelled_none"
        return "done" if self.finished else "running"

    @property
    def time_left(self) -> float | None:
        """Seconds still to run, estimated from the measured time per run so far (None before the first run)."""
        return self.seconds / self.done * (self.sweep.total - self.done) if self.done else None

    def advance(self, budget_s: float = 0.0) -> int:
        """Measure at least one more whole run, then more until budget_s of wall time has passed; returns how many."""
        count = 0
        if not self._lock.acquire(blocking=False):
            return count  # another thread is inside the generator: leave it to finish its run
        try:
            start = time.perf_counter()  # scheduling only: the rows carry the engine's own timings
            while not self.finished and (not count or time.perf_counter() - start < budget_s):
                if self._cancel.is_set():
                    break
                began = time.perf_counter()
                try:
                    with quiet():  # nothing else of this process competes while the run is measured
                        rows = next(self.sweep.runs)
                except StopIteration:
                    self.finished = True
                    break
                except InputError as exc:  # e.g. a setting that does not fit the context: stop, say why
                    self.error, self.finished = exc, True
                    break
                self.rows, self.done, count = rows, self.done + 1, count + 1
                self.seconds += time.perf_counter() - began
                if self.done >= self.sweep.total:
                    self._stop()
            if self._cancel.is_set():
                self._stop()
        finally:
            self._lock.release()
        return count

    def cancel(self) -> None:
        """Stop after the run being measured (if any); the rows complete so far are kept."""
        self._cancel.set()
        self.cancelled = not self.finished
        if self._lock.acquire(blocking=False):  # nobody measuring: stop now
            try:
                self._stop()
            finally:
                self._lock.release()

    def _stop(self) -> None:
        self.sweep.runs.close()  # nothing more runs (a no-op on a finished generator)
        self.finished = True

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


def _rounds(points: Sequence, repeats: int, measure: Callable[[object], dict],
            make_rows: Callable[[object, list[dict]], list[dict]]) -> Iterator[list[dict]]:
    """repeats + 1 rounds over every point, each round in the opposite order to the last, the first dropped (each
    point's first pass at its size pays one-off costs). Yields after every run the rows complete so far: every
    point's, from the rounds already finished."""
    runs: dict = {p: [] for p in points}
    rows: list[dict] = []
    for r in range(repeats + 1):
        order = list(points) if r % 2 == 0 else list(points)[::-1]
        for i, p in enumerate(order):
            result = measure(p)
            if r:
                runs[p].append(result)
                if i == len(order) - 1:
                    rows = [row for q in points for row in make_rows(q, list(runs[q]))]
            yield rows


def prompt_length_sweep(backend: Backend, prompt_lengths: Sequence[int], *, n_new: int = 8,
                        repeats: int = DEFAULT_REPEATS["prompt-length"]) -> Sweep:
    """TTFT and TPOT for each prompt length: the median (and range) of `repeats` interleaved whole runs."""
    lengths = sorted(set(prompt_lengths))
    _check_fits(backend, max(lengths) + n_new)

    def measure(n: int) -> dict:
        s = summarize(_measure(backend, n, n_new).events)
        return {"ttft_s": s.ttft_s, "prefill_s": s.prefill_s, "tpot_s": s.tpot_s, "e2e_s": s.e2e_s}

    def make_rows(n: int, runs: list[dict]) -> list[dict]:
        keys = ("ttft_s", "prefill_s", "tpot_s", "e2e_s")
        return [{"prompt_tokens": n, "new_tokens": n_new, **_median_row(runs, keys), "runs": runs}]

    def runs() -> Iterator[list[dict]]:
        warm_up(backend)
        yield from _rounds(lengths, repeats, measure, make_rows)

    return Sweep("prompt-length", (repeats + 1) * len(lengths), len(lengths), runs())


def _one_step(backend: Backend, context: int, use_cache: bool) -> float:
    """Seconds of one decode step that attends over `context` positions: the prefix (context − 1 tokens) is
    prefilled untimed, then the step is timed. With the cache it feeds 1 token and reads the cached prefix;
    without, it runs all `context` tokens again."""
    gen = Generation(backend, max_new_tokens=2, use_cache=use_cache, stop_at_eos=False)
    gen.prefill(prompt_ids(backend, context - 1))
    return gen.step().seconds


def cache_sweep(backend: Backend, contexts: Sequence[int], *, repeats: int = DEFAULT_REPEATS["cache"]) -> Sweep:
    """Decode-step seconds at each context length, with the KV cache and recomputing the whole prefix.

    Each row is the median (and range) of `repeats` steps, one per round: every round times a step at every
    context in both modes, interleaved (the order reversed each round, so cached and uncached take turns first).
    """
    points = sorted(set(contexts))
    if points[0] < 2:
        raise InputError("latency.context_min")
    _check_fits(backend, points[-1] + 1)  # the step emits one more token: the engine's context holds it
    settings = [(n, mode) for n in points for mode in ("cache", "no_cache")]

    def measure(setting: tuple[int, str]) -> dict:
        n, mode = setting
        return {"seconds": _one_step(backend, n, mode == "cache")}

    def make_rows(setting: tuple[int, str], steps: list[dict]) -> list[dict]:
        n, mode = setting
        return [{"mode": mode, "context_tokens": n, "input_tokens": 1 if mode == "cache" else n,
                 **_median_row(steps, ("seconds",)), "runs": steps}]

    def runs() -> Iterator[list[dict]]:
        warm_up(backend)
        yield from _rounds(settings, repeats, measure, make_rows)

    return Sweep("cache", (repeats + 1) * len(settings), len(settings), runs())


def batch_sweep(backend: Backend, batches: Sequence[int], *, n_prompt: int = 64, n_new: int = 16,
                repeats: int = DEFAULT_REPEATS["batch"]) -> Sweep:
    """TPOT, tokens/s and measured KV bytes per batch size (all rows share each pass); medians of `repeats`
    interleaved runs."""
    sizes = sorted(set(batches))
    _check_fits(backend, n_prompt + n_new)
    cache_bytes: dict[int, tuple[int, int, int | None]] = {}  # measured from the tensors (the same every run)

    def measure(b: int) -> dict:
        gen = _measure(backend, n_prompt, n_new, batch=b)
        s, last = summarize(gen.events), gen.events[-1]
        cache_bytes[b] = (last.live_bytes, last.formula_bytes, last.device_memory_bytes)
        return {"ttft_s": s.ttft_s, "tpot_s": s.tpot_s}

    def make_rows(b: int, runs: list[dict]) -> list[dict]:
        med = _median_row(runs, ("ttft_s", "tpot_s"))
        kv, formula, device = cache_bytes[b]
        return [{"batch": b, **med,
                 "tokens_per_s": b / med["tpot_s"] if med["tpot_s"] else None,  # every row emits a token per pass
                 "kv_bytes": kv, "kv_formula_bytes": formula, "device_memory_bytes": device, "runs": runs}]

    def runs() -> Iterator[list[dict]]:
        warm_up(backend)
        yield from _rounds(sizes, repeats, measure, make_rows)

    return Sweep("batch", (repeats + 1) * len(sizes), len(sizes), runs())


def dtype_sweep(
    load: Callable[[str], Backend], dtypes: Sequence[str], *, n_prompt: int = 64, n_new: int = 16
) -> Sweep:
    """The same model in each dtype, one run each; a dtype the device cannot run gives a row with supported=False."""

    def runs() -> Iterator[list[dict]]:
        rows: list[dict] = []
        for name in dtypes:
            row = {"dtype": name, "supported": True, "error": ""}
            try:
                backend = load(name)
                _check_fits(backend, n_prompt + n_new)
                warm_up(backend)
                gen = _measure(backend, n_prompt, n_new)
            except (RuntimeError, TypeError) as exc:  # e.g. a kernel missing for this dtype on this device
                rows = [*rows, {**row, "supported": False, "ttft_s": None, "tpot_s": None, "tokens_per_s": None,
                                "weight_bytes": None, "kv_bytes": None, "error": str(exc).splitlines()[0]}]
                yield rows
                continue
            s = summarize(gen.events)
            rows = [*rows, {**row, "ttft_s": s.ttft_s, "tpot_s": s.tpot_s,
                            "tokens_per_s": 1 / s.tpot_s if s.tpot_s else None,
                            "weight_bytes": backend.spec.n_params * backend.dtype.itemsize,
                            "kv_bytes": gen.events[-1].live_bytes}]
            yield rows

    return Sweep("dtype", len(dtypes), len(dtypes), runs())


def run_sweep(load: Callable[[str], Backend], kind: str, *, dtype: str = "float32",
              lengths: Sequence[int] | None = None, contexts: Sequence[int] | None = None,
              batches: Sequence[int] = (1, 2, 4, 8), dtypes: Sequence[str] = DTYPE_NAMES,
              prompt_tokens: int = 64, new_tokens: int = 16, repeats: int = 3) -> dict:
    """One whole sweep of `kind` ("prompt-length", "cache", "batch", "dtype"), run to the end: its rows, columns and
    summary. `load(dtype)` gives the model in a dtype; the sweeps other than dtype run it in `dtype`. Lengths and
    contexts left out are the defaults of sweep_stats for the model's context."""
    backend = load(dtype)
    max_len = backend.spec.max_context
    if kind == "prompt-length":
        sweep = prompt_length_sweep(backend, lengths or default_prompt_lengths(max_len, new_tokens),
                                    n_new=new_tokens, repeats=repeats)
    elif kind == "cache":
        sweep = cache_sweep(backend, contexts or default_contexts(max_len), repeats=repeats)
    elif kind == "batch":
        sweep = batch_sweep(backend, batches, n_prompt=prompt_tokens, n_new=new_tokens)
    else:
        sweep = dtype_sweep(load, dtypes, n_prompt=prompt_tokens, n_new=new_tokens)
    rows = SweepRun(sweep).run()
    return {"sweep": kind, "model": backend.spec.name, "device": str(backend.device), "dtype": dtype,
            "columns": list(COLUMNS[kind]), "rows": rows, "summary": summary(kind, rows)}
