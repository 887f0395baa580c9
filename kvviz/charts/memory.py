"""Figures of the Memory Footprint page: pure functions, data (and translated labels) in, Plotly figure out (the
curves and residuals they draw are kvviz.lessons.memory's)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from kvviz.charts.base import style
from kvviz.lessons.memory import CacheCurve, Residual
from kvviz.units import binary_unit, format_binary

GIB = 1024**3
# Okabe & Ito's colour-blind-safe hues (darkened where a line needs 3:1 on white): tests/charts/test_palettes.py
KIND_COLORS = {"MHA": "#d55e00", "GQA": "#0072b2", "MQA": "#009e73", "MLA": "#cc79a7"}


def attention_comparison_figure(
    labels: Sequence[str],
    kinds: Sequence[str],
    bytes_per_token: Sequence[int],
    *,
    title: str,
    y_title: str,
    lecture: bool = False,
) -> go.Figure:
    """KV bytes per token (all layers) for MHA / GQA / MQA / MLA of one model size, in KiB."""
    fig = go.Figure(
        go.Bar(
            x=list(labels),
            y=[b / 1024 for b in bytes_per_token],
            marker_color=[KIND_COLORS.get(k, "#7f7f7f") for k in kinds],
            text=[format_binary(b) for b in bytes_per_token],
            textposition="outside",
            customdata=list(bytes_per_token),
            hovertemplate="%{x}<br>%{customdata:,} B<extra></extra>",
        )
    )
    fig.update_yaxes(title=y_title, rangemode="tozero")
    return style(fig, title=title, lecture=lecture)


def cache_vs_weights_figure(
    curves: Sequence[CacheCurve],
    weight_bytes: int,
    *,
    title: str,
    x_title: str,
    y_title: str,
    weights_label: str,
    batch_label: str,
    crossing_label: str,
    lecture: bool = False,
) -> go.Figure:
    """Cache bytes against context length for several batch sizes, the weights as a flat line, and a
    marker where each cache passes the weights. Axes are log-scaled: contexts span 256 to 128k tokens."""
    fig = go.Figure()
    for curve in curves:
        fig.add_trace(
            go.Scatter(
                x=curve.tokens,
                y=[b / GIB for b in curve.cache_bytes],
                mode="lines",
                name=batch_label.format(batch=curve.batch),
                hovertemplate="%{x:,} tok · %{y:.2f} GiB<extra></extra>",
            )
        )
    xs = [t for c in curves for t in c.tokens]
    fig.add_trace(
        go.Scatter(
            x=[min(xs), max(xs)],
            y=[weight_bytes / GIB] * 2,
            mode="lines",
            name=weights_label,
            line=dict(color="black", dash="dash"),
        )
    )
    crossed = [c for c in curves if c.crossing_tokens is not None and c.crossing_tokens <= max(xs)]
    fig.add_trace(
        go.Scatter(
            x=[c.crossing_tokens for c in crossed],
            y=[weight_bytes / GIB] * len(crossed),
            mode="markers+text",
            name=crossing_label,
            marker=dict(size=12, color="black", symbol="x"),
            text=[f"{c.crossing_tokens:,}" for c in crossed],
            textposition="top center",
        )
    )
    fig.update_xaxes(title=x_title, type="log", dtick=1)  # one tick per decade: no 2…9 clutter
    fig.update_yaxes(title=y_title, type="log", dtick=1)
    return style(fig, title=title, lecture=lecture, height=420)


def allocation_figure(
    labels: Sequence[str],
    live_bytes: int,
    allocated_bytes: Sequence[int],
    *,
    title: str,
    live_label: str,
    waste_label: str,
    y_title: str,
    lecture: bool = False,
) -> go.Figure:
    """Live vs reserved-but-empty bytes for each allocation scheme, stacked, in the binary unit the largest reads
    best in (`y_title` names it as {unit}); plain tick numbers, never SI suffixes ("2.5B" read as bytes)."""
    unit, size = binary_unit(max(allocated_bytes, default=live_bytes))
    fig = go.Figure(
        [
            go.Bar(x=list(labels), y=[live_bytes / size] * len(labels), name=live_label, marker_color="#1f77b4"),
            go.Bar(
                x=list(labels),
                y=[(a - live_bytes) / size for a in allocated_bytes],
                name=waste_label,
                marker_color="#ff7f0e",
                text=[format_binary(a - live_bytes) for a in allocated_bytes],
                textposition="outside",
            ),
        ]
    )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title=y_title.format(unit=unit), exponentformat="none", tickformat=",~r")
    return style(fig, title=title, lecture=lecture)


def residual_figure(
    residuals: Sequence[Residual],
    terms: Sequence[str],
    *,
    tolerance: float,
    title: str,
    y_title: str,
    named_label: str,
    unnamed_label: str,
    band_label: str,
    lecture: bool = False,
) -> go.Figure:
    """The planner's error per term over real start-up logs: one point per log and term, (predicted − logged) /
    logged in percent, logs that name their flags apart from those that do not, and the ±tolerance band."""
    fig = go.Figure()
    fig.add_hrect(y0=-tolerance * 100, y1=tolerance * 100, fillcolor="#2ca02c", opacity=0.12, line_width=0)
    for named, label, color, symbol in ((True, named_label, "#1f77b4", "circle"),
                                        (False, unnamed_label, "#ff7f0e", "diamond-open")):
        rows = [r for r in residuals if r.named == named]
        fig.add_trace(go.Scatter(
            x=[r.term for r in rows], y=[r.difference * 100 for r in rows], mode="markers", name=label,
            marker=dict(color=color, size=10, symbol=symbol), text=[r.log for r in rows],
            hovertemplate="%{text}<br>%{x}: %{y:+.1f}%<extra></extra>",
        ))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=band_label,
                             marker=dict(color="#2ca02c", opacity=0.3, size=12, symbol="square")))
    fig.update_xaxes(categoryorder="array", categoryarray=list(terms))
    fig.update_yaxes(title=y_title, zeroline=True, zerolinecolor="#767676", ticksuffix="%")
    fig.update_layout(legend=dict(orientation="h", y=-0.15))
    return style(fig, title=title, lecture=lecture, height=400)
