"""Speculative Decoding: a draft proposes k tokens, the target verifies them in one pass over k + 1 positions of
its cache, and the positions it rejects are rolled back out of every cache, in place — stepped on a real decoder."""
import dataclasses

import pandas as pd
import streamlit as st

from kvviz.app.language import lang, show_error, tr
from kvviz.app.lecture import demo_seed, ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import check_request, get_backend, limit, loading_engine, model_caption
from kvviz.app.shell import page_setup
from kvviz.app.widgets import (
    apply_press,
    chart,
    current_number,
    number_in_range,
    pending_actions,
    persisted,
    stepper,
    table,
)
from kvviz.charts import decode as decode_charts
from kvviz.charts import speculative as charts
from kvviz.engine.spec.ngram import NgramConfig
from kvviz.engine.tokenizer import chip_labels
from kvviz.errors import InputError
from kvviz.i18n import LANGS, t
from kvviz.kv.hardware import HARDWARE

settings = page_setup("spec.title")
lecture = settings.lecture
head = lecture_head(tr("spec.title"))
with head[0], intro_box():  # on a projector folded away: the page is the demo
    st.caption(tr("spec.lead"))
if settings.model == "hf":
    st.info(tr("spec.hf_note"))  # the cache is cropped in place inside kvviz's own decoder: the shipped model runs
    settings = dataclasses.replace(settings, model="tiny")
IDEAS = ("step", "acceptance", "speed")
shown = {IDEAS[i] for i in ideas([tr(f"spec.idea_{name}") for name in IDEAS], "spec")}  # lecture: one
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.spec import drafts
    from kvviz.engine.spec.decoding import SpeculativeGeneration
    from kvviz.engine.spec.measure import compare, gpu_prediction
    from kvviz.lessons import decode_view, spec_view
    backend = get_backend(settings)
if not isinstance(backend, NativeBackend):
    st.stop()

state = st.session_state
METHODS = drafts.METHODS
DRAFT_MODELS = ("layers", "random")  # the target's first layers with their own cache, or random weights
PLAY_PERIOD_S = 0.8
MEASURE_REPEATS = 3
# On a projector the target's K/V rows share what the buttons and the token strip leave of a 720 px screen: a deep
# model's (SmolLM2: 60 rows) thin to fit it.
LECTURE_GRID_PX = 200
# Presets in the UI's language first: 1 a list and 2 code, where prompt lookup finds its drafts; 3 plain prose.
presets = [t(f"spec.preset_{i}", lang) for lang in sorted(LANGS, key=lambda x: x != lang()) for i in (1, 2, 3)]
n_layers = backend.spec.n_layers
for key, value in {"spec_gen": None, "spec_playing": False, "spec_served": 0, "spec_prompt": presets[0],
                   "spec_method": "ngram", "spec_temperature": 0.0, "spec_draft_model": "layers",
                   "spec_measured": None}.items():
    state.setdefault(key, value)
max_new_limit = limit(settings, "max_new_tokens", 256)
# The number boxes' defaults; a callback reads a box with current_number (the value it would accept, else the last).
NUMBERS = {"spec_k": 4, "spec_max_new": min(32, max_new_limit), "spec_lookup_min": 2, "spec_lookup_max": 5,
           f"spec_exit_{n_layers}": drafts.default_exit_layer(n_layers)}


def number(key: str) -> int:
    return int(current_number(key, NUMBERS[key]))
LANG = lang()  # read now: a widget calls format_func later


def use_preset() -> None:
    state.spec_prompt = state.spec_preset


def make_draft_factory():  # noqa: ANN202 - a () -> Draft
    """The draft the settings describe; a draft model is built once per prefill and shared by its measurements."""
    method, m = state.spec_method, number(f"spec_exit_{n_layers}")
    if method == "ngram":
        cfg = NgramConfig(number("spec_lookup_min"), number("spec_lookup_max"))
        return lambda: drafts.NgramDraft(cfg)
    if method == "early-exit":
        return lambda: drafts.EarlyExitDraft(m)
    loaded = drafts.load_draft(drafts.RANDOM_DRAFT if state.spec_draft_model == "random" else f"layers:{m}", backend,
                               seed=demo_seed(0))
    return lambda: drafts.ModelDraft(loaded.backend, loaded.name)


def prefill() -> None:
    state.spec_playing = False
    prompt = state["_w_spec_prompt"]
    try:
        factory = make_draft_factory()
        n_prompt = len(backend.tokenizer.encode(prompt))
        check_request(settings, backend, batch=1, prompt_tokens=n_prompt, max_new_tokens=number("spec_max_new"))
        gen = SpeculativeGeneration(backend, factory(), k=number("spec_k"), max_new_tokens=number("spec_max_new"),
                                    temperature=float(state.spec_temperature), seed=demo_seed(0))
        gen.prefill(prompt)
    except InputError as exc:
        state.spec_error = exc  # the previous generation stays as it was
        return
    state.spec_gen, state.spec_factory, state.spec_prompt_used = gen, factory, prompt
    state.spec_measured = None


def step_once(gen: SpeculativeGeneration) -> bool:
    if gen.done:
        return False
    gen.step()
    return True


def play(on: bool) -> None:
    state.spec_playing = on  # set, never toggled: a click may reach the server twice


def reset() -> None:
    state.spec_gen, state.spec_playing, state.spec_measured = None, False, None


def measure() -> None:
    """Plain and speculative decoding of the same prompt, alternated, in quiet (before anything is drawn)."""
    gen: SpeculativeGeneration | None = state.spec_gen
    if gen is None:
        return
    state.spec_measured = compare(backend, state.spec_factory, state.spec_prompt_used, k=gen.k,
                                  max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, seed=gen.seed,
                                  repeats=MEASURE_REPEATS)


with head[1], settings_box(tr("spec.settings"), border=True):
    if lecture:  # on a projector the model is named behind the settings button, so the step keeps the screen
        model_caption(backend.spec)
    c1, c2, c3, c4 = st.columns([3, 2, 1, 1])
    c1.selectbox(tr("spec.preset"), presets, key="spec_preset", index=None, placeholder=tr("spec.preset_pick"),
                 on_change=use_preset)
    persisted(c2.radio, "spec_method", tr("spec.method"), options=METHODS, horizontal=True,
                 format_func=lambda m: t(f"spec.method_{m}", LANG), help=tr("spec.method_help"))
    number_in_range(c3, tr("spec.k"), 1, 8, NUMBERS["spec_k"], "spec_k", help=tr("spec.k_help"))
    number_in_range(c4, tr("spec.max_new"), 1, max_new_limit, NUMBERS["spec_max_new"], "spec_max_new")
    persisted(st.text_area, "spec_prompt", tr("spec.prompt"), height=90)
    o1, o2, o3 = st.columns(3)
    if state.spec_method == "ngram":
        for box, key in ((o1, "spec_lookup_min"), (o2, "spec_lookup_max")):
            number_in_range(box, tr(f"spec.{key.removeprefix('spec_')}"), 1, 16, NUMBERS[key], key,
                            help=tr("spec.lookup_help"))
    else:
        number_in_range(o1, tr("spec.exit_layer", n_layers=n_layers), 1, max(1, n_layers - 1),
                        NUMBERS[f"spec_exit_{n_layers}"], f"spec_exit_{n_layers}", help=tr("spec.exit_layer_help"))
        if state.spec_method == "draft":
            persisted(o2.radio, "spec_draft_model", tr("spec.draft_model"), options=DRAFT_MODELS,
                         format_func=lambda d: t(f"spec.draft_{d}", LANG), help=tr("spec.draft_help"))
    persisted(o3.slider, "spec_temperature", tr("spec.temperature"), min_value=0.0, max_value=2.0, step=0.1,
                 help=tr("spec.temperature_help"))

if not lecture:
    model_caption(backend.spec)
gen0: SpeculativeGeneration | None = state.spec_gen
state.spec_timer_on = bool(state.spec_playing and gen0 is not None and not gen0.done)


def apply(action: str) -> None:
    """One press from the stepper's log, in the order it was made (as on Reusing Past K/V)."""
    gen: SpeculativeGeneration | None = state.spec_gen
    can_step = gen is not None and not gen.done and gen.backend is backend
    apply_press(action, playing=state.spec_playing, can_step=can_step, prefill=prefill, reset=reset, play=play,
                step=lambda: step_once(gen))


ORDERED_BUTTONS = {"spec_btn_prefill": "prefill", "spec_btn_play": "play", "spec_btn_pause": "pause",
                   "spec_btn_reset": "reset"}


@st.fragment(run_every=PLAY_PERIOD_S if state.spec_timer_on else None)
def live_view() -> None:
    """Controls and the view: a Step or a Play tick reruns only this."""
    # Every press since the last run, in order, before the controls are drawn (so they show its result).
    for number, action in pending_actions("spec_stepper", state.spec_served):
        apply(action)
        state.spec_served = number
    gen: SpeculativeGeneration | None = state.spec_gen
    playing = state.spec_playing
    can_step = gen is not None and not gen.done and gen.backend is backend
    # On a projector one row holds the buttons and the run's status line (the keys are in the Step button's help).
    if lecture:
        buttons, line = st.columns([5, 8], vertical_alignment="center")
        b = [buttons.container(horizontal=True, vertical_alignment="center")] * 4 + [line]
    else:
        b = st.columns([1, 1, 1, 1, 3], vertical_alignment="center")
    b[0].button(tr("spec.prefill"), on_click=prefill, disabled=playing, type="primary", key="spec_btn_prefill")
    with b[1]:
        stepper(tr("spec.step"), key="spec_stepper", served=state.spec_served, disabled=not can_step or playing,
                help=tr("spec.step_help") + (" " + tr("spec.keys_help") if lecture else ""),
                buttons=ORDERED_BUTTONS, keys={"p": "toggle_play", "r": "reset"},
                shown=len(gen.events) if gen is not None else 0, playing=playing, behind=tr("spec.play_jump"))
    if playing:
        b[2].button(tr("spec.pause"), on_click=play, args=(False,), key="spec_btn_pause", icon=":material/pause:")
    else:
        b[2].button(tr("spec.play"), on_click=play, args=(True,), disabled=not can_step, key="spec_btn_play",
                    icon=":material/play_arrow:")
    b[3].button(tr("spec.reset"), on_click=reset, key="spec_btn_reset")
    if not lecture:
        b[4].caption(tr("spec.keys_help"))
    if playing and can_step:
        step_once(gen)
    if state.spec_playing and (gen is None or gen.done):
        state.spec_playing = False
    if bool(state.spec_playing and gen is not None and not gen.done) != state.spec_timer_on:
        st.rerun(scope="app")  # the whole page, so the timer starts or stops
    if "spec_error" in state:
        show_error(state.pop("spec_error"))
    if gen is None:
        st.info(tr("spec.empty"))
        return
    if gen.backend is not backend:
        st.warning(tr("spec.stale", name=gen.backend.spec.name))
        return
    draw(gen, b[4] if lecture else st)


def texts_of(gen: SpeculativeGeneration, ids) -> dict[int, str]:  # noqa: ANN001 - any iterable of ids
    return {i: decode_view.token_texts(gen.backend.tokenizer, [i])[0] for i in set(ids)}


def draw(gen: SpeculativeGeneration, status) -> None:  # noqa: ANN001 - where the status line goes
    last, stats = gen.events[-1], gen.stats
    if lecture and "step" in shown:  # on a projector this idea's line beside the buttons is its bytes (step_view)
        step_view(gen, status)
        return
    status.caption(tr("spec.status", n_prompt=len(gen.prompt_ids), n_gen=gen.n_generated, passes=gen.target_passes,
                  plain=gen.plain_passes, rolled=gen.rollback_tokens, mal=f"{stats.mean_acceptance_length:.2f}",
                  step_ms=f"{last.seconds * 1e3:.1f}") + (" " + tr("spec.done") if gen.done else ""))
    if "step" in shown:
        step_view(gen, st)
    if "acceptance" in shown:
        acceptance_view(gen)
    if "speed" in shown:
        speed_view(gen)


def step_view(gen: SpeculativeGeneration, bytes_line) -> None:  # noqa: ANN001 - where the bytes line goes
    last = gen.events[-1]
    texts = decode_view.token_texts(gen.backend.tokenizer, gen.token_ids)
    names = texts_of(gen, last.drafted)
    if last.phase == "prefill":
        legend = tr("spec.strip_prefill")
    elif not last.drafted:
        legend = tr("spec.strip_nodraft")
    else:
        legend = tr("spec.strip_legend", drafted=len(last.drafted), accepted=last.accepted, k1=len(last.drafted) + 1,
                    rolled=last.rolled_back)
    st.html(spec_view.step_strip_html(texts, len(gen.prompt_ids), last, names, legend, lecture=lecture))
    if last.drafted and not lecture:
        rows = spec_view.draft_rows(last, names)
        df = pd.DataFrame([{tr("spec.col_i"): r["i"], tr("spec.col_position"): r["position"],
                            tr("spec.col_token"): r["token"],
                            tr("spec.col_p"): f"{r['p']:.3f}",
                            tr("spec.col_q"): "—" if r["q"] is None else f"{r['q']:.3f}",
                            tr("spec.col_kept"): tr("spec.kept_yes" if r["kept"] else "spec.kept_no")} for r in rows])
        st.dataframe(df, hide_index=True)
    shared = gen.draft.shared_layers
    grid = spec_view.cache_grid(gen.events, shared)
    labels = decode_view.position_labels(chip_labels(texts[:-1] + [names[d] for d in grid.rejected_ids]))
    kinds = ("prefill", "step", "draft", "newest", "rejected") if shared else ("prefill", "step", "newest", "rejected")
    legend = [tr(f"spec.legend_{k}", last=shared - 1) for k in kinds]
    n_kept = last.cache_lengths[0]
    st.html(decode_charts.cache_grid_html(
        grid.written, labels, title=tr("spec.grid_title", n=n_kept, rolled=last.rolled_back),
        x_title=tr("spec.position"), hover=tr("spec.grid_hover"), legend=legend, legend_kinds=kinds,
        kinds=grid.kinds, lecture=lecture, rows_px=LECTURE_GRID_PX if lecture else None))
    bytes_line.caption(tr("spec.bytes_line", peak=f"{last.peak_live_bytes:,}", live=f"{last.live_bytes:,}",
                  formula=f"{last.formula_bytes:,}", allocated=f"{last.allocated_bytes:,}",
                  verdict=tr("spec.bytes_equal" if last.live_bytes == last.formula_bytes else "spec.bytes_differ")))
    if gen.draft.cache is not None:  # a separate draft model: its own cache, cropped too
        own = spec_view.cache_grid(gen.events, own_lengths=True)
        st.html(decode_charts.cache_grid_html(
            own.written, labels, title=tr("spec.draft_grid_title", name=getattr(gen.draft, "name", ""),
                                          n=last.draft_lengths[0], rolled=last.draft_rolled_back),
            x_title=tr("spec.position"), hover=tr("spec.grid_hover"),
            legend=[tr(f"spec.legend_{k}") for k in ("prefill", "step", "newest")],
            layer_names=[f"D{i}" for i in range(len(own.written))], lecture=lecture,
            rows_px=LECTURE_GRID_PX if lecture else None))
        st.caption(tr("spec.draft_bytes", live=f"{last.draft_live_bytes:,}", formula=f"{last.draft_formula_bytes:,}"))
    elif shared:
        st.caption(tr("spec.shared_caption", m=shared, last=shared - 1))


def acceptance_view(gen: SpeculativeGeneration) -> None:
    stats = gen.stats
    m = st.columns(4)
    m[0].metric(tr("spec.m_mal"), f"{stats.mean_acceptance_length:.2f}", help=tr("spec.m_mal_help"))
    m[1].metric(tr("spec.m_passes"), f"{gen.target_passes} / {gen.plain_passes}", help=tr("spec.m_passes_help"))
    m[2].metric(tr("spec.m_rolled"), gen.rollback_tokens, help=tr("spec.m_rolled_help"))
    m[3].metric(tr("spec.m_draft_kv"), f"{max(e.draft_peak_formula_bytes for e in gen.events):,} B",
                help=tr("spec.m_draft_kv_help", after=f"{gen.events[-1].draft_formula_bytes:,}"))
    if len(gen.events) < 2:
        st.info(tr("spec.no_steps"))
        return
    left, right = st.columns([3, 2])
    with left:
        series = spec_view.acceptance_series(gen.events)
        labels = {k: tr(f"spec.c_{k}") for k in ("accepted", "rejected", "emitted", "mean_length", "step", "tokens")}
        chart(charts.acceptance_figure(series, labels | {"title": tr("spec.c_acceptance_title")}, lecture=lecture),
                 "spec_acceptance")
    with right:
        # On a projector the bytes chart is folded under this one, so the idea keeps one screen.
        chart(charts.per_position_figure(stats.acceptance_rate_per_pos, {
            "position": tr("spec.c_draft_position"), "rate": tr("spec.c_rate"),
            "title": tr("spec.c_per_position_title", drafts=stats.num_drafts)}, lecture=lecture, lecture_height=290),
            "spec_per_position")
    ev = gen.events
    with right.expander(tr("spec.c_bytes_title")) if lecture else st.container():
        chart(charts.bytes_figure(
            [e.index for e in ev], [e.peak_live_bytes for e in ev], [e.live_bytes for e in ev],
            [e.formula_bytes for e in ev], [e.draft_live_bytes for e in ev],
            {k: tr(f"spec.c_{k}") for k in ("peak", "live", "formula", "draft", "step", "bytes")}
            | {"title": tr("spec.c_bytes_title")}, lecture=lecture), "spec_bytes")


def _ms(s) -> str:  # noqa: ANN001 - a metrics.Spread
    return f"{s.median * 1e3:.2f} ms ({s.low * 1e3:.2f}–{s.high * 1e3:.2f})"


def speed_view(gen: SpeculativeGeneration) -> None:
    st.caption(tr("spec.speed_help"))
    c1, c2 = st.columns([2, 3])
    c1.button(tr("spec.measure", repeats=MEASURE_REPEATS), on_click=measure, key="spec_btn_measure",
              help=tr("spec.measure_help"))
    gpu = c2.selectbox(tr("spec.gpu"), [n for n, h in HARDWARE.items() if h.memory_kind != "given"],
                       key="spec_gpu")
    measured = state.spec_measured
    run = measured.spec if measured is not None else gen
    pred = gpu_prediction(run, HARDWARE[gpu]) if run.n_generated > 1 else None
    rows = []
    if measured is not None and measured.tpot_s and measured.tpot_plain_s:
        rows.append({tr("spec.col_where"): tr("spec.here", device=str(backend.device)),
                     tr("spec.col_plain"): _ms(measured.tpot_plain_s), tr("spec.col_spec"): _ms(measured.tpot_s),
                     tr("spec.col_speedup"): f"{measured.speedup:.2f}×"})
    if pred is not None:
        rows.append({tr("spec.col_where"): tr("spec.roofline", gpu=gpu),
                     tr("spec.col_plain"): f"{pred.plain_s / max(run.n_generated - 1, 1) * 1e6:.1f} µs",
                     tr("spec.col_spec"): f"{pred.spec_s / max(run.n_generated - 1, 1) * 1e6:.1f} µs",
                     tr("spec.col_speedup"): f"{pred.speedup:.2f}×"})
    if rows:
        table(pd.DataFrame(rows), "spec_speed")
    if measured is None:
        st.info(tr("spec.measure_first"))
    else:
        same = measured.tokens_equal_plain
        st.caption(tr("spec.same_tokens" if same else "spec.sampled" if same is None else "spec.not_same"))
    if pred is not None:
        st.caption(tr("spec.roofline_help", ratio=f"{pred.verify_over_decode:.2f}", gpu=gpu))


live_view()
