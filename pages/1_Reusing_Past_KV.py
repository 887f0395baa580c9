"""Reusing Past K/V: a real decoder, one token at a time — the cache grows, past K/V are reused, work is counted."""
import time

import streamlit as st

from kvviz.app import ui
from kvviz.charts import decode as charts
from kvviz.engine.generation import Generation
from kvviz.engine.tokenizer import chip_labels
from kvviz.errors import InputError
from kvviz.i18n import LANGS, t
from kvviz.lessons import decode_view, tolerance, work

settings = ui.page_setup("reuse.title")
tr, lecture = ui.tr, settings.lecture
st.title(tr("reuse.title"))
st.caption(tr("reuse.lead"))
backend = ui.get_backend(settings)

state = st.session_state
state.setdefault("reuse_gen", None)
state.setdefault("reuse_playing", False)
state.setdefault("reuse_last_step", 0.0)
state.setdefault("reuse_checks", {})
# The settings a generation was started with: a later sidebar change must not be applied to it silently.
model_key = (settings.model, settings.dtype, settings.device, settings.hf_model,
             settings.shape if settings.model == "random" else None)

# Presets in the UI's language first, then the other language's.
presets = [t(f"reuse.preset_{i}", lang) for lang in sorted(LANGS, key=lambda x: x != ui.lang()) for i in (1, 2, 3)]
state.setdefault("reuse_prompt", presets[0])


def use_preset() -> None:
    state.reuse_prompt = state.reuse_preset


def prefill() -> None:
    gen = Generation(backend, max_new_tokens=int(state.reuse_max_new), capture_attention=True)
    try:
        gen.prefill(state.reuse_prompt)
    except InputError as exc:
        state.reuse_error = exc  # the previous generation stays as it was
        return
    state.reuse_gen, state.reuse_model_key, state.reuse_playing = gen, model_key, False
    state.reuse_checks = {}


def step() -> None:
    gen = state.reuse_gen
    if gen is not None and not gen.done:
        gen.step()  # only the newest token goes in; the prefill is never rerun
        state.reuse_last_step = time.monotonic()


def play(on: bool) -> None:
    # Set, never toggle: a click can reach the server twice when a timed fragment run coalesces with it.
    state.reuse_playing = on


def reset() -> None:
    state.reuse_gen, state.reuse_playing, state.reuse_checks = None, False, {}


gen: Generation | None = state.reuse_gen
stale = gen is not None and state.get("reuse_model_key") != model_key
can_step = gen is not None and not gen.done and not stale

with st.container(border=True):
    c1, c2 = st.columns([3, 1])
    c1.selectbox(tr("reuse.preset"), presets, key="reuse_preset", index=None, placeholder=tr("reuse.preset_pick"),
                 on_change=use_preset)
    c2.number_input(tr("reuse.max_new"), 1, 512, 24, key="reuse_max_new", help=tr("reuse.max_new_help"))
    st.text_area(tr("reuse.prompt"), key="reuse_prompt", height=80)
    b = st.columns([1, 1, 1, 1, 3])
    playing = state.reuse_playing
    b[0].button(tr("reuse.prefill"), on_click=prefill, disabled=backend is None or playing, type="primary",
                key="reuse_btn_prefill")
    b[1].button(tr("reuse.step"), on_click=step, disabled=not can_step or playing, key="reuse_btn_step")
    if playing:
        b[2].button(tr("reuse.pause"), on_click=play, args=(False,), key="reuse_btn_pause")
    else:
        b[2].button(tr("reuse.play"), on_click=play, args=(True,), disabled=not can_step, key="reuse_btn_play")
    b[3].button(tr("reuse.reset"), on_click=reset, key="reuse_btn_reset")
    b[4].slider(tr("reuse.speed"), 0.5, 8.0, 2.0, 0.5, key="reuse_speed", help=tr("reuse.speed_help"))

if "reuse_error" in state:
    ui.show_error(state.pop("reuse_error"))
if stale:
    st.warning(tr("reuse.stale", name=gen.backend.spec.name))
if backend is not None:
    ui.model_caption(backend)
period = 1.0 / state.reuse_speed


@st.fragment(run_every=period if state.reuse_playing and can_step else None)
def live_view() -> None:
    """Steps when Play is on and a step is due, then draws everything from the generation's real state."""
    gen: Generation | None = state.reuse_gen
    if state.reuse_playing and gen is not None and not stale:
        # Widget changes also rerun this fragment: step only on the timer's beat.
        if not gen.done and time.monotonic() - state.reuse_last_step >= 0.8 * period:
            step()
        if gen.done:
            state.reuse_playing = False
            st.rerun()  # the whole page, so the timer stops
    if gen is None:
        st.info(tr("reuse.empty"))
        return
    draw(gen)


def draw(gen: Generation) -> None:
    be, arch, last = gen.backend, gen.backend.spec, gen.events[-1]
    texts = decode_view.token_texts(be.tokenizer, gen.token_ids)
    labels = decode_view.position_labels(chip_labels(texts))  # byte runs as their characters
    n_prompt, n_steps, n_cached = len(gen.prompt_ids), len(gen.events) - 1, last.cache_lengths[0]

    st.subheader(tr("reuse.tokens_title"))
    st.caption(tr("reuse.status", n_prompt=n_prompt, n_steps=n_steps, n_gen=gen.n_generated, n_cached=n_cached,
                  ttft_ms=f"{gen.events[0].seconds * 1e3:.1f}", step_ms=f"{last.seconds * 1e3:.1f}")
               + (" " + tr("reuse.done") if gen.done else ""))
    top_caption = tr("reuse.top_caption", token=decode_view.visible(texts[-1]))
    st.html(decode_view.token_strip_html(texts, n_prompt, last.top_k, top_caption, lecture=lecture))

    st.subheader(tr("reuse.growth_title"))
    st.caption(tr("reuse.growth_help"))
    g1, g2 = st.columns([3, 2])
    g1.plotly_chart(charts.cache_growth_figure(
        decode_view.written_at(gen.events), labels, title=tr("reuse.growth_chart", n=n_cached),
        x_title=tr("reuse.position"), hover=tr("reuse.growth_hover"), lecture=lecture), key="reuse_growth")
    g2.plotly_chart(charts.cache_bytes_figure(
        [e.index for e in gen.events], [e.live_bytes for e in gen.events], [e.allocated_bytes for e in gen.events],
        [e.formula_bytes for e in gen.events], title=tr("reuse.bytes_chart"), x_title=tr("reuse.pass"),
        y_title=tr("reuse.bytes"), names=(tr("reuse.live"), tr("reuse.allocated"), tr("reuse.formula")),
        lecture=lecture), key="reuse_bytes")

    k1, k2 = st.columns(2)
    with k1:
        st.subheader(tr("reuse.kv_title"))
        s1, s2, s3 = st.columns(3)
        layer = s1.selectbox(tr("reuse.layer"), range(arch.n_layers), key="reuse_kv_layer")
        head = s2.selectbox(tr("reuse.kv_head"), range(arch.n_kv_heads), key="reuse_kv_head")
        kind = s3.radio(tr("reuse.k_or_v"), ("K", "V"), horizontal=True, key="reuse_kv_kind")
        k, v = be.layer_kv(gen.cache, layer)
        values = (k if kind == "K" else v)[0, head].float().cpu().numpy()
        st.plotly_chart(charts.kv_values_figure(
            values, labels, title=tr("reuse.kv_chart", kind=kind, layer=layer, head=head, n=values.shape[0]),
            x_title=tr("reuse.dim"), lecture=lecture), key="reuse_kv")
    with k2:
        st.subheader(tr("reuse.attn_title"))
        attn_layer = st.selectbox(tr("reuse.layer"), range(arch.n_layers), key="reuse_attn_layer")
        rows = last.attention[attn_layer]
        st.plotly_chart(charts.attention_figure(
            rows, labels, decode_view.head_labels(arch.n_heads, arch.n_kv_heads),
            decode_view.kv_head_of(arch.n_heads, arch.n_kv_heads),
            title=tr("reuse.attn_chart", layer=attn_layer, token=decode_view.visible(texts[rows.shape[1] - 1])),
            x_title=tr("reuse.position"), lecture=lecture), key="reuse_attn")
        st.caption(tr("reuse.attn_help", kind=arch.attention_kind, group=arch.n_heads // arch.n_kv_heads))

    st.subheader(tr("reuse.work_title"))
    pw = work.pass_work(arch, last)
    m = st.columns(4)
    m[0].metric(tr("reuse.positions_cached"), pw.cached_positions)
    m[1].metric(tr("reuse.positions_recompute"), pw.recompute_positions)
    m[2].metric(tr("reuse.scores_cached"), f"{pw.cached_scores:,}")
    m[3].metric(tr("reuse.scores_recompute"), f"{pw.recompute_scores:,}")
    w1, w2 = st.columns(2)
    w1.plotly_chart(charts.step_work_figure(
        pw, title=tr("reuse.step_work_chart", t=pw.n_keys), categories=(tr("reuse.qkv_vectors"), tr("reuse.scores")),
        names=(tr("reuse.with_cache"), tr("reuse.without_cache")), y_title=tr("reuse.count_log"), lecture=lecture),
        key="reuse_step_work")
    cw = work.cumulative_work(arch, gen.events)
    n_axis = list(range(n_prompt, n_prompt + gen.max_new_tokens))
    w2.plotly_chart(charts.cumulative_work_figure(
        cw, n_axis, [work.analytic_cached(arch, n) for n in n_axis],
        [work.analytic_recompute(arch, n_prompt, n) for n in n_axis], title=tr("reuse.cum_chart"),
        x_title=tr("reuse.seq_len"), y_title=tr("reuse.scores"),
        names=(tr("reuse.measured_cached"), tr("reuse.measured_recompute"), tr("reuse.analytic_cached"),
               tr("reuse.analytic_recompute")), lecture=lecture), key="reuse_cum_work")
    st.caption(tr("reuse.work_help", ratio=f"{cw.recompute[-1] / cw.cached[-1]:.1f}"))

    st.subheader(tr("reuse.check_title"))
    check_key = (id(gen), len(gen.events))
    if check_key not in state.reuse_checks:
        state.reuse_checks = {check_key: gen.cache_vs_recompute()}  # once per pass, not per redraw
    delta, tok_cached, tok_fresh = state.reuse_checks[check_key]
    e = st.columns(3)
    e[0].metric(tr("reuse.max_delta"), f"{delta:.2e}")
    e[1].metric(tr("reuse.greedy_cached"), decode_view.visible(be.tokenizer.token_text(tok_cached)))
    e[2].metric(tr("reuse.greedy_recompute"), decode_view.visible(be.tokenizer.token_text(tok_fresh)))
    rounding = tolerance.agreement(delta, be.dtype, tolerance.magnitude(gen.last_logits), be.spec.d_model)
    verdict = "check_beyond" if not rounding.within else "check_same" if tok_cached == tok_fresh else "check_differs"
    (st.success if verdict == "check_same" else st.warning)(
        tr(f"reuse.{verdict}", delta=f"{delta:.2e}", tol=f"{rounding.tolerance:.2e}"))


live_view()
