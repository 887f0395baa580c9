"""Speculative Decoding: a draft proposes k tokens, the target verifies them in one pass over k + 1 positions of
its cache, and the positions it rejects are rolled back out of every cache, in place — stepped on a real decoder.
kvviz.app.views.spec draws the run from its texts and numbers, which a lecture room's followers get."""
import streamlit as st

from kvviz.app.decode_controls import DecodeController
from kvviz.app.language import lang, show_error, tr
from kvviz.app.lecture import demo_seed, ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import check_request, get_backend, limit, loading_engine, model_caption, shipped_for_hf
from kvviz.app.navigation import page_of
from kvviz.app.room.explore import page_settings
from kvviz.app.room.follow import room_part
from kvviz.app.room.session import follower_room
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.widgets import current_number, number_in_range, persisted
from kvviz.engine.spec.ngram import NgramConfig
from kvviz.errors import InputError
from kvviz.i18n import t

PAGE = page_of(__file__)
settings = page_setup("spec.title")
lecture = settings.lecture
head = lecture_head(tr("spec.title"))
with head[0], intro_box():  # on a projector folded away: the page is the demo
    st.caption(tr("spec.lead"))
settings = shipped_for_hf(settings, "spec.hf_note")  # the cache is cropped in place inside kvviz's own decoder
if follower_room():  # a lecture's follower: the lecturer's run, drawn read-only; this session runs no model
    with loading_engine():
        from kvviz.app.views.spec import follow
# A follower's page stops here; the lecturer: an open room's link and QR code, full width.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
IDEAS = ("step", "acceptance", "speed")
shown = {IDEAS[i] for i in ideas([tr(f"spec.idea_{name}") for name in IDEAS], "spec")}  # lecture: one
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.app.views.spec import EXPLORED, MEASURE_REPEATS, SPEC, download, draw
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.spec import drafts
    from kvviz.engine.spec.decoding import SpeculativeGeneration
    from kvviz.engine.spec.measure import compare
    from kvviz.lessons import decode_view
    backend = get_backend(settings)
if not isinstance(backend, NativeBackend):
    st.stop()

state = st.session_state
METHODS = drafts.METHODS
DRAFT_MODELS = ("layers", "random")  # the target's first layers with their own cache, or random weights
PLAY_PERIOD_S = 0.8
# Presets in the UI's language first: 1 a list and 2 code, where prompt lookup finds its drafts; 3 plain prose.
presets = decode_view.presets("spec", lang())
n_layers = backend.spec.n_layers
SPEC.seed()
if state.spec_prompt is None:  # kept under a non-widget key, so it survives a visit to another page
    state.spec_prompt = presets[0]
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
                               seed=run_seed())
    return lambda: drafts.ModelDraft(loaded.backend, loaded.name)


def run_seed() -> int:
    """The run's seed: one taken from a lecturer's by "Explore from here", else the demo's."""
    return demo_seed(0) if state.spec_seed is None else state.spec_seed


def prefill() -> None:
    state.spec_playing = False
    prompt = state["_w_spec_prompt"]
    try:
        factory = make_draft_factory()
        n_prompt = len(backend.tokenizer.encode(prompt))
        check_request(settings, backend, batch=1, prompt_tokens=n_prompt, max_new_tokens=number("spec_max_new"))
        gen = SpeculativeGeneration(backend, factory(), k=number("spec_k"), max_new_tokens=number("spec_max_new"),
                                    temperature=float(state.spec_temperature), seed=run_seed())
        gen.prefill(prompt)
    except InputError as exc:
        state.spec_error = exc  # the previous generation stays as it was (said once by the live view)
        return
    state.spec_gen, state.spec_factory, state.spec_prompt_used = gen, factory, prompt
    state.spec_measured = None
    # what a follower's "Explore from here" replays this run from: these settings, this seed, the same steps
    state.spec_started = {**page_settings(settings, "spec", **EXPLORED), "spec_prompt": prompt,
                          "spec_seed": run_seed()}


def step_once(gen: SpeculativeGeneration) -> bool:
    if gen.done:
        return False
    gen.step()
    return True


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
    share_button(lecture)  # behind the settings button, as on Reusing Past K/V
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


def can_step_now() -> bool:
    """Whether Step may run a pass: a run is started on this model and not finished."""
    gen: SpeculativeGeneration | None = state.spec_gen
    return decode_view.can_step(gen, gen is not None and gen.backend is not backend)


controls = DecodeController(SPEC, prefill=prefill, step=lambda: step_once(state.spec_gen), reset=reset,
                            can_step=can_step_now, period=PLAY_PERIOD_S)


@st.fragment(run_every=controls.timer())  # Play's timer
def live_view() -> None:
    """Controls and the view: a Step or a Play tick reruns only this."""
    # Every press since the last run, in order, before the controls are drawn (so they show its result).
    controls.serve()
    gen: SpeculativeGeneration | None = state.spec_gen
    playing = controls.playing
    # On a projector one row holds the buttons and the run's status line (the keys are in the Step button's help).
    if lecture:
        buttons, line = st.columns([5, 8], vertical_alignment="center")
        # Gaps half the default: five buttons (Korean labels are wider) keep one line beside the status line.
        b = [buttons.container(horizontal=True, vertical_alignment="center", gap="xsmall")] * 5 + [line]
    else:
        b = st.columns([1, 1, 1, 1, 2, 3], vertical_alignment="center")
    controls.row(b, prefill_disabled=playing,
                 step_help=tr("spec.step_help") + (" " + tr("spec.keys_help") if lecture else ""),
                 shown=len(gen.events) if gen is not None else 0)
    download(b[4], gen, compact=lecture)
    if not lecture:
        b[5].caption(tr("spec.keys_help"))
    controls.beat()
    controls.settle()  # finished: Play stops by itself
    if state.spec_error is not None:
        show_error(state.spec_error)
        state.spec_error = None
    if gen is None:
        st.info(tr("spec.empty"))
        if room is not None:  # reset, or no run yet: a room's followers wait for the next one
            room.publish(None)
        return
    if gen.backend is not backend:
        st.warning(tr("spec.stale", name=gen.backend.spec.name))
        return
    controls.warn()
    view = draw(gen, b[5] if lecture else st, shown, lecture=lecture, measure=measure, device=str(backend.device))
    if room is not None:  # a lecture room's followers draw the same; "Explore from here" replays the run
        room.publish(view, explore=state.spec_started)


controls.replay()  # "Explore from here": the lecturer's run, prefilled and stepped to the lecturer's step here
live_view()
