"""A config.json uploader that survives Streamlit's replace: a fresh, empty uploader after every file read, so
choosing another file is a new upload, never a replace (a DELETE and a PUT that can lose the new file when the two
overlap). The last valid config stays in session state; a bad file is an error in the user's language."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import streamlit as st

from kvviz.app.language import show_error
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec
from kvviz.kv.reader import parse_config_text


def config_upload(where: Any, label: str, key: str, on_read: Callable[[KVSpec], None] | None = None
                  ) -> KVSpec | None:
    """The last config.json read under `key` (None before any); `on_read` runs once per file read."""
    ss = st.session_state
    n = ss.setdefault(f"{key}_n", 0)
    upload = where.file_uploader(label, type=None, key=f"{key}_{n}")
    if upload is not None:
        ss[f"{key}_error"] = None
        try:
            parsed = parse_config_text(upload.getvalue(), upload.name)
            if parsed.model_type:
                parsed = replace(parsed, name=f"{upload.name} ({parsed.model_type})")
            ss[f"{key}_spec"] = parsed
            if on_read is not None:
                on_read(parsed)
        except InputError as exc:
            ss[f"{key}_error"] = exc  # the last valid config stays in use
        ss[f"{key}_n"] = n + 1
        st.rerun()
    if ss.get(f"{key}_error"):
        show_error(ss[f"{key}_error"])
    return ss.get(f"{key}_spec")
