"""Latency sweeps over the real engine: prompt length, cache vs no cache, batch size, dtype.

Each sweep is a generator of rows (one per setting), so a page can draw progress between settings and
a Cancel can stop it there, keeping the rows already measured. Times are the engine's
device-synchronized pass seconds; each sweep warms the model up first so the first setting does not
pay one-off costs (allocator growth, kernel selection).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvviz.engine.backends.base import Backend
from kvviz.engine.generation import Generation
from kvviz.engine.metrics import linear_fit, loglog_slope, summarize
from kvviz.errors import InputError

KINDS = ("prompt-length", "cache", "batch", "dtype")

# Prompts are this text repeated to the wanted length: real words for a trained model, any length.
FILLER = (
    "Once computed, the keys and values of earlier tokens never change under a causal mask, "
    "so the decoder stores them and each new token only computes its own. "
)

COLUMNS: dict[str, tuple[str, ...]] = {
    "prompt-length": ("prompt_tokens", "new_tokens", "ttft_s", "prefill_s", "tpot_s", "e2e_s"),
    "cache": ("mode", "context_tokens", "input_tokens", "seconds"),
    "batch": ("batch", "ttft_s", "tpot_s", "tokens_per_s", "kv_bytes", "kv_formula_bytes", "device_memory_bytes"),
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
    """A sweep in progress: advance it a little per UI tick; cancel keeps the rows done."""

    sweep: Sweep
    rows: list[dict] = field(default_factory=list)
    finished: bool = False
    cancelled: bool = False
    error: Exception | None = None

    @property
    def progress(self) -> float:
        return min(1.0, len(self.rows) / self.sweep.total) if self.sweep.total else 1.0

    def advance(self, budget_s: float = 0.0) -> list[dict]:
        """Measure at least one more setting, then more until budget_s of wall time has passed."""
        new: list[dict] = []
        start = time.perf_counter()  # scheduling only: the rows carry the engine's own timings
        while not self.finished and (not new or time.perf_counter() - start < budget_s):
            try:
                row = next(self.sweep.rows)
            except StopIteration:
                self.finished = True
                break
            except InputError as exc:  # e.g. a setting that does not fit the context: stop, say why
                self.error, self.finished = exc, True
                break
            self.rows.append(row)
            new.append(row)
        return new

    def cancel(self) -> None:
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


def warm_up(backend: Backend) -> None:
    """A few short passes first, so one-off costs (allocator growth, kernel choice) land in no timing."""
    _measure(backend, min(8, backend.spec.max_context - 3), 3)


def _check_fits(backend: Backend, n_tokens: int) -> None:
    if n_tokens > backend.spec.max_context:
        raise InputError("latency.too_long", n_tokens=n_tokens, max_len=backend.spec.max_context)


def _fastest(values: Sequence[float | None]) -> float | None:
    # Noise (other processes, interrupts) only ever adds time: the fastest repeat is closest to the cost.
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


def prompt_length_sweep(backend: Backend, prompt_lengths: Sequence[int], *, n_new: int = 8, repeats: int = 1) -> Sweep:
    """TTFT and TPOT for each prompt length (the fastest of `repeats` runs)."""
    lengths = sorted(set(prompt_lengths))
    _check_fits(backend, max(lengths) + n_new)

    def rows() -> Iterator[dict]:
        warm_up(backend)
        for n in lengths:
            runs = [summarize(_measure(backend, n, n_new).events) for _ in range(repeats)]
            yield {
                "prompt_tokens": n,
                "new_tokens": n_new,
                "ttft_s": _fastest([r.ttft_s for r in runs]),
                "prefill_s": _fastest([r.prefill_s for r in runs]),
                "tpot_s": _fastest([r.tpot_s for r in runs]),
                "e2e_s": _fastest([r.e2e_s for r in runs]),
            }

    return Sweep("prompt-length", len(lengths), rows())


def cache_sweep(backend: Backend, contexts: Sequence[int], *, repeats: int = 3) -> Sweep:
    """Decode-step seconds at each context length, with the KV cache and recomputing the whole prefix.

    With the cache a step feeds 1 token and reads the cached prefix; without it the step runs all
    `context` tokens again. Each row is the fastest of `repeats` consecutive steps starting there.
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
            steps = [cached.step().seconds for _ in range(repeats)]
            yield {"mode": "cache", "context_tokens": n, "input_tokens": 1, "seconds": min(steps)}
            fresh = Generation(backend, max_new_tokens=repeats + 1, use_cache=False, stop_at_eos=False)
            fresh.prefill(prompt_ids(backend, n - 1))
            steps = [fresh.step().seconds for _ in range(repeats)]
            yield {"mode": "no_cache", "context_tokens": n, "input_tokens": n, "seconds": min(steps)}

    return Sweep("cache", 2 * len(points), rows())


def batch_sweep(backend: Backend, batches: Sequence[int], *, n_prompt: int = 64, n_new: int = 16) -> Sweep:
    """TPOT, tokens/s and measured KV bytes for each batch size (all rows share each pass)."""
    sizes = sorted(set(batches))
    _check_fits(backend, n_prompt + n_new)

    def rows() -> Iterator[dict]:
        warm_up(backend)
        for b in sizes:
            gen = _measure(backend, n_prompt, n_new, batch=b)
            s, last = summarize(gen.events), gen.events[-1]
            yield {
                "batch": b,
                "ttft_s": s.ttft_s,
                "tpot_s": s.tpot_s,
                "tokens_per_s": b / s.tpot_s if s.tpot_s else None,  # every row emits a token per pass
                "kv_bytes": last.live_bytes,
                "kv_formula_bytes": last.formula_bytes,
                "device_memory_bytes": last.device_memory_bytes,
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
    """Fitted slopes and totals the page and the CLI print beside the rows."""
    if kind == "prompt-length":
        x = [r["prompt_tokens"] for r in rows]
        ttft = [r["ttft_s"] for r in rows]
        lin = linear_fit(x, ttft)
        return {
            "ttft_loglog_slope": _slope(x, ttft),
            "tpot_loglog_slope": _slope(x, [r["tpot_s"] for r in rows]),
            "ttft_s_per_prompt_token": lin[0] if lin else None,
            "ttft_fixed_s": lin[1] if lin else None,
        }
    if kind == "cache":
        out = {}
        for mode in ("cache", "no_cache"):
            mine = [r for r in rows if r["mode"] == mode]
            x, y = [r["context_tokens"] for r in mine], [r["seconds"] for r in mine]
            out[mode] = {"loglog_slope": _slope(x, y), "total_s": total_seconds(x, y)}
        return out
    if kind == "batch":
        return {"tpot_loglog_slope": _slope([r["batch"] for r in rows], [r["tpot_s"] for r in rows])}
    return {}


def _slope(x: Sequence[float], y: Sequence[float | None]) -> float | None:
    pairs = [(a, b) for a, b in zip(x, y, strict=True) if b is not None]
    fit = loglog_slope([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None
    return fit[0] if fit else None


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
