"""Figures of the step-by-step decode (Home and Reusing Past K/V): data in, plotly Figure out. The cache grid is
Speculative Decoding's too, with the one rule of which layers it draws on a projector (`grid_layers`).

Every user-visible string comes in as an argument (the pages pass them translated).
"""
from __future__ import annotations

import html
import zlib
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from kvviz.charts.base import fit_labels, legend_below, style
from kvviz.i18n import SR_ONLY
from kvviz.lessons.work import CumulativeWork, PassWork

# Each at least 3:1 on the grid's track and on white (WCAG 1.4.11), and apart from the others under simulated
# deuteranopia, protanopia and tritanopia (tests/charts/test_palettes.py); the grid also marks draft and rejected
# positions with a pattern and the newest with its label, so colour is never the only carrier.
PREFILL_COLOR, STEP_COLOR, NEWEST_COLOR = "#88909c", "#3b6fd8", "#b35900"
DRAFT_COLOR = "#a05195"  # speculative decoding: K/V an early-exit draft wrote into the target's shared layers
REJECTED_COLOR = "#e5484d"  # positions a verify pass wrote and the rollback then removed
MAX_TICKS = 48
LECTURE_HEIGHT = 290  # px: under the decode page's controls, a two-line token strip and the tabs, at 1280×720


def _position_axis(labels: Sequence[str], max_ticks: int = MAX_TICKS) -> dict:
    """Numeric positions with token labels (a categorical axis would merge repeated tokens), at most `max_ticks`."""
    n = len(labels)
    every = max(1, -(-n // max(1, max_ticks)))
    vals = list(range(0, n, every))
    return dict(tickmode="array", tickvals=vals, ticktext=[labels[i] for i in vals])


def decode_loop_dot(steps: Sequence[str], loop_label: str, *, lecture: bool = False) -> str:
    """The decode loop as Graphviz DOT: prefill → cache → new Q/K/V → append → attend → next token → repeat.

    Two rows of three boxes, not one row of six: the drawing is scaled to the page's width, and a single row
    shrank its text to ~8 px at 1400 px. Row one is the prefill and the first step, row two the rest of the loop.
    """
    nodes = []
    for i, text in enumerate(steps):
        fill = "#ffe2b3" if i == 0 else ("#dfe9ff" if i < len(steps) - 1 else "#d8f5dc")
        nodes.append(f'  s{i} [label="{_dot_escape(text)}", fillcolor="{fill}"];')
    half = (len(steps) + 1) // 2
    rows = [f"  {{rank=same; {' '.join(f's{i}' for i in range(start, min(start + half, len(steps))))}}}"
            for start in (0, half)]
    edges = [f"  s{i} -> s{i + 1};" for i in range(len(steps) - 1)]
    # Invisible verticals stack row two under row one: a grid of three columns, not a staircase of five.
    edges += [f"  s{i} -> s{i + half} [style=invis];" for i in range(len(steps) - half)]
    # The loop closes from the next token back to "new token's Q/K/V": prefill runs once.
    edges.append(f'  s{len(steps) - 1} -> s2 [label="{_dot_escape(loop_label)}", style=dashed, constraint=false];')
    size = 20 if lecture else 16
    return "\n".join([
        "digraph decode {",
        '  rankdir=TB; bgcolor="transparent"; nodesep=0.5; ranksep=0.6;',
        f'  node [shape=box, style="rounded,filled", fontname="Noto Sans CJK KR, sans-serif", fontsize={size},'
        ' margin="0.2,0.1"];',
        f'  edge [fontname="Noto Sans CJK KR, sans-serif", fontsize={size - 2}];',
        *nodes,
        *rows,
        *edges,
        "}",
    ])


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _segments(row: Sequence[int], newest: int, kinds: Sequence[str] | None = None
              ) -> list[tuple[int, int, str, int, int]]:
    """Runs of one colour in a row: (first position, last position, kind, first pass, last pass)."""
    def kind(pos: int, p: int) -> str:
        if kinds is not None:
            return kinds[pos]
        return "prefill" if p == 0 else ("newest" if p == newest else "step")

    out: list[tuple[int, int, str, int, int]] = []
    for pos, p in enumerate(row):
        k = kind(pos, p)
        if out and out[-1][2] == k:
            a, _, _, pa, _ = out[-1]
            out[-1] = (a, pos, k, pa, p)
        else:
            out.append((pos, pos, k, p, p))
    return out


# The cache grid's K or V row at full height and the gap under it.
GRID_ROW_PX, GRID_GAP_PX = 22, 2
# On a projector the K/V rows share what the buttons, the token strip and the tabs leave of a 720 px screen: the
# shipped model's 4 layers (8 rows, 192 px) end Reusing Past K/V's Cache growth at ~655 px.
LECTURE_GRID_PX = 200


def grid_layers(n_layers: int, *, lecture: bool, keep: Sequence[int] = ()) -> list[int]:
    """Which layers the cache grid draws, one rule for every page that draws it. On a page, all of them (it scrolls).
    On a projector (1280×720), as many as fit LECTURE_GRID_PX at full height, a K and a V row each (4): the first,
    the last and the rest evenly between, each layer of `keep` (what the lesson is about: the early exit's last
    shared layer and the next) in place of the nearest of those between. SmolLM2's 30 layers drew 60 rows, 1,903 px."""
    fit = max(2, LECTURE_GRID_PX // (2 * (GRID_ROW_PX + GRID_GAP_PX)))
    if not lecture or n_layers <= fit:
        return list(range(n_layers))
    chosen = {round(i * (n_layers - 1) / (fit - 1)) for i in range(fit)}
    fixed = {0, n_layers - 1} | {k for k in keep if 0 <= k < n_layers}
    for k in sorted(fixed - chosen):
        free = [c for c in chosen if c not in fixed]
        if free:
            chosen.remove(min(free, key=lambda c: (abs(c - k), c)))
        chosen.add(k)
    return sorted(chosen)


_GRID_COLORS = {"prefill": PREFILL_COLOR, "step": STEP_COLOR, "newest": NEWEST_COLOR,
                "draft": f"radial-gradient(circle,#fff 0 1.5px,transparent 2px) 0 0/6px 6px,{DRAFT_COLOR}",
                "rejected": f"repeating-linear-gradient(45deg,{REJECTED_COLOR} 0 4px,#ffd6d7 4px 8px)"}


def _short(label: str, n: int = 12) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def cache_grid_html(
    written: Sequence[Sequence[int]],
    labels: Sequence[str],
    *,
    title: str,
    x_title: str,
    legend: Sequence[str],
    hover: str,
    lecture: bool = False,
    kinds: Sequence[Sequence[str]] | None = None,
    legend_kinds: Sequence[str] = ("prefill", "step", "newest"),
    layer_names: Sequence[str] | None = None,
    rows_px: int | None = None,
    title_help: str = "",
    legend_help: Sequence[str] = (),
) -> str:
    """The per-layer cache as an HTML grid: one K row and one V row per layer, a column per cached position.

    Cell colour = the pass that wrote the position (grey prefill, blue earlier steps, orange the newest).
    Runs of one colour are drawn as one block whose width is their share of the row, so 500+ positions stay
    visible (a Plotly heatmap's sub-pixel cells with gaps vanish); thin white column separators are drawn
    while there are few enough columns to see them. Every row is labelled, and the newest column's token is
    always labelled (horizontally, in orange). Plain HTML with inline styles: st.html keeps it (it strips
    SVG), and the browser lays it out without a plotting library. `hover` is a template with {row},
    {position} and {pass_}.

    `kinds` (per layer, per position) overrides the colour the pass gives: speculative decoding draws the draft's
    writes ("draft") and the rolled-back positions ("rejected", striped); `legend` names each of `legend_kinds`;
    `layer_names` labels the rows (default L0, L1, ...). `rows_px`: the rows' total height at most (a deep model's
    rows thin to fit it, every k-th labelled, so every layer stays on one screen). `title_help`: a tooltip (ⓘ) after
    the title; `legend_help`: each legend entry's tooltip (a projector's short legend keeps the page's words there).
    """
    esc = html.escape
    n = max((len(r) for r in written), default=0)
    # A position with no token text to show (a byte of an unfinished character, a rolled-back slot) is named by
    # its index rather than left without a label.
    labels = list(labels) + [str(i) for i in range(len(labels), n)]
    newest = max((r[-1] for r in written if r), default=0)
    font = 20 if lecture else 13
    # On a projector the spaces between title, rows, ticks and legend are trimmed (20 px): the step idea of
    # Speculative Decoding keeps its grid, strip, legend and a draft model's folded grid on one 720 px screen.
    space = (0, 4, 2, 0) if lecture else (6, 10, 6, 2)
    row_h, gap, thin = GRID_ROW_PX, GRID_GAP_PX, ""
    n_rows = 2 * len(written)
    if rows_px is not None and n_rows * (row_h + gap) > rows_px:
        gap = 1
        row_h = max(2, rows_px // n_rows - gap)
        thin = f"white-space:nowrap;height:{row_h}px;line-height:{row_h}px;"  # a label overflows its thin row
    label_every = -(-int(1.2 * font) // (row_h + gap))  # a label a line of text below the last
    label_w = 5 * font
    share = 100 / max(n, 1)
    rows, drawn = [], set()  # the kinds drawn: each one's colour is said once, in the stylesheet
    said: list[tuple[list[str], list]] = []  # rows with the same runs, said once for all of them (text alternative)
    for layer, row in enumerate(written):
        for kind_i, kind_name in enumerate(("K", "V")):
            name = f"{layer_names[layer] if layer_names else f'L{layer}'} {kind_name}"
            shown = esc(name) if (2 * layer + kind_i) % label_every == 0 else ""
            rows.append(f'<div class="kv-row" data-row="{esc(name)}" data-cached="{len(row)}" style="height:{row_h}px;'
                        f'margin-bottom:{gap}px"><div class="kv-lab">{shown}</div><div class="kv-track">')
            segments = _segments(row, newest, kinds[layer] if kinds is not None else None)
            if said and said[-1][1] == segments:
                said[-1][0].append(name)
            else:
                said.append(([name], segments))
            for a, b, kind, pa, pb in segments:
                drawn.add(kind)
                tip = hover.format(row=name, position=f"{a}" if a == b else f"{a}–{b}",
                                   pass_=f"{pa}" if pa == pb else f"{pa}–{pb}")
                rows.append(f'<div class="kv-seg" data-kind="{kind}" data-from="{a}" data-to="{b}" '
                            f'title="{esc(tip)}" style="width:{(b - a + 1) * share:.4f}%"></div>')
            rows.append("</div></div>")
    # What every row, label and block shares is said once, in the grid's own stylesheet (scoped by a class named
    # after its rules): a Step redraws the whole grid, and SmolLM2's 60 rows were 68 KB of repeated inline styles per
    # Step for the browser to sanitize and parse. Each block keeps its own width, each row its height.
    css = (".G .kv-row{display:flex;align-items:center}"
           f".G .kv-lab{{flex:none;width:{label_w}px;text-align:right;padding-right:8px;box-sizing:border-box;{thin}}}"
           ".G .kv-track{flex:1;position:relative;height:100%;display:flex;background:#f7f8fa}"
           ".G .kv-seg{flex:none;height:100%}"
           + "".join(f'.G .kv-seg[data-kind="{k}"]{{background:{_GRID_COLORS[k]}}}' for k in sorted(drawn)))
    if 1 < n <= 200:  # a white line between columns, while columns are wide enough to show one
        css += (".G .kv-track::after{content:'';position:absolute;inset:0;pointer-events:none;background:"
                f"repeating-linear-gradient(to right,transparent 0,transparent calc(100% / {n} - 1px),"
                f"#fff calc(100% / {n} - 1px),#fff calc(100% / {n}))}}")
    gid = f"{zlib.crc32(css.encode()):08x}"
    css = css.replace(".G ", f".kv-grid[data-css='{gid}'] ")
    out = [f'<div class="kv-grid" data-css="{gid}" data-positions="{n}" style="font-family:ui-monospace,monospace;'
           f'font-size:{font}px;line-height:1.2;color:#31333f"><style>{css}</style>',
           f'<div style="font-family:sans-serif;font-weight:600;font-size:{font + 3}px;margin-bottom:{space[0]}px">'
           f"{esc(title)}"
           + (f' <span class="kv-grid-help" title="{esc(title_help)}" style="cursor:help;color:#6b6f80;'
              f'font-weight:400">ⓘ</span>' if title_help else "") + "</div>",
           _grid_text(said, hover, dict(zip(legend_kinds, legend, strict=True))),
           '<div aria-hidden="true">', *rows, "</div>"]  # the rows are said by the text above, in order
    if n:
        # Position ticks: evenly spaced and horizontal; the newest column always labelled, never overlapped.
        tick_w = 0.62 * font * 13 / 1000 * 100  # a label's share of a ~1000 px wide grid, in %
        every = max(1, -(-n // max(1, int(100 / tick_w))))
        spans = []
        for i in range(0, n, every):
            x = (i + 0.5) * share
            if 100 - x < 1.6 * tick_w:
                continue
            spans.append(f'<span style="position:absolute;left:{x:.3f}%;transform:translateX(-50%);'
                         f'white-space:pre;color:#555">{esc(_short(labels[i]))}</span>')
        spans.append(f'<span class="kv-newest" style="position:absolute;right:0;top:0;white-space:pre;'
                     f'color:#b06000;font-weight:700">▲ {esc(_short(labels[n - 1], 16))}</span>')
        out.append(f'<div aria-hidden="true" style="position:relative;margin-left:{label_w}px;'
                   f'height:{font + space[1]}px;margin-top:{space[3]}px">{"".join(spans)}</div>')
    swatch = "".join(
        f'<span data-kind="{k}" title="{esc(tip)}" style="display:inline-flex;align-items:center;gap:4px;'
        f'margin-right:{12 if lecture else 16}px"><span style="width:{font}px;height:{font}px;'
        f'background:{_GRID_COLORS[k]};display:inline-block;border-radius:2px"></span>{esc(text)}</span>'
        for k, text, tip in zip(legend_kinds, legend, legend_help or legend, strict=True)
    )
    # The legend and the axis's name share one line (a line less between the grid and the next lesson).
    out.append(f'<div style="margin:{space[2]}px 0 0 {label_w}px;font-family:sans-serif;display:flex;flex-wrap:wrap;'
               f'justify-content:space-between;gap:4px 16px"><span class="kv-legend">{swatch}</span>'
               f'<span style="color:#555">{esc(x_title)}</span></div></div>')
    return "".join(out)


def _grid_text(said: Sequence[tuple[list[str], list]], hover: str, names: dict[str, str]) -> str:
    """The grid as a screen reader reads it (WCAG 1.1.1), visually hidden: for each run of rows written alike, the
    rows, then each run of positions in order, in the page's own words (`hover`: {row}, {position}, {pass_}) and the
    legend's name for its colour."""
    esc = html.escape
    items = []
    for rows, segments in said:
        where = rows[0] if len(rows) == 1 else f"{rows[0]} … {rows[-1]} ({len(rows)})"
        # the rows named once, then each run: the hover's words without its {row}
        runs = "; ".join(hover.format(row=where if i == 0 else "", position=f"{a}" if a == b else f"{a}–{b}",
                                      pass_=f"{pa}" if pa == pb else f"{pa}–{pb}").lstrip(" ·")
                         + f" ({names.get(kind, kind)})" for i, (a, b, kind, pa, pb) in enumerate(segments))
        items.append(f"<li>{esc(runs)}</li>")
    return f'<ul class="kv-grid-text" style="{SR_ONLY}">{"".join(items)}</ul>'


def cache_bytes_figure(
    passes: Sequence[int],
    live: Sequence[int],
    allocated: Sequence[int],
    formula: Sequence[int],
    *,
    title: str,
    x_title: str,
    y_title: str,
    names: tuple[str, str, str],
    lecture: bool = False,
) -> go.Figure:
    """Live (measured from the tensors) vs preallocated bytes after each pass, with the formula's bytes."""
    fig = go.Figure([
        go.Scatter(x=list(passes), y=list(allocated), name=names[1], mode="lines",
                   line=dict(dash="dash", color="#767676")),
        go.Scatter(x=list(passes), y=list(live), name=names[0], mode="lines+markers", line=dict(color=STEP_COLOR)),
        go.Scatter(x=list(passes), y=list(formula), name=names[2], mode="markers",
                   marker=dict(symbol="x", size=9, color=NEWEST_COLOR)),
    ])
    fig.update_xaxes(title=x_title, dtick=1 if len(passes) <= 20 else None)
    fig.update_yaxes(title=y_title, rangemode="tozero")
    fig = style(fig, title=title, lecture=lecture, height=380, lecture_height=LECTURE_HEIGHT)
    return legend_below(fig, lecture=lecture)


def kv_values_figure(
    values: np.ndarray, labels: Sequence[str], *, title: str, x_title: str, lecture: bool = False
) -> go.Figure:
    """The real cached K or V of one layer and KV head: positions (rows, growing) × d_head."""
    n, d_head = values.shape
    lim = float(np.abs(values).max()) if values.size else 1.0
    fig = go.Figure(go.Heatmap(
        z=values.tolist(), x=list(range(d_head)), y=list(range(n)), zmin=-lim, zmax=lim,
        colorscale="RdBu_r", hovertemplate="%{y} · d%{x}: %{z:.4f}<extra></extra>",
    ))
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(autorange="reversed")
    fig = style(fig, title=title, lecture=lecture, height=max(260, min(900, 80 + 14 * n)),
                lecture_height=LECTURE_HEIGHT)
    return fit_labels(fig, labels[:n])


def attention_figure(
    rows: np.ndarray,
    labels: Sequence[str],
    head_labels: Sequence[str],
    kv_head_of: Sequence[int],
    *,
    title: str,
    x_title: str,
    lecture: bool = False,
) -> go.Figure:
    """The newest query's attention probabilities: query heads × prefix positions, GQA groups outlined."""
    n_heads, n_keys = rows.shape
    fig = go.Figure(go.Heatmap(
        # zmax = the largest weight, so a spread-out row still shows its structure; the colour bar gives the scale
        z=rows.tolist(), x=list(range(n_keys)), y=list(range(n_heads)), zmin=0, zmax=float(rows.max()),
        colorscale="Viridis",
        hovertemplate="%{y}: %{x} → %{z:.3f}<extra></extra>",
    ))
    # A box around each group of query heads that share one KV head.
    starts = [h for h in range(n_heads) if h == 0 or kv_head_of[h] != kv_head_of[h - 1]]
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else n_heads
        fig.add_shape(type="rect", x0=-0.5, x1=n_keys - 0.5, y0=start - 0.5, y1=end - 0.5,
                      line=dict(color=NEWEST_COLOR, width=2), fillcolor="rgba(0,0,0,0)")
    fig.update_xaxes(title=x_title, **_position_axis(labels[:n_keys]))
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_heads)), ticktext=list(head_labels), autorange="reversed")
    return style(fig, title=title, lecture=lecture, height=max(300, 140 + 36 * n_heads),  # readable head rows
                 lecture_height=LECTURE_HEIGHT)


def step_work_figure(work: PassWork, *, title: str, categories: tuple[str, str], names: tuple[str, str],
                     y_title: str, lecture: bool = False) -> go.Figure:
    """This pass: Q/K/V vectors and attention scores computed with the cache vs recomputed without it."""
    fig = go.Figure([
        go.Bar(x=list(categories), y=[work.cached_qkv, work.cached_scores], name=names[0], marker_color=STEP_COLOR,
               text=[f"{work.cached_qkv:,}", f"{work.cached_scores:,}"], textposition="outside"),
        go.Bar(x=list(categories), y=[work.recompute_qkv, work.recompute_scores], name=names[1],
               marker_color="#767676", text=[f"{work.recompute_qkv:,}", f"{work.recompute_scores:,}"],
               textposition="outside"),
    ])
    fig.update_yaxes(type="log", title=y_title, dtick=1)  # one tick per decade
    fig.update_layout(barmode="group")
    fig = style(fig, title=title, lecture=lecture, height=340, lecture_height=LECTURE_HEIGHT)
    return legend_below(fig, lecture=lecture)


def cumulative_work_figure(
    measured: CumulativeWork,
    analytic_n: Sequence[int],
    analytic_cached: Sequence[int],
    analytic_recompute: Sequence[int],
    *,
    title: str,
    x_title: str,
    y_title: str,
    names: tuple[str, str, str, str],
    lecture: bool = False,
) -> go.Figure:
    """Cumulative attention scores counted from the real passes (markers) on the analytic curves (lines)."""
    fig = go.Figure([
        go.Scatter(x=list(analytic_n), y=list(analytic_recompute), name=names[3], mode="lines",
                   line=dict(color="#767676", dash="dot")),
        go.Scatter(x=list(analytic_n), y=list(analytic_cached), name=names[2], mode="lines",
                   line=dict(color=STEP_COLOR, dash="dot")),
        go.Scatter(x=measured.n_tokens, y=measured.recompute, name=names[1], mode="markers",
                   marker=dict(color="#555", size=8, symbol="square")),
        go.Scatter(x=measured.n_tokens, y=measured.cached, name=names[0], mode="markers",
                   marker=dict(color=NEWEST_COLOR, size=9)),
    ])
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title, rangemode="tozero")
    fig = style(fig, title=title, lecture=lecture, height=380, lecture_height=LECTURE_HEIGHT)
    if lecture:  # half a projector's width: four entries below would take the plot's height; the top left is empty
        fig.update_layout(legend=dict(x=0.01, y=0.99, xanchor="left", yanchor="top", bgcolor="rgba(255,255,255,0.8)",
                                      font=dict(size=14)))
        return fig
    return legend_below(fig, lecture=lecture)


