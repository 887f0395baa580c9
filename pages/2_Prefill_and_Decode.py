"""Prefill & Decode: one request streamed pass by pass; TTFT, TPOT and T ≈ TTFT + (N−1)·TPOT measured."""
import time

import streamlit as st

from kvviz.app import ui
from kvviz.charts import latency as charts
from kvviz.engine import metrics
from kvviz.engine.generation import Generation
from kvviz.engine.sweeps import prompt_ids, warm_up
from kvviz.errors import InputError

TICK_S = 0.25  # the fragment's period while decoding
STEP_BUDGET_S = 0.15  # decode work per tick, so the timeline redraws a few times a second

settings = ui.page_setup("prefill_decode.title")
tr = ui.tr
st.title(tr("prefill_decode.title"))
st.write(tr("prefill_decode.intro"))
backend = ui.get_backend(settings)
if backend is None:
    st.stop()
ui.model_caption(backend)

max_len = backend.spec.max_context
c1, c2, c3 = st.columns([2, 2, 3])
# Keys carry the context size: a model with a shorter context starts from defaults that fit it.
n_prompt = c1.number_input(tr("prefill_decode.prompt_tokens"), 1, max_len - 1, max_len // 2, key=f"pd_prompt_{max_len}")
max_new = ui.limit(settings, "max_new_tokens", max_len - 1)  # a hosted demo caps it
n_new = c2.number_input(tr("prefill_decode.new_tokens"), 1, max_new, min(64, max_len // 4, max_new),
                        key=f"pd_new_{max_len}_{max_new}")
if n_prompt + n_new > max_len:
    c3.warning(tr("prefill_decode.clamped", n_new=max_len - n_prompt, max_len=max_len))


def start() -> None:
    # Read from state: a callback runs before this rerun's widgets, with their new values already stored.
    ss = st.session_state
    ss.pd_request = (int(ss[f"pd_prompt_{max_len}"]), int(ss[f"pd_new_{max_len}_{max_new}"]))
    st.session_state.pd_gen = None
    st.session_state.pd_error = None
    st.session_state.pd_running = True


def stop() -> None:
    st.session_state.pd_running = False


running = st.session_state.get("pd_running", False)
b1, b2, _ = st.columns([1, 1, 4])
b1.button(tr("prefill_decode.run"), on_click=start, type="primary", disabled=running, key="pd_run")
b2.button(tr("prefill_decode.stop"), on_click=stop, disabled=not running, key="pd_stop")


def advance() -> None:
    """Model work for one tick: the prefill, or decode steps for up to STEP_BUDGET_S."""
    gen: Generation | None = st.session_state.get("pd_gen")
    try:
        if gen is None:
            n_p, n_n = st.session_state.pd_request
            ui.check_request(settings, backend, batch=1, prompt_tokens=n_p, max_new_tokens=n_n)
            if st.session_state.get("pd_warm") != id(backend):
                warm_up(backend)  # a fresh model's first pass pays one-off costs: keep them out of TTFT
                st.session_state.pd_warm = id(backend)
            # Created and prefilled in the same tick: the queue is the wait before work starts, ~0 here.
            gen = Generation(backend, max_new_tokens=n_n, stop_at_eos=False)
            st.session_state.pd_gen = gen
            gen.prefill(prompt_ids(backend, n_p))
        else:
            start_s = time.perf_counter()
            while not gen.done and time.perf_counter() - start_s < STEP_BUDGET_S:
                gen.step()
    except InputError as exc:  # kept for after the rerun, which would wipe a message shown now
        st.session_state.pd_running = False
        st.session_state.pd_error = exc


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f} ms"


def show(gen: Generation) -> None:
    s = metrics.summarize(gen.events)
    st.progress(gen.n_generated / gen.max_new_tokens,
                text=tr("prefill_decode.progress", done=gen.n_generated, total=gen.max_new_tokens,
                        prompt=len(gen.prompt_ids)))
    names = ("title", "x", "y", "y2", "queue", "prefill", "decode", "cumulative")
    labels = {k: tr(f"prefill_decode.chart_{k}") for k in names}
    st.plotly_chart(charts.token_timeline([e.seconds for e in gen.events], s.queue_s, labels, lecture=settings.lecture),
                    key="pd_timeline", width="stretch")
    m = st.columns(4)
    m[0].metric(tr("prefill_decode.ttft"), ms(s.ttft_s))
    m[0].caption(tr("prefill_decode.ttft_split", queue=ms(s.queue_s), prefill=ms(s.prefill_s)))
    m[1].metric(tr("prefill_decode.tpot"), ms(s.tpot_s))
    m[1].caption(tr("prefill_decode.tpot_split", p50=ms(s.tpot_p50_s), p90=ms(s.tpot_p90_s)))
    m[2].metric(tr("prefill_decode.tokens_per_s"), "—" if s.tokens_per_s is None else f"{s.tokens_per_s:.1f}")
    rate = "—" if s.decode_tokens_per_s is None else f"{s.decode_tokens_per_s:.1f}"
    m[2].caption(tr("prefill_decode.decode_rate", rate=rate))
    m[3].metric(tr("prefill_decode.e2e"), ms(s.e2e_s))
    if s.predicted_e2e_s is not None:
        m[3].caption(tr("prefill_decode.formula", n=s.n_tokens, predicted=ms(s.predicted_e2e_s),
                        error=f"{(s.predicted_e2e_s - s.e2e_s) / s.e2e_s * 100:+.1f}"))
    if s.tpot_s:
        st.caption(tr("prefill_decode.ratio", ratio=f"{s.prefill_s / s.tpot_s:.1f}", prompt=len(gen.prompt_ids)))
    with st.expander(tr("prefill_decode.text")):
        st.code(gen.text or " ", language=None, wrap_lines=True)


def live() -> None:
    if st.session_state.get("pd_running"):
        advance()
        gen = st.session_state.get("pd_gen")
        if gen is None or gen.done or not st.session_state.pd_running:
            st.session_state.pd_running = False
            st.rerun()  # the whole page, so the fragment stops ticking and the buttons flip
    if st.session_state.get("pd_error"):
        ui.show_error(st.session_state.pd_error)
    gen = st.session_state.get("pd_gen")
    if gen is not None and gen.started:
        show(gen)
    else:
        st.info(tr("prefill_decode.idle"))


st.fragment(live, run_every=TICK_S if running else None)()

st.subheader(tr("prefill_decode.table_title"))
cols = ("inputs", "computation", "stored", "latency")
header = "| | " + " | ".join(tr(f"prefill_decode.col_{c}") for c in cols) + " |"
lines = [header, "|---" * (len(cols) + 1) + "|"]
for phase in ("training", "prefill", "decode"):
    lines.append(f"| **{tr(f'prefill_decode.row_{phase}')}** | "
                 + " | ".join(tr(f"prefill_decode.{phase}_{c}") for c in cols) + " |")
st.markdown("\n".join(lines))
