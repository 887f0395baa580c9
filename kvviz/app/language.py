"""The session's language and what the app says in it: `lang()` (the language chosen in the sidebar or the link),
`tr()` (a locale key in that language) and `show_error()` (an error as a message in that language, never a
traceback). Every other kvviz/app module speaks through these.
"""
from __future__ import annotations

import streamlit as st

from kvviz.errors import InputError
from kvviz.i18n import t


def lang() -> str:
    return st.session_state.get("kv_lang", "en")


def tr(key: str, **values: object) -> str:
    """Translate a locale key into the session's language."""
    return t(key, lang(), **values)


def show_error(exc: Exception) -> None:
    """A clear message in the user's language, never a traceback."""
    st.error(exc.message(lang()) if isinstance(exc, InputError) else str(exc))
