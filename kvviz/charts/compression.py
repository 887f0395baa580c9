"""Figures for the Compressing the Cache page: memory saved vs quality lost, kept positions, attention rows."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from kvviz.charts.base import style
from kvviz.kv.formats import KV_DTYPES

# Okabe & Ito's colour-blind-safe hues (darkened where a line needs 3:1 on white): tests/charts/test_palettes.py
FAMILY_COLORS = {"evict": "#0072b2", "quantize": "#d55e00", "share": "#009e73"}
# Markers of the eviction and head-sharing methods; a stored KV format's marker is its table entry's.
SYMBOLS = {"window": "square", "streaming": "diamond", "h2o": "circle", "snapkv": "triangle-up",
           "gqa": "hexagon", "mqa": "pentagon"}
FLOOR = 1e-6  # a log axis cannot show 0: smaller values sit on this floor (the table gives the exact number)


def symbol(method: str) -> str:
    """A method's marker: its own, or, for a stored KV format, the one its entry in KV_DTYPES gives."""
    fmt = KV_DTYPES.get(method)
    return fmt.stored.marker if fmt is not None and fmt.stored is not None else SYMBOLS[method]


def tradeoff_figure(rows: Sequence[dict], *, metric: str, family_names: dict[str, str], x_title: str,
                    y_title: str, title: str, lecture: bool = False) -> go.Figure:
    """One marker per method: x = share of KV bytes saved (what the cache actually kept, not its budget), y =
    quality lost (KL, or top-1 disagreement). A method that left the cache whole is drawn hollow. Each row says its
    family (Quality.to_dict: evict, quantize or share)."""
    fig = go.Figure()
    for fam, color in FAMILY_COLORS.items():
        for r in (r for r in rows if r["family"] == fam):  # one legend entry per method, grouped by family
            y = max(FLOOR, r["kl_divergence"] if metric == "kl" else 1 - r["top1_agreement"])
            marker = symbol(r["method"]) + ("-open" if r.get("left_whole") else "")
            fig.add_trace(go.Scatter(
                x=[r["memory_saved"]], y=[y], mode="markers", name=r["label"], legendgroup=fam,
                legendgrouptitle=dict(text=family_names[fam]),
                marker=dict(size=13, color=color, symbol=marker),
                customdata=[[r["perplexity"], r["kv_bytes"], r["n_cached"]]],
                hovertemplate=f"{r['label']}<br>saved %{{x:.1%}}<br>%{{y:.4g}}<br>ppl %{{customdata[0]:.3f}}"
                              "<br>%{customdata[1]:,} B · %{customdata[2]} positions<extra></extra>"))
    fig.update_xaxes(title=x_title, tickformat=".0%", range=[-0.05, 1.0])
    fig.update_yaxes(title=y_title, type="log")
    # A legend taller than the plot scrolls inside a clipped box (entries hidden): the figure grows to hold every
    # entry and family title, at a legend font a little smaller than the axes'. A row is ~1.65 font sizes
    # (measured in Chromium: 16 rows at 13 px took 347 px).
    legend_px = 12  # on a projector 13 px rows ran the figure below a 720 px screen once KIVI-2 made 17 rows
    n_rows = len(rows) + len({r["family"] for r in rows})
    fig = style(fig, title=title, lecture=lecture, height=440)
    fig.update_layout(legend=dict(font=dict(size=legend_px), grouptitlefont=dict(size=legend_px), tracegroupgap=6))
    margin = fig.layout.margin
    fig.update_layout(height=max(fig.layout.height, int(margin.t + margin.b + 1.65 * legend_px * n_rows + 6 * 3 + 30)))
    return fig


def kept_share(kept: np.ndarray, n_positions: int) -> np.ndarray:
    """Share of KV heads ([H_kv, n_kept] original positions) that keep each position 0..n_positions-1."""
    counts = np.zeros(n_positions)
    for row in kept:
        counts += np.bincount(row[row < n_positions], minlength=n_positions)[:n_positions]
    return counts / max(1, kept.shape[0])


def kept_strip_figure(labels: Sequence[str], shares: Sequence[np.ndarray], *, x_title: str, title: str,
                      lecture: bool = False) -> go.Figure:
    """Rows = methods, columns = token positions; shade = share of KV heads that keep the position."""
    z = np.vstack(shares)
    fig = go.Figure(go.Heatmap(z=z, x=np.arange(z.shape[1]), y=list(labels), zmin=0, zmax=1,
                               colorscale="Blues", showscale=False, xgap=0, ygap=2,
                               hovertemplate="%{y}<br>position %{x}: %{z:.0%}<extra></extra>"))
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(autorange="reversed")
    # On a projector the strip has the screen's height below the idea stepper (its choices stand beside it): a row
    # per method stays taller than its 18 px label.
    return style(fig, title=title, lecture=lecture, height=max(220, 34 * len(labels) + 120), lecture_height=500)


def attention_row_figure(full: tuple[np.ndarray, np.ndarray], comp: tuple[np.ndarray, np.ndarray], *,
                         full_name: str, comp_name: str, x_title: str, y_title: str, title: str,
                         lecture: bool = False) -> go.Figure:
    """The newest query's attention (mean over heads) at each position the cache holds, full vs compressed."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=full[0], y=full[1], mode="lines", name=full_name, line=dict(color="#7f7f7f")))
    fig.add_trace(go.Scatter(x=comp[0], y=comp[1], mode="markers", name=comp_name,
                             marker=dict(size=5, color="#d62728")))
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title, type="log")
    # On a projector the row has the screen's height below the idea stepper (its choices stand beside it).
    return style(fig, title=title, lecture=lecture, height=380, lecture_height=460)


def attention_by_position(kept: np.ndarray, attention: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over query heads of the attention each original position receives. kept [H_kv, n] positions per KV
    head, attention [n_heads, n] (query heads grouped under KV heads in order). Positions not kept by any
    head are absent."""
    h_kv, n = kept.shape
    g = attention.shape[0] // h_kv
    total: dict[int, float] = {}
    for kv in range(h_kv):
        probs = attention[kv * g : (kv + 1) * g].sum(0)
        for pos, p in zip(kept[kv].tolist(), probs.tolist(), strict=False):
            total[pos] = total.get(pos, 0.0) + p
    xs = np.array(sorted(total))
    return xs, np.array([total[x] / attention.shape[0] for x in xs])
