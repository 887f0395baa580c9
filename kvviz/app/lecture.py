"""Lecture mode (`?lecture=1`, the sidebar's toggle): a page laid out for a projector at 1280×720.

- `LECTURE_CSS`: large type, the whole width, little padding (page_setup adds it);
- `lecture_head()`, `intro_box()`, `settings_box()`: where a page's introduction and settings go (folded away or
  behind one button in lecture mode, so the demo and its idea get the screen);
- `ideas()`: one idea per screen, with a ← → stepper kept in the link;
- `demo_seed()`: every seed pinned, so a demo repeats exactly on the projector.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import streamlit as st

from kvviz.app.language import tr
from kvviz.app.url_state import int_in, url_state
from kvviz.app.widgets import persisted

LECTURE_SEED = 0  # lecture mode pins every seed, so a demo repeats exactly on the projector
# Streamlit sizes its text in rem: a larger root font enlarges every label, paragraph and widget.
LECTURE_CSS = """<style>
html { font-size: 22px; }
[data-testid='stMainBlockContainer'] { max-width: 100%; padding: 4rem 3rem 2rem 3rem; }
[data-testid='stMainBlockContainer'] h1 { font-size: 2.2rem; padding-top: 0; }
[data-testid='stMain'] [data-testid='stPageLink-NavLink'] span { white-space: normal; }
</style>"""  # at 1280×720 the default 6rem top padding (4rem clears the fixed header) and a 2.75rem title took a third;
# a label wraps onto a second line rather than being cut short (Streamlit ends a long one with "…")


def lecture_head() -> tuple[Any, Any]:
    """Where the introduction and the settings go: in lecture mode one row of two columns (so the demo's controls
    and the idea fit one screen); otherwise wherever the page is when each is entered."""
    if not st.session_state.get("kv_lecture"):
        return contextlib.nullcontext(), contextlib.nullcontext()
    intro, settings = st.columns([3, 1], vertical_alignment="center")
    return intro, settings


def intro_box() -> Any:
    """Where a page's introduction goes: on the page, or in lecture mode folded away (the presenter says it)."""
    return st.expander(tr("lecture.about")) if st.session_state.get("kv_lecture") else st.container()


def settings_box(label: str | None = None, *, border: bool = False) -> Any:
    """Where a page's settings go: on the page, or in lecture mode behind one button (`label`, or "Settings"), so
    that one screen holds the controls a demo clicks and the idea on screen."""
    if st.session_state.get("kv_lecture"):
        return st.popover(label or tr("lecture.settings"), icon=":material/tune:")
    return st.container(border=border)


def ideas(titles: Sequence[str], key: str) -> list[int]:
    """Which sections a page renders: all of them, or in lecture mode one idea per screen (kept in `?idea=`).

    In lecture mode a stepper heads the page: previous / next buttons around a bar naming every idea, so a
    presenter moves through the page one screen at a time (the choice is in the link, so a slide can be shared).
    """
    if not st.session_state.get("kv_lecture"):
        return list(range(len(titles)))
    state = url_state("idea", 1, int_in(1, len(titles)), state=f"kv_idea_{key}")

    def move(by: int) -> None:
        st.session_state[state] = min(max(st.session_state[state] + by, 1), len(titles))

    back, bar, forward = st.columns([1, 12, 1], vertical_alignment="bottom")
    back.button("←", key=f"kv_idea_back_{key}", on_click=move, args=(-1,), disabled=st.session_state[state] == 1,
                help=tr("lecture.previous"), width="stretch")
    forward.button("→", key=f"kv_idea_next_{key}", on_click=move, args=(1,),
                   disabled=st.session_state[state] == len(titles), help=tr("lecture.next"), width="stretch")
    with bar:
        persisted(st.segmented_control, state, tr("lecture.idea"), options=range(1, len(titles) + 1),
                  format_func=lambda i: f"{i}. {titles[i - 1]}", required=True, width="stretch")
    return [st.session_state[state] - 1]


def demo_seed(seed: int) -> int:
    """The seed a demo uses: the user's, or in lecture mode the fixed one."""
    return LECTURE_SEED if st.session_state.get("kv_lecture") else seed
