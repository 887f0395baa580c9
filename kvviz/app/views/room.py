"""The lecture room in the app: the only streamlit part of kvviz.room.

Lives here: room_store (the process's store, as KVVIZ_ROOM_STORE picks it), follower_room (the room a `?room=` link
follows), model_settings + page_settings + explore_from + explore + explore_button + take_replay +
follow_again_button (a follower's own run from the lecturer's settings and step, and back),
share_box (the lecturer's "Share with the room": the link and its QR code), ask_room (the lecturer's "Ask the room"
and the tally as it comes in), follow_check (a follower's live question on the Check page), qr_svg (a link as a QR
code), heartbeat (the lecturer's "still here"), publish (what the lecturer's page draws, sent to the room),
follow_run (a follower's page drawn from it, read-only), follow_or_share + share_button (a followed page's room
part: the follower's page, or the lecturer's Share and link).
The lecturer's secret lives in this session only (ROOM's `secret`); the followers' link carries the room id alone.
"""
from __future__ import annotations

import dataclasses
import io
import secrets
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

import segno
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from kvviz.app.language import lang, show_error, tr
from kvviz.app.models import hosted_caps
from kvviz.app.navigation import PAGES, ROOT
from kvviz.app.state import REGISTRY, page_state
from kvviz.engine.config import DecoderConfig
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.room.network import RoomLink, network_address, room_link
from kvviz.room.results import RESULT_COLUMNS, results_csv, summary
from kvviz.room.store import LECTURER_BEAT_S, Asked, RoomStore, store_from_env

# explore: a follower exploring on their own (the room kept, to follow again); replay: the lecturer's step to reach
# stopped: why this lecturer's sharing stopped (an InputError), said at the top of every page until dismissed;
# at: the page the room was last told the lecturer is on
# sent: (room id, the view) last published, so a rerun that changes nothing is not a new version for the room
# results: an ended room's results (its questions asked), shown once by the next share box
ROOM = page_state("room", id=None, secret=None, follower=None, explore=False, replay=None, stopped=None, at=None,
                  sent=None, results=None)
# The pages a room can follow (they publish what they draw and draw a follower's view, see follow_or_share): every
# page but Home; the lecturer on Home (or a page not listed): followers are told which, and linked to it on their
# own. Only these pages offer "Share with the room".
FOLLOWED = ("pages/1_Reusing_Past_KV.py", "pages/2_Prefill_and_Decode.py", "pages/3_Memory_Footprint.py",
            "pages/4_Latency_and_Capacity.py", "pages/5_Training_Prefill_Decode.py", "pages/6_Check.py",
            "pages/7_Serving_Engine.py", "pages/8_Compressing_the_Cache.py", "pages/9_Paged_Blocks.py",
            "pages/10_Speculative_Decoding.py", "pages/11_Moving_the_Cache.py", "pages/12_Attention_Patterns.py")
POLL_S = 1.0  # a live question (the projector's tally, a follower's answer box) is re-read and redrawn once a second
# A run's follower re-reads the room twice a second and redraws only on a change: a poll that finds nothing new
# costs ~0.5 % of a core per follower (bench/room_follow.py), and the click -> redrawn median is half a poll plus
# the page's redraw, so 1 s polls put it at the "within a second" goal, not under it.
RUN_POLL_S = 0.5
# A pasted text (Compressing the Cache takes 200,000 characters) would travel in every view the page publishes, to
# every follower, and a long Korean one would pass the store's limit on a view (room.store.MAX_SNAPSHOT_BYTES):
# longer texts are not carried for "Explore from here".
SHARED_TEXT_CHARS = 20_000
QR_SCALE = 12  # px per module: a ~30-module code is ~360 px wide, drawn to fill its column on the projector


@st.cache_resource(show_spinner=False)
def room_store() -> RoomStore:
    """One store per server process: every session (lecturer and followers) reads and writes the same rooms; a
    hosted demo's caps on rooms and followers enforced by it."""
    caps = hosted_caps()
    if caps is None:
        return store_from_env()
    return store_from_env(max_rooms=caps.max_rooms, max_followers=caps.max_room_followers)


def follower_room() -> str | None:
    """The room this session follows (`?room=<id>` in its link), or None: the lecturer, a plain visitor, and a
    follower exploring on their own (until "Follow again")."""
    return None if ROOM.get("explore") else st.query_params.get("room") or None


MODEL_KEYS = ("kv_model", "kv_dtype", "kv_device", "kv_hf_model", "kv_engine", "kv_shape")  # the sidebar's model


def model_settings(s: object) -> dict:
    """The sidebar's model settings of `s` (a Settings, or the ModelKey a run started with), as JSON: what a
    lecturer's view carries so that "Explore from here" runs the follower's page on the lecturer's model."""
    shape = s.shape if s.model == "random" else None
    return {"kv_model": s.model, "kv_dtype": s.dtype, "kv_device": s.device, "kv_hf_model": s.hf_model,
            "kv_engine": s.engine, "kv_shape": None if shape is None else dataclasses.asdict(shape)}


def _plain(value: object) -> bool:
    # A box's value (a number, a text, a choice, a list of choices); a button's True/False and objects are not.
    scalar = (int, float, str)
    return (isinstance(value, scalar) and not isinstance(value, bool)) or (
        isinstance(value, list) and all(isinstance(v, scalar) and not isinstance(v, bool) for v in value))


def _page_keys(items: Iterable[tuple[str, object]], prefix: str, keep: Collection[str], also: Collection[str],
               skip: Collection[str]) -> dict:
    """The keys of `items` that are this page's boxes: under `prefix` (or named in `also`: a box kept in the link),
    a plain value, not in `skip` (a box whose options are in the UI's language), and not one of the page's own state
    keys (page_state's: runs, flags, counters) unless `keep` names it (a box persisted under it)."""
    own = set(REGISTRY[prefix].defaults) - set(keep) if prefix in REGISTRY else set()
    return {key: value for key, value in items if _plain(value) and key not in skip and (key in also or (
        key.startswith(f"{prefix}_") and key.removeprefix(f"{prefix}_") not in own))}


def page_settings(settings: object, prefix: str, keep: Collection[str] = (), also: Collection[str] = (),
                  skip: Collection[str] = ()) -> dict:
    """What a lecturer's view carries for "Explore from here", as JSON: the sidebar's model (model_settings) and the
    page's boxes as they stand (see _page_keys), but a text longer than SHARED_TEXT_CHARS: that box keeps the
    follower's own text."""
    boxes = _page_keys(st.session_state.items(), prefix, keep, also, skip)
    return {**model_settings(settings), **{key: value for key, value in boxes.items()
                                          if not (isinstance(value, str) and len(value) > SHARED_TEXT_CHARS)}}


def explore_from(view: Mapping[str, object], prefix: str, keep: Collection[str] = (), also: Collection[str] = (),
                 skip: Collection[str] = (), steps: object = None,
                 help_key: str = "room.explore_settings_help") -> None:
    """A follower's "Explore from here" for a view that carries `explore` (the lecturer's page_settings): the
    model's keys and the page's boxes only are taken (a key of another page, of the room or of a run is never set
    from the store), each then checked by the page as any entry is; `steps`: the lecturer's step to replay to."""
    run = view.get("explore")
    if isinstance(run, Mapping):
        model = {key: run[key] for key in MODEL_KEYS if key in run}
        explore_button({**model, **_page_keys(run.items(), prefix, keep, also, skip)}, steps, help_key=help_key)


def explore(settings: Mapping[str, object], steps: object = None) -> None:
    """Take the lecturer's run into this session: the lecturer's settings (sidebar keys, model_settings', and the
    page's own) set before the next rerun draws the widgets, each then checked by its page as any entry is, and the
    step to replay to (see `take_replay`; None: a page with no run to replay, its settings are all it takes)."""
    for key, value in settings.items():
        if key == "kv_shape":  # a custom shape travels as JSON; None: not the random model, this session's kept
            if value is not None:
                st.session_state[key] = DecoderConfig(**value)
            continue
        st.session_state[key] = value
    ROOM.set("explore", True)
    ROOM.set("replay", steps)


def explore_button(settings: Mapping[str, object], steps: object = None, help_key: str = "room.explore_help",
                   ) -> None:
    """A follower's "Explore from here": `explore` with the lecturer's settings (and step) when pressed."""
    st.button(tr("room.explore"), key="room_btn_explore", help=tr(help_key), icon=":material/explore:",
              on_click=explore, args=(settings, steps))


def take_replay() -> object:
    """The lecturer's step an "Explore from here" asks this session to reach, once (a step count; a page's own
    record of how it got there, such as Paged Blocks' requests and step)."""
    return ROOM.pop("replay")


def follow_again_button() -> None:
    """While exploring: back to the lecture (this session's own run stays, unused, until it is reset)."""
    if ROOM.get("explore") and st.query_params.get("room"):
        st.button(tr("room.follow_again"), key="room_btn_follow_again", icon=":material/groups:", type="primary",
                  on_click=lambda: ROOM.set("explore", False))


def _follower_id() -> str:
    # One opaque id per browser session: one answer each, no names.
    if ROOM.get("follower") is None:
        ROOM.set("follower", secrets.token_urlsafe(16))
    return ROOM.get("follower")


def _link(room_id: str) -> RoomLink:
    """The followers' link (kvviz.room.network.room_link): this page's address with `?room=<id>` alone, on the
    machine's network address where the lecturer opened it at a loopback one; or why no phone can open it."""
    return room_link(st.context.url or "", room_id, st.get_option("server.address"), st.get_option("server.port"),
                     network_address())


def qr_svg(url: str) -> str:
    """The link as a QR code: an SVG document (st.html strips an inline <svg>; st.image draws a document)."""
    out = io.BytesIO()
    segno.make(url, error="m").save(out, kind="svg", scale=QR_SCALE, border=2, xmldecl=False)
    return out.getvalue().decode()


def _try(fn: Callable[[], object], *, callback: bool = False) -> object | None:
    """Run a store call; a fault stops the sharing (said, with why), never the lecture. The room out of reach:
    the page is drawn again at once (not in a widget's `callback`, which runs before the page anyway), so the
    reason stands at its top (heartbeat) rather than in a fragment the next step or beat redraws."""
    try:
        return fn()
    except InputError as e:
        if e.locale_key not in ("room.store_down", "room.gone"):
            show_error(e)
            return None
        ROOM.reset("id", "secret", "at")  # the room is out of reach: this page goes on alone
        ROOM.set("stopped", e)
        if not callback:
            st.rerun(scope="app")
        return None


def heartbeat() -> None:
    """On every page (page_setup calls it): why sharing stopped, if it did; and while this session holds an open
    room, the lecturer is still here, so followers are told when the lecturer's browser has closed."""
    stopped = ROOM.get("stopped")
    if stopped is not None:
        # one under the other: in a horizontal row the message was squeezed to nothing beside its button
        st.error(stopped.message(lang()), icon=":material/portable_wifi_off:")
        st.button(tr("room.dismiss"), key="room_stopped_ok", on_click=lambda: ROOM.set("stopped", None))
    if ROOM.get("id") is None:
        return
    here = _this_page()
    if here is not None and ROOM.get("at") != here:
        # Followers are told where the lecturer went: a page the room cannot follow, or a followed one before it
        # has anything to show (no run yet, a model it cannot use) instead of the last page's state.
        publish({"page": None}, here)

    @st.fragment(run_every=LECTURER_BEAT_S)
    def beat() -> None:
        room_id = ROOM.get("id")
        if room_id is not None:
            _try(lambda: room_store().beat(room_id, ROOM.get("secret")))

    beat()


def _this_page() -> str | None:
    """The page this run draws, as PAGES names it (pages/3_Memory_Footprint.py), or None outside a run."""
    ctx = get_script_run_ctx()
    info = ctx.pages_manager.get_pages().get(ctx.page_script_hash) if ctx is not None else None
    if not info or not info.get("script_path"):
        return None
    try:
        return Path(info["script_path"]).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None


def _end_room(room_id: str) -> None:
    secret = ROOM.get("secret")
    ROOM.set("results", _try(lambda: room_store().results(room_id, secret), callback=True))  # shown once, after
    _try(lambda: room_store().end(room_id, secret), callback=True)
    ROOM.reset("id", "secret", "at")
    st.toast(tr("room.ended"))


def share_box() -> str | None:
    """The lecturer's "Share with the room" and, once open, the link and its QR code; returns the open room's id."""
    def open_room() -> None:
        room = _try(room_store().create, callback=True)
        if room is not None:
            ROOM.reset("stopped", "at")
            ROOM.set("id", room.id)
            ROOM.set("secret", room.secret)

    if ROOM.get("id") is None:
        ended = ROOM.pop("results")
        if ended is not None:
            _ended_results(ended)
        st.button(tr("room.share"), key="room_share", help=tr("room.share_help"), icon=":material/groups:",
                  on_click=open_room)
        return None
    room_id = ROOM.get("id")
    link = _link(room_id)
    with st.expander(tr("room.link"), expanded=True, icon=":material/qr_code_2:"):
        text, code = st.columns([3, 2], vertical_alignment="center")  # the code ~470 px: whole on a 720 px screen
        if link.url is not None:
            text.markdown(f"**{tr('room.scan')}**")  # a subheader was drawn half under the code box (lecture CSS)
            text.code(link.url, language=None, wrap_lines=True)
            code.image(qr_svg(link.url), width="stretch")  # the column's width: scannable from the back
        else:  # a link only this machine opens is never shown: why, and the command that fixes it
            text.warning(tr(link.why, address=st.get_option("server.address")), icon=":material/wifi_off:")
        store, secret, language = room_store(), ROOM.get("secret"), lang()
        if _try(lambda: store.results(room_id, secret)):
            # written when pressed (on a thread of its own, outside this session): the counts as they stand then,
            # not as they stood when the box was last drawn (the tally is redrawn by its fragment alone)
            text.download_button(tr("room.results"), lambda: _results_csv(store.results(room_id, secret), language),
                                 file_name="kvviz-room-results.csv", mime="text/csv", key="room_results",
                                 help=tr("room.results_help"), icon=":material/download:", on_click="ignore")
        text.button(tr("room.end"), key="room_end", icon=":material/logout:", on_click=_end_room, args=(room_id,))
    return room_id


def _results_csv(asked: Sequence[Asked], language: str) -> str:
    from kvviz.app.views.check import labels_by_id, question_text  # the questions a room is asked: the Check page's

    return results_csv(asked, lambda q: question_text(q, language), lambda q: labels_by_id(q, language),
                       [t(f"room.col_{c.split('_')[0]}", language) for c in RESULT_COLUMNS])


def _ended_results(asked: Sequence[Asked]) -> None:
    """The ended room's results, once: per question how many answered and were right, and the CSV to keep."""
    from kvviz.app.views.check import question_text

    @st.dialog(tr("room.results_title"), width="large")
    def show() -> None:
        if not asked:
            st.info(tr("room.results_none"))
            return
        st.caption(tr("room.results_ended"))
        st.table([{tr("room.col_question"): question_text(s.question), tr("room.col_answered"): s.answered,
                   tr("room.col_right"): "" if s.right is None else s.right,
                   tr("room.col_right_share"): "" if s.right_share is None else f"{100 * s.right_share:.0f}"}
                  for s in summary(asked)])
        st.download_button(tr("room.results"), _results_csv(asked, lang()), file_name="kvviz-room-results.csv",
                           mime="text/csv", key="room_results_ended", icon=":material/download:", on_click="ignore")

    show()


def _counts(counts: Mapping[str, int], labels: Mapping[str, str], answer: str | None, shown: bool = True) -> None:
    """The tally: how many answered and, when `shown` (the lecturer's choice, or revealed), the counts per option."""
    total = sum(counts.values())
    st.caption(tr("room.answers", n=total))
    if not shown:
        st.caption(tr("room.tally_hidden"))
        return
    for option, n in counts.items():
        mark = " ✓" if option == answer else ""
        st.progress(n / total if total else 0.0, text=f"{labels[option]}{mark} — {n}")


def ask_room(question: str, options: Sequence[str], labels: Mapping[str, str], answer: str,
             explain: Callable[[], None]) -> None:
    """The lecturer's side of a live question: open it to the room, watch the tally, reveal the answer."""
    room_id, secret = ROOM.get("id"), ROOM.get("secret")
    if room_id is None:
        return
    poll = _try(lambda: room_store().tally(room_id))
    if poll is None or poll.question != question:
        show = st.checkbox(tr("room.show_tally"), key=f"room_show_tally_{question}", help=tr("room.show_tally_help"))
        if st.button(tr("room.open_question"), key=f"room_ask_{question}", help=tr("room.open_question_help"),
                     icon=":material/campaign:"):
            _try(lambda: room_store().open_question(room_id, secret, question, options, answer, show))
            st.rerun()
        return

    @st.fragment(run_every=POLL_S)
    def live() -> None:
        poll = _try(lambda: room_store().tally(room_id))
        if poll is None or poll.question != question:
            return
        st.caption(tr("room.asked"))
        _counts(poll.counts, labels, answer if poll.revealed else None, poll.revealed or poll.show_tally)
        if not poll.revealed:
            st.button(tr("room.reveal_room"), key=f"room_reveal_{question}", type="primary",
                      on_click=lambda: _try(lambda: room_store().reveal(room_id, secret), callback=True))
        else:
            st.success(tr("room.correct_was", answer=labels[answer]))
            explain()

    live()


def publish(view: dict, path: str) -> None:
    """Send what the lecturer's page (`path`) draws to the room, if one is open (a fault stops sharing, not the
    page); followers on another page get a link to this one."""
    room_id, secret = ROOM.get("id"), ROOM.get("secret")
    sent = (room_id, {**view, "path": path})
    if room_id is None or ROOM.get("sent") == sent:  # a rerun that changed nothing: no redraw for the room
        return
    if _try(lambda: room_store().publish(room_id, secret, sent[1])):
        ROOM.set("at", path)
        ROOM.set("sent", sent)


def _elsewhere(view: dict | None, own_page: str) -> bool:
    """The lecturer is on another page: a link to follow there (in this session's language); True when so."""
    path = (view or {}).get("path")
    page = next((p for p in PAGES if p.path == path), None)
    if page is None or path == own_page:
        return False
    if path not in FOLLOWED:  # the lecturer is on a page a room cannot follow yet: that page, on one's own
        st.info(tr("room.lecturer_on_unfollowed", page=tr(page.title_key)))
        st.page_link(path, label=tr("room.on_own"), icon=":material/arrow_forward:", query_params={"lang": lang()})
        return True
    st.page_link(path, label=tr("room.lecturer_on", page=tr(page.title_key)), icon=":material/arrow_forward:",
                 query_params={"room": follower_room(), "lang": lang()})
    return True


def _unreachable(e: InputError, own_page: str) -> None:
    """An unknown, ended or unreachable room: said, and the same page on its own linked."""
    if e.locale_key == "room.store_down":  # the lecturer's words ("the lecture goes on here") are not a follower's
        st.error(tr("room.store_down_follower", **e.params))
    else:
        show_error(e)
    # the same page, without the room: its language kept, nothing of the lecture
    st.page_link(own_page, label=tr("room.on_own"), icon=":material/arrow_forward:", query_params={"lang": lang()})


def _room_mark(room_id: str) -> tuple[int, bool, InputError | None]:
    """What a follower's redraw depends on: (version, whether the lecturer left, the error if the room is out of
    reach). A poll's question, asked without the snapshot (a view can be ~100 kB); each call holds this follower's
    seat (a hosted demo caps the seats)."""
    try:
        room_store().follow(room_id, _follower_id())
        version, left = room_store().status(room_id)
        return version, version > 0 and left, None  # version 0: nothing published yet, nobody to have left
    except InputError as e:
        return -1, False, e


def _same(a: tuple[int, bool, InputError | None], b: tuple[int, bool, InputError | None]) -> bool:
    # an error by its kind: its reason (a Redis message) may vary from poll to poll
    return a[:2] == b[:2] and (a[2] and a[2].locale_key) == (b[2] and b[2].locale_key)


def follow_run(page: str, draw: Callable[[dict], None], own_page: str) -> None:
    """A follower's page: what the lecturer's page last published, drawn by `draw` (the page's own drawing
    functions); the follower runs no model and changes nothing. The room is re-read twice a second, and the page
    drawn again only when it changed: a poll that finds nothing new costs a few store reads, not a redraw (every
    poll redrawing the view held one app server's core with eight followers)."""
    room_id = follower_room()
    st.caption(tr("room.following"))
    drawn = _room_mark(room_id)
    view, left, error = None, drawn[1], drawn[2]
    if error is None:
        try:
            view = room_store().read(room_id)[1]  # a newer version than the mark's: the next poll redraws
        except InputError as e:
            error = e
    if error is not None:
        _unreachable(error, own_page)
    elif _elsewhere(view, own_page):
        pass
    elif view is None or view.get("page") != page:
        st.info(tr("room.waiting_run"))
    else:
        if left:  # the last state stays on screen
            st.warning(tr("room.lecturer_left", step=view["n_steps"]) if "n_steps" in view
                       else tr("room.lecturer_left_page"))
        draw(view)

    @st.fragment(run_every=RUN_POLL_S)
    def poll() -> None:
        if not _same(_room_mark(room_id), drawn):
            st.rerun(scope="app")

    poll()


def follow_or_share(page: str, path: str, draw: Callable[[dict], None], *, lecture: bool) -> None:
    """A followed page's room, under its title. A follower: the page is the room's (`draw`, the view module's
    `follow`, draws what the lecturer's page published as `page`) and the run stops here, so no widget of this
    session can reach the room. The lecturer: an open room's link and QR code, full width (scannable from the back
    of the room; "Share with the room" itself is share_button's, behind the page's settings). A follower
    exploring: "Follow again"."""
    if follower_room():
        follow_run(page, draw, path)
        st.stop()
    if lecture and ROOM.get("id") is not None:
        share_box()
    follow_again_button()


def share_button(lecture: bool) -> None:
    """"Share with the room", in lecture mode, until a room is open (then follow_or_share draws its link)."""
    if lecture and ROOM.get("id") is None:
        share_box()


def follow_check(labels: Callable[[str], Mapping[str, str]], answers: Callable[[str], str],
                 question_text: Callable[[str], str], explain: Callable[[str], None], own_page: str) -> None:
    """A follower's Check page: the question the lecturer opened, answered here, in this session's language;
    after the reveal, the room's counts, the answer and the explanation."""
    room_id = follower_room()
    st.caption(tr("room.following"))

    @st.fragment(run_every=POLL_S)
    def live() -> None:
        try:
            room_store().follow(room_id, _follower_id())
            poll, (_, view) = room_store().tally(room_id), room_store().read(room_id)
        except InputError as e:
            _unreachable(e, own_page)
            return
        if _elsewhere(view, own_page):
            return
        if poll is None:
            st.info(tr("room.waiting"))
            return
        names = labels(poll.question)
        st.subheader(question_text(poll.question))
        key = f"room_answer_{poll.question}"

        def send() -> None:
            try:
                room_store().answer(room_id, poll.question, _follower_id(), st.session_state[key])
            except InputError as e:
                show_error(e)

        st.radio(tr("room.your_answer"), list(poll.counts), index=None, key=key, format_func=names.get,
                 on_change=send, disabled=poll.revealed)
        st.caption(tr("room.anonymous"))
        if not poll.revealed:  # the counts as they come in if the lecturer chose so, else only at the reveal
            _counts(poll.counts, names, None, poll.show_tally)
        if poll.revealed:
            _counts(poll.counts, names, answers(poll.question))
            st.success(tr("room.correct_was", answer=names[answers(poll.question)]))
            explain(poll.question)
        elif st.session_state.get(key) is not None:
            st.caption(tr("room.answer_saved"))

    live()
