"""Reusing Past K/V: a real decoder, one token at a time — the cache grows, past K/V are reused, work is counted."""
import time

import streamlit as st

from kvviz.app.language import lang, show_error, tr
from kvviz.app.lecture import intro_box, lecture_head, settings_box
from kvviz.app.models import check_request, get_backend, limit, loading_engine, model_caption
from kvviz.app.shell import page_setup
from kvviz.app.timing import record_timing
from kvviz.app.widgets import apply_press, chart, current_number, number_in_range, pending_actions, persisted, stepper
from kvviz.charts import decode as charts
from kvviz.engine.chat import chat_prompt
from kvviz.engine.tokenizer import chip_labels
from kvviz.errors import InputError
from kvviz.i18n import LANGS, t

settings = page_setup("reuse.title")
lecture = settings.lecture
head = lecture_head(tr("reuse.title"))
with head[0], intro_box():  # on a projector folded away: the page is the demo
    st.caption(tr("reuse.lead"))
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.engine import tolerance
    from kvviz.engine.generation import Generation
    from kvviz.lessons import decode_view, work
    backend = get_backend(settings)

state = st.session_state
state.setdefault("reuse_gen", None)
state.setdefault("reuse_playing", False)
state.setdefault("reuse_checks", {})
state.setdefault("reuse_served", 0)  # the number of the last press applied (the stepper's log only grows)
state.setdefault("reuse_play_times", [])  # when Play's recent steps ran: the rate it really keeps
# The settings a generation was started with: a later sidebar change must not be applied to it silently.
model_key = decode_view.ModelKey(settings.model, settings.dtype, settings.device, settings.hf_model,
                                 settings.shape if settings.model == "random" else None, settings.engine)

# Presets in the UI's language first, then the other language's.
presets = [t(f"reuse.preset_{i}", language) for language in sorted(LANGS, key=lambda x: x != lang())
           for i in (1, 2, 3)]
# Kept under non-widget keys, so they survive a visit to another page (as the generation does).
state.setdefault("reuse_prompt", presets[0])
state.setdefault("reuse_speed", 4.0)
max_new_limit = limit(settings, "max_new_tokens", 512)  # a hosted demo caps it


def use_preset() -> None:
    state.reuse_prompt = state.reuse_preset


def prefill() -> None:
    state.reuse_playing = False
    if backend is None:
        return
    prompt, max_new = state["_w_reuse_prompt"], current_number("_w_reuse_max_new")  # never a refused value
    template = getattr(backend.tokenizer, "chat_template", None)
    try:
        if state.get("_w_reuse_chat") and template:
            prompt = chat_prompt(template, prompt)  # the model's own turn markers, shown as tokens in the strip
        if settings.hosted is not None:
            n_prompt = len(backend.tokenizer.encode(prompt))
            check_request(settings, backend, batch=1, prompt_tokens=n_prompt, max_new_tokens=max_new)
        gen = Generation(backend, max_new_tokens=max_new, capture_attention=True)
        gen.prefill(prompt)
    except InputError as exc:
        state.reuse_error = exc  # the previous generation stays as it was
        return
    state.reuse_gen, state.reuse_model_key = gen, model_key
    state.reuse_checks, state.reuse_play_times = {}, []
    # The context may hold fewer new tokens than asked: say so (the engine clamps, never errs mid-way).
    state.reuse_clamped = (gen.max_new_tokens, backend.spec.max_context) if gen.max_new_tokens < max_new else None


def step_once(gen: Generation) -> bool:
    if gen.done or gen.cache is None:
        return False
    gen.step()  # only the newest token goes in; the prefill is never rerun
    return True


def play(on: bool) -> None:
    # Set, never toggle: a click can reach the server twice when a timed fragment run coalesces with it.
    state.reuse_playing = on
    state.reuse_play_times, state.reuse_play_next = [], None


def reset() -> None:
    state.reuse_gen, state.reuse_playing, state.reuse_checks = None, False, {}
    state.reuse_clamped = None


def is_stale(gen: Generation | None) -> list[str]:
    """What changed in the sidebar since `gen` started (its settings are never applied to it silently)."""
    return decode_view.changed_settings(state.get("reuse_model_key"), model_key) if gen is not None else []


gen: Generation | None = state.reuse_gen
changed = is_stale(gen)
stale = bool(changed)
if stale and state.reuse_playing:
    state.reuse_playing = False  # stopped, and it stays stopped if the sidebar goes back: no surprise replay
can_step = gen is not None and not gen.done and not stale and gen.cache is not None

with head[1], settings_box(tr("reuse.settings"), border=True):
    c1, c2, c3 = st.columns([3, 1, 1])
    c1.selectbox(tr("reuse.preset"), presets, key="reuse_preset", index=None, placeholder=tr("reuse.preset_pick"),
                 on_change=use_preset)
    number_in_range(c2, tr("reuse.max_new"), 1, max_new_limit, 24, "_w_reuse_max_new", help=tr("reuse.max_new_help"))
    persisted(c3.slider, "reuse_speed", tr("reuse.speed"), min_value=0.5, max_value=8.0, step=0.5,
              help=tr("reuse.speed_help"))
    persisted(st.text_area, "reuse_prompt", tr("reuse.prompt"), height=80)
    has_template = backend is not None and bool(getattr(backend.tokenizer, "chat_template", None))
    state.setdefault("reuse_chat", False)
    persisted(st.toggle, "reuse_chat", tr("reuse.chat"), disabled=not has_template,
              help=tr("reuse.chat_help" if has_template else "reuse.chat_none"))
    if backend is not None and lecture:  # on a projector behind the settings button, with the prompt
        model_caption(backend.spec)

if backend is not None and not lecture:
    model_caption(backend.spec)
period = 1.0 / float(state.reuse_speed)
# Whether this full run starts Play's timer: a fragment rerun keeps the timer it was registered with, so a
# change of playing needs a whole-page rerun.
state.reuse_timer_on = bool(state.reuse_playing and can_step)
TABS = ("growth", "bytes", "values", "attention", "work", "check")


def apply(action: str) -> None:
    """One press from the stepper's log, in the order it was made (Prefill, R, Prefill, R, Space ends with none)."""
    gen: Generation | None = state.reuse_gen
    can_step = gen is not None and not gen.done and gen.cache is not None and not is_stale(gen)
    apply_press(action, playing=state.reuse_playing, can_step=can_step, prefill=prefill, reset=reset, play=play,
                step=lambda: step_once(gen))


ORDERED_BUTTONS = {"reuse_btn_prefill": "prefill", "reuse_btn_play": "play", "reuse_btn_pause": "pause",
                   "reuse_btn_reset": "reset"}


@st.fragment(run_every=period if state.reuse_timer_on else None)
def live_view() -> None:
    """Controls and the live view: a Step, Play tick or tab switch reruns only this, not the whole page."""
    run_start = time.perf_counter()
    n_before = len(state.reuse_gen.events) if state.reuse_gen is not None else 0
    # Every press since the last run, in order, before the controls are drawn (so they show its result).
    for number, action in pending_actions("reuse_stepper", state.reuse_served):
        apply(action)
        state.reuse_served = number
    gen: Generation | None = state.reuse_gen
    playing = state.reuse_playing
    changed = is_stale(gen)  # read again here: a Prefill in this run starts a generation on the current settings
    stale = bool(changed)
    can_step = gen is not None and not gen.done and not stale and gen.cache is not None
    n_events = n_before if gen is state.reuse_gen else 0
    b = st.columns([1, 1, 1, 1, 3], vertical_alignment="center")
    # Streamlit's buttons for the look (and for AppTest); in the browser the stepper catches their clicks into its log.
    b[0].button(tr("reuse.prefill"), on_click=prefill, disabled=backend is None or playing, type="primary",
                key="reuse_btn_prefill")
    with b[1]:
        stepper(tr("reuse.step"), key="reuse_stepper", served=state.reuse_served, disabled=not can_step or playing,
                help=tr("reuse.step_help"), buttons=ORDERED_BUTTONS, keys={"p": "toggle_play", "r": "reset"},
                shown=len(gen.token_ids) if gen is not None else 0, playing=playing, behind=tr("reuse.play_jump"))
    if playing:
        b[2].button(tr("reuse.pause"), on_click=play, args=(False,), key="reuse_btn_pause", icon=":material/pause:")
    else:
        b[2].button(tr("reuse.play"), on_click=play, args=(True,), disabled=not can_step, key="reuse_btn_play",
                    icon=":material/play_arrow:")
    b[3].button(tr("reuse.reset"), on_click=reset, key="reuse_btn_reset")
    # On a projector the status line takes the keys' place (Step's tooltip names them): one row, not two.
    state.reuse_status_slot = b[4].empty() if lecture else None
    if not lecture:
        b[4].caption(tr("reuse.keys_help"))

    if playing and gen is not None and not stale:
        # Play keeps a schedule (one step every period from its start), not "a period since the last step":
        # a timer tick that comes late or early still lands on its beat, so jitter does not lose beats.
        # At most one step per redraw: a late tick shows its step late (and says so), never several at once.
        now = time.monotonic()
        before = state.get("reuse_play_next")
        due, state.reuse_play_next = decode_view.play_beats(before, now, period)
        record_timing("reuse_play_tick", due=due, late_s=0.0 if before is None else now - before)
        if before is not None and now - before > period:  # a whole beat late: the machine is behind right now
            state.reuse_play_late = now
        for _ in range(due):
            if step_once(gen):
                state.reuse_play_times.append(now)
        del state.reuse_play_times[:-21]
    if state.reuse_playing and (gen is None or gen.done or gen.cache is None or stale):
        state.reuse_playing = False  # finished (or freed): Play stops by itself
    timer_on = bool(state.reuse_playing and gen is not None and not gen.done and not stale)
    if timer_on != state.reuse_timer_on:
        st.rerun(scope="app")  # the whole page, so the timer starts or stops
    if "reuse_error" in state:
        show_error(state.pop("reuse_error"))
    if stale:
        names = ", ".join(tr(f"reuse.changed_{c}") for c in changed)
        st.warning(tr("reuse.stale", name=gen.backend.spec.name, changed=names))
    if gen is None:
        st.info(tr("reuse.empty"))
        return
    if playing:
        rate = decode_view.achieved_rate(state.reuse_play_times)
        if rate is not None and rate < 0.9 / period:
            st.warning(tr("reuse.play_behind", rate=f"{rate:.1f}", asked=f"{1 / period:g}"))
        elif time.monotonic() - state.get("reuse_play_late", -1e9) < 3.0:  # before the rate says it
            st.warning(tr("reuse.play_late", asked=f"{1 / period:g}"))
    draw(gen)
    if len(gen.events) > n_events:  # this run served steps: the server's own time for them, for bench/
        record_timing("reuse_steps", steps=len(gen.events) - n_events, run_s=time.perf_counter() - run_start,
                      model_s=sum(e.seconds for e in gen.events[n_events:]))


def draw(gen: Generation) -> None:
    be, last = gen.backend, gen.events[-1]
    texts = decode_view.token_texts(be.tokenizer, gen.token_ids)
    labels = decode_view.position_labels(chip_labels(texts))  # byte runs as their characters
    n_prompt, n_steps, n_cached = len(gen.prompt_ids), len(gen.events) - 1, last.cache_lengths[0]

    (state.get("reuse_status_slot") or st).caption(
        tr("reuse.status", n_prompt=n_prompt, n_steps=n_steps, n_gen=gen.n_generated, n_cached=n_cached,
           ttft_ms=f"{gen.events[0].seconds * 1e3:.1f}", step_ms=f"{last.seconds * 1e3:.1f}")
        + (" " + tr("reuse.done") if gen.done else ""))
    if state.get("reuse_clamped"):
        n_fit, max_len = state.reuse_clamped
        st.warning(tr("reuse.clamped", n_new=n_fit, max_len=max_len))
    top_caption = tr("reuse.top_short" if lecture else "reuse.top_caption", token=decode_view.visible(texts[-1]))
    st.html(decode_view.token_strip_html(texts, n_prompt, last.top_k, top_caption, lecture=lecture))

    # Only the open tab is drawn (Streamlit tells the server which one): a step redraws one lesson, not six charts.
    tabs = st.tabs([tr(f"reuse.tab_{name}") for name in TABS], key="reuse_tab", on_change="rerun")
    opened = next((name for name, tab in zip(TABS, tabs, strict=True) if tab.open), TABS[0])
    with tabs[TABS.index(opened)]:
        {"growth": growth_tab, "bytes": bytes_tab, "values": values_tab, "attention": attention_tab, "work": work_tab,
         "check": check_tab}[opened](gen, labels, texts)


def growth_tab(gen: Generation, labels: list[str], texts: list[str]) -> None:
    n_cached = gen.events[-1].cache_lengths[0]
    if not lecture:  # said aloud on a projector; the legend under the grid names the colours
        st.caption(tr("reuse.growth_help"))
    st.html(charts.cache_grid_html(
        decode_view.written_at(gen.events), labels, title=tr("reuse.growth_chart", n=n_cached),
        x_title=tr("reuse.position"), hover=tr("reuse.growth_hover"),
        legend=(tr("reuse.legend_prefill"), tr("reuse.legend_steps"), tr("reuse.legend_newest")), lecture=lecture))
    last = gen.events[-1]
    if not lecture:  # on a projector the Cache bytes tab shows them
        st.caption(tr("reuse.bytes_line", live=f"{last.live_bytes:,}", formula=f"{last.formula_bytes:,}",
                      allocated=f"{last.allocated_bytes:,}"))


def bytes_tab(gen: Generation, labels: list[str], texts: list[str]) -> None:
    chart(charts.cache_bytes_figure(
        [e.index for e in gen.events], [e.live_bytes for e in gen.events], [e.allocated_bytes for e in gen.events],
        [e.formula_bytes for e in gen.events], title=tr("reuse.bytes_chart"), x_title=tr("reuse.pass"),
        y_title=tr("reuse.bytes"), names=(tr("reuse.live"), tr("reuse.allocated"), tr("reuse.formula")),
        lecture=lecture), key="reuse_bytes")


def beside() -> tuple:
    """Where a tab's selectors and its chart go: on a projector side by side (the chart keeps the height), else one
    above the other."""
    return st.columns([1, 4]) if lecture else (st.container(), st.container())


def values_tab(gen: Generation, labels: list[str], texts: list[str]) -> None:
    be, arch = gen.backend, gen.backend.spec
    if not lecture:  # the tab names it
        st.subheader(tr("reuse.kv_title"))
    pick, view = beside()
    s1, s2, s3 = (pick, pick, pick) if lecture else st.columns(3)
    layer = s1.selectbox(tr("reuse.layer"), range(arch.n_layers), key="reuse_kv_layer")
    head = s2.selectbox(tr("reuse.kv_head"), range(arch.n_kv_heads), key="reuse_kv_head")
    kind = s3.radio(tr("reuse.k_or_v"), ("K", "V"), horizontal=True, key="reuse_kv_kind")
    k, v = be.layer_kv(gen.cache, layer)
    values = (k if kind == "K" else v)[0, head].float().cpu().numpy()
    with view:
        chart(charts.kv_values_figure(
            values, labels, title=tr("reuse.kv_chart", kind=kind, layer=layer, head=head, n=values.shape[0]),
            x_title=tr("reuse.dim"), lecture=lecture), key="reuse_kv")


def attention_tab(gen: Generation, labels: list[str], texts: list[str]) -> None:
    arch, last = gen.backend.spec, gen.events[-1]
    if not lecture:  # the tab names it
        st.subheader(tr("reuse.attn_title"))
    pick, view = beside()
    attn_layer = pick.selectbox(tr("reuse.layer"), range(arch.n_layers), key="reuse_attn_layer")
    rows = last.attention[attn_layer]
    with view:
        chart(charts.attention_figure(
            rows, labels, decode_view.head_labels(arch.n_heads, arch.n_kv_heads),
            decode_view.kv_head_of(arch.n_heads, arch.n_kv_heads),
            title=tr("reuse.attn_chart", layer=attn_layer, token=decode_view.visible(texts[rows.shape[1] - 1])),
            x_title=tr("reuse.position"), lecture=lecture), key="reuse_attn")
    pick.caption(tr("reuse.attn_help", kind=arch.attention_kind, group=arch.n_heads // arch.n_kv_heads))


def work_tab(gen: Generation, labels: list[str], texts: list[str]) -> None:
    arch, last, n_prompt = gen.backend.spec, gen.events[-1], len(gen.prompt_ids)
    if not lecture:  # the tab names it
        st.subheader(tr("reuse.work_title"))
    pw = work.pass_work(arch, last)
    if not lecture:  # on a projector the two charts carry the counts (their bars are labelled)
        m = st.columns(4)
        m[0].metric(tr("reuse.positions_cached"), pw.cached_positions)
        m[1].metric(tr("reuse.positions_recompute"), pw.recompute_positions)
        m[2].metric(tr("reuse.scores_cached"), f"{pw.cached_scores:,}")
        m[3].metric(tr("reuse.scores_recompute"), f"{pw.recompute_scores:,}")
    w1, w2 = st.columns(2)
    with w1:
        chart(charts.step_work_figure(
            pw, title=tr("reuse.step_work_chart", t=pw.n_keys),
            categories=(tr("reuse.qkv_vectors"), tr("reuse.scores")),
            names=(tr("reuse.with_cache"), tr("reuse.without_cache")), y_title=tr("reuse.count_log"),
            lecture=lecture), key="reuse_step_work")
    cw = work.cumulative_work(arch, gen.events)
    n_axis = list(range(n_prompt, n_prompt + gen.max_new_tokens))
    ratio = f"{cw.recompute[-1] / cw.cached[-1]:.1f}"
    # On a projector the chart's title carries the ratio the caption below gives on the page.
    cum_title = tr("reuse.cum_chart_ratio", ratio=ratio) if lecture else tr("reuse.cum_chart")
    with w2:
        chart(charts.cumulative_work_figure(
            cw, n_axis, [work.analytic_cached(arch, n) for n in n_axis],
            [work.analytic_recompute(arch, n_prompt, n) for n in n_axis], title=cum_title,
            x_title=tr("reuse.seq_len"), y_title=tr("reuse.scores"),
            names=(tr("reuse.measured_cached"), tr("reuse.measured_recompute"), tr("reuse.analytic_cached"),
                   tr("reuse.analytic_recompute")), lecture=lecture), key="reuse_cum_work")
    if not lecture:
        st.caption(tr("reuse.work_help", ratio=ratio))


def check_tab(gen: Generation, labels: list[str], texts: list[str]) -> None:
    be = gen.backend
    if not lecture:  # the tab names it
        st.subheader(tr("reuse.check_title"))
    if gen.cache is None:  # freed after idling on a hosted demo: nothing to compare
        st.info(tr("reuse.empty"))
        return
    check_key = (id(gen), len(gen.events))
    if check_key not in state.reuse_checks:
        state.reuse_checks = {check_key: gen.cache_vs_recompute()}  # once per pass, and only when this tab is open
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
