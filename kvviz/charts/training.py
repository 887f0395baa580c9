"""Figures of the Training · Prefill · Decode page: data in, Plotly figure out (labels come from the page)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.charts.base import fit_labels, legend_below, style

K_COLOR, V_COLOR = "#1f77b4", "#d55e00"  # V: a line at least 3:1 on white (tests/charts/test_palettes.py)
PREFILL_COLOR, DECODE_COLOR = "#7f7f7f", "#2ca02c"


FLOOR = 1e-10  # where a log axis draws an exact zero
MAX_TOKEN_LABELS = 24  # beyond this, tick labels overlap: plain position numbers instead


def _token_axis(tokens: Sequence[str]) -> dict:
    # Numeric positions with token text as tick labels: repeated tokens must stay separate rows/columns.
    if len(tokens) > MAX_TOKEN_LABELS:
        return dict(tickmode="auto")
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)]
    return dict(tickmode="array", tickvals=list(range(len(tokens))), ticktext=labels)


def mask_figure(
    tokens: Sequence[str], causal: bool, *, title: str, key_axis: str, query_axis: str, allowed: str, masked: str,
    lecture: bool = False,
) -> go.Figure:
    """Which key (column) each query (row) may attend to: the lower triangle under the causal mask, all without."""
    n = len(tokens)
    grid = np.tril(np.ones((n, n))) if causal else np.ones((n, n))
    fig = go.Figure(go.Heatmap(
        z=grid, zmin=0, zmax=1, colorscale=[[0, "#f0f0f0"], [1, "#3b6fb6"]], showscale=False, xgap=1, ygap=1,
        customdata=np.where(grid > 0, allowed, masked),
        hovertemplate=f"{query_axis} %{{y}} → {key_axis} %{{x}}: %{{customdata}}<extra></extra>",
    ))
    fig.update_xaxes(title=key_axis, **_token_axis(tokens))
    fig.update_yaxes(title=query_axis, autorange="reversed", **_token_axis(tokens))
    style(fig, title=title, lecture=lecture, height=420)
    return fit_labels(fig, _token_axis(tokens)["ticktext"]) if len(tokens) <= MAX_TOKEN_LABELS else fig


def _dim_ticks(d_head: int) -> dict:
    # Whole dimensions only (a d_head of 2 must not read −0.5 … 1.5), at most ~8 labels.
    return dict(tick0=0, dtick=max(1, -(-d_head // 8)), range=[-0.5, d_head - 0.5])


def kv_side_by_side(
    parallel: np.ndarray, sequential: np.ndarray, tokens: Sequence[str], *, titles: Sequence[str], position_axis: str,
    dim_axis: str, lecture: bool = False,
) -> go.Figure:
    """One head's K (or V) [T, d_head] from both paths, and their absolute difference, stacked (one shared x axis).

    Stacked rather than side by side: three titles over three narrow columns overlapped at any page width. In
    lecture mode, where the chart has the screen's width but not its height, side by side (positions down).
    """
    diff = np.abs(parallel - sequential)
    lim = float(max(np.abs(parallel).max(), np.abs(sequential).max()))
    if lecture:
        return _kv_abreast(parallel, sequential, diff, lim, tokens, titles=titles, position_axis=position_axis,
                           dim_axis=dim_axis)
    fig = make_subplots(rows=3, cols=1, subplot_titles=list(titles), shared_xaxes=True, vertical_spacing=0.11)
    for row, z in ((1, parallel), (2, sequential)):
        fig.add_trace(go.Heatmap(z=z.T, zmin=-lim, zmax=lim, colorscale="RdBu", showscale=False,
                                 hovertemplate="%{x}, %{y}: %{z:.6f}<extra></extra>"), row, 1)
    # The difference gets its own scale from 0: any nonzero entry would stand out.
    fig.add_trace(go.Heatmap(z=diff.T, zmin=0, zmax=max(float(diff.max()), 1e-12), colorscale="Greys",
                             colorbar=dict(len=0.28, y=0.13, x=1.02, tickformat=".0e"),
                             hovertemplate="%{x}, %{y}: %{z:.3e}<extra></extra>"), 3, 1)
    ticks = _token_axis(tokens)
    for row in (1, 2, 3):
        fig.update_xaxes(title=position_axis if row == 3 else None, **ticks, row=row, col=1)
        fig.update_yaxes(title=dim_axis if row == 2 else None, **_dim_ticks(parallel.shape[1]), row=row, col=1)
    style(fig, lecture=lecture, height=540)
    fig.update_layout(margin_t=75)  # subplot titles sit under the always-visible toolbar
    return fig


def _kv_abreast(parallel: np.ndarray, sequential: np.ndarray, diff: np.ndarray, lim: float, tokens: Sequence[str], *,
                titles: Sequence[str], position_axis: str, dim_axis: str) -> go.Figure:
    """kv_side_by_side for a projector: the three heatmaps side by side, positions down, dimensions across."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=list(titles), shared_yaxes=True, horizontal_spacing=0.04)
    for col, z in ((1, parallel), (2, sequential)):
        fig.add_trace(go.Heatmap(z=z, zmin=-lim, zmax=lim, colorscale="RdBu", showscale=False,
                                 hovertemplate="%{y}, %{x}: %{z:.6f}<extra></extra>"), 1, col)
    fig.add_trace(go.Heatmap(z=diff, zmin=0, zmax=max(float(diff.max()), 1e-12), colorscale="Greys",
                             colorbar=dict(tickformat=".1e"),
                             hovertemplate="%{y}, %{x}: %{z:.3e}<extra></extra>"), 1, 3)
    for col in (1, 2, 3):
        fig.update_xaxes(title=dim_axis if col == 2 else None, **_dim_ticks(parallel.shape[1]), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(title=position_axis, row=1, col=1)
    style(fig, lecture=True, height=400)
    fig.update_layout(margin_t=75)  # subplot titles sit under the always-visible toolbar
    labels = _token_axis(tokens)
    return fit_labels(fig, labels["ticktext"]) if "ticktext" in labels else fig


def logits_diff_figure(
    diffs: Sequence[float], n_prompt: int, tolerance: float, *, title: str, x_title: str, y_title: str,
    prefill_name: str, decode_name: str, tolerance_name: str, lecture: bool = False,
) -> go.Figure:
    """max |Δlogits| per position on a log axis, prefill positions and decode steps apart, under the rounding line.

    An exact 0 cannot sit on a log axis: it is drawn at FLOOR and its hover says 0.
    """
    positions = np.arange(len(diffs))
    values = np.asarray(diffs, dtype=float)
    fig = go.Figure()
    for name, color, sel in ((prefill_name, PREFILL_COLOR, positions < n_prompt),
                             (decode_name, DECODE_COLOR, positions >= n_prompt)):
        fig.add_trace(go.Bar(x=positions[sel], y=np.maximum(values[sel], FLOOR), name=name, marker_color=color,
                             customdata=values[sel], hovertemplate="%{x}: %{customdata:.3e}<extra></extra>"))
    # A trace rather than add_hline: hline annotations land at the wrong height on a log axis.
    fig.add_trace(go.Scatter(x=[-0.5, len(values) - 0.5], y=[tolerance, tolerance], mode="lines", name=tolerance_name,
                             line=dict(color="#d62728", dash="dash"), hoverinfo="skip"))
    top = max(tolerance, float(values.max(initial=0.0)))
    fig.update_yaxes(title=y_title, type="log", range=[np.log10(FLOOR), np.log10(top) + 0.7], exponentformat="power")
    fig.update_xaxes(title=x_title)
    fig.update_layout(legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"))
    # on a projector the verdict stands above it and a two-line caption below: 345 px ran that screen to 723 px
    return style(fig, title=title, lecture=lecture, height=300, lecture_height=320)


def drift_figure(
    k_diff: Sequence[float], v_diff: Sequence[float], y_max: float, tolerance: Sequence[float] | None = None, *,
    title: str, x_title: str, y_title: str, k_name: str, v_name: str, tolerance_name: str = "",
    lecture: bool = False,
) -> go.Figure:
    """Per layer, how far the past positions' K and V moved when one token was appended, on a log axis.

    Log, because the causal change (~1e-7, rounding) and the bidirectional one (~1) differ by six orders of
    magnitude: on a linear axis the former is invisible. An exact 0 sits at FLOOR (its label says 0). The range is
    fixed by `y_max` (both modes), so switching shows bars grow rather than rescale; each layer's rounding
    tolerance is drawn as a dashed step.
    """
    layers = [str(i) for i in range(len(k_diff))]  # 0-based, as model.layers.0 and the decode page count
    fig = go.Figure()
    for name, color, diffs in ((k_name, K_COLOR, k_diff), (v_name, V_COLOR, v_diff)):
        # Only an exact zero is labelled (it has no bar); other values are in the hover and the metrics above.
        fig.add_trace(go.Bar(x=layers, y=[max(d, FLOOR) for d in diffs], name=name, marker_color=color,
                             text=["0" if d == 0 else "" for d in diffs], textposition="outside",
                             customdata=list(diffs), hovertemplate="%{x}: %{customdata:.3e}<extra></extra>"))
    top = max(y_max, *(tolerance or [0.0]), FLOOR * 10)
    if tolerance is not None:
        fig.add_trace(go.Scatter(x=layers, y=list(tolerance), name=tolerance_name, mode="lines+markers",
                                 line=dict(color="#d62728", dash="dash", shape="hvh"),
                                 marker=dict(symbol="line-ew-open", size=24, color="#d62728"),
                                 hovertemplate="%{x}: %{y:.2e}<extra></extra>"))
    fig.update_yaxes(title=y_title, type="log", range=[np.log10(FLOOR), np.log10(top) + 1], exponentformat="power")
    fig.update_xaxes(title=x_title, type="category")
    fig.update_layout(barmode="group")
    # The legend under the axis title: above the plot its three entries wrapped onto the chart's title.
    return legend_below(style(fig, title=title, lecture=lecture, height=400), lecture=lecture)


def attention_figure(
    probs: np.ndarray, tokens: Sequence[str], *, title: str, key_axis: str, query_axis: str, new_row: str,
    past_rows: str, lecture: bool = False,
) -> go.Figure:
    """One head's causal attention [T, T]: past queries' rows dimmed, the newest query's row outlined.

    Colour is log10(probability): row i of a causal matrix spreads over i + 1 keys, so a linear scale would show
    only the first rows. Masked entries (exactly 0) are left blank, which draws the causal triangle.
    """
    n = probs.shape[0]
    with np.errstate(divide="ignore"):
        logp = np.where(probs > 0, np.log10(np.maximum(probs, 1e-30)), np.nan)
    low = min(-3.0, float(np.floor(np.nanmin(logp))))
    ticks = list(range(int(low), 1))
    fig = go.Figure(go.Heatmap(
        z=logp, zmin=low, zmax=0, colorscale="Viridis", customdata=probs,
        colorbar=dict(len=0.8, tickvals=ticks, ticktext=[f"{10.0 ** t:g}" for t in ticks]),
        hovertemplate=f"{query_axis} %{{y}} → {key_axis} %{{x}}: %{{customdata:.4f}}<extra></extra>",
    ))
    if n > 1:
        fig.add_shape(type="rect", x0=-0.5, x1=n - 0.5, y0=-0.5, y1=n - 1.5, fillcolor="white", opacity=0.55,
                      line_width=0)
        fig.add_annotation(x=n / 2, y=(n - 2) / 2, text=past_rows, showarrow=False, font=dict(color="#333"))
    fig.add_shape(type="rect", x0=-0.5, x1=n - 0.5, y0=n - 1.5, y1=n - 0.5, line=dict(color="#d62728", width=3))
    fig.add_annotation(x=0, y=n - 1, text=new_row, showarrow=False, xanchor="left", yanchor="bottom", yshift=10,
                       font=dict(color="#d62728"), bgcolor="rgba(255,255,255,0.8)")
    fig.update_xaxes(title=key_axis, range=[-0.5, n - 0.5], **_token_axis(tokens))
    fig.update_yaxes(title=query_axis, range=[n - 0.5, -0.5], **_token_axis(tokens))  # row 0 on top
    return style(fig, title=title, lecture=lecture, height=460)


def decode_row_figure(
    decode_row: np.ndarray, full_row: np.ndarray, tokens: Sequence[str], *, title: str, x_title: str,
    decode_name: str, full_name: str, lecture: bool = False,
) -> go.Figure:
    """The row a decode step computes next to the last row of the full matrix: the same numbers."""
    x = list(range(len(tokens)))
    fig = go.Figure([
        go.Bar(x=x, y=list(decode_row), name=decode_name, marker_color="#d62728"),
        go.Scatter(x=x, y=list(full_row), name=full_name, mode="markers",
                   marker=dict(color="black", symbol="x", size=8)),
    ])
    fig.update_xaxes(title=x_title, **_token_axis(tokens))
    fig.update_layout(legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"))
    return style(fig, title=title, lecture=lecture, height=280)
