"""Paged Blocks & Prefix Sharing: many requests in one block pool, prefix hits, preemption, fragmentation.
kvviz.app.views.paged draws the engine's state from its numbers (room_view), which a lecture room's followers get."""
import streamlit as st

from kvviz.app.hosted import check_kv_budget
from kvviz.app.language import show_error, tr
from kvviz.app.lecture import ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import get_backend, limit, loading_engine, model_caption, shipped_for_hf
from kvviz.app.navigation import page_of
from kvviz.app.room.explore import page_settings, take_replay
from kvviz.app.room.follow import room_part
from kvviz.app.room.session import follower_room
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.widgets import number_in_range, run_download
from kvviz.errors import InputError
from kvviz.kv.capacity import BLOCK_SIZE

TICK_S = 0.4  # one scheduler step per tick while playing
BLOCK_SIZES = (4, 8, 16, 32)
IDEAS = ("tables", "pool", "requests", "savings", "memory")  # one screen each in lecture mode
PAGE = page_of(__file__)

settings = page_setup("paged.title")
head = lecture_head(tr("paged.title"))
with head[0]:
    about = intro_box()
with about:
    st.write(tr("paged.intro"))
settings = shipped_for_hf(settings, "paged.hf_note")  # the paged path gathers K/V inside our own attention
if follower_room():  # a lecture's follower: the lecturer's pool and requests, drawn read-only; no engine runs here
    with loading_engine():
        from kvviz.app.views.paged import follow
# A follower's page stops here; the lecturer: an open room's link and QR code, full width.
room = room_part(PAGE, lambda view: follow(view, lecture=settings.lecture), lecture=settings.lecture)
shown = {IDEAS[i] for i in ideas([tr(f"paged.idea_{name}") for name in IDEAS], "paged")}  # lecture: one
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.app.views.paged import PAGED, SAVING_REPEATS, room_view, show
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.paged.demo import HitSaving, add_request, measure_hit_saving, replay
    from kvviz.engine.paged.scheduler import PagedEngine
    from kvviz.lessons.run_record import paged_record
    backend = get_backend(settings)
if not isinstance(backend, NativeBackend):
    st.stop()
if not settings.lecture:  # on a projector behind the settings button
    model_caption(backend.spec)
model, max_len = backend.model, backend.spec.max_context
PAGED.seed()


def reset() -> None:
    PAGED.reset("engine", "playing", "savings", "adds")


with head[1]:
    box = settings_box()
with box:
    share_button(settings.lecture)  # behind the settings button, as on Reusing Past K/V
c = box.columns(5)
block_size = c[0].selectbox(tr("paged.block_size"), BLOCK_SIZES, index=BLOCK_SIZES.index(BLOCK_SIZE), key="paged_block",
                            on_change=reset, help=tr("paged.block_size_help"))
# (a new pool size or block size builds a new engine below: no on_change reset, which a refused value would trigger)
n_blocks = number_in_range(c[1], tr("paged.pool_blocks"), 2, 1024, 20, "paged_blocks",
                           help=tr("paged.pool_blocks_help"))
n_system = number_in_range(c[2], tr("paged.system_tokens"), 1, max_len - 2, min(48, max_len // 4),
                           f"paged_system_{max_len}")
n_own = number_in_range(c[3], tr("paged.own_tokens"), 1, max_len - 2, min(20, max_len // 8), f"paged_own_{max_len}")
n_new = number_in_range(c[4], tr("paged.new_tokens"), 1, limit(settings, "max_new_tokens", max_len - 2),
                        min(40, max_len // 8), f"paged_new_{max_len}")

if settings.hosted is not None:  # the pool is allocated whole: its token slots count against the session's KV budget
    try:
        check_kv_budget(settings.hosted, backend.spec, batch=1, n_tokens=n_blocks * block_size,
                               dtype=settings.dtype)
    except InputError as exc:
        show_error(exc)
        st.stop()
key = (id(model), block_size, n_blocks)
if PAGED.get("engine") is None or PAGED.get("key") != key:
    PAGED.reset("savings", "playing", "adds")
    PAGED.set("engine", PagedEngine(model, n_blocks, block_size, record_views=True))  # "Download this run"
    PAGED.set("key", key)
engine: PagedEngine = PAGED.get("engine")
box.caption(tr("paged.pool_caption", blocks=n_blocks, size=block_size, tokens=n_blocks * block_size,
               kib=f"{engine.kv.allocated_bytes() / 1024:,.0f}", per_block=f"{engine.kv.bytes_per_block():,}"))
if settings.lecture:
    with box:
        model_caption(backend.spec)


def add(shared: bool, count: int = 1) -> None:
    """Queue requests, all arriving now: admitted in one step, the later ones hit the first one's blocks."""
    try:
        for _ in range(count):
            PAGED.get("adds").append(add_request(engine, backend.tokenizer, shared, n_system, n_own, n_new))
    except InputError as exc:
        PAGED.set("error", exc)


def step() -> None:
    if not engine.idle:
        engine.step()


def play(on: bool) -> None:
    # Set, never toggle: a click that reaches the server twice (coalesced with a tick) must not undo itself.
    PAGED.set("playing", on and not engine.idle)


lecturers = take_replay()
if isinstance(lecturers, dict):  # "Explore from here": the lecturer's requests, replayed here to the lecturer's step
    engine = PagedEngine(model, n_blocks, block_size, record_views=True)
    PAGED.set("engine", engine)
    PAGED.reset("savings", "adds")
    try:
        for record in replay(engine, backend.tokenizer, lecturers["adds"], int(lecturers["step"]), max_len):
            PAGED.get("adds").append(record)
    except InputError as exc:  # said as a click's would be
        PAGED.set("error", exc)
playing = PAGED.get("playing")
b = st.columns([4, 3, 2, 2, 2, 2, 1] if settings.lecture else [4, 3, 2, 2, 2, 2, 4])
b[0].button(tr("paged.add4"), on_click=add, args=(True, 4), type="primary", key="paged_add4", width="stretch")
b[1].button(tr("paged.add_shared"), on_click=add, args=(True,), key="paged_add_shared", width="stretch")
b[2].button(tr("paged.add_own"), on_click=add, args=(False,), key="paged_add_own", width="stretch")
b[3].button(tr("paged.step"), on_click=step, disabled=playing or engine.idle, key="paged_step", width="stretch")
b[4].button(tr("paged.pause" if playing else "paged.play"), on_click=play, args=(not playing,), key="paged_play",
            width="stretch",
            disabled=engine.idle and not playing)
b[5].button(tr("paged.reset"), on_click=reset, key="paged_reset", width="stretch")
run_settings = {"block_size": block_size, "n_blocks": n_blocks, "system_tokens": n_system, "own_tokens": n_own,
                "new_tokens": n_new}
run_download(b[6], "paged_download", f"kvviz-paged-{backend.spec.name}-{engine.n_steps}-steps.html",
             (lambda: paged_record(engine, run_settings, model_name=backend.spec.name)) if engine.n_steps else None,
             (engine.n_steps, 0), compact=settings.lecture)
if PAGED.get("error") is not None:
    show_error(PAGED.pop("error"))


def savings() -> dict[int, HitSaving]:
    """The prefill time each hit saved: whole prompt vs after the hit, measured once per (prompt length, hit)."""
    done: dict = PAGED.get("savings")
    out = {}
    for r in engine.requests:
        if r.cached_tokens:
            key = (len(r.prompt_ids), r.cached_tokens)
            if key not in done:
                done[key] = measure_hit_saving(model, r.prompt_ids, r.cached_tokens, repeats=SAVING_REPEATS)
            out[r.request_id] = done[key]
    return out


def live() -> None:
    if PAGED.get("playing"):
        engine.step()
        if engine.idle:
            PAGED.set("playing", False)
            st.rerun()  # the whole page, so the buttons flip and the fragment stops ticking
    saved = savings() if shown & {"requests", "savings"} else {}  # measured only where it is shown
    view = room_view(engine, shown, saved, max_len, backend.spec.name)
    # a lecture room's followers draw the same pool, requests and idea; "Explore from here" replays the requests
    if room is not None:
        room.publish({**view, "adds": PAGED.get("adds")}, explore=page_settings(settings, "paged"))
    show(view, settings.lecture)


st.fragment(live, run_every=TICK_S if playing else None)()

if settings.lecture:  # on a projector the rules sit with the introduction, folded away
    with about:
        for title, text in ((tr("paged.rules_title"), tr("paged.rules", size=block_size)),
                            (tr("paged.backends_title"), tr("paged.backends"))):
            st.markdown(f"**{title}**\n\n{text}")
else:
    with st.expander(tr("paged.rules_title")):
        st.markdown(tr("paged.rules", size=block_size))
    with st.expander(tr("paged.backends_title")):
        st.markdown(tr("paged.backends"))
