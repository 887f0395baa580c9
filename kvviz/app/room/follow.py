"""The follower's side of a room: follower_page (a followed page drawn from what the lecturer's page last published,
read-only), elsewhere (the lecturer is on another page: a link there), unreachable (an unknown, ended or unreachable
room: said, and the page on its own linked), and room_part (a followed page's room, under its title: the
follower's page, or the lecturer's open room as a Sharing to publish to)."""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from kvviz.app.language import lang, show_error, tr
from kvviz.app.navigation import Page, page_at
from kvviz.app.room.explore import follow_again_button
from kvviz.app.room.session import ROOM, follower_id, follower_room, room_store
from kvviz.app.room.share import Sharing, share_box, sharing
from kvviz.app.room.view import RoomView
from kvviz.errors import InputError

# A run's follower re-reads the room twice a second and redraws only on a change: a re-read that finds nothing new
# costs ~0.5 % of a core per follower (bench/room_follow.py), and the click -> redrawn median is half a period plus
# the page's redraw, so 1 s re-reads put it at the "within a second" goal, not under it.
REREAD_S = 0.5


def read_view(snapshot: dict | None) -> RoomView | None:
    """A store's snapshot as a RoomView; None for nothing published, or a snapshot no registered page sent."""
    if snapshot is None:
        return None
    try:
        return RoomView.from_json(snapshot)
    except (KeyError, ValueError, TypeError):
        return None


def elsewhere(view: RoomView | None, own: Page) -> bool:
    """The lecturer is on another page: a link to follow there (in this session's language); True when so."""
    page = page_at(view.path) if view is not None else None
    if page is None or page == own:
        return False
    if not page.followed:  # the lecturer is on a page a room does not follow: that page, on one's own
        st.info(tr("room.lecturer_on_unfollowed", page=tr(page.title_key)))
        st.page_link(page.path, label=tr("room.on_own"), icon=":material/arrow_forward:",
                     query_params={"lang": lang()})
        return True
    st.page_link(page.path, label=tr("room.lecturer_on", page=tr(page.title_key)), icon=":material/arrow_forward:",
                 query_params={"room": follower_room(), "lang": lang()})
    return True


def unreachable(e: InputError, own: Page) -> None:
    """An unknown, ended or unreachable room: said, and the same page on its own linked."""
    if e.locale_key == "room.store_down":  # the lecturer's words ("the lecture goes on here") are not a follower's
        st.error(tr("room.store_down_follower", **e.params))
    else:
        show_error(e)
    # the same page, without the room: its language kept, nothing of the lecture
    st.page_link(own.path, label=tr("room.on_own"), icon=":material/arrow_forward:", query_params={"lang": lang()})


def _room_mark(room_id: str) -> tuple[int, bool, InputError | None]:
    """What a follower's redraw depends on: (version, whether the lecturer left, the error if the room is out of
    reach). Asked without the snapshot (a view can be ~100 kB); each call holds this follower's seat (a hosted demo
    caps the seats)."""
    try:
        room_store().hold_seat(room_id, follower_id())
        version, left = room_store().status(room_id)
        return version, version > 0 and left, None  # version 0: nothing published yet, nobody to have left
    except InputError as e:
        return -1, False, e


def _same(a: tuple[int, bool, InputError | None], b: tuple[int, bool, InputError | None]) -> bool:
    # an error by its kind: its reason (a Redis message) may vary from one re-read to the next
    return a[:2] == b[:2] and (a[2] and a[2].locale_key) == (b[2] and b[2].locale_key)


def follower_page(page: Page, draw: Callable[[RoomView], None]) -> None:
    """A follower's page: what the lecturer's page last published as `page`'s name, drawn by `draw` (the page's own
    drawing functions); the follower runs no model and changes nothing. The room is re-read twice a second, and the
    page drawn again only when it changed: a re-read that finds nothing new costs a few store reads, not a redraw
    (every re-read redrawing the view held one app server's core with eight followers)."""
    room_id = follower_room()
    st.caption(tr("room.following"))
    drawn = _room_mark(room_id)
    view, left, error = None, drawn[1], drawn[2]
    if error is None:
        try:
            view = read_view(room_store().read(room_id)[1])  # a newer version than the mark's: the next re-read draws
        except InputError as e:
            error = e
    if error is not None:
        unreachable(error, page)
    elif elsewhere(view, page):
        pass
    elif view is None or view.page != page.name:
        st.info(tr("room.waiting_run"))
    else:
        if left:  # the last state stays on screen
            st.warning(tr("room.lecturer_left", step=view["n_steps"]) if "n_steps" in view
                       else tr("room.lecturer_left_page"))
        draw(view)

    @st.fragment(run_every=REREAD_S)
    def reread() -> None:
        if not _same(_room_mark(room_id), drawn):
            st.rerun(scope="app")

    reread()


def room_part(page: Page, draw: Callable[[RoomView], None], *, lecture: bool) -> Sharing | None:
    """A followed page's room, under its title. A follower: the page is the room's (`draw`, the view module's
    `follow`, draws what the lecturer's page published under `page`'s name) and the run stops here, so no widget of
    this session can reach the room. The lecturer: an open room's link and QR code, full width (scannable from the
    back of the room; "Share with the room" itself is share_button's, behind the page's settings), and the open room
    returned: the page publishes to it where it draws. A follower exploring: "Follow again". None: no room open."""
    if follower_room():
        follower_page(page, draw)
        st.stop()
    if lecture and ROOM.get("id") is not None:
        share_box()
    follow_again_button()
    return sharing(page)
