"""Figures of the Prefill & Decode and Latency & Capacity pages: data in, Plotly figure out.

Every visible word arrives in `labels` (translated by the page); times are plotted in milliseconds.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.charts.base import style

# Okabe & Ito's colour-blind-safe hues, each line at least 3:1 on white: tests/charts/test_palettes.py
PREFILL, DECODE, NO_CACHE, FIT = "#d55e00", "#0072b2", "#cc79a7", "#555555"
MS = 1e3
MIN_BARS = 10  # the timeline's x axis spans at least this many tokens: one bar never fills the width
# In lecture mode a chart shares one 1280×720 screen with the page's title, the idea stepper, the controls and a
# line under it: at this height (× 1.4 for lecture type, so 294 px) the idea stays whole on screen.
LECTURE_HEIGHT = 210


def _style(fig: go.Figure, title: str, lecture: bool, height: int = 360) -> go.Figure:
    style(fig, title=title, lecture=lecture, height=LECTURE_HEIGHT if lecture else height)
    if lecture:  # the title on the left, Plotly's toolbar on the right: no need to stack them
        fig.update_layout(title_pad_t=12, margin_t=70)
    return fig


def log_ticks(low: float, high: float) -> tuple[list[float], list[str]] | None:
    """Tick values 1, 2, 5 × 10^k spanning [low, high], labelled in full ("20", "500", "2,000"), for a log axis.

    Plotly labels a log axis that spans less than a decade with bare mantissas ("…8, 9, 10, 2, 3"),
    which reads as a falling sequence; these say the value itself. None when low or high is not positive.
    """
    if not (low > 0 and high > 0):
        return None
    low, high = min(low, high), max(low, high)
    values: list[float] = []
    for k in range(int(np.floor(np.log10(low))) - 1, int(np.ceil(np.log10(high))) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**k
            if low / 1.5 <= v <= high * 1.5:
                values.append(v)
    if len(values) < 3:  # less than a decade: every whole mantissa
        values = [m * 10.0**k for k in range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
                  for m in range(1, 10) if low / 1.2 <= m * 10.0**k <= high * 1.2]
    if len(values) > 12:  # many decades: powers of ten only
        values = [v for v in values if np.log10(v) == round(np.log10(v))]
    return values, [_tick_text(v) for v in values]


def _tick_text(v: float) -> str:
    if v >= 1:
        return f"{v:,.0f}"
    return f"{v:.{max(0, -int(np.floor(np.log10(v))))}f}"


def _log_axis(fig: go.Figure, axis: str, values: Sequence[float], **kwargs) -> None:
    """A log axis with full-number ticks over `values` (the positive ones)."""
    pos = [v for v in values if v is not None and v > 0]
    ticks = log_ticks(min(pos), max(pos)) if pos else None
    extra = dict(tickmode="array", tickvals=ticks[0], ticktext=ticks[1]) if ticks else {}
    (fig.update_xaxes if axis == "x" else fig.update_yaxes)(type="log", **extra, **kwargs)


def token_timeline(seconds: Sequence[float], queue_s: float, labels: Mapping[str, str], *,
                   lecture: bool = False) -> go.Figure:
    """One bar per forward pass (token 1 = queue + prefill, then one per decoded token) and the running total."""
    n = len(seconds)
    x = list(range(1, n + 1))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    if n:
        fig.add_bar(x=[1], y=[queue_s * MS], name=labels["queue"], marker_color="#bbbbbb")
        fig.add_bar(x=[1], y=[seconds[0] * MS], name=labels["prefill"], marker_color=PREFILL)
        fig.add_bar(x=x[1:], y=[s * MS for s in seconds[1:]], name=labels["decode"], marker_color=DECODE)
        cumulative = np.cumsum([queue_s + seconds[0], *seconds[1:]]) * MS
        fig.add_scatter(x=x, y=cumulative.tolist(), name=labels["cumulative"], mode="lines",
                        line=dict(color=FIT, dash="dot"), secondary_y=True)
    # Legend under the plot, below the x-axis title; the top edge keeps the title and Plotly's toolbar.
    fig.update_layout(barmode="stack", legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"))
    fig.update_xaxes(title_text=labels["x"], range=[0.5, max(n, MIN_BARS) + 0.5])
    fig.update_yaxes(title_text=labels["y"], secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text=labels["y2"], secondary_y=True, rangemode="tozero", showgrid=False)
    _style(fig, labels["title"], lecture)
    return _room_below(fig, lecture)


def _room_below(fig: go.Figure, lecture: bool) -> go.Figure:
    """Bottom margin for the x-axis title and, under it, a one-line legend (anchored to the container's foot); in
    lecture mode, where height is scarce, the legend stands right of the plot, clear of the second y axis."""
    if lecture:
        fig.update_layout(legend=dict(orientation="v", yref="paper", y=1, yanchor="top", x=1.1, xanchor="left"),
                          margin=dict(b=60))
    else:
        fig.update_layout(margin=dict(b=95))
    return fig


Fit = Callable[[float], float]  # seconds at a token count: a fitted cost model


def _fit_curve(x: Sequence[float], fit: Fit) -> tuple[list[float], list[float]]:
    """The fitted model over the measured range, dense enough to show its bend on log axes, in ms."""
    grid = np.unique(np.geomspace(min(x), max(x), 48).round(2)).tolist()
    return grid, [fit(v) * MS for v in grid]  # fitted on seconds, drawn in ms


def prompt_length_chart(rows: Sequence[dict], fits: Mapping[str, Fit | None], labels: Mapping[str, str],
                        *, lecture: bool = False) -> go.Figure:
    """TTFT and TPOT (ms) vs prompt length on log-log axes: each point the median of its runs, a bar from the
    fastest to the slowest run, and the cost model fitted to every run."""
    x = [r["prompt_tokens"] for r in rows]
    series = {key: (x, [_ms(r.get(key)) for r in rows], [_ms(r.get(f"{key[:-2]}_min_s")) for r in rows],
                    [_ms(r.get(f"{key[:-2]}_max_s")) for r in rows]) for key in ("ttft_s", "tpot_s")}
    return _loglog_with_fits(series, {"ttft_s": PREFILL, "tpot_s": DECODE}, fits, labels, lecture)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * MS


def cache_chart(rows: Sequence[dict], fits: Mapping[str, Fit | None], labels: Mapping[str, str],
                *, lecture: bool = False) -> go.Figure:
    """Per-step ms vs context length, with and without the cache, log-log with the fitted cost models (median and
    range of each point)."""
    series = {}
    for mode in ("cache", "no_cache"):
        mine = [r for r in rows if r["mode"] == mode]
        series[mode] = ([r["context_tokens"] for r in mine], [_ms(r["seconds"]) for r in mine],
                        [_ms(r.get("seconds_min")) for r in mine], [_ms(r.get("seconds_max")) for r in mine])
    return _loglog_with_fits(series, {"cache": DECODE, "no_cache": NO_CACHE}, fits, labels, lecture)


def _loglog_with_fits(series: Mapping[str, tuple[list, ...]], colors: Mapping[str, str],
                      fits: Mapping[str, Fit | None], labels: Mapping[str, str],
                      lecture: bool) -> go.Figure:
    """Measured series (x, y[, low, high]) on log-log axes, each with its fitted model dashed in the same colour
    (labels[f"fit_{key}"] names the model)."""
    fig = go.Figure()
    all_x, all_y = [], []
    for key, (x, y, *band) in series.items():
        color = colors[key]
        error = None
        if band and all(v is not None for v in (*band[0], *band[1], *y)) and len(band) == 2:
            low, high = band
            error = dict(type="data", symmetric=False, array=[h - m for h, m in zip(high, y, strict=True)],
                         arrayminus=[m - lo for m, lo in zip(y, low, strict=True)], thickness=1.5, width=4)
            all_y += [*low, *high]
        fig.add_scatter(x=x, y=y, mode="lines+markers", name=labels[key], marker_color=color, error_y=error)
        all_x += x
        all_y += y
        if fits.get(key) is not None and x:
            fx, fy = _fit_curve(x, fits[key])
            fig.add_scatter(x=fx, y=fy, mode="lines", line=dict(color=color, dash="dash", width=1.5),
                            name=labels[f"fit_{key}"])
    _log_axis(fig, "x", all_x, title_text=labels["x"])
    _log_axis(fig, "y", all_y, title_text=labels["y"])
    return _style(fig, labels["title"], lecture)


def batch_chart(rows: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """Three panels against batch size: TPOT (ms), tokens/s, KV-cache bytes (MiB)."""
    x = [r["batch"] for r in rows]
    fig = make_subplots(rows=1, cols=3, subplot_titles=(labels["tpot"], labels["tokens_per_s"], labels["kv"]))
    fig.add_scatter(x=x, y=[r["tpot_s"] * MS for r in rows], mode="lines+markers", marker_color=DECODE,
                    name=labels["tpot"], row=1, col=1)
    fig.add_scatter(x=x, y=[r["tokens_per_s"] for r in rows], mode="lines+markers", marker_color="#2ca02c",
                    name=labels["tokens_per_s"], row=1, col=2)
    fig.add_scatter(x=x, y=[r["kv_bytes"] / 2**20 for r in rows], mode="lines+markers", marker_color=NO_CACHE,
                    name=labels["kv"], row=1, col=3)
    ticks = log_ticks(min(x), max(x)) if x else None
    fig.update_xaxes(title_text=labels["x"], type="log",
                     **(dict(tickmode="array", tickvals=ticks[0], ticktext=ticks[1]) if ticks else {}))
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(showlegend=False)
    return _style(fig, labels["title"], lecture)


def dtype_chart(rows: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """TTFT and TPOT (ms) per dtype, side by side; unsupported dtypes are left out."""
    ok = [r for r in rows if r["supported"]]
    x = [r["dtype"] for r in ok]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r["ttft_s"] * MS for r in ok], name=labels["ttft_s"], marker_color=PREFILL)
    fig.add_bar(x=x, y=[r["tpot_s"] * MS for r in ok], name=labels["tpot_s"], marker_color=DECODE)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text=labels["y"])
    return _style(fig, labels["title"], lecture)


def _marker(fig: go.Figure, x: float, span: tuple[float, float], name: str, color: str, dash: str) -> None:
    """A named vertical line drawn as a trace: it shows in the legend, and on log axes needs no log10 coordinates."""
    fig.add_scatter(x=[x, x], y=list(span), mode="lines", name=name, line=dict(color=color, dash=dash, width=1.5))


def roofline_chart(curve: Sequence[dict], labels: Mapping[str, str], *, compute_batch: float | None,
                   max_batch: int, kv_weights_batch: float, lecture: bool = False) -> go.Figure:
    """Decode TPOT lower bound vs batch: the memory and compute limits, the bound, and where each regime ends."""
    x = [r["batch"] for r in curve]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=x, y=[r["memory_s"] * MS for r in curve], mode="lines", name=labels["memory"],
                    line=dict(color=DECODE))
    fig.add_scatter(x=x, y=[r["compute_s"] * MS for r in curve], mode="lines", name=labels["compute"],
                    line=dict(color=PREFILL))
    fig.add_scatter(x=x, y=[r["seconds"] * MS for r in curve], mode="lines", name=labels["bound"],
                    line=dict(color="black", width=3, dash="dot"))
    fig.add_scatter(x=x, y=[r["tokens_per_s"] for r in curve], mode="lines", name=labels["tokens_per_s"],
                    line=dict(color="#2ca02c"), secondary_y=True)
    times = [r[k] * MS for r in curve for k in ("memory_s", "compute_s")]
    span = (min(times), max(times))
    if compute_batch is not None and x[0] <= compute_batch <= x[-1]:  # below B = 1 it is no batch to mark
        name = labels["compute_batch"].format(batch=f"{compute_batch:,.0f}")
        _marker(fig, compute_batch, span, name, PREFILL, "dash")
    if max_batch:
        _marker(fig, max_batch, span, labels["max_batch"].format(batch=f"{max_batch:,}"), FIT, "dash")
    if x[0] <= kv_weights_batch <= x[-1]:
        name = labels["kv_weights"].format(batch=f"{kv_weights_batch:,.0f}")
        _marker(fig, kv_weights_batch, span, name, NO_CACHE, "dot")
    _log_axis(fig, "x", x, title_text=labels["x"])
    _log_axis(fig, "y", times, title_text=labels["y"], secondary_y=False)
    fig.update_yaxes(title_text=labels["y2"], secondary_y=True, showgrid=False, rangemode="tozero")
    if lecture:  # the chart is the idea on screen: all of the height left under the controls, a compact legend
        style(fig, title=labels["title"], lecture=True, height=LECTURE_HEIGHT + 25)
        fig.update_layout(title_pad_t=12, margin_t=70, legend_font_size=15)
        return _room_below(fig, lecture)
    style(fig, title=labels["title"], height=520)
    # Legend at the foot of the figure, under the x-axis title (never over it), in as many rows as it needs.
    fig.update_layout(legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"), margin=dict(b=150))
    return fig


def kv_vs_weights_chart(tokens: Sequence[int], kv_bytes: Sequence[float], weight_bytes: float,
                        crossing_tokens: float | None, labels: Mapping[str, str], *,
                        lecture: bool = False) -> go.Figure:
    """The batch's KV cache (GB) growing with context against the flat weights, the crossing marked (None: the
    cache never reaches the weights)."""
    fig = go.Figure()
    fig.add_scatter(x=list(tokens), y=[b / 1e9 for b in kv_bytes], mode="lines", name=labels["kv"],
                    line=dict(color=NO_CACHE))
    fig.add_scatter(x=[tokens[0], tokens[-1]], y=[weight_bytes / 1e9] * 2, mode="lines", name=labels["weights"],
                    line=dict(color=DECODE))
    if crossing_tokens is not None and tokens[0] <= crossing_tokens <= tokens[-1]:
        span = (min(kv_bytes[0], weight_bytes) / 1e9, max(kv_bytes[-1], weight_bytes) / 1e9)
        _marker(fig, crossing_tokens, span, labels["crossing"].format(tokens=f"{crossing_tokens:,.0f}"), FIT, "dash")
    _log_axis(fig, "x", list(tokens), title_text=labels["x"])
    _log_axis(fig, "y", [b / 1e9 for b in kv_bytes] + [weight_bytes / 1e9], title_text=labels["y"])
    return _style(fig, labels["title"], lecture)
