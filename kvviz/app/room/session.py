"""This session's place in a lecture room: ROOM (its session keys), room_store() (the process's store, as
KVVIZ_ROOM_STORE picks it), follower_room() (the room a `?room=` link follows), follower_id() (this browser's
opaque id: one seat, one answer), guarded() (a store call whose fault stops the sharing, never the lecture) and
this_page() (the page this run draws). The lecturer's secret lives in this session only (ROOM's `secret`); the
followers' link carries the room id alone."""
from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from kvviz.app.language import show_error
from kvviz.app.models import hosted_caps
from kvviz.app.navigation import ROOT
from kvviz.app.state import page_state
from kvviz.errors import InputError
from kvviz.room.store import RoomStore, store_from_env

# id, secret: the lecturer's open room; follower: this browser's seat; explore: a follower exploring on their own
# (the room kept, to follow again); replay: the lecturer's step to reach; stopped: why this lecturer's sharing
# stopped (an InputError), said at the top of every page until dismissed; at: the page the room was last told the
# lecturer is on; sent: (room id, the view) last published, so a rerun that changes nothing is not a new version;
# results: an ended room's results (its questions asked), shown once by the next share box
ROOM = page_state("room", id=None, secret=None, follower=None, explore=False, replay=None, stopped=None, at=None,
                  sent=None, results=None)


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


def follower_id() -> str:
    """One opaque id per browser session: one seat and one answer each, no names."""
    if ROOM.get("follower") is None:
        ROOM.set("follower", secrets.token_urlsafe(16))
    return ROOM.get("follower")


def guarded(fn: Callable[[], object], *, callback: bool = False) -> object | None:
    """Run a store call; a fault stops the sharing (said, with why), never the lecture. The room out of reach:
    the page is drawn again at once (not in a widget's `callback`, which runs before the page anyway), so the
    reason stands at its top (share.heartbeat) rather than in a fragment the next step or beat redraws."""
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


def this_page() -> str | None:
    """The page this run draws, as navigation's PAGES names its file (pages/3_Memory_Footprint.py), or None
    outside a run."""
    ctx = get_script_run_ctx()
    info = ctx.pages_manager.get_pages().get(ctx.page_script_hash) if ctx is not None else None
    if not info or not info.get("script_path"):
        return None
    try:
        return Path(info["script_path"]).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
