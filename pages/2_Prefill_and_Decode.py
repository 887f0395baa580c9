"""Prefill & Decode: one request measured as whole repeated runs; TTFT, TPOT and T = TTFT + (N−1)·TPOT checked.

The model is timed in quiet (kvviz.engine.timing): while a chunk of passes runs nothing is drawn, the
garbage collector is paused and torch's threads are fixed; the page draws after each chunk.
"""
import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import intro_box
from kvviz.app.models import check_request, get_backend, limit, model_caption
from kvviz.app.shell import page_setup
from kvviz.app.timing import noise_indicator
from kvviz.app.widgets import number_in_range
from kvviz.charts import latency as charts
from kvviz.engine import metrics
from kvviz.engine.sweeps import prompt_ids
from kvviz.engine.timing import RepeatedRequest
from kvviz.errors import InputError

TICK_S = 0.25  # the fragment's period while measuring
CHUNK_S = 1.0  # model work per tick, in quiet; only a progress bar is drawn between chunks

settings = page_setup("prefill_decode.title")
st.title(tr("prefill_decode.title"))
with intro_box():
    st.write(tr("prefill_decode.intro"))
backend = get_backend(settings)
if backend is None:
    st.stop()
model_caption(backend.spec)
noise_indicator(backend, "pd")
ss = st.session_state

# What the results were measured on: a different model (or dtype, device, shape) must not inherit them.
model_key = (settings.model, settings.hf_model, settings.dtype, settings.device, backend.spec.name,
             backend.spec.n_layers, backend.spec.n_kv_heads, backend.spec.d_head, backend.spec.n_params)
model_label = f"{backend.spec.name} ({settings.dtype}, {settings.device})"

max_len = backend.spec.max_context
max_new = limit(settings, "max_new_tokens", max_len - 1)  # a hosted demo caps it
c1, c2, c3, c4 = st.columns([2, 2, 1, 3])
n_prompt = number_in_range(c1, tr("prefill_decode.prompt_tokens"), 1, max_len - 1, max_len // 2,
                            f"pd_prompt_{max_len}")  # keyed by the context: another model starts from defaults that fit
n_new = number_in_range(c2, tr("prefill_decode.new_tokens"), 1, max_new, min(64, max_len // 4, max_new),
                         f"pd_new_{max_len}_{max_new}")
repeats = number_in_range(c3, tr("prefill_decode.repeats"), 1, 9, 3, "pd_repeats",
                            help=tr("prefill_decode.repeats_help"))
if n_prompt + n_new > max_len:
    c4.warning(tr("prefill_decode.clamped", n_new=max_len - n_prompt, max_len=max_len))


def start() -> None:
    ss.pd_start = True  # built below, from this rerun's checked values (a callback would see the last run's)


def stop() -> None:
    ss.pd_running = False


if ss.pop("pd_start", False):
    ss.pd_error = None
    try:
        check_request(settings, backend, batch=1, prompt_tokens=n_prompt, max_new_tokens=n_new)
        ss.pd_request = RepeatedRequest(backend, prompt_ids(backend, n_prompt), n_new, repeats)
        ss.pd_model, ss.pd_model_label = model_key, model_label
        ss.pd_running = ss.pd_skip_tick = True
    except InputError as exc:
        ss.pd_error, ss.pd_running = exc, False
running = ss.get("pd_running", False)
b1, b2, _ = st.columns([1, 1, 4])
b1.button(tr("prefill_decode.run"), on_click=start, type="primary", disabled=running, key="pd_run")
b2.button(tr("prefill_decode.stop"), on_click=stop, disabled=not running, key="pd_stop")


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f} ms"


def spread_text(s: metrics.Spread | None) -> str:
    if s is None or s.n < 2:
        return ""
    return tr("prefill_decode.spread", low=ms(s.low), high=ms(s.high), n=s.n, pct=f"{s.relative * 100:.0f}")


def show(request: RepeatedRequest) -> None:
    runs = request.finished_runs
    if not runs:
        return
    summaries = [metrics.summarize(g.events) for g in runs]
    # The run drawn is the median one by T (whole runs, never a mix of columns).
    order = sorted(range(len(runs)), key=lambda i: summaries[i].e2e_s)
    shown = order[(len(order) - 1) // 2]
    gen, s = runs[shown], summaries[shown]
    names = ("title", "x", "y", "y2", "queue", "prefill", "decode", "cumulative")
    labels = {k: tr(f"prefill_decode.chart_{k}") for k in names}
    labels["title"] = tr("prefill_decode.chart_title_run", run=shown + 1, runs=len(runs))
    st.plotly_chart(charts.token_timeline([e.seconds for e in gen.events], s.queue_s, labels, lecture=settings.lecture),
                    key="pd_timeline", width="stretch")
    # The metrics are medians over the runs (their range beside); the lines below them are the drawn run's.
    def med(values: list) -> float | None:
        found = metrics.spread(values)
        return found.median if found else None

    ttft = metrics.spread([x.ttft_s for x in summaries])
    p50 = metrics.spread([x.tpot_p50_s for x in summaries])
    e2e = metrics.spread([x.e2e_s for x in summaries])
    rates = [x.tokens_per_s for x in summaries]
    m = st.columns(4)
    m[0].metric(tr("prefill_decode.ttft"), ms(ttft.median))
    m[0].caption(tr("prefill_decode.ttft_split", queue=ms(med([x.queue_s for x in summaries])),
                    prefill=ms(med([x.prefill_s for x in summaries]))) + spread_text(ttft))
    m[1].metric(tr("prefill_decode.tpot_p50"), ms(p50.median) if p50 else "—")
    if p50:
        m[1].caption(tr("prefill_decode.tpot_split", mean=ms(med([x.tpot_s for x in summaries])),
                        p90=ms(med([x.tpot_p90_s for x in summaries]))) + spread_text(p50))
    rate = med(rates)
    m[2].metric(tr("prefill_decode.tokens_per_s"), "—" if rate is None else f"{rate:.1f}")
    decode_rate = med([x.decode_tokens_per_s for x in summaries])
    m[2].caption(tr("prefill_decode.decode_rate", rate="—" if decode_rate is None else f"{decode_rate:.1f}"))
    m[3].metric(tr("prefill_decode.e2e"), ms(e2e.median))
    m[3].caption(spread_text(e2e).strip(" ·") or tr("prefill_decode.one_run"))
    st.caption(tr("prefill_decode.medians", runs=len(runs), run=shown + 1))

    gaps = [e.seconds for e in gen.events[1:]]
    totals = [x.e2e_s for x in summaries]  # T of every whole run: the machine's own repeatability
    check = metrics.formula_check(s, gaps, totals)
    if check is not None:
        st.markdown(tr("prefill_decode.formula_exact", n=s.n_tokens, ttft=ms(s.ttft_s), mean=ms(s.tpot_s),
                       exact=ms(check.exact_s), measured=ms(check.measured_s)))
        within = [c.within for c in (metrics.formula_check(x, [e.seconds for e in g.events[1:]], totals)
                                     for x, g in zip(summaries, runs, strict=True)) if c is not None]
        verdict = "formula_within" if check.within else "formula_outside"
        st.markdown(tr(f"prefill_decode.{verdict}", n=s.n_tokens, p50=ms(s.tpot_p50_s), predicted=ms(check.p50_form_s),
                       error=f"{check.error_s * 1e3:+.2f} ms", pct=f"{check.error_s / check.measured_s * 100:+.1f}",
                       tolerance=f"{check.tolerance_s * 1e3:.2f} ms", sampling=f"{check.sampling_s * 1e3:.2f} ms",
                       runs_spread="—" if check.run_spread_s is None else f"{check.run_spread_s * 1e3:.2f} ms")
                    + " " + tr("prefill_decode.formula_runs", ok=sum(within), runs=len(within)))
    if s.tpot_p50_s:
        st.caption(tr("prefill_decode.ratio", ratio=f"{s.prefill_s / s.tpot_p50_s:.1f}", prompt=len(gen.prompt_ids)))
        noise = s.tpot_p90_s / s.tpot_p50_s
        st.caption(tr("prefill_decode.step_noise", ratio=f"{noise:.2f}", slowest=ms(max(gaps)),
                      verdict=tr("prefill_decode.steady" if noise < 1.25 else "prefill_decode.unsteady")))
    with st.expander(tr("prefill_decode.runs_table")):
        st.dataframe([{tr("prefill_decode.col_run"): i + 1, "TTFT (ms)": round(x.ttft_s * 1e3, 3),
                       "TPOT p50 (ms)": round(x.tpot_p50_s * 1e3, 3) if x.tpot_p50_s else None,
                       "TPOT p90 (ms)": round(x.tpot_p90_s * 1e3, 3) if x.tpot_p90_s else None,
                       "T (ms)": round(x.e2e_s * 1e3, 3)} for i, x in enumerate(summaries)], hide_index=True)
    with st.expander(tr("prefill_decode.text")):
        st.code(gen.text or " ", language=None, wrap_lines=True)


def live() -> None:
    request: RepeatedRequest | None = ss.get("pd_request")
    if ss.get("pd_running") and request is not None:
        # The page's own elements are still being drawn by the browser after the Run click: start measuring
        # on the fragment's first tick, when only this fragment reruns.
        if not ss.pop("pd_skip_tick", False):
            request.advance(CHUNK_S)  # model work only, in quiet: nothing of this rerun is drawn meanwhile
        if request.done or not ss.pd_running:
            ss.pd_running = False
            st.rerun()  # the whole page, so the fragment stops ticking and the buttons flip
        st.progress(request.passes_done / request.passes_total,
                    text=tr("prefill_decode.measuring", done=len(request.finished_runs), runs=request.repeats,
                            passes=request.passes_done, total=request.passes_total, prompt=len(request.prompt_ids)))
        return
    if ss.get("pd_error"):
        show_error(ss.pd_error)
    if request is None or not request.finished_runs:
        st.info(tr("prefill_decode.idle"))
        return
    if ss.get("pd_model") != model_key:  # measured on another model: say so instead of showing them as this one's
        st.warning(tr("prefill_decode.other_model", old=ss.get("pd_model_label", "?"), new=model_label))
        return
    gen = request.finished_runs[-1]
    st.progress(1.0, text=tr("prefill_decode.progress", done=gen.n_generated, total=gen.max_new_tokens,
                             prompt=len(gen.prompt_ids), runs=len(request.finished_runs)))
    show(request)


st.fragment(live, run_every=TICK_S if running else None)()

st.subheader(tr("prefill_decode.table_title"))
cols = ("inputs", "computation", "stored", "latency")
header = "| | " + " | ".join(tr(f"prefill_decode.col_{c}") for c in cols) + " |"
lines = [header, "|---" * (len(cols) + 1) + "|"]
for phase in ("training", "prefill", "decode"):
    lines.append(f"| **{tr(f'prefill_decode.row_{phase}')}** | "
                 + " | ".join(tr(f"prefill_decode.{phase}_{c}") for c in cols) + " |")
st.markdown("\n".join(lines))
