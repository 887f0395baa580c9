"""Figures of the Paged Blocks & Prefix Sharing page: pool, block tables, usage, fragmentation, hit savings.

Data in (the engine's BlockView / RequestView / PoolSample / Fragmentation values), Plotly figure out; every
visible word arrives in `labels`, translated by the page.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from kvviz.charts.base import style

LECTURE_HEIGHT = 330  # px: under the page's buttons, idea stepper and metrics, at 1280×720

if TYPE_CHECKING:  # a chart takes the measurement; it does not import the engine (and torch) to draw it
    from kvviz.engine.paged.demo import HitSaving

# free, cached-but-free (evictable), used by 1, shared by 2, by 3, by 4 or more, the null block (vLLM's block 0)
COLORS = ("#eeeeee", "#9ecae1", "#fdd0a2", "#fd8d3c", "#e6550d", "#a63603", "#636363")
CATEGORY_KEYS = ("free", "cached", "used1", "shared2", "shared3", "shared4", "null")
NULL = 6
# Each category's mark in its cells and its legend entry, so that sharing is read without the colour (WCAG 1.4.1):
# cached-but-free blocks ↺, a block shared by N requests ×N; free, used by one and the null block need none.
MARKS = ("", "↺", "", "×2", "×3", "×4+", "")
HIT = "#009e73"  # Okabe & Ito's green and vermilion: apart under every simulated colour-vision deficiency
PREEMPT = "#d55e00"
KIB = 1024
STATUS_KEYS = ("running", "waiting", "preempted", "arriving", "finished")
# The words (label keys) pool_grid and block_tables take, and pool_usage's.
FIGURE_LABELS = ("free", "cached", "used1", "shared2", "shared3", "shared4", "null", "hover_block", "hover_table",
                 "row", "logical", "hit_boundary", "pool_title", "tables_title", "label_shared", "label_own",
                 "released", "hover_released") + tuple(f"status_{s}" for s in STATUS_KEYS)
USAGE_LABELS = ("used", "cached", "free", "preempted", "step", "blocks", "usage_title")


def category(state: str, ref_count: int) -> int:
    """0 free, 1 cached-but-free, 2 + min(sharers, 4) − 1 for a block in use, 6 the null block."""
    if state == "null":
        return NULL
    if state == "free":
        return 0
    if state == "cached":
        return 1
    return 1 + min(ref_count, 4)


def status_key(request: Any) -> str:
    """running | waiting | preempted (waiting to be recomputed) | arriving | finished."""
    return "preempted" if request.status == "waiting" and request.n_preemptions else request.status


def _colorscale() -> list[list[Any]]:
    n = len(COLORS)
    scale = []
    for k, c in enumerate(COLORS):
        scale += [[k / n, c], [(k + 1) / n, c]]
    return scale


def _heatmap(z: list[list[float | None]], text: list[list[str]], hover: list[list[str]], x: list[Any],
             y: list[Any]) -> go.Heatmap:
    return go.Heatmap(z=z, x=x, y=y, text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text",
                      colorscale=_colorscale(), zmin=-0.5, zmax=len(COLORS) - 0.5, showscale=False, xgap=3, ygap=3)


def _legend(fig: go.Figure, labels: Mapping[str, str], keys: Sequence[int]) -> None:
    for k in keys:  # a heatmap has no legend: one square marker per colour stands in
        fig.add_scatter(x=[None], y=[None], mode="markers", name=_marked(labels[CATEGORY_KEYS[k]], k),
                        marker=dict(symbol="square", size=14, color=COLORS[k], line=dict(color="#999", width=1)))


def _marked(text: str, k: int) -> str:
    return f"{text} {MARKS[k]}" if MARKS[k] else text


def _filled(n_filled: int, block_size: int) -> str:
    return "" if n_filled >= block_size else f"<br>{n_filled}/{block_size}"


def pool_grid(blocks: Sequence[Any], block_size: int, labels: Mapping[str, str], *, columns: int = 16,
              lecture: bool = False) -> go.Figure:
    """Every physical block, coloured by state and by how many requests share it; a partial block shows its fill."""
    rows = max(1, math.ceil(len(blocks) / columns))
    z: list[list[float | None]] = [[None] * columns for _ in range(rows)]
    text = [[""] * columns for _ in range(rows)]
    hover = [[""] * columns for _ in range(rows)]
    for b in blocks:
        r, c = divmod(b.block_id, columns)
        z[r][c] = category(b.state, b.ref_count)
        text[r][c] = _marked(f"{b.block_id}", z[r][c]) + (_filled(b.n_filled, block_size) if b.state == "used" else "")
        owners = ", ".join(f"R{o}" for o in b.owners) or "—"
        hover[r][c] = labels["hover_block"].format(block=b.block_id, state=labels[CATEGORY_KEYS[z[r][c]]],
                                                   refs=b.ref_count, filled=b.n_filled, size=block_size,
                                                   owners=owners)
    fig = go.Figure(_heatmap(z, text, hover, list(range(columns)), list(range(rows))))
    _legend(fig, labels, range(len(COLORS)))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_layout(legend=dict(orientation="h", y=-0.02, yanchor="top"), plot_bgcolor="white")
    return style(fig, title=labels["pool_title"], lecture=lecture, height=120 + 42 * rows,
                 lecture_height=LECTURE_HEIGHT)


def block_tables(requests: Sequence[Any], blocks: Sequence[Any], block_size: int, labels: Mapping[str, str], *,
                 lecture: bool = False) -> go.Figure:
    """One row per request: logical block j → the physical block it points to (the number in the cell), coloured
    by sharing; the green bar is the hit boundary (blocks left of it came from the prefix cache)."""
    by_id = {b.block_id: b for b in blocks}
    width = max([max(len(r.block_table), r.n_released) for r in requests] + [1])
    names = [labels["row"].format(id=r.request_id, label=labels.get(f"label_{r.label}", r.label),
                                  status=labels[f"status_{status_key(r)}"]) for r in requests]
    z: list[list[float | None]] = []
    text, hover = [], []
    for r in requests:
        zr: list[float | None] = [None] * width
        tr, hr = [""] * width, [""] * width
        for j in range(r.n_released):  # freed and maybe taken by others since: no physical id to read as sharing
            zr[j], tr[j] = 0, labels["released"]
            hr[j] = labels["hover_released"].format(logical=j, id=r.request_id)
        for j, pb in enumerate(r.block_table):
            b = by_id[pb]
            zr[j] = category(b.state, b.ref_count)
            n_in = min(block_size, max(r.n_computed - j * block_size, 0))
            tr[j] = _marked(f"{pb}", zr[j]) + _filled(n_in, block_size)
            hr[j] = labels["hover_table"].format(logical=j, physical=pb, refs=b.ref_count, filled=n_in,
                                                 size=block_size)
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    fig = go.Figure(_heatmap(z, text, hover, list(range(width)), names))
    for idx, r in enumerate(requests):
        if r.cached_tokens and r.block_table:
            x = r.cached_tokens / block_size - 0.5
            fig.add_shape(type="line", x0=x, x1=x, y0=idx - 0.5, y1=idx + 0.5, line=dict(color=HIT, width=5))
    fig.add_scatter(x=[None], y=[None], mode="lines", name=labels["hit_boundary"], line=dict(color=HIT, width=5))
    _legend(fig, labels, range(2, NULL))  # a block table holds only blocks in use
    fig.update_xaxes(title_text=labels["logical"], dtick=1, range=[-0.5, width - 0.5])
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(legend=dict(orientation="h", y=1.02, yanchor="bottom"), plot_bgcolor="white")
    return style(fig, title=labels["tables_title"], lecture=lecture, height=160 + 34 * max(len(requests), 1),
                 lecture_height=LECTURE_HEIGHT)


def pool_usage(history: Sequence[Any], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """Blocks in use, cached-but-free and free after each step, one stacked bar per step (a filled area needs two
    steps before it shows anything: at step 1 the chart was empty); a red mark where a request was preempted."""
    x = [h.step for h in history]
    fig = go.Figure()
    for key, attr, color in (("used", "used", COLORS[4]), ("cached", "cached_free", COLORS[1]),
                             ("free", "free", "#cccccc")):
        fig.add_bar(x=x, y=[getattr(h, attr) for h in history], name=labels[key], marker_color=color)
    fig.update_layout(barmode="stack", bargap=0.05)
    marks = [(h.step, h.used + h.cached_free + h.free, ", ".join(f"R{i}" for i in h.preempted))
             for h in history if h.preempted]
    if marks:
        fig.add_scatter(x=[m[0] for m in marks], y=[m[1] for m in marks], mode="markers+text",
                        text=[m[2] for m in marks], textposition="top center", name=labels["preempted"],
                        marker=dict(symbol="x", size=12, color=PREEMPT))
    fig.update_xaxes(title_text=labels["step"])
    top = max((h.used + h.cached_free + h.free for h in history), default=1)
    fig.update_yaxes(title_text=labels["blocks"], range=[0, top * 1.15])
    return style(fig, title=labels["usage_title"], lecture=lecture, height=400, lecture_height=LECTURE_HEIGHT)


def fragmentation_bars(frag: Any, labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """The same running requests' K/V: held tokens, paged with sharing, paged without, contiguous max-length."""
    rows = [("live", frag.live_bytes, "#636363"), ("paged", frag.paged_bytes, COLORS[4]),
            ("paged_unshared", frag.paged_unshared_bytes, COLORS[2]), ("contiguous", frag.contiguous_bytes, "#6baed6")]
    fig = go.Figure(go.Bar(
        y=[labels[k] for k, _, _ in rows], x=[v / KIB for _, v, _ in rows], orientation="h",
        marker_color=[c for _, _, c in rows],
        text=[labels["bar_text"].format(kib=f"{v / KIB:,.0f}", waste=f"{(v - frag.live_bytes) / v:.0%}" if v else "—")
              for _, v, _ in rows],
        textposition="auto"))
    fig.update_xaxes(title_text=labels["kib"], rangemode="tozero")
    fig.update_yaxes(autorange="reversed")
    return style(fig, title=labels["frag_title"], lecture=lecture, height=300, lecture_height=LECTURE_HEIGHT)


def saving_text(h: HitSaving, labels: Mapping[str, str]) -> str:
    """"saved 0.4 ms", or "within noise (±0.2 ms)" when the two timings differ by less than repeated runs do."""
    if h.measurable:
        return labels["saved"].format(ms=f"{h.saved_s * 1e3:.1f}")
    return labels["saved_noise"].format(noise=f"{h.noise_s * 1e3:.1f}")


def hit_savings(rows: Sequence[tuple[int, HitSaving]], labels: Mapping[str, str], *,
                lecture: bool = False) -> go.Figure:
    """Per request that hit: the measured prefill of its whole prompt vs of the part after the hit (ms); a saving
    within the timing noise is labelled so, not given a sign it does not have."""
    names = [f"R{r}" for r, _ in rows]
    fig = go.Figure()
    fig.add_bar(x=names, y=[h.full_s * 1e3 for _, h in rows], name=labels["full"], marker_color="#9e9e9e")
    fig.add_bar(x=names, y=[h.with_hit_s * 1e3 for _, h in rows], name=labels["with_hit"], marker_color=HIT,
                text=[saving_text(h, labels) for _, h in rows], textposition="outside")
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    fig.update_yaxes(title_text=labels["ms"], rangemode="tozero")
    return style(fig, title=labels["savings_title"], lecture=lecture, lecture_height=LECTURE_HEIGHT)
