"""The lecturer's side of a room: share_box ("Share with the room": the followers' link on the machine's network
(kvviz.room.network, never loopback) and its QR code, qr_svg; the room's results as CSV, and once ended, shown once),
share_button (the same behind a page's settings), Sharing (an open room this session shares to: publish, the
lecturer's explicit call where a page draws), sharing() (this session's open room, or None), heartbeat() (on every
page: why sharing stopped, and the lecturer's "still here")."""
from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import segno
import streamlit as st

from kvviz.app.language import lang, tr
from kvviz.app.navigation import Page, page_at
from kvviz.app.room.session import ROOM, guarded, room_store, this_page
from kvviz.app.room.view import RoomView
from kvviz.i18n import t
from kvviz.room.network import RoomLink, network_address, room_link
from kvviz.room.results import RESULT_COLUMNS, results_csv, summary
from kvviz.room.store import LECTURER_BEAT_S, Asked

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


def _end_room(room_id: str) -> None:
    secret = ROOM.get("secret")
    ROOM.set("results", guarded(lambda: room_store().results(room_id, secret), callback=True))  # shown once, after
    guarded(lambda: room_store().end(room_id, secret), callback=True)
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
        if guarded(lambda: store.results(room_id, secret)):
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


def share_button(lecture: bool) -> None:
    """"Share with the room", in lecture mode, until a room is open (then room_part draws its link)."""
    if lecture and ROOM.get("id") is None:
        share_box()
