"""Figures of the Serving Engine page: data in, Plotly figure out; every visible word arrives in `labels`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.charts.base import LECTURE_MAX_HEIGHT, legend_below, style
from kvviz.charts.kv_events import REMOVED, STORED

# Okabe & Ito's colour-blind-safe hues (darkened where a line needs 3:1 on white): tests/charts/test_palettes.py
TTFT, TPOT, THROUGHPUT, FIT = "#d55e00", "#0072b2", "#009e73", "#555555"
GAUGE_COLORS = {"kv_usage": "#cc79a7", "running": TPOT, "waiting": TTFT}
DASH = {"median": "solid", "p90": "dash", "p99": "dot"}
MS = 1e3
LECTURE_LEGEND_PX = 14  # a legend's type in lecture mode: one row over a short plot (at 18 px eight entries took two)


def _ms(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else v * MS for v in values]


def _lecture_legend(fig: go.Figure, lecture: bool, rows: int = 1) -> go.Figure:
    """In lecture mode the legend in compact rows over the plots (at −0.25 it sat on a short plot's x title)."""
    if lecture:
        fig.update_layout(legend_font_size=LECTURE_LEGEND_PX)
    return legend_below(fig, lecture=lecture, rows=rows, page=False)


def load_chart(points: Sequence[dict], x: Sequence[str], labels: Mapping[str, str], *,
               lecture: bool = False, lecture_height: int = LECTURE_MAX_HEIGHT) -> go.Figure:
    """Per point (x: its concurrency or request rate, as text): TTFT and TPOT median (solid), p90 (dashed) and
    p99 (dotted) in ms; output tokens/s, and requests/s with goodput on the right axis."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(labels["latency"], labels["throughput"]),
                        specs=[[{}, {"secondary_y": True}]])
    for metric, color in (("ttft", TTFT), ("tpot", TPOT)):
        for stat, dash in DASH.items():
            key = f"{stat}_{metric}_ms"
            if any(key in p for p in points):
                fig.add_scatter(x=list(x), y=[p.get(key) for p in points], mode="lines+markers",
                                marker_color=color, line=dict(dash=dash), name=labels[f"{metric}_{stat}"],
                                row=1, col=1)
    fig.add_scatter(x=list(x), y=[p["output_throughput"] for p in points], mode="lines+markers",
                    marker_color=THROUGHPUT, name=labels["tokens_per_s"], row=1, col=2)
    fig.add_scatter(x=list(x), y=[p["request_throughput"] for p in points], mode="lines+markers",
                    marker_color=FIT, name=labels["requests_per_s"], row=1, col=2, secondary_y=True)
    if any(p.get("request_goodput") is not None for p in points):
        fig.add_scatter(x=list(x), y=[p.get("request_goodput") for p in points], mode="lines+markers",
                        marker=dict(color="#ff7f0e", symbol="diamond"), name=labels["goodput"], row=1, col=2,
                        secondary_y=True)
    fig.update_xaxes(title_text=labels["x"], type="category")
    fig.update_yaxes(title_text=labels["y_ms"], rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=labels["y_tps"], rangemode="tozero", row=1, col=2, secondary_y=False)
    fig.update_yaxes(title_text=labels["y_rps"], rangemode="tozero", row=1, col=2, secondary_y=True)
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return _lecture_legend(style(fig, title=labels["title"], lecture=lecture, height=420,
                                 lecture_height=lecture_height), lecture)


def request_timeline(requests: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False,
                     lecture_height: int = LECTURE_MAX_HEIGHT, rates: Sequence[dict] | None = None,
                     x_max_ms: float | None = None) -> go.Figure:
    """One row per request of a point, on its clock: waiting in the client for a free slot (grey, open loop with
    a concurrency cap), waiting for its first token (red), then streaming (blue). `rates`: the server's blocks
    stored (up) and removed (down, hatched) per second on the same clock (kvviz.serving.kv_run.run_rates, bins by
    their middles and widths), drawn under it on the same x axis, [0, x_max_ms]; their words in labels "stored",
    "removed", "rates_y"."""
    below = rates is not None
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.08) \
        if below else go.Figure()
    at = {"row": 1, "col": 1} if below else {}
    ok = [r for r in requests if r.get("ttft_s") is not None]
    ys = [str(i + 1) for i in range(len(ok))]
    queued = [r.get("queue_s") or 0.0 for r in ok]
    if any(q > 0.001 for q in queued):
        fig.add_bar(y=ys, x=[q * MS for q in queued], base=[r["arrival_s"] * MS for r in ok], orientation="h",
                    marker_color="#bbbbbb", name=labels["queue"], **at)
    fig.add_bar(y=ys, x=[r["ttft_s"] * MS for r in ok], base=[r["start_s"] * MS for r in ok], orientation="h",
                marker_color=TTFT, name=labels["ttft"], **at)
    fig.add_bar(y=ys, x=[(r["e2e_s"] - r["ttft_s"]) * MS for r in ok],
                base=[(r["start_s"] + r["ttft_s"]) * MS for r in ok], orientation="h", marker_color=TPOT,
                name=labels["decode"], **at)
    fig.update_layout(barmode="overlay", legend=dict(orientation="h", y=1.08))
    fig.update_yaxes(title_text=labels["y"], autorange="reversed", showticklabels=len(ok) <= 40, **at)
    height = max(300, min(700, 14 * len(ok) + 150))
    if below:
        xs = [r["t_s"] * MS for r in rates]
        width = [r["width_s"] * MS for r in rates]
        fig.add_bar(x=xs, y=[r["stored"] for r in rates], width=width, name=labels["stored"],
                    marker_color=STORED, row=2, col=1)
        fig.add_bar(x=xs, y=[-r["removed"] for r in rates], width=width, name=labels["removed"],
                    marker_color=REMOVED, marker_pattern_shape="/", row=2, col=1)  # hatched, and below 0
        fig.update_yaxes(title_text=labels["rates_y"], row=2, col=1)
        fig.update_xaxes(title_text=labels["x"], row=2, col=1)
        height += 160
    else:
        fig.update_xaxes(title_text=labels["x"])
    if x_max_ms is not None:
        fig.update_xaxes(range=[0, x_max_ms])
    return style(fig, title=labels["title"], lecture=lecture, height=height, lecture_height=lecture_height)


def metrics_chart(samples: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False,
                  lecture_height: int = LECTURE_MAX_HEIGHT) -> go.Figure:
    """The server's own gauges over the run (samples: {"t_s", "gauges": {field: {label set: value}}}): KV-cache
    use (%), running and waiting requests. One line per label set, never a sum (two engines at 25% and 75% are
    not one at 100%); series the server does not export are left out (unknown, not zero)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(labels["cache"], labels["requests"]))
    series: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for s in samples:
        for name, by_label in (s.get("gauges") or {}).items():
            for label, value in by_label.items():
                xs, ys = series.setdefault((name, label), ([], []))
                xs.append(s["t_s"])
                ys.append(value * 100 if name == "kv_usage" else value)
    per_field: dict[str, int] = {}
    for name, _ in series:
        per_field[name] = per_field.get(name, 0) + 1
    for (name, label), (xs, ys) in series.items():
        if name not in GAUGE_COLORS:
            continue
        text = labels[name] + (f" · {label}" if per_field[name] > 1 else "")
        fig.add_scatter(x=xs, y=ys, mode="lines", name=text, line=dict(color=GAUGE_COLORS[name], shape="hv"),
                        row=1, col=1 if name == "kv_usage" else 2)
    for (xaxis, yaxis), names in (((fig.layout.xaxis, fig.layout.yaxis), ("kv_usage",)),
                                  ((fig.layout.xaxis2, fig.layout.yaxis2), ("running", "waiting"))):
        if not any(name in names for name, _ in series):
            # in paper coordinates: plotly.js draws no axes for a subplot without traces, so an "x domain"
            # reference to one lands elsewhere in the browser
            fig.add_annotation(text=labels["not_exported"], showarrow=False, xref="paper", yref="paper",
                               xanchor="center", yanchor="middle",
                               x=sum(xaxis.domain) / 2, y=sum(yaxis.domain) / 2)
    fig.update_xaxes(title_text=labels["x"])
    fig.update_yaxes(title_text=labels["y_pct"], rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=labels["y_count"], rangemode="tozero", row=1, col=2)
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return _lecture_legend(style(fig, title=labels["title"], lecture=lecture, height=380,
                                 lecture_height=lecture_height), lecture)


def prefix_chart(rows: Sequence[dict], labels: Mapping[str, str], *, lecture: bool = False,
                 lecture_height: int = LECTURE_MAX_HEIGHT) -> go.Figure:
    """Per trial: TTFT of the cold, warm (shared prefix) and control requests; the saving (control − warm) by the
    client's clock and the server's, with the median over trials; and cached vs predicted tokens."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=(labels["ttft"], labels["saving"], labels["cached"]))
    colors = {"cold": "#bbbbbb", "warm": THROUGHPUT, "control": TTFT}
    for kind, color in colors.items():
        mine = [r for r in rows if r["request"] == kind]
        fig.add_bar(x=[r["trial"] for r in mine], y=_ms([r["ttft_s"] for r in mine]), marker_color=color,
                    name=labels[kind], row=1, col=1)
    trials = sorted({r["trial"] for r in rows})
    for key, name, color, symbol in (("ttft_s", "saving_client", TPOT, "circle"),
                                     ("server_prefill_s", "saving_server", "#ff7f0e", "diamond")):
        saved = []
        for t in trials:
            pair = {r["request"]: r[key] for r in rows if r["trial"] == t}
            ok = pair.get("control") is not None and pair.get("warm") is not None
            saved.append((pair["control"] - pair["warm"]) * MS if ok else None)
        if any(v is not None for v in saved):
            fig.add_scatter(x=trials, y=saved, mode="markers", marker=dict(color=color, symbol=symbol, size=11),
                            name=labels[name], row=1, col=2)
    fig.add_hline(y=0, line=dict(color=FIT, width=1), row=1, col=2)
    warm = [r for r in rows if r["request"] == "warm"]
    fig.add_bar(x=[r["trial"] for r in warm], y=[r["cached_tokens"] for r in warm], marker_color=THROUGHPUT,
                name=labels["measured"], row=1, col=3)
    fig.add_scatter(x=[r["trial"] for r in warm], y=[r["predicted_cached_tokens"] for r in warm], mode="markers",
                    marker=dict(symbol="line-ew-open", size=30, line=dict(width=3, color="#000000")),
                    name=labels["predicted"], row=1, col=3)
    fig.update_xaxes(title_text=labels["x"], dtick=1)
    fig.update_yaxes(title_text=labels["y_ms"], rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=labels["y_ms"], row=1, col=2)
    fig.update_yaxes(title_text=labels["y_tokens"], rangemode="tozero", row=1, col=3)
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=-0.25))
    return _lecture_legend(style(fig, title=labels["title"], lecture=lecture, height=400,
                                 lecture_height=lecture_height), lecture, rows=2)  # seven entries
