"""What the Compressing the Cache page draws: the session keys it keeps (`CC`), the run's settings (`choices`,
`Choices`), the run and Cancel buttons with the background run (`run_buttons`), its progress and time left
(`progress`), the last results (`measured`, with the settings they were `measured_with`), each method's name in the
user's language (`method_name`), memory saved against quality (`tradeoff_view`) and the kept positions
and attention rows (`positions_view`), each drawn from the lecturer's choices on a lecture room follower's page; what
the lecturer's page publishes to the room (`room_view`: the measured rows, the step and layer on screen) and the
follower's page drawn from it (`follow`). The budgets and steps come from kvviz.compression.quality. The engine's
modules (torch) are imported inside the functions: the page imports this module before its first screen is drawn."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from typing import Any

import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import idea_title
from kvviz.app.room.explore import explore_from
from kvviz.app.room.view import RoomView
from kvviz.app.state import page_state
from kvviz.app.timing import draw_then_measure
from kvviz.app.url_state import one_of, url_state
from kvviz.app.widgets import chart, persisted, table
from kvviz.charts import compression as charts
from kvviz.errors import InputError
from kvviz.units import format_binary

# The keys the page keeps besides its widgets': the Run press read once, the run under way and the request it was
# started for, its error, a Cancel before any chunk finished, and the last results (request, rows, partial).
CC = page_state("compression", start=False, sweep=None, error=None, empty=None, result=None)
SOURCES = ("held_out", "own")
METRICS = ("kl", "top1")
TICK_S = 0.3  # the fragment's period while the methods run
BUDGET_S = 1.0  # model work per tick, after the progress bar and the time left are drawn


@dataclasses.dataclass(frozen=True)
class Choices:
    """The run the controls ask for: its text and methods, and `request`, what its results are labelled with."""

    source: str
    own: str
    seq_len: int
    n_tokens: int
    methods: list
    request: tuple


# ---- the settings --------------------------------------------------------------------------------------------
def choices(box: Any, backend: Any, *, native: bool, hosted: Any, lecture: bool) -> Choices:
    """The text, chunk, tokens and budgets in `box`, each control's caption when its value was raised."""
    from kvviz.compression import quality
    from kvviz.compression.eviction import SNAPKV_WINDOW

    max_len = backend.spec.max_context
    lengths = [n for n in (128, 256, 512) if n <= max_len] or [max_len]
    with box:  # one above the other in the settings popover
        c1, c2, c3, c4 = [st.container()] * 4 if lecture else st.columns([2, 1, 1, 2])
    source = persisted(c1.radio, url_state("text", "held_out", one_of(SOURCES)), tr("compression.text_source"),
                       options=SOURCES, format_func={s: tr(f"compression.text_{s}") for s in SOURCES}.get,
                       horizontal=True)
    tokens = [256, 512] if hosted is not None else [256, 512, 1024, 2048]  # a shared demo runs less
    seq_len = persisted(c2.selectbox, url_state("seq", lengths[min(1, len(lengths) - 1)], one_of(lengths, int)),
                        tr("compression.seq_len"), options=lengths, help=tr("compression.seq_len_help"))
    default_tokens = quality.page_tokens(backend.spec.n_params)
    n_tokens = persisted(c3.selectbox, url_state("tokens", default_tokens, one_of(tokens, int)),
                         tr("compression.n_tokens"), options=tokens)
    st.session_state.setdefault("compression_budgets", [0.25, 0.5])  # seeded so a language switch keeps the choice
    shares = persisted(c4.multiselect, "compression_budgets", tr("compression.budgets"), options=[0.25, 0.5],
                       format_func=lambda s: f"{s:.0%}", help=tr("compression.budgets_help"))
    own = ""
    if source == "own":
        own = box.text_area(tr("compression.own_text"), key="compression_own_text", height=120, max_chars=200_000)
    budgets, raised = quality.eviction_budgets(shares, seq_len)
    if raised:
        c4.caption(tr("compression.budget_raised", shares=", ".join(f"{s:.0%}" for s in raised), seq_len=seq_len,
                      asked=", ".join(str(round(s * seq_len)) for s in raised), kept=SNAPKV_WINDOW + 1,
                      window=SNAPKV_WINDOW))
    if n_tokens < seq_len:  # whole chunks only: fewer tokens than one chunk still runs one chunk, said here
        c3.caption(tr("compression.tokens_raised", n_tokens=n_tokens, seq_len=seq_len))
    methods = quality.all_methods(budgets, native=native, n_kv_heads=backend.spec.n_kv_heads)
    text_id = hashlib.sha1(own.encode()).hexdigest() if source == "own" else "held_out"
    return Choices(source, own, seq_len, n_tokens, methods,
                   (backend.spec, str(backend.dtype), text_id, seq_len, n_tokens, tuple(budgets)))


def measured_with(r: tuple) -> str:
    """The settings a run was measured with, in words: text, chunk, tokens and budgets."""
    return tr("compression.measured_with", text=tr(f"compression.text_{'held_out' if r[2] == 'held_out' else 'own'}"),
              seq_len=r[3], n_tokens=r[4], budgets=", ".join(map(str, r[5])))


# ---- the run in the background -------------------------------------------------------------------------------
def _start() -> None:
    CC.set("start", True)  # built by run_buttons from this rerun's checked values (a callback sees the last run's)


def _cancel() -> None:
    if CC.get("sweep") is not None:
        CC.get("sweep")[1].cancel()  # a flag: the run stops after the pass under way, keeping every finished chunk


def run_buttons(controls: Any, backend: Any, c: Choices, *, lecture: bool) -> bool:
    """Starts the run Run asked for, draws Run and Cancel; whether a run is under way."""
    from kvviz.compression import quality
    from kvviz.compression.runner import Method

    if CC.pop("start"):
        try:
            from kvviz.engine.sweeps import SweepRun

            text = c.own if c.source == "own" else quality.held_out_text()
            CC.set("sweep", (c.request, SweepRun(quality.evaluation(
                backend, [Method("full"), *c.methods], text, seq_len=c.seq_len, n_tokens=c.n_tokens,
                view_steps=quality.chunk_steps(c.seq_len)[1]))))
        except InputError as exc:
            show_error(exc)
    running = CC.get("sweep") is not None
    buttons = controls if lecture else controls.container(horizontal=True)  # Cancel beside the run button
    buttons.button(tr("compression.run"), type="primary", key="compression_run", on_click=_start, disabled=running)
    if running or not lecture:  # on a projector's narrow row only while it can be pressed
        buttons.button(tr("compression.cancel"), key="compression_cancel", on_click=_cancel,
                       disabled=not running or CC.get("sweep")[1].cancelled)
    return running


def _live(backend: Any) -> None:
    """Draws the progress and the time left, then runs the methods a second per tick; once done or cancelled the
    whole page redraws with what was measured."""
    from kvviz.engine.timing import torch_threads

    if CC.get("sweep") is None:
        return
    asked, run = CC.get("sweep")

    def draw() -> None:
        left = run.time_left
        st.progress(run.progress, text=tr("compression.progress", done=run.done, total=run.sweep.total,
                                          left=tr("compression.time_left", seconds=round(left)) if left is not None
                                          else tr("compression.time_left_unknown")))

    def measure() -> None:
        with torch_threads(1 if backend.device.type == "cpu" else None):
            run.advance(BUDGET_S)

    if not run.finished:
        draw_then_measure(draw, measure)
    if run.finished:
        CC.pop("sweep")
        if run.error:
            CC.set("error", run.error)
        elif run.rows:  # the rows of every method that finished a chunk; a Cancel keeps them, labelled partial
            partial = (run.done, run.sweep.total, run.sweep.settings - 1) if run.cancelled else None
            CC.set("result", (asked, run.rows, partial))
        else:
            CC.set("empty", (run.done, run.sweep.total))
        st.rerun()


def progress(backend: Any, running: bool) -> None:
    """The run's progress, redrawn on its own while it runs; its error, or a Cancel that left nothing to draw."""
    st.fragment(_live, run_every=TICK_S if running else None)(backend)
    if CC.get("error") is not None:
        show_error(CC.pop("error"))
    if CC.get("empty") is not None:  # cancelled before any chunk was finished: nothing to draw, said so
        done, total = CC.pop("empty")
        st.info(tr("compression.cancelled_empty", done=done, total=total))


# ---- what was measured ---------------------------------------------------------------------------------------
def measured(backend: Any, request: tuple) -> tuple | None:
    """The last results on this model (request, rows, partial), said when they were measured with other settings or
    cancelled; None before any."""
    stored = CC.get("result")
    if stored is None or stored[0][0] != backend.spec:  # nothing measured yet on this model
        return None
    if stored[0] != request:  # the last results stay, labelled with the settings they were measured with
        st.info(tr("compression.settings_changed", run=tr("compression.run"), shown=measured_with(stored[0])))
    if stored[2] is not None:
        partial_note(stored[0][3], stored[1], stored[2])
    return stored


def partial_note(seq_len: int, rows: list, partial: tuple) -> None:
    """A cancelled run's results: each method pooled over the chunks it finished, said so."""
    from kvviz.compression.quality import chunk_steps

    n_prompt = chunk_steps(seq_len)[0]
    done, total, n_methods = partial
    counts = sorted({r.n_predicted // (seq_len - n_prompt) for r in rows})
    st.warning(tr("compression.partial", done=done, total=total, measured=len(rows) - 1, methods=n_methods,
                  chunks="–".join(map(str, dict.fromkeys([counts[0], counts[-1]])))))


def method_name(r: Any) -> str:
    """A method's name in the user's language, with its budget or head count ("window (64)" → "슬라이딩 윈도 (64)")."""
    return tr(f"compression.method_{r.method}") + r.label.removeprefix(r.method)


# ---- the ideas, on the lecturer's page and a room follower's ----------------------------------------------------
def tradeoff_view(full_row: Any, rows: list, names: list[str], seq_len: int, *, run_dtype: str, d_head: int,
                  lecture: bool, picks: dict | None = None) -> dict:
    """Memory saved against quality lost, every method on one chart, with the table, the sink finding and notes.
    `picks`: the deployment's KV dtype and the quality metric as a room follower got them from the lecturer (no box
    of the follower's); None: the boxes. Returns what was drawn with."""
    from kvviz.compression import quality
    from kvviz.compression.eviction import SNAPKV_KERNEL, SNAPKV_WINDOW, STREAMING_SINKS
    from kvviz.compression.quant import K_SCALE_CONSTANT, V_SCALE_CONSTANT
    from kvviz.compression.runner import DEPLOY_DTYPES
    from kvviz.kv.formats import stored_dtype

    n_prompt = quality.chunk_steps(seq_len)[0]
    idea_title(tr("compression.s1_title"))
    # Savings against the KV dtype of a deployment (bfloat16 by default): every dtype's bytes were counted in the
    # run, so changing it redraws without measuring again. On a projector the chart keeps the screen: its choices
    # beside it, the caption, table and findings folded under them.
    if lecture:
        plot, side = st.columns([3, 1])
        k1 = k2 = side
        above = below = side.expander(tr("compression.details"))
    else:
        k1, k2 = st.columns(2)
        above, plot, below = st.container(), st.container(), st.container()
    kv_dtype = picks["kv_dtype"] if picks else persisted(
        k1.selectbox, url_state("kvdtype", "bfloat16", one_of(DEPLOY_DTYPES)), tr("compression.kv_dtype"),
        options=DEPLOY_DTYPES, help=tr("compression.kv_dtype_help"))
    data = [dataclasses.replace(r, kv_dtype=kv_dtype).to_dict() | {"label": name}
            for r, name in zip(rows, names, strict=True)]
    above.caption(tr("compression.s1_caption", n_predicted=full_row.n_predicted, n_chunks=full_row.n_predicted // (
        seq_len - n_prompt), seq_len=seq_len, n_prompt=n_prompt, full_ppl=f"{full_row.full_perplexity:.3f}",
        full_bytes=format_binary(full_row.full_kv_bytes), run_dtype=run_dtype, dtype=kv_dtype))
    metric = picks["metric"] if picks else persisted(
        k2.radio, url_state("metric", "kl", one_of(METRICS)), tr("compression.metric"), options=METRICS,
        horizontal=True, format_func={m: tr(f"compression.metric_{m}") for m in METRICS}.get)
    fams = {f: tr(f"compression.family_{f}") for f in charts.FAMILY_COLORS}
    with plot:
        chart(charts.tradeoff_figure(data, metric=metric, family_names=fams,
                                     x_title=tr("compression.chart_x", dtype=kv_dtype),
                                     y_title=tr(f"compression.chart_{metric}"),
                                     title=tr("compression.chart_saved_title"), lecture=lecture),
              "compression_tradeoff")
    whole = [r["label"] for r in data if r["left_whole"]]
    if whole:
        below.info(tr("compression.left_whole", labels=", ".join(whole), n_prompt=n_prompt))
    with below:
        results = {  # columns: table() builds the DataFrame (no pandas before the page's title)
            tr("compression.table_method"): [tr("compression.full")] + [r["label"] for r in data],
            tr("compression.table_ppl"): [round(full_row.full_perplexity, 3)]
            + [round(r["perplexity"], 3) for r in data],
            tr("compression.table_kl"): [0.0] + [round(r["kl_divergence"], 5) for r in data],
            tr("compression.table_top1"): [1.0] + [round(r["top1_agreement"], 4) for r in data],
            tr("compression.table_kept"): [full_row.full_n_cached] + [r["n_cached"] for r in data],
            tr("compression.table_bytes"): [full_row.full_kv_bytes] + [r["kv_bytes"] for r in data],
            tr("compression.table_formula"): [full_row.formula_bytes] + [r["formula_bytes"] for r in data],
            tr("compression.table_saved", dtype=kv_dtype): ["0%"] + [f"{r['memory_saved']:.1%}" for r in data],
        }
        table(results, "compression_table")
        for v in quality.sink_values(rows):  # StreamingLLM's central finding, as a measured number
            st.markdown(tr("compression.sink_value", budget=v.budget, sinks=STREAMING_SINKS,
                           streaming=f"{v.streaming_perplexity:.2f}", window=f"{v.window_perplexity:.2f}",
                           ratio=f"{v.ratio:.2f}",
                           verdict=tr(f"compression.sink_{v.verdict}", tolerance=f"{quality.SINK_TOLERANCE:.0%}")))
        fp8 = [r for r in data if r["kv_scale"]]  # formats scaled per layer tensor: how each scale was set
        if fp8:
            st.caption(tr("compression.fp8_used", k_const=f"{K_SCALE_CONSTANT:g}", v_const=f"{V_SCALE_CONSTANT:g}",
                          clipped="; ".join(tr("compression.fp8_clipped", label=r["label"], n=r["fp8_clipped"])
                                            for r in fp8)))
        kivi = next((r for r in data if r["group"]), None)
        grouped = [r for r in data if r["group"]]
        if grouped:  # every KIVI format as it ran: its G and R (KIVI-2 keeps its own R)
            st.caption(tr("compression.kivi_used", runs="; ".join(
                tr("compression.kivi_run", label=r["label"], group=r["group"], residual=r["residual"])
                for r in grouped)))
        with st.container() if lecture else st.expander(tr("compression.notes_title")):  # none inside another
            if lecture:
                st.markdown(f"**{tr('compression.notes_title')}**")
            int4 = stored_dtype("int4").stored  # the notes' int8/int4 line: their G and R where none ran
            group = kivi["group"] if kivi else int4.group_for(d_head)
            st.markdown(tr("compression.notes", sinks=STREAMING_SINKS, window=SNAPKV_WINDOW, kernel=SNAPKV_KERNEL,
                           group=group, residual=kivi["residual"] if kivi else int4.residual_for(group)))
    return {"kv_dtype": kv_dtype, "metric": metric}


def positions_view(full_row: Any, rows: list, names: list[str], seq_len: int, show: set[int], *, n_layers: int,
                   lecture: bool, picks: dict | None = None) -> dict:
    """At one decode step and layer: the positions each method kept (idea 2) and one method's attention beside the
    full cache's (idea 3). `picks` (step, layer, method): a room follower's copy of the lecturer's, drawn without
    their boxes; None: the boxes. Returns what was drawn with."""
    from kvviz.compression.quality import chunk_steps

    view_steps = chunk_steps(seq_len)[1]
    if lecture:  # on a projector the chart keeps the screen, its choices and caption beside it
        plot, side = st.columns([3, 1])
        d1 = d2 = d3 = side
    else:
        d1, d2, d3 = st.columns(3)
        side, plot = st, contextlib.nullcontext()
    if picks:
        step, layer = picks["step"], picks["layer"]
    else:
        if st.session_state.get("compression_step") not in view_steps:
            st.session_state.compression_step = view_steps[-1]
        step = persisted(d1.select_slider, "compression_step", tr("compression.s2_step"), options=list(view_steps))
        if st.session_state.get("compression_layer") not in range(n_layers):
            st.session_state.compression_layer = 0
        layer = persisted(d2.selectbox, "compression_layer", tr("compression.s2_layer"), options=range(n_layers))
    view_full = full_row.views[step]
    position = view_full.position
    if 1 in show:
        idea_title(tr("compression.s2_title"))
        side.caption(tr("compression.s2_caption", step=step, position=position))
        labels = [tr("compression.full"), *names]
        shares = [charts.kept_share(r.views[step].kept[layer], position + 1) for r in [full_row, *rows]]
        with plot:
            chart(charts.kept_strip_figure(labels, shares, x_title=tr("compression.chart_strip_x"),
                                           title=tr("compression.chart_strip_title", layer=layer, step=step),
                                           lecture=lecture), "compression_strip")
    pick = None
    if 2 in show:
        idea_title(tr("compression.s3_title"))
        if picks:
            pick = picks["method"]
        else:
            if st.session_state.get("compression_attn_method") not in range(len(rows)):
                st.session_state.compression_attn_method = 0
            pick = persisted(d3.selectbox, "compression_attn_method", tr("compression.s3_method"),
                             options=range(len(rows)),
                             format_func=names.__getitem__)
        side.caption(tr("compression.s3_caption"))
        v = rows[pick].views[step]
        with plot:
            chart(charts.attention_row_figure(
                charts.attention_by_position(view_full.kept[layer], view_full.attention[layer]),
                charts.attention_by_position(v.kept[layer], v.attention[layer]),
                full_name=tr("compression.full"), comp_name=names[pick], x_title=tr("compression.chart_strip_x"),
                y_title=tr("compression.chart_attn_y"),
                title=tr("compression.chart_attn_title", layer=layer, step=step), lecture=lecture),
                "compression_attention")
    return {"step": step, "layer": layer, "method": pick}


# ---- a lecture room --------------------------------------------------------------------------------------------
# The page's boxes kept in the link (url_state's keys), which "Explore from here" takes with its cc_ ones.
LINKED = ("kv_url_text", "kv_url_seq", "kv_url_tokens", "kv_url_kvdtype", "kv_url_metric")


def room_view(shown: list[int], stored: tuple | None, picks: dict, *, running: bool, model: str, run_dtype: str,
              d_head: int, n_layers: int) -> dict:
    """What a lecture room's followers draw of this page, as JSON: the ideas on screen, whether a run is under way,
    and the last results' measured rows (the full cache's first) with, for the positions' ideas, only the step and
    layer on the lecturer's screen (each method's kept positions there, and the attention of the full cache and
    the method shown). `picks`: the lecturer's choices the figures were drawn with (published beside it, as the
    RoomView's picks)."""
    if stored is None:
        return {"shown": shown, "measuring": running, "result": None}
    request, rows, partial = stored
    step, layer, method = picks.get("step"), picks.get("layer"), picks.get("method")

    def row(i: int, r: Any) -> dict:
        out = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "views"}
        out["notes"] = list(r.notes)
        if step is not None:
            v = r.views[step]
            out["view"] = {"position": v.position, "kept": v.kept[layer].tolist(),
                           "attention": v.attention[layer].tolist() if i == 0 or i - 1 == method else None}
        return out

    return {"shown": shown, "measuring": running,
            "result": {"model": model, "run_dtype": run_dtype, "d_head": d_head, "n_layers": n_layers,
                       "seq_len": request[3], "measured_with": list(request[2:]), "partial": partial,
                       "rows": [row(i, r) for i, r in enumerate(rows)]}}


def _rows(result: dict, picks: dict) -> list:
    """The published rows as the page's own (kvviz.compression.quality.Quality), each holding the one step and
    layer published (float32 attention, as measured: the same sums, the same chart)."""
    import numpy as np

    from kvviz.compression.quality import Quality
    from kvviz.compression.runner import StepView

    out = []
    for r in result["rows"]:
        r = dict(r)
        v = r.pop("view", None)
        views = {} if v is None else {picks["step"]: StepView(
            picks["step"], v["position"], {picks["layer"]: np.asarray(v["kept"])},
            {picks["layer"]: None if v["attention"] is None else np.asarray(v["attention"], dtype=np.float32)})}
        out.append(Quality(**{**r, "notes": tuple(r["notes"]), "views": views}))
    return out


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Compressing the Cache: the lecturer's measured rows, drawn with the lecturer's
    choices, the ideas on the lecturer's screen (all of them when the lecturer is not in lecture mode), in this
    session's language; no model runs here, no box of this session's is drawn."""
    explore_from(view, "compression", also=LINKED, help_key="room.explore_measure_help")
    result = view["result"]
    if view["measuring"]:
        st.info(tr("room.measuring"))
    if result is None:
        if not view["measuring"]:
            st.info(tr("room.waiting_run"))
        return
    st.caption(tr("room.measured_on", model=result["model"]))
    text, seq_len, n_tokens, budgets = result["measured_with"]
    st.caption(measured_with((None, None, text, seq_len, n_tokens, budgets)))
    rows = _rows(result, view.picks)
    full_row, rows = rows[0], rows[1:]
    if result["partial"] is not None:
        partial_note(seq_len, [full_row, *rows], result["partial"])
    names = [method_name(r) for r in rows]
    shown = set(view["shown"])
    if 0 in shown:
        tradeoff_view(full_row, rows, names, seq_len, run_dtype=result["run_dtype"], d_head=result["d_head"],
                      lecture=lecture, picks=view.picks)
    if shown & {1, 2}:
        positions_view(full_row, rows, names, seq_len, shown, n_layers=result["n_layers"], lecture=lecture,
                       picks=view.picks)
