"""Figures of the Speculative Decoding page: acceptance over the generation, per draft position, cache bytes
through each verify and rollback. Data in (lists the page reads off the engine's events), Plotly figure out;
every visible word arrives in `labels`, translated by the page."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from kvviz.charts.base import LECTURE_MAX_HEIGHT, legend_below, style
from kvviz.charts.decode import DRAFT_COLOR, NEWEST_COLOR, REJECTED_COLOR, STEP_COLOR

ACCEPTED_COLOR = "#009e73"  # apart from REJECTED_COLOR under deuteranopia too (tests/charts/test_palettes.py)
BYTES_LABELS = ("peak", "live", "formula", "draft", "step", "bytes")  # the words bytes_figure takes (and "title")


def acceptance_figure(series: Mapping[str, Sequence], labels: Mapping[str, str], *, lecture: bool = False
                      ) -> go.Figure:
    """Per step: drafted tokens kept (green) and rejected (red) as stacked bars, tokens emitted (markers), and the
    mean acceptance length so far as vLLM defines it (line)."""
    steps = list(series["step"])
    fig = go.Figure([
        go.Bar(x=steps, y=list(series["accepted"]), name=labels["accepted"], marker_color=ACCEPTED_COLOR),
        go.Bar(x=steps, y=list(series["rejected"]), name=labels["rejected"], marker_color=REJECTED_COLOR),
        go.Scatter(x=steps, y=list(series["emitted"]), name=labels["emitted"], mode="markers",
                   marker=dict(symbol="diamond", size=10, color=NEWEST_COLOR)),
        go.Scatter(x=steps, y=list(series["mean_length"]), name=labels["mean_length"], mode="lines",
                   line=dict(color=STEP_COLOR, width=3)),
    ])
    fig.update_layout(barmode="stack", legend=dict(orientation="h", x=0, y=-0.25, yanchor="top"), margin_b=120)
    fig.update_xaxes(title=labels["step"], dtick=1 if len(steps) <= 30 else None)
    fig.update_yaxes(title=labels["tokens"], rangemode="tozero")
    fig = style(fig, title=labels["title"], lecture=lecture, height=400)
    return legend_below(fig, lecture=lecture, page=False)  # at −0.25 it sat on the short plot's x title


def per_position_figure(rates: Sequence[float | None], labels: Mapping[str, str], *, lecture: bool = False,
                        lecture_height: int = LECTURE_MAX_HEIGHT) -> go.Figure:
    """vLLM's per-position acceptance rate: the share of drafting steps that kept a token at draft position i."""
    xs = list(range(1, len(rates) + 1))
    ys = [r if r is not None else 0 for r in rates]
    fig = go.Figure(go.Bar(x=xs, y=ys, marker_color=ACCEPTED_COLOR,
                           text=["—" if r is None else f"{r:.0%}" for r in rates], textposition="outside"))
    fig.update_xaxes(title=labels["position"], dtick=1)
    fig.update_yaxes(title=labels["rate"], range=[0, 1.15], tickformat=".0%")
    return style(fig, title=labels["title"], lecture=lecture, height=340, lecture_height=lecture_height)


def bytes_figure(steps: Sequence[int], peak: Sequence[int], live: Sequence[int], formula: Sequence[int],
                 draft: Sequence[int], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """Target cache bytes right after each verify (rejected positions still there) and after its rollback (live,
    read off the tensors) with the formula's bytes for the positions kept; the draft model's own cache."""
    data = [
        go.Scatter(x=list(steps), y=list(peak), name=labels["peak"], mode="lines+markers",
                   line=dict(color=REJECTED_COLOR, dash="dot")),
        go.Scatter(x=list(steps), y=list(live), name=labels["live"], mode="lines+markers", line=dict(color=STEP_COLOR)),
        go.Scatter(x=list(steps), y=list(formula), name=labels["formula"], mode="markers",
                   marker=dict(symbol="x", size=9, color=NEWEST_COLOR)),
    ]
    if any(draft):
        data.append(go.Scatter(x=list(steps), y=list(draft), name=labels["draft"], mode="lines+markers",
                               line=dict(color=DRAFT_COLOR)))
    fig = go.Figure(data)
    fig.update_layout(legend=dict(orientation="h", x=0, y=-0.25, yanchor="top"), margin_b=120)
    fig.update_xaxes(title=labels["step"], dtick=1 if len(steps) <= 30 else None)
    fig.update_yaxes(title=labels["bytes"], rangemode="tozero")
    fig = style(fig, title=labels["title"], lecture=lecture, height=380)
    return legend_below(fig, lecture=lecture, page=False)  # at −0.25 it sat on the short plot's x title
