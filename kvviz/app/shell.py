"""The page shell: `page_setup()`, called first on every page, sets the page up and draws what every page shares.

It reads the session's settings from their defaults and the link, sets the page's title and width, adds the
lecture and Korean styles (`KOREAN_CSS`), says what a malformed link got wrong, notes a hosted session's activity
(freeing the caches of sessions left idle), and draws the sidebar: navigation (kvviz.app.navigation), then the
settings (kvviz.app.sidebar), whose choice it returns.
"""
from __future__ import annotations

import time

import streamlit as st
from streamlit import runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from kvviz.app.hosted import HostedCaps
from kvviz.app.language import lang, tr
from kvviz.app.lecture import LECTURE_CSS, screen_capture
from kvviz.app.models import hosted_caps
from kvviz.app.navigation import nav_links
from kvviz.app.room.share import heartbeat
from kvviz.app.sidebar import Settings, init_state, sidebar
from kvviz.i18n import LANGS, t

# Korean breaks lines between words (eojeol), not inside one: the browser's default split "토큰" across lines.
# overflow-wrap still breaks a word longer than its box, so nothing overflows.
KOREAN_CSS = """<style>
[data-testid='stAppViewContainer'] :is(p, li, h1, h2, h3, label, span, td, th, div[data-testid='stMarkdownContainer']),
[data-testid='stSidebar'] :is(p, li, label, span) { word-break: keep-all; overflow-wrap: break-word; }
</style>"""


def page_setup(title_key: str) -> Settings:
    """Call first on every page: page config, the shared sidebar, and the settings it chose."""
    init_state()
    sidebar_state = "collapsed" if st.session_state.kv_lecture else "auto"  # the projector gets the whole width
    st.set_page_config(page_title=t(title_key, lang()), layout="wide", initial_sidebar_state=sidebar_state)
    if st.session_state.kv_lecture:
        st.html(LECTURE_CSS)
        screen_capture(title_key.split(".")[0])
    if lang() == "ko":
        st.html(KOREAN_CSS)
    _check_link()
    caps = hosted_caps()
    _track_session(caps)
    heartbeat()  # a lecturer with an open room, on whatever page: still here
    with st.sidebar:
        nav_links()
        return sidebar(caps)


def _check_link() -> None:
    """A malformed shared link (?lang=xx&lecture=banana) is said, not obeyed; the settings stay."""
    # (lecture= and model= are checked by url_state)
    bad_lang = st.query_params.get("lang")
    if bad_lang is not None and bad_lang not in LANGS:
        st.warning(tr("hosted.bad_link", name="lang", value=bad_lang, choices=", ".join(LANGS)))


def _track_session(caps: HostedCaps | None) -> None:
    """On a hosted demo: note this session's activity and free the caches of sessions left idle."""
    ctx = get_script_run_ctx()
    if caps is None or ctx is None or not runtime.exists():
        return
    from kvviz.app.sessions import REGISTRY  # imports the engine (torch): only on a hosted demo

    now = time.monotonic()
    REGISTRY.sweep(now, caps.idle_timeout_s, _session_state_of)
    if REGISTRY.pop_freed(ctx.session_id):
        st.info(tr("hosted.idle_freed", minutes=f"{caps.idle_timeout_s / 60:g}"))
    REGISTRY.touch(ctx.session_id, now)


def _session_state_of(session_id: str):  # noqa: ANN202 - Streamlit's SessionState, or None
    """A connected session's state (None once it disconnected or closed: Streamlit frees those)."""
    session = runtime.get_instance().get_app_session(session_id)
    return session.session_state if session is not None else None
