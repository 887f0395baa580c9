"""What a latency sweep starts from and what its rows say, without torch: a page draws a sweep's settings and its
results before (or without) loading a model; `sweeps` measures.

Settings: the kinds, their default points and repeats, and the parsing of a typed list. Results: the rows'
columns, every run as (x, y) and as CSV records, the cost model each series is fitted with and what the fits
support (a verdict computed from 95% intervals, never a sign the data cannot back).
"""
from __future__ import annotations

import csv
import io
from collections.abc import Sequence

import numpy as np

from kvviz.engine.metrics import PolyFit, linear_fit, loglog_fit, poly_fit, trend_verdict
from kvviz.errors import InputError

KINDS = ("prompt-length", "cache", "batch", "dtype")

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



# ---- settings ----------------------------------------------------------------------------------------------
def default_prompt_lengths(max_seq_len: int, n_new: int, points: int = 6) -> list[int]:
    """Geometric steps from 16 tokens to the longest prompt that leaves room for n_new tokens (at least 1 token:
    where nothing fits, e.g. a hosted demo's tiny KV budget, the one default is refused with its reason)."""
    top = max(1, max_seq_len - n_new)
    return sorted({int(round(v)) for v in np.geomspace(min(16, top), top, points)})


def default_contexts(max_seq_len: int, points: int = 8) -> list[int]:
    """Geometric steps from 8 positions to the longest step the context allows (it emits one more token); at
    least 2, the shortest step there is."""
    top = max(2, max_seq_len - 1)
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


# ---- what a finished (or cancelled) sweep says ---------------------------------------------------------
# The cost model each series is fitted with (degree of the polynomial in tokens). A pass over n tokens at once
# (a prefill, or a step that recomputes the prefix) costs fixed + per token + per pair of tokens (each token
# attends to those before it); a cached step reads n cached positions with one query: fixed + per token.
MODELS = {"prompt-length": {"ttft_s": 2, "tpot_s": 1}, "cache": {"cache": 1, "no_cache": 2}}
CACHE_VERDICTS = ("consistent", "too_noisy", "contradicts")


def series(kind: str, rows: Sequence[dict], name: str) -> tuple[list[float], list[float]]:
    """(tokens, seconds) of every run of one fitted series of a sweep."""
    if kind == "cache":
        return runs_xy([r for r in rows if r["mode"] == name], "context_tokens", "seconds")
    return runs_xy(rows, "prompt_tokens", name)


def model_fits(kind: str, rows: Sequence[dict]) -> dict[str, PolyFit | None]:
    """Each series fitted with its cost model (MODELS) over every run, weighted for relative error."""
    return {name: poly_fit(*series(kind, rows, name), degree, relative=True)
            for name, degree in MODELS[kind].items()}


def _fit_terms(name: str, fit: PolyFit | None, degree: int) -> dict:
    """The fitted cost's terms and their standard errors (None where the fit could not be made)."""
    out = {}
    for i, term in enumerate(("fixed_s", "s_per_token", "s_per_token_pair")[:degree + 1]):
        out[f"{name}_{term}"] = fit.coef[i] if fit else None
        out[f"{name}_{term}_se"] = fit.se(i) if fit else None
    return out


def _trend(fit: PolyFit | None, x: Sequence[float], y: Sequence[float]) -> str:
    return trend_verdict(fit, (min(x), max(x)), float(np.median(y))) if x else "too_noisy"


def cache_verdict(fits: dict[str, PolyFit | None], x_range: tuple[float, float], trends: dict[str, str]) -> str:
    """What the cache sweep says about its lesson, from the 95% intervals of each curve's rise over x_range:

    consistent: recomputing the prefix rises, the cached step's rise is below it (the two intervals apart) and
    the cached step did not fall (its own slope may be too small to tell from zero: flat-to-linear allows both);
    contradicts: the cached step rose more than recomputing (the intervals apart the other way); too_noisy:
    anything else (the intervals overlap, or a step got faster with more context to read, which the work cannot
    do: the machine's load changed).
    """
    cached, uncached = (f.change_ci95(*x_range) if f is not None else None for f in (fits["cache"], fits["no_cache"]))
    if cached is None or uncached is None:
        return "too_noisy"
    if cached[0] > uncached[1]:
        return "contradicts"
    if trends["no_cache"] == "rising" and trends["cache"] != "falling" and uncached[0] > cached[1]:
        return "consistent"
    return "too_noisy"


def summary(kind: str, rows: Sequence[dict]) -> dict:
    """Fitted cost models (each term with its standard error), what the data supports, and totals, over every run."""
    if kind == "prompt-length":
        fits = model_fits(kind, rows)
        x, ttft = series(kind, rows, "ttft_s")
        xt, tpot = series(kind, rows, "tpot_s")
        line = linear_fit(x, ttft)
        return {
            **_fit_terms("ttft", fits["ttft_s"], MODELS[kind]["ttft_s"]),
            **_fit_terms("tpot", fits["tpot_s"], MODELS[kind]["tpot_s"]),
            # An ordinary straight line through TTFT leaves out the n² term: its intercept is what it gives.
            "ttft_line_fixed_s": line.intercept if line else None,
            "ttft_verdict": _trend(fits["ttft_s"], x, ttft),
            "tpot_verdict": _trend(fits["tpot_s"], xt, tpot),
            "n_runs": len(x),
        }
    if kind == "cache":
        fits = model_fits(kind, rows)
        out: dict = {}
        trends = {}
        for mode in ("cache", "no_cache"):
            mine = [r for r in rows if r["mode"] == mode]
            x, y = series(kind, rows, mode)
            trends[mode] = _trend(fits[mode], x, y)
            fit = fits[mode]
            rise = fit.change_ci95(min(x), max(x)) if fit is not None and x else None
            out[mode] = {**_fit_terms("step", fit, MODELS[kind][mode]), "verdict": trends[mode],
                         "rise_s": fit(max(x)) - fit(min(x)) if fit is not None and x else None,
                         "rise_ci95_s": list(rise) if rise else None,
                         "total_s": total_seconds([r["context_tokens"] for r in mine], [r["seconds"] for r in mine]),
                         "n_runs": len(x)}
        contexts = [r["context_tokens"] for r in rows]
        out["contexts"] = [min(contexts), max(contexts)] if contexts else None
        out["verdict"] = cache_verdict(fits, tuple(out["contexts"]), trends) if contexts else "too_noisy"
        return out
    if kind == "batch":
        x, y = runs_xy(rows, "batch", "tpot_s")
        fit = loglog_fit(x, y) if x else None
        return {"tpot_loglog_slope": fit.slope if fit else None, "tpot_loglog_slope_se": fit.slope_se if fit else None}
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


def records_csv(rows: Sequence[dict]) -> str:
    """The CSV a page offers for download: run_records' every whole run (not only the medians), one line each."""
    records = run_records(rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(dict.fromkeys(k for r in records for k in r)))
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def total_seconds(contexts: Sequence[int], seconds: Sequence[float]) -> float | None:
    """Decode time summed over every context from the first to the last measured one (linear interpolation)."""
    if len(contexts) < 2:
        return None
    every = np.arange(contexts[0], contexts[-1] + 1)
    return float(np.interp(every, contexts, seconds).sum())
