"""Figures of the Moving the Cache page: the tiers and what each holds, TTFT with a load vs a recompute, the
break-even of loading against recomputing, the handoff timeline.

Data in (plain rows from kvviz.engine.offload and kvviz.kv.transfer), Plotly figure out; every visible word
arrives in `labels`, translated by the page.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from kvviz.charts.base import legend_below, style
from kvviz.i18n import fill

TIER_COLORS = {"memory": "#3182bd", "disk": "#e6550d", "computed": "#bdbdbd", "empty": "#f4f4f4"}
DOC_COLORS = {"A": "#6baed6", "A*": "#9e9ac8", "B": "#74c476", "C": "#fd8d3c"}
LINK_DASH = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot", "solid")


def _doc(label: str) -> str:
    return label.rstrip("0123456789")


def tier_boxes(device: Sequence[tuple[str, str]], computed: int, contents: Mapping[str, Sequence[str]],
               capacity: Mapping[str, int], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """Three columns: the device cache of the latest request (its chunks, coloured by the tier each came from, and
    the computed rest), CPU memory and disk (each chunk they hold, oldest at the bottom; empty slots grey)."""
    columns = [labels["device"], labels["memory"], labels["disk"]]
    cells: list[list[tuple[str, str, str]]] = [  # per column: (text, colour, hover)
        [(lab, TIER_COLORS[tier], labels[f"from_{tier}"].format(chunk=lab)) for lab, tier in device]
        + ([(fill(labels["computed_cell"], n=computed), TIER_COLORS["computed"], labels["computed_hover"])]
           if computed else []),
    ]
    for tier in ("memory", "disk"):
        held = [(lab, DOC_COLORS.get(_doc(lab), "#cccccc"), labels["held"].format(chunk=lab)) for lab in contents[tier]]
        empty = [("", TIER_COLORS["empty"], labels["empty_slot"])] * max(capacity[tier] - len(held), 0)
        cells.append(held + empty)
    fig = go.Figure()
    for slot in range(max(len(c) for c in cells) if any(cells) else 0):
        row = [c[slot] if slot < len(c) else ("", "rgba(0,0,0,0)", "") for c in cells]
        fig.add_bar(x=columns, y=[1 if slot < len(c) else 0 for c in cells], text=[r[0] for r in row],
                    marker=dict(color=[r[1] for r in row], line=dict(color="white", width=2)),
                    hovertext=[r[2] for r in row], hoverinfo="text", textposition="inside",
                    insidetextanchor="middle", showlegend=False)
    fig.update_layout(barmode="stack", bargap=0.35)
    fig.update_yaxes(title=labels["chunks"], dtick=1, rangemode="tozero")
    return style(fig, title=labels["tiers_title"], lecture=lecture, height=380)


def ttft_bars(rows: Sequence[Mapping], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """Per request two bars: TTFT through the store (load from memory, load from disk, prefill of the rest,
    stacked) and TTFT recomputing the whole prompt; milliseconds."""
    # on a projector each label upright on two lines: turned 45°, they ran into the legend and off the figure
    x = [f"{r['request']}.{'<br>' if lecture else ' '}{labels['kind_' + r['kind']]}" for r in rows]
    mem = [r["load_s"]["memory"] * 1e3 for r in rows]
    disk = [r["load_s"]["disk"] * 1e3 for r in rows]
    rest = [max(r["ttft_s"] * 1e3 - m - d, 0.0) for r, m, d in zip(rows, mem, disk, strict=True)]
    fig = go.Figure()
    base = [0.0] * len(rows)
    for name, values, color in ((labels["load_memory"], mem, TIER_COLORS["memory"]),
                                (labels["load_disk"], disk, TIER_COLORS["disk"]),
                                (labels["prefill_rest"], rest, "#31a354")):
        fig.add_bar(x=x, y=values, base=base, name=name, offsetgroup="store", marker_color=color,
                    hovertemplate="%{y:.2f} ms<extra>" + name + "</extra>")
        base = [b + v for b, v in zip(base, values, strict=True)]
    fig.add_bar(x=x, y=[r["ttft_recompute_s"] * 1e3 for r in rows], name=labels["recompute"],
                offsetgroup="recompute", marker_color=TIER_COLORS["computed"],
                hovertemplate="%{y:.2f} ms<extra>" + labels["recompute"] + "</extra>")
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=-0.25))
    fig.update_yaxes(title=labels["ms"], rangemode="tozero")
    if lecture:
        fig.update_xaxes(tickangle=0, tickfont_size=14)
    fig = style(fig, title=labels["ttft_title"], lecture=lecture, height=400)
    return legend_below(fig, lecture=lecture, page=False)


def break_even_chart(curves: Mapping[str, Sequence[Mapping]], break_even: Mapping[str, int | None],
                     measured: Sequence[Mapping], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """Load time ÷ recompute time against prompt length, log-log, one line per link: below 1 loading wins. A diamond
    where a link's line crosses 1 for good; this machine's measured ratios (its tiers) as points on the same axes.
    curves: link -> rows {"tokens", "load_s", "recompute_s"}; measured: {"label", "tokens", "ratio", "color"}."""
    fig = go.Figure()
    for i, (name, rows) in enumerate(curves.items()):
        fig.add_scatter(x=[r["tokens"] for r in rows], y=[r["load_s"] / r["recompute_s"] for r in rows],
                        mode="lines", name=name, line=dict(dash=LINK_DASH[i % len(LINK_DASH)], width=2),
                        customdata=[[r["load_s"] * 1e3, r["recompute_s"] * 1e3] for r in rows],
                        hovertemplate=labels["hover"] + f"<extra>{name}</extra>")
        n = break_even.get(name)
        if n is not None and n > 1:
            fig.add_scatter(x=[n], y=[1], mode="markers", showlegend=False, hoverinfo="text",
                            hovertext=fill(labels["break_even_at"], link=name, n=f"{n:,}"),
                            marker=dict(size=12, symbol="diamond", color="#2ca02c", line=dict(color="black", width=1)))
    for m in measured:
        fig.add_scatter(x=[m["tokens"]], y=[m["ratio"]], mode="markers+text", name=m["label"], text=[m["label"]],
                        textposition="middle right", marker=dict(size=13, symbol="circle", color=m["color"],
                                                                  line=dict(color="black", width=1)))
    fig.add_hline(y=1, line=dict(color="black", width=2), annotation_text=labels["even_line"],
                  annotation_position="top left")
    fig.update_xaxes(title=labels["tokens"], type="log")
    fig.update_yaxes(title=labels["ratio"], type="log", exponentformat="power")
    fig.update_layout(legend=dict(orientation="h", y=-0.3))
    return style(fig, title=labels["break_even_title"], lecture=lecture, height=500)


def handoff_timeline(steps: Sequence[Mapping], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """One row per engine: prefill, save, transfer, restore, first decode step laid end to end (ms), bytes on the
    transfer. steps: {"engine", "phase", "seconds", "text"} in order per engine."""
    colors = {"prefill": "#31a354", "save": "#756bb1", "transfer": "#e6550d", "restore": "#3182bd",
              "decode": "#636363"}
    fig = go.Figure()
    ends: dict[str, float] = {}
    shown: set[str] = set()
    for s in steps:
        start = ends.get(s["engine"], 0.0)
        ms = s["seconds"] * 1e3
        fig.add_bar(y=[s["engine"]], x=[ms], base=[start], orientation="h", name=labels["phase_" + s["phase"]],
                    marker_color=colors[s["phase"]], text=[s.get("text", "")], textposition="inside",
                    showlegend=s["phase"] not in shown, legendgroup=s["phase"],
                    hovertemplate=f"{labels['phase_' + s['phase']]}: %{{x:.3f}} ms<extra>{s['engine']}</extra>")
        shown.add(s["phase"])
        ends[s["engine"]] = start + ms
    fig.update_layout(barmode="overlay", legend=dict(orientation="h", y=-0.3))
    fig.update_xaxes(title=labels["ms"])
    return style(fig, title=labels["handoff_title"], lecture=lecture, height=300)
