"""Figures of the Serving Engine page: data in, Plotly figure out; every visible word arrives in `labels`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.charts.base import style

TTFT, TPOT, THROUGHPUT, FIT = "#d62728", "#1f77b4", "#2ca02c", "#7f7f7f"
MS = 1e3


def _ms(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else v * MS for v in values]


def concurrency_chart(rows: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """TTFT and TPOT p50 (solid) and p90 (dotted) in ms, and output tokens/s, against concurrency."""
    x = [r["concurrency"] for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(labels["latency"], labels["throughput"]))
    for key, color in (("ttft", TTFT), ("tpot", TPOT)):
        fig.add_scatter(x=x, y=_ms([r[f"{key}_p50_s"] for r in rows]), mode="lines+markers", marker_color=color,
                        name=labels[f"{key}_p50"], row=1, col=1)
        fig.add_scatter(x=x, y=_ms([r[f"{key}_p90_s"] for r in rows]), mode="lines+markers", marker_color=color,
                        line=dict(dash="dot"), name=labels[f"{key}_p90"], row=1, col=1)
    fig.add_scatter(x=x, y=[r["output_tokens_per_s"] for r in rows], mode="lines+markers", marker_color=THROUGHPUT,
                    name=labels["tokens_per_s"], row=1, col=2)
    fig.update_xaxes(title_text=labels["x"], type="log", dtick=0.30103)
    fig.update_yaxes(title_text=labels["y_ms"], rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=labels["y_tps"], rangemode="tozero", row=1, col=2)
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return style(fig, title=labels["title"], lecture=lecture, height=400)


def request_timeline(requests: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """One row per request: waiting for its first token (red), then streaming (blue), on the run's clock."""
    fig = go.Figure()
    ok = [r for r in requests if r.get("ttft_s") is not None]
    ys = [f"c{r['concurrency']}·{i + 1}" for i, r in enumerate(ok)]
    fig.add_bar(y=ys, x=[r["ttft_s"] * MS for r in ok], base=[r["start_s"] * MS for r in ok], orientation="h",
                marker_color=TTFT, name=labels["ttft"])
    fig.add_bar(y=ys, x=[(r["e2e_s"] - r["ttft_s"]) * MS for r in ok],
                base=[(r["start_s"] + r["ttft_s"]) * MS for r in ok], orientation="h", marker_color=TPOT,
                name=labels["decode"])
    fig.update_layout(barmode="overlay", legend=dict(orientation="h", y=1.08))
    fig.update_xaxes(title_text=labels["x"])
    fig.update_yaxes(title_text=labels["y"], autorange="reversed", showticklabels=len(ok) <= 40)
    return style(fig, title=labels["title"], lecture=lecture, height=max(300, min(700, 14 * len(ok) + 150)))


def metrics_chart(samples: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """The server's own gauges over the run: KV-cache use and prefix hit rate (%), running/waiting requests,
    preemptions. Series the server does not export are left out (unknown, not zero)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(labels["cache"], labels["requests"]))
    t = [s["t_s"] for s in samples]

    def series(key: str, scale: float = 1.0) -> list | None:
        values = [s.get(key) for s in samples]
        return None if all(v is None for v in values) else [None if v is None else v * scale for v in values]

    for key, color, scale in (("kv_usage", "#9467bd", 100), ("prefix_hit_rate", "#8c564b", 100)):
        if (y := series(key, scale)) is not None:
            fig.add_scatter(x=t, y=y, mode="lines", name=labels[key], line=dict(color=color), row=1, col=1)
    for key, color in (("running", TPOT), ("waiting", TTFT), ("preemptions", "#ff7f0e")):
        if (y := series(key)) is not None:
            fig.add_scatter(x=t, y=y, mode="lines", name=labels[key], line=dict(color=color, shape="hv"), row=1, col=2)
    fig.update_xaxes(title_text=labels["x"])
    fig.update_yaxes(title_text=labels["y_pct"], rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=labels["y_count"], rangemode="tozero", row=1, col=2)
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return style(fig, title=labels["title"], lecture=lecture, height=380)


def prefix_chart(rows: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False) -> go.Figure:
    """Per trial: TTFT of the cold, warm (shared prefix) and control requests; and cached vs predicted tokens."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(labels["ttft"], labels["cached"]))
    colors = {"cold": "#bbbbbb", "warm": THROUGHPUT, "control": TTFT}
    for kind, color in colors.items():
        mine = [r for r in rows if r["request"] == kind]
        fig.add_bar(x=[r["trial"] for r in mine], y=_ms([r["ttft_s"] for r in mine]), marker_color=color,
                    name=labels[kind], row=1, col=1)
    warm = [r for r in rows if r["request"] == "warm"]
    fig.add_bar(x=[r["trial"] for r in warm], y=[r["cached_tokens"] for r in warm], marker_color=THROUGHPUT,
                name=labels["measured"], row=1, col=2)
    fig.add_scatter(x=[r["trial"] for r in warm], y=[r["predicted_cached_tokens"] for r in warm], mode="markers",
                    marker=dict(symbol="line-ew-open", size=30, line=dict(width=3, color="#000000")),
                    name=labels["predicted"], row=1, col=2)
    fig.update_xaxes(title_text=labels["x"], dtick=1)
    fig.update_yaxes(title_text=labels["y_ms"], rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=labels["y_tokens"], rangemode="tozero", row=1, col=2)
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=-0.25))
    return style(fig, title=labels["title"], lecture=lecture, height=380)
