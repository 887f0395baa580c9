"""Prefill & Decode: one request measured as whole repeated runs; TTFT, TPOT and T = TTFT + (N−1)·TPOT checked.

The model is timed in quiet (kvviz.engine.timing): while a chunk of passes runs nothing is drawn, the
garbage collector is paused and torch's threads are fixed; the page draws after each chunk. The first screen
needs no model (kvviz.app.models.model_spec): it loads when the request first runs. Every figure shown is one run's,
the median run by T, the one drawn; the range over all runs stands beside it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from kvviz.app.hosted import tokens_within
from kvviz.app.language import show_error, tr
from kvviz.app.lecture import ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import check_request, get_backend, limit, model_caption, model_spec, preload_engine
from kvviz.app.shell import page_setup
from kvviz.app.timing import noise_indicator
from kvviz.app.widgets import chart, number_in_range
from kvviz.charts import latency as charts
from kvviz.engine import metrics
from kvviz.errors import InputError

if TYPE_CHECKING:
    from kvviz.engine.backends.base import Backend
    from kvviz.engine.timing import RepeatedRequest

TICK_S = 0.25  # the fragment's period while measuring
CHUNK_S = 1.0  # model work per tick, in quiet; only a progress bar is drawn between chunks

settings = page_setup("prefill_decode.title")
lecture, ss = settings.lecture, st.session_state
st.title(tr("prefill_decode.title"))
spec = model_spec(settings)
if spec is None:
    st.stop()


def load() -> Backend | None:
    """The model, loaded when the request or the noise check first needs it (None after showing why not)."""
    return get_backend(settings)


# In lecture mode one idea per screen: the stepper under the title, then the introduction and the request's
# controls in one row (none on the table of phases, which takes the whole screen).
titles = [tr(f"prefill_decode.idea_{k}") for k in ("run", "numbers", "formula", "phases")]
shown = ideas(titles, "pd")  # all four, or in lecture mode one
measuring_idea = not lecture or shown != [3]
if measuring_idea:
    head = lecture_head(widths=(2, 3))
    with head[0], intro_box():
        st.write(tr("prefill_decode.intro"))
        model_caption(spec)
        noise_indicator(load, "pd")

# What the results were measured on: a different model (or dtype, device, shape) must not inherit them.
model_key = (settings.model, settings.hf_model, settings.dtype, settings.device, spec.name,
             spec.n_layers, spec.n_kv_heads, spec.d_head, spec.n_params)
model_label = f"{spec.name} ({settings.dtype}, {settings.device})"

max_len = spec.max_context
max_new = limit(settings, "max_new_tokens", max_len - 1)  # a hosted demo caps it
default_new = min(64, max_len // 4, max_new)
# A default request whose cache fits a hosted demo's KV budget: a first click on Run is never refused.
default_prompt = max(1, min(max_len // 2, tokens_within(settings.hosted, spec, settings.dtype, max_len)
                            - default_new))


def controls() -> tuple[int, int, int]:
    c1, c2, c3, c4 = st.columns([2, 2, 1, 3])
    n_prompt = number_in_range(c1, tr("prefill_decode.prompt_tokens"), 1, max_len - 1, default_prompt,
                                  f"pd_prompt_{max_len}")  # keyed by the context: another model starts from defaults
    n_new = number_in_range(c2, tr("prefill_decode.new_tokens"), 1, max_new, default_new,
                               f"pd_new_{max_len}_{max_new}")
    repeats = number_in_range(c3, tr("prefill_decode.repeats"), 1, 9, 3, "pd_repeats",
                                 help=tr("prefill_decode.repeats_help"))
    if n_prompt + n_new > max_len:
        c4.warning(tr("prefill_decode.clamped", n_new=max_len - n_prompt, max_len=max_len))
    return n_prompt, n_new, repeats


if not measuring_idea:  # the table of phases: no controls (each number box keeps its last valid value)
    n_prompt = n_new = repeats = 0
    b1 = b2 = None
elif lecture:  # the settings behind one button beside Run and Stop: the idea keeps the screen
    with head[1]:
        where, b1, b2 = st.columns([3, 3, 2], vertical_alignment="center")
    with where, settings_box():
        n_prompt, n_new, repeats = controls()
else:
    n_prompt, n_new, repeats = controls()
    b1, b2, _ = st.columns([1, 1, 4])


def start() -> None:
    ss.pd_start = True  # built below, from this rerun's checked values (a callback would see the last run's)


def stop() -> None:
    ss.pd_running = False
    if ss.get("pd_request") is not None:
        ss.pd_request.stop()  # a thread still measuring stops after its pass


if ss.pop("pd_start", False):
    ss.pd_error = None
    try:
        backend = load()
        if backend is not None:
            check_request(settings, backend, batch=1, prompt_tokens=n_prompt, max_new_tokens=n_new)
            from kvviz.engine.sweeps import prompt_ids  # the engine, imported with the model
            from kvviz.engine.timing import RepeatedRequest

            ss.pd_request = RepeatedRequest(backend, prompt_ids(backend, n_prompt), n_new, repeats)
            ss.pd_model, ss.pd_model_label = model_key, model_label
            ss.pd_running = ss.pd_skip_tick = True
    except InputError as exc:
        ss.pd_error, ss.pd_running = exc, False
running = ss.get("pd_running", False)
if measuring_idea:
    b1.button(tr("prefill_decode.run"), on_click=start, type="primary", disabled=running, key="pd_run")
    b2.button(tr("prefill_decode.stop"), on_click=stop, disabled=not running, key="pd_stop")


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f} ms"


def spread_text(s: metrics.Spread | None) -> str:
    """The range of one figure over every run ("" from one run: there is no spread yet)."""
    if s is None or s.n < 2:
        return ""
    return tr("prefill_decode.spread", low=ms(s.low), high=ms(s.high), n=s.n, pct=f"{s.relative * 100:.0f}")


def show(request: RepeatedRequest) -> None:
    runs = request.finished_runs
    summaries = [metrics.summarize(g.events) for g in runs]
    # The run drawn, and every figure shown, is the median run by T (whole runs, never a mix of columns).
    order = sorted(range(len(runs)), key=lambda i: summaries[i].e2e_s)
    shown_run = order[(len(order) - 1) // 2]
    gen, s = runs[shown_run], summaries[shown_run]
    gaps = [e.seconds for e in gen.events[1:]]
    if 0 in shown:
        names = ("title", "x", "y", "y2", "queue", "prefill", "decode", "cumulative")
        labels = {k: tr(f"prefill_decode.chart_{k}") for k in names}
        labels["title"] = tr("prefill_decode.chart_title_run", run=shown_run + 1, runs=len(runs))
        chart(charts.token_timeline([e.seconds for e in gen.events], s.queue_s, labels, lecture=lecture),
              "pd_timeline")
        if s.tpot_p50_s:
            st.caption(tr("prefill_decode.ratio", ratio=f"{s.prefill_s / s.tpot_p50_s:.1f}",
                          prompt=len(gen.prompt_ids)))
    if 1 in shown:
        ttft, p50, e2e = (metrics.spread([getattr(x, k) for x in summaries]) for k in ("ttft_s", "tpot_p50_s", "e2e_s"))
        # How each figure splits (queue + prefill, mean and p90 beside the p50): under the cards, or on a projector
        # folded with the runs, so the cards, their ranges and what they are fit one screen.
        splits = {0: tr("prefill_decode.ttft_split", queue=ms(s.queue_s), prefill=ms(s.prefill_s))}
        if s.tpot_p50_s:
            splits[1] = tr("prefill_decode.tpot_split", mean=ms(s.tpot_s), p90=ms(s.tpot_p90_s))
            # named by the TPOT it inverts: the p50 in the card beside it
            splits[2] = tr("prefill_decode.decode_rate", rate=f"{1 / s.tpot_p50_s:.1f}", p50=ms(s.tpot_p50_s))
        m = st.columns(4)
        m[0].metric(tr("prefill_decode.ttft"), ms(s.ttft_s))
        m[1].metric(tr("prefill_decode.tpot_p50"), ms(s.tpot_p50_s))
        m[2].metric(tr("prefill_decode.tokens_per_s"), "—" if s.tokens_per_s is None else f"{s.tokens_per_s:.1f}")
        m[3].metric(tr("prefill_decode.e2e"), ms(s.e2e_s))
        for i, spread in enumerate((ttft, p50, None, e2e)):
            text = " · ".join(t for t in ("" if lecture else splits.get(i, ""), spread_text(spread)) if t)
            if text or i == 3:
                m[i].caption(text or tr("prefill_decode.one_run"))
        st.caption(tr("prefill_decode.statistic", run=shown_run + 1, runs=len(runs)) if len(runs) > 1
                   else tr("prefill_decode.statistic_one"))
        table = [{tr("prefill_decode.col_run"): i + 1, "TTFT (ms)": round(x.ttft_s * 1e3, 3),
                  "TPOT p50 (ms)": round(x.tpot_p50_s * 1e3, 3) if x.tpot_p50_s else None,
                  "TPOT p90 (ms)": round(x.tpot_p90_s * 1e3, 3) if x.tpot_p90_s else None,
                  "T (ms)": round(x.e2e_s * 1e3, 3)} for i, x in enumerate(summaries)]
        if lecture:  # one fold for the splits, the runs and the text
            with st.expander(tr("prefill_decode.details")):
                st.markdown("\n".join(f"- {splits[i]}" for i in sorted(splits)))
                st.dataframe(table, hide_index=True)
                st.code(gen.text or " ", language=None, wrap_lines=True)
        else:
            with st.expander(tr("prefill_decode.runs_table")):
                st.dataframe(table, hide_index=True)
            with st.expander(tr("prefill_decode.text")):
                st.code(gen.text or " ", language=None, wrap_lines=True)
    if 2 in shown:
        totals = [x.e2e_s for x in summaries]  # T of every whole run: the machine's own repeatability
        check = metrics.formula_check(s, gaps, totals)
        if check is not None:
            st.markdown(tr("prefill_decode.formula_exact", n=s.n_tokens, ttft=ms(s.ttft_s), mean=ms(s.tpot_s),
                           exact=ms(check.exact_s), measured=ms(check.measured_s)))
            within = [c.within for c in (metrics.formula_check(x, [e.seconds for e in g.events[1:]], totals)
                                         for x, g in zip(summaries, runs, strict=True)) if c is not None]
            sampling = ms(check.sampling_s)
            why = (tr("prefill_decode.tolerance_runs", sampling=sampling, runs_spread=ms(check.run_spread_s))
                   if check.run_spread_s is not None else tr("prefill_decode.tolerance_one_run", sampling=sampling))
            verdict = "formula_within" if check.within else "formula_outside"
            st.markdown(tr(f"prefill_decode.{verdict}", n=s.n_tokens, p50=ms(s.tpot_p50_s),
                           predicted=ms(check.p50_form_s), error=f"{check.error_s * 1e3:+.2f} ms".replace("-", "−"),
                           pct=f"{check.error_s / check.measured_s * 100:+.1f}".replace("-", "−"),
                           tolerance=ms(check.tolerance_s), why=why)
                        + " " + tr("prefill_decode.formula_runs", ok=sum(within), runs=len(within)))
        if s.tpot_p50_s:
            noise = s.tpot_p90_s / s.tpot_p50_s
            st.caption(tr("prefill_decode.step_noise", ratio=f"{noise:.2f}", slowest=ms(max(gaps)),
                          verdict=tr("prefill_decode.steady" if noise < 1.25 else "prefill_decode.unsteady")))


def live() -> None:
    request: RepeatedRequest | None = ss.get("pd_request")
    if ss.get("pd_running") and request is not None:
        # The page's own elements are still being drawn by the browser after the Run click: start measuring
        # on the fragment's first tick, when only this fragment reruns.
        if not ss.pop("pd_skip_tick", False):
            request.advance(CHUNK_S)  # model work only, in quiet: nothing of this rerun is drawn meanwhile
        if request.done or request.stopped or not ss.pd_running:
            ss.pd_running = False
            st.rerun()  # the whole page, so the fragment stops ticking and the buttons flip
        st.progress(request.passes_done / request.passes_total,
                    text=tr("prefill_decode.measuring", done=len(request.finished_runs), runs=request.repeats,
                            passes=request.passes_done, total=request.passes_total, prompt=len(request.prompt_ids)))
        return
    if shown == [3]:
        return  # the table of phases: nothing measured belongs on it
    if ss.get("pd_error"):
        show_error(ss.pd_error)
    if request is None:
        st.info(tr("prefill_decode.idle"))
        return
    if not request.finished_runs:
        st.info(tr("prefill_decode.stopped_early"))
        return
    if ss.get("pd_model") != model_key:  # measured on another model: say so instead of showing them as this one's
        st.warning(tr("prefill_decode.other_model", old=ss.get("pd_model_label", "?"), new=model_label))
        return
    gen = request.finished_runs[-1]
    if not lecture:  # on a projector the chart's title says it
        st.progress(1.0, text=tr("prefill_decode.progress", done=gen.n_generated, total=gen.max_new_tokens,
                                 prompt=len(gen.prompt_ids), runs=len(request.finished_runs)))
    show(request)


st.fragment(live, run_every=TICK_S if running else None)()  # on every idea: measuring never waits on the stepper

if 3 in shown:
    if not lecture:
        st.subheader(tr("prefill_decode.table_title"))
    # One column per phase, one row per aspect: three wide columns read in two or three lines per cell.
    phases = ("training", "prefill", "decode")
    lines = ["| | " + " | ".join(f"**{tr(f'prefill_decode.row_{p}')}**" for p in phases) + " |",
             "|---" * (len(phases) + 1) + "|"]
    for aspect in ("inputs", "computation", "stored", "latency"):
        lines.append(f"| **{tr(f'prefill_decode.col_{aspect}')}** | "
                     + " | ".join(tr(f"prefill_decode.{p}_{aspect}") for p in phases) + " |")
    if lecture:  # twelve cells of prose on one projected screen: a smaller type than the page's, still large
        st.html("<style>.st-key-pd_phases :is(th, td) { font-size: 0.8rem; padding: 0.3rem 0.6rem; }</style>")
    st.container(key="pd_phases").markdown("\n".join(lines))
preload_engine()  # the page is drawn: torch and the engine load in the background for the first run
