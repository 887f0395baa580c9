"""What the Prefill & Decode page draws: the session keys it keeps (`PD`), the request's settings (`controls`), Run and
Stop (`start_request`, `stop_request`), the fragment that draws the progress and measures a little per tick, then the
results (`live`), the runs' figures as plain numbers (`results`: what is drawn, and what a lecture room's followers
get), the median run's timeline, cards, runs and formula (`show`), the table of phases (`phases`), a room follower's
page (`follow`, with "Explore from here": the lecturer's model and boxes). The measuring is
kvviz.engine.timing.RepeatedRequest's (imported with the model, when Run is clicked), always in quiet; what its runs
say comes from kvviz.lessons.prefill_decode. Nothing here imports torch before Run."""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import streamlit as st

from kvviz.app.language import lang, show_error, tr
from kvviz.app.models import check_request, get_backend
from kvviz.app.room.explore import explore_from
from kvviz.app.room.share import Sharing
from kvviz.app.room.view import RoomView
from kvviz.app.state import page_state
from kvviz.app.timing import draw_then_measure
from kvviz.app.widgets import chart, number_in_range
from kvviz.charts import latency as charts
from kvviz.engine import metrics
from kvviz.errors import InputError
from kvviz.lessons import prefill_decode as lessons
from kvviz.units import format_ms as ms

if TYPE_CHECKING:
    from kvviz.app.sidebar import Settings
    from kvviz.engine.timing import RepeatedRequest

TICK_S = 0.25  # the fragment's period while measuring
CHUNK_S = 1.0  # model work per tick, in quiet; only a progress bar is drawn between chunks
PHASES_IDEA = 3  # the table of phases: nothing measured belongs on it
# The request being measured, Run clicked (built on the next rerun), the error that refused it, whether it runs,
# the tick to skip after Run (the click redraws the whole page), and the model it was measured on (its key and name).
PD = page_state("prefill", request=None, start=False, error=None, running=False, skip_tick=False, model=None,
                model_label="?")


def controls(max_len: int, max_new: int, default: tuple[int, int]) -> tuple[int, int, int]:
    """The prompt length, new tokens and runs, each refused out of its range; a warning when the context clamps N."""
    c1, c2, c3, c4 = st.columns([2, 2, 1, 3])
    n_prompt = number_in_range(c1, tr("prefill.prompt_tokens"), 1, max_len - 1, default[0],
                               f"prefill_prompt_{max_len}")  # keyed by the context: another model starts from defaults
    n_new = number_in_range(c2, tr("prefill.new_tokens"), 1, max_new, default[1], f"prefill_new_{max_len}_{max_new}")
    repeats = number_in_range(c3, tr("prefill.repeats"), 1, 9, 3, "prefill_repeats",
                              help=tr("prefill.repeats_help"))
    if n_prompt + n_new > max_len:
        c4.warning(tr("prefill.clamped", n_new=max_len - n_prompt, max_len=max_len))
    return n_prompt, n_new, repeats


def start() -> None:
    PD.set("start", True)  # built on the rerun, from its checked values (a callback would see the last run's)


def stop() -> None:
    PD.set("running", False)
    if PD.get("request") is not None:
        PD.get("request").stop()  # a thread still measuring stops after its pass


def start_request(settings: Settings, request: tuple[int, int, int], model: tuple[tuple, str]) -> None:
    """After a Run click: load the model, check the request against a hosted demo's caps, and start measuring it
    (an InputError is kept to be shown; the results before it stay)."""
    if not PD.pop("start"):
        return
    PD.set("error", None)
    n_prompt, n_new, repeats = request
    try:
        backend = get_backend(settings)
        if backend is not None:
            check_request(settings, backend, batch=1, prompt_tokens=n_prompt, max_new_tokens=n_new)
            from kvviz.engine.sweeps import prompt_ids  # the engine, imported with the model
            from kvviz.engine.timing import RepeatedRequest

            PD.set("request", RepeatedRequest(backend, prompt_ids(backend, n_prompt), n_new, repeats))
            PD.set("model", model[0])
            PD.set("model_label", model[1])
            PD.set("running", True)
            PD.set("skip_tick", True)
    except InputError as exc:
        PD.set("error", exc)
        PD.set("running", False)


def live(shown: list[int], model: tuple[tuple, str], lecture: bool, room: Sharing | None, run: dict) -> None:
    """One tick: while running, only a progress bar, then model work in quiet; once done, the results of the model
    they were measured on (another model's are named, not shown as this one's). A lecture room gets what is shown:
    the ideas on screen and the runs' figures (while measuring, only that the lecturer is), and `run`, the lecturer's
    model and boxes (explore.page_settings) for a follower's "Explore from here"; `room`: the lecturer's open room
    (None: none)."""
    request: RepeatedRequest | None = PD.get("request")
    if PD.get("running") and request is not None:
        if request.done or request.stopped:
            PD.set("running", False)
            st.rerun()  # the whole page, so the fragment stops ticking and the buttons flip

        def draw() -> None:
            if room is not None:
                room.publish({"shown": shown, "measuring": True, "results": None}, explore=run)
            st.progress(request.passes_done / request.passes_total,
                        text=tr("prefill.measuring", done=len(request.finished_runs), runs=request.repeats,
                                passes=request.passes_done, total=request.passes_total,
                                prompt=len(request.prompt_ids)))

        # The page's own elements are still being drawn by the browser after the Run click: start measuring
        # on the fragment's first tick, when only this fragment reruns.
        if PD.pop("skip_tick"):
            draw()
            return
        draw_then_measure(draw, lambda: request.advance(CHUNK_S))  # model work in quiet, after the drawing
        if request.done or request.stopped or not PD.get("running"):
            PD.set("running", False)
            st.rerun()
        return
    measured = request is not None and request.finished_runs and PD.get("model") == model[0]
    view = results(request, model[1]) if measured else None
    if room is not None:
        room.publish({"shown": shown, "measuring": False, "results": view}, explore=run)
    if shown == [PHASES_IDEA]:
        return
    if PD.get("error"):
        show_error(PD.get("error"))
    if request is None:
        st.info(tr("prefill.idle"))
        return
    if not request.finished_runs:
        st.info(tr("prefill.stopped_early"))
        return
    if PD.get("model") != model[0]:  # measured on another model: say so instead of showing them as this one's
        st.warning(tr("prefill.other_model", old=PD.get("model_label"), new=model[1]))
        return
    show(view, shown, lecture)


def results(request: RepeatedRequest, model_label: str) -> dict:
    """The finished runs as plain numbers (every figure the page draws comes from these): each run's summary and
    gaps between tokens, the median run by T with its passes' seconds, the last run's progress, the text."""
    runs = request.finished_runs
    summaries = [metrics.summarize(g.events) for g in runs]
    i_run = lessons.median_run(summaries)
    last = runs[-1]
    return {"summaries": [asdict(x) for x in summaries], "gaps": [[e.seconds for e in g.events[1:]] for g in runs],
            "run": i_run, "seconds": [e.seconds for e in runs[i_run].events], "n_prompt": len(runs[i_run].prompt_ids),
            "text": runs[i_run].text, "done": last.n_generated, "total": last.max_new_tokens, "model": model_label}


def show(view: dict, shown: list[int], lecture: bool) -> None:
    """The median run by T (every figure is that one run's) with each figure's range over all runs beside it, from
    `results` (the lecturer's page's own, or a room follower's copy)."""
    summaries = [metrics.LatencySummary(**x) for x in view["summaries"]]
    gaps, i_run = view["gaps"], view["run"]
    s = summaries[i_run]
    if not lecture:  # on a projector the chart's title says it
        st.progress(1.0, text=tr("prefill.progress", done=view["done"], total=view["total"],
                                 prompt=view["n_prompt"], runs=len(summaries)))
    if 0 in shown:
        names = ("x", "y", "y2", "queue", "prefill", "decode", "cumulative")
        labels = {k: tr(f"prefill.chart_{k}") for k in names}  # the title is the run's, below
        labels["title"] = tr("prefill.chart_title_run", run=i_run + 1, runs=len(summaries))
        chart(charts.token_timeline(view["seconds"], s.queue_s, labels, lecture=lecture), "prefill_timeline")
        if s.tpot_p50_s:
            st.caption(tr("prefill.ratio", ratio=f"{s.prefill_s / s.tpot_p50_s:.1f}", prompt=view["n_prompt"]))
    if 1 in shown:
        cards(summaries, i_run, view["text"], lecture)
    if 2 in shown:
        formula = lessons.formula_text(summaries, gaps, i_run, lang())
        if formula is not None:
            st.markdown(formula[0])
            st.markdown(formula[1])
        noise = lessons.step_noise(s, gaps[i_run], lang())
        if noise is not None:
            st.caption(noise)


def cards(summaries: list[metrics.LatencySummary], i_run: int, text: str, lecture: bool) -> None:
    """TTFT, TPOT p50, tokens/s and T as cards, each with its range over the runs; the runs and the text under them
    (how each figure splits, queue + prefill, mean and p90 beside the p50: under the cards, or on a projector folded
    with the runs, so the cards, their ranges and what they are fit one screen)."""
    s = summaries[i_run]
    ttft, p50, e2e = (metrics.spread([getattr(x, k) for x in summaries]) for k in ("ttft_s", "tpot_p50_s", "e2e_s"))
    splits = lessons.splits(s, lang())
    m = st.columns(4)
    m[0].metric(tr("prefill.ttft"), ms(s.ttft_s))
    m[1].metric(tr("prefill.tpot_p50"), ms(s.tpot_p50_s))
    m[2].metric(tr("prefill.tokens_per_s"), "—" if s.tokens_per_s is None else f"{s.tokens_per_s:.1f}")
    m[3].metric(tr("prefill.e2e"), ms(s.e2e_s))
    for i, spread in enumerate((ttft, p50, None, e2e)):
        parts = ("" if lecture else splits.get(i, ""), lessons.spread_text(spread, lang()))
        caption = " · ".join(x for x in parts if x)
        if caption or i == 3:
            m[i].caption(caption or tr("prefill.one_run"))
    n = len(summaries)
    st.caption(tr("prefill.statistic", run=i_run + 1, runs=n) if n > 1 else tr("prefill.statistic_one"))
    table = lessons.runs_table(summaries, lang())
    if lecture:  # one fold for the splits, the runs and the text
        with st.expander(tr("prefill.details")):
            st.markdown("\n".join(f"- {splits[i]}" for i in sorted(splits)))
            st.dataframe(table, hide_index=True)
            st.code(text or " ", language=None, wrap_lines=True)
    else:
        with st.expander(tr("prefill.runs_table")):
            st.dataframe(table, hide_index=True)
        with st.expander(tr("prefill.text")):
            st.code(text or " ", language=None, wrap_lines=True)


def phases(lecture: bool) -> None:
    """Training, prefill and decode side by side: what each takes in, computes, stores and costs."""
    if not lecture:
        st.subheader(tr("prefill.table_title"))
    if lecture:  # twelve cells of prose on one projected screen: a smaller type than the page's, still large
        st.html("<style>.st-key-prefill_phases :is(th, td) { font-size: 0.8rem; padding: 0.3rem 0.6rem; }</style>")
    st.container(key="prefill_phases").markdown(lessons.phases_table(lang()))


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Prefill & Decode: the ideas on the lecturer's screen (all of them when the lecturer
    is not in lecture mode) drawn from the lecturer's runs, in this session's language; no model, no box."""
    shown, measured = view["shown"], view["results"]
    explore_from(view, "prefill", help_key="room.explore_measure_help")  # the lecturer's model and request
    if shown != [PHASES_IDEA]:
        if view["measuring"]:
            st.info(tr("room.measuring"))
        elif measured is None:
            st.info(tr("room.waiting_run"))
        else:
            st.caption(tr("room.measured_on", model=measured["model"]))
            show(measured, shown, lecture)
    if PHASES_IDEA in shown:
        phases(lecture)
