"""Figures of what the heads attend to: the attention-sink heatmap, induction heads, the loss on a repeat."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from kvviz.charts.base import style


def sink_heatmap(share: np.ndarray, *, title: str, x_title: str, y_title: str, hover: str,
                 lecture: bool = False) -> go.Figure:
    """[layers, heads] share of attention on position 0, in percent; layer 0 at the bottom as in a stack."""
    n_layers, n_heads = share.shape
    fig = go.Figure(go.Heatmap(
        z=share * 100, x=list(range(n_heads)), y=list(range(n_layers)), zmin=0, zmax=100, colorscale="Viridis",
        colorbar=dict(title="%", thickness=14), hovertemplate=hover + "<extra></extra>",
    ))
    fig.update_xaxes(title=x_title, dtick=1)
    fig.update_yaxes(title=y_title, dtick=1 if n_layers <= 12 else 2)
    return style(fig, title=title, lecture=lecture, height=max(300, min(560, 18 * n_layers + 150)))


def layer_profile(share: np.ndarray, uniform: float, *, title: str, x_title: str, y_title: str, mean_name: str,
                  max_name: str, uniform_name: str, lecture: bool = False) -> go.Figure:
    """Per layer: mean and largest head share on position 0, beside what uniform attention would give."""
    layers = list(range(share.shape[0]))
    fig = go.Figure([
        go.Bar(x=layers, y=share.mean(1) * 100, name=mean_name, marker_color="#636efa"),
        go.Scatter(x=layers, y=share.max(1) * 100, name=max_name, mode="markers", marker=dict(size=9, color="#ef553b")),
        go.Scatter(x=[layers[0] - 0.5, layers[-1] + 0.5], y=[uniform * 100] * 2, name=uniform_name, mode="lines",
                   line=dict(dash="dash", color="#555")),
    ])
    fig.update_xaxes(title=x_title, dtick=1 if len(layers) <= 12 else 2, range=[-0.5, layers[-1] + 0.5])
    fig.update_yaxes(title=y_title, range=[0, 100])
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return style(fig, title=title, lecture=lecture, height=340)


def induction_scatter(prefix: np.ndarray, copying: np.ndarray | None, *, title: str, x_title: str, y_title: str,
                      threshold: float, hover: str, lecture: bool = False) -> go.Figure:
    """Each head a point: prefix matching (x) against OV copying (y), coloured by layer (Olsson et al. 2022 Fig. 3
    style); without copying scores (a model whose weights kvviz does not read) the points sit on y = 0."""
    n_layers, n_heads = prefix.shape
    layer, head = np.divmod(np.arange(prefix.size), n_heads)
    y = copying.ravel() if copying is not None else np.zeros(prefix.size)
    fig = go.Figure(go.Scatter(
        x=prefix.ravel(), y=y, mode="markers", customdata=np.stack([layer, head], axis=1),
        marker=dict(size=9, color=layer, colorscale="Viridis", cmin=0, cmax=max(n_layers - 1, 1),
                    colorbar=dict(title="L", thickness=14), line=dict(width=0.5, color="#333")),
        hovertemplate=hover + "<extra></extra>",
    ))
    fig.add_vline(x=threshold, line_dash="dash", line_color="#767676")
    fig.update_xaxes(title=x_title, range=[-0.02, 1.02])
    fig.update_yaxes(title=y_title, range=[-1.05, 1.05])
    return style(fig, title=title, lecture=lecture, height=380)


def repeat_loss_chart(losses: list[float], n_random: int, *, title: str, x_title: str, y_title: str,
                      boundary: str, lecture: bool = False) -> go.Figure:
    """Per-position loss on random tokens seen twice; the second copy starts at the dashed line."""
    x = list(range(1, len(losses) + 1))  # position i's loss is the prediction of token i
    fig = go.Figure(go.Scatter(x=x, y=losses, mode="lines", line=dict(width=1.5, color="#636efa"),
                               hovertemplate="%{x}: %{y:.2f}<extra></extra>"))
    fig.add_vline(x=n_random, line_dash="dash", line_color="#ef553b", annotation_text=boundary,
                  annotation_position="top")
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title, rangemode="tozero")
    return style(fig, title=title, lecture=lecture, height=340)
