"""Figures of a server's KV cache as its events draw it (Serving Engine): the prefix tree of cached blocks and the
blocks stored and removed per second. Data in (kvviz.serving.kv_tree's chains and rate rows), Plotly figure out;
every visible word arrives in `labels`."""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from kvviz.charts.base import LECTURE_MAX_HEIGHT, legend_below, style
from kvviz.i18n import fill

# a medium's colour (vLLM's MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE); the medium is also written in each box
MEDIA_COLORS = {"GPU": "#1f77b4", "CPU": "#ff7f0e", "STORAGE": "#2ca02c"}
MIXED, ROOT, UNKNOWN = "#9467bd", "#e8e8e8", "#cfcfcf"
STORED, REMOVED = "#2ca02c", "#d62728"


def first_tokens(chain: dict, max_chars: int = 60) -> str:
    """A chain's first tokens for its hover: as text where the server detokenized them (`first_text`, quoted,
    line breaks shown as ↵, HTML escaped: Plotly's hover reads tags), else their ids."""
    text = chain.get("first_text")
    if text is None:
        return " ".join(map(str, chain["first_tokens"]))
    text = text.replace("\n", "↵")
    text = text if len(text) <= max_chars else text[:max_chars] + "…"
    return "“" + html.escape(text) + "”"


def tree_chart(chains: Sequence[dict], groups: Sequence[object], labels: Mapping[str, str], *,
               lecture: bool = False, lecture_height: int = LECTURE_MAX_HEIGHT) -> go.Figure:
    """The prefix tree, the prompt's start at the left: one box per chain of blocks (a straight run, kv_tree's
    chains), under its parent; its height is how many cached continuations share it (its leaves), its colour and
    text its medium; a root per KV-cache group (the prompt's start), and "?" for blocks whose parent is not
    cached."""
    ids, parents, values, texts, colors, hovers = [], [], [], [], [], []
    leaves: dict[str, int] = {}
    for c in chains:
        leaves[c["parent"]] = leaves.get(c["parent"], 0) + c["leaves"]
    for g in groups:  # one root per group (Plotly draws several roots under a blank one): the prompt's start
        for root, name in ((f"g{g}", labels["root"].format(group=g)), (f"?{g}", labels["unknown_parent"])):
            if leaves.get(root):
                ids.append(root)
                parents.append("")
                values.append(leaves[root])
                texts.append(name)
                colors.append(ROOT if root[0] == "g" else UNKNOWN)
                hovers.append(name)
    for c in chains:
        ids.append(c["id"])
        parents.append(c["parent"])
        values.append(c["leaves"])
        texts.append(labels["box"].format(blocks=c["blocks"], tokens=c["tokens"], media=c["media"],
                                          leaves=c["leaves"]))
        colors.append(MEDIA_COLORS.get(c["media"], MIXED))
        start = "?" if c["depth"] is None else c["depth"]
        hovers.append(fill(labels["hover"], hash=c["hash"], start=start, blocks=c["blocks"], tokens=c["tokens"],
                           media=c["media"], copies=c["copies"], leaves=c["leaves"],
                           group=c["group"], first=first_tokens(c)))
    fig = go.Figure(go.Icicle(ids=ids, labels=ids, parents=parents, values=values, text=texts, branchvalues="total",
                              marker=dict(colors=colors, line=dict(color="white", width=1)),
                              tiling=dict(orientation="h"), textinfo="text", hovertext=hovers, hoverinfo="text",
                              pathbar=dict(visible=False),
                              maxdepth=-1, sort=False))
    fig.update_layout(uniformtext=dict(minsize=9, mode="hide"))
    fig = style(fig, title=labels["title"], lecture=lecture, height=420, lecture_height=lecture_height)
    fig.update_layout(margin=dict(l=4, r=4, b=4))
    return fig


def rates_chart(rows: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False,
                lecture_height: int = LECTURE_MAX_HEIGHT) -> go.Figure:
    """Blocks stored (up) and removed (down) in each second of the server's clock, from the first second shown."""
    t0 = rows[0]["t"] if rows else 0
    xs = [r["t"] - t0 for r in rows]
    fig = go.Figure()
    fig.add_bar(x=xs, y=[r["stored"] for r in rows], name=labels["stored"], marker_color=STORED)
    fig.add_bar(x=xs, y=[-r["removed"] for r in rows], name=labels["removed"], marker_color=REMOVED,
                marker_pattern_shape="/")  # colour is not the only carrier: removed bars are hatched, and below 0
    fig.update_layout(barmode="relative")
    fig.update_xaxes(title_text=labels["x"])
    fig.update_yaxes(title_text=labels["y"])
    fig = style(fig, title=labels["title"], lecture=lecture, height=300, lecture_height=lecture_height)
    return legend_below(fig, lecture=lecture)
