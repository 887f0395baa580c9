"""The lecturer's side of a room: share_box ("Share with the room": the followers' link and its QR code, qr_svg),
share_button (the same behind a page's settings), Sharing (an open room this session shares to: publish, the
lecturer's explicit call where a page draws), sharing() (this session's open room, or None), heartbeat() (on every
page: why sharing stopped, and the lecturer's "still here")."""
from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import segno
import streamlit as st

from kvviz.app.language import lang, tr
from kvviz.app.navigation import Page, page_at
from kvviz.app.room.session import ROOM, guarded, room_store, this_page
from kvviz.app.room.view import RoomView
from kvviz.room.store import LECTURER_BEAT_S

QR_SCALE = 12  # px per module: a ~30-module code is ~360 px wide, drawn to fill its column on the projector


@dataclass(frozen=True)
class Sharing:
    """The room this lecturer's session has open, seen from `page`: what the page publishes goes there under the
    page's own name (navigation's record), so a follower of that page never waits on a name it was not sent."""

    room_id: str
    secret: str
    page: Page

    def publish(self, data: Mapping[str, Any] | None = None, *, explore: Mapping[str, Any] | None = None,
                picks: Mapping[str, Any] | None = None) -> None:
        """Send what the page draws (`data`: its view module's room fields) to the room; None: the page has nothing
        to show (no run yet, a reset), followers wait. A fault stops sharing, not the page; an unchanged view is
        not sent again."""
        view = RoomView(self.page.path, None if data is None else self.page.name, dict(data or {}), explore, picks)
        _send(self.room_id, self.secret, view)


def _send(room_id: str, secret: str, view: RoomView) -> None:
    if ROOM.get("id") != room_id:  # ended (or lost) since this run began: nothing to send to
        return
    sent = (room_id, view.to_json())
    if ROOM.get("sent") == sent:  # a rerun that changed nothing: no redraw for the room
        return
    if guarded(lambda: room_store().publish(room_id, secret, sent[1])):
        ROOM.set("at", view.path)
        ROOM.set("sent", sent)


def sharing(page: Page) -> Sharing | None:
    """The room this session shares `page` to (it opened one with "Share with the room"), or None."""
    room_id, secret = ROOM.get("id"), ROOM.get("secret")
    return None if room_id is None else Sharing(room_id, secret, page)


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
    here = this_page()
    if here is not None and page_at(here) is not None and ROOM.get("at") != here:
        # Followers are told where the lecturer went: a page the room cannot follow, or a followed one before it
        # has anything to show (no run yet, a model it cannot use) instead of the last page's state.
        _send(ROOM.get("id"), ROOM.get("secret"), RoomView(here))

    @st.fragment(run_every=LECTURER_BEAT_S)
    def beat() -> None:
        room_id = ROOM.get("id")
        if room_id is not None:
            guarded(lambda: room_store().beat(room_id, ROOM.get("secret")))

    beat()


def _link(room_id: str) -> str:
    """The followers' link: this page's address with `?room=<id>` and nothing else (no secret, no language)."""
    parts = urlsplit(st.context.url or "")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode({"room": room_id}), ""))


def qr_svg(url: str) -> str:
    """The link as a QR code: an SVG document (st.html strips an inline <svg>; st.image draws a document)."""
    out = io.BytesIO()
    segno.make(url, error="m").save(out, kind="svg", scale=QR_SCALE, border=2, xmldecl=False)
    return out.getvalue().decode()


def _end_room(room_id: str) -> None:
    guarded(lambda: room_store().end(room_id, ROOM.get("secret")), callback=True)
    ROOM.reset("id", "secret", "at")
    st.toast(tr("room.ended"))


def share_box() -> str | None:
    """The lecturer's "Share with the room" and, once open, the link and its QR code; returns the open room's id."""
    def open_room() -> None:
        room = guarded(room_store().create, callback=True)
        if room is not None:
            ROOM.reset("stopped", "at")
            ROOM.set("id", room.id)
            ROOM.set("secret", room.secret)

    if ROOM.get("id") is None:
        st.button(tr("room.share"), key="room_share", help=tr("room.share_help"), icon=":material/groups:",
                  on_click=open_room)
        return None
    room_id = ROOM.get("id")
    with st.expander(tr("room.link"), expanded=True, icon=":material/qr_code_2:"):
        text, code = st.columns([3, 2], vertical_alignment="center")  # the code ~470 px: whole on a 720 px screen
        text.markdown(f"**{tr('room.scan')}**")  # a subheader was drawn half under the code box (lecture CSS)
        text.code(_link(room_id), language=None, wrap_lines=True)
        text.button(tr("room.end"), key="room_end", icon=":material/logout:", on_click=_end_room, args=(room_id,))
        code.image(qr_svg(_link(room_id)), width="stretch")  # the column's width: scannable from the back
    return room_id


def share_button(lecture: bool) -> None:
    """"Share with the room", in lecture mode, until a room is open (then room_part draws its link)."""
    if lecture and ROOM.get("id") is None:
        share_box()
