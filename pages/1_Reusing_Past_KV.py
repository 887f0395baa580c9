"""Reusing Past K/V: a real decoder, one token at a time — the cache grows, past K/V are reused, work is counted."""
import time

import streamlit as st

from kvviz.app.decode_controls import DecodeController
from kvviz.app.language import lang, show_error, tr
from kvviz.app.lecture import intro_box, lecture_head, settings_box
from kvviz.app.models import c_step, check_request, get_backend, limit, loading_engine, model_caption
from kvviz.app.navigation import page_of
from kvviz.app.room.follow import room_part
from kvviz.app.room.session import follower_room
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.timing import record_timing
from kvviz.app.widgets import current_number, number_in_range, persisted
from kvviz.engine.chat import chat_prompt
from kvviz.errors import InputError

PAGE = page_of(__file__)
settings = page_setup("reuse.title")
lecture = settings.lecture
head = lecture_head(tr("reuse.title"))
with head[0], intro_box():  # on a projector folded away: the page is the demo
    st.caption(tr("reuse.lead"))
if follower_room():  # a lecture's follower: the lecturer's run, drawn read-only; this session runs no model
    with loading_engine():
        from kvviz.app.views.reuse import follow
# A follower's page stops here; the lecturer: an open room's link and QR code, full width (scannable from the back).
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.app.views.reuse import REUSE, download, draw, run_settings
    from kvviz.engine.generation import Generation
    from kvviz.lessons import decode_view
    backend = get_backend(settings)
    compiled = c_step(backend) if backend is not None else None  # the status line names it when a step ran on it

state = st.session_state
REUSE.seed()
# The settings a generation was started with: a later sidebar change must not be applied to it silently.
model_key = decode_view.ModelKey(settings.model, settings.dtype, settings.device, settings.hf_model,
                                 settings.shape if settings.model == "random" else None, settings.engine)

presets = decode_view.presets("reuse", lang())  # in the UI's language first, then the other language's
if state.reuse_prompt is None:  # kept under a non-widget key, so it survives a visit to another page
    state.reuse_prompt = presets[0]
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
        gen = Generation(backend, max_new_tokens=max_new, capture_attention=True, compiled=compiled)
        gen.prefill(prompt)
    except InputError as exc:
        state.reuse_error = exc  # the previous generation stays as it was (said once by the live view)
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


def reset() -> None:
    state.reuse_gen, state.reuse_playing, state.reuse_checks = None, False, {}
    state.reuse_clamped = None


def is_stale(gen: Generation | None) -> list[str]:
    """What changed in the sidebar since `gen` started (its settings are never applied to it silently)."""
    return decode_view.changed_settings(state.get("reuse_model_key"), model_key) if gen is not None else []


def can_step_now() -> bool:
    """Whether Step and Play may run a pass: a run is started, not finished, on the sidebar it started with."""
    return decode_view.can_step(state.reuse_gen, bool(is_stale(state.reuse_gen)))


controls = DecodeController(REUSE, prefill=prefill, step=lambda: step_once(state.reuse_gen), reset=reset,
                            can_step=can_step_now, period=lambda: 1.0 / float(state.reuse_speed))

with head[1], settings_box(tr("reuse.settings"), border=True):
    share_button(lecture)  # behind the settings button: the growth idea keeps one 720 px screen
    c1, c2, c3 = st.columns([3, 1, 1])
    c1.selectbox(tr("reuse.preset"), presets, key="reuse_preset", index=None, placeholder=tr("reuse.preset_pick"),
                 on_change=use_preset)
    number_in_range(c2, tr("reuse.max_new"), 1, max_new_limit, 24, "_w_reuse_max_new", help=tr("reuse.max_new_help"))
    persisted(c3.slider, "reuse_speed", tr("reuse.speed"), min_value=0.5, max_value=8.0, step=0.5,
              help=tr("reuse.speed_help"))
    persisted(st.text_area, "reuse_prompt", tr("reuse.prompt"), height=80)
    has_template = backend is not None and bool(getattr(backend.tokenizer, "chat_template", None))
    persisted(st.toggle, "reuse_chat", tr("reuse.chat"), disabled=not has_template,
              help=tr("reuse.chat_help" if has_template else "reuse.chat_none"))
    if backend is not None and lecture:  # on a projector behind the settings button, with the prompt
        model_caption(backend.spec)

if backend is not None and not lecture:
    model_caption(backend.spec)


@st.fragment(run_every=controls.timer())  # Play's timer; a sidebar change stops Play, and it stays stopped
def live_view() -> None:
    """Controls and the live view: a Step, Play tick or tab switch reruns only this, not the whole page."""
    run_start = time.perf_counter()
    n_before = len(state.reuse_gen.events) if state.reuse_gen is not None else 0
    # Every press since the last run, in order, before the controls are drawn (so they show its result).
    controls.serve()
    gen: Generation | None = state.reuse_gen
    playing = controls.playing
    changed = is_stale(gen)  # read again here: a Prefill in this run starts a generation on the current settings
    stale = bool(changed)
    n_events = n_before if gen is state.reuse_gen else 0
    # Play's column wider: "Pause" and "일시정지" with the icon broke in two at 1280 px ("Pau" "se").
    b = st.columns([1, 1, 1, 1, 1, 3] if lecture else [1, 1, 1.5, 1, 2, 2.5], vertical_alignment="center")
    controls.row(b, prefill_disabled=backend is None or playing, step_help=tr("reuse.step_help"),
                 shown=len(gen.token_ids) if gen is not None else 0)
    download(b[4], gen, compact=lecture)
    # On a projector the status line takes the keys' place (Step's tooltip names them): one row, not two.
    state.reuse_status_slot = b[5].empty() if lecture else None
    if not lecture:
        b[5].caption(tr("reuse.keys_help"))

    controls.beat()
    controls.settle()  # finished, freed or stale: Play stops by itself
    if state.reuse_error is not None:
        show_error(state.reuse_error)
        state.reuse_error = None
    if stale:
        names = ", ".join(tr(f"reuse.changed_{c}") for c in changed)
        st.warning(tr("reuse.stale", name=gen.backend.spec.name, changed=names))
    if gen is None:
        st.info(tr("reuse.empty"))
        return
    controls.warn()
    started = run_settings(state.reuse_model_key, state.reuse_prompt, bool(state.get("_w_reuse_chat")),
                           gen.max_new_tokens)  # what "Explore from here" starts a follower's own run with
    view = draw(gen, lecture=lecture)
    if room is not None:  # a lecture room's followers draw the same
        room.publish(view, explore=started)
    if len(gen.events) > n_events:  # this run served steps: the server's own time for them, for bench/
        record_timing("reuse_steps", steps=len(gen.events) - n_events, run_s=time.perf_counter() - run_start,
                      model_s=sum(e.seconds for e in gen.events[n_events:]))


controls.replay()  # "Explore from here": the lecturer's run, prefilled and stepped to the lecturer's step here
live_view()
