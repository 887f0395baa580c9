"""Lecture mode (`?lecture=1`, the sidebar's toggle): a page laid out for a projector at 1280×720.

- `LECTURE_CSS`: large type, the whole width, little padding (page_setup adds it);
- `lecture_head()`, `intro_box()`, `settings_box()`: a page's title, and where its introduction and settings go
  (in lecture mode one row: the introduction folded away, the settings behind one button, so the idea gets the
  screen);
- `ideas()`: one idea per screen, with a ← → stepper kept in the link; `idea_title()`: a section's heading,
  which in lecture mode the stepper shows instead; `lecture_tabs()`: a page's tabs, one per screen in lecture mode,
  `shown_idea()`: which one is on screen, and `screen_part()`: where a part of a section shown over several
  screens goes;
- `demo_seed()`: every seed pinned, so a demo repeats exactly on the projector;
- `screen_capture()`: a button in the header that saves the screen as it is shown as a PNG, for a slide.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import streamlit as st

from kvviz.app.language import tr
from kvviz.app.url_state import int_in, url_state
from kvviz.app.widgets import BUTTON_JS, persisted

LECTURE_SEED = 0  # lecture mode pins every seed, so a demo repeats exactly on the projector
# Streamlit sizes its text in rem: a larger root font enlarges every label, paragraph and widget.
LECTURE_CSS = """<style>
html { font-size: 20px; }
header[data-testid='stHeader'] { height: 2.6rem !important; min-height: 0 !important; }
[data-testid='stMainBlockContainer'] { max-width: 100%; padding: 3rem 2.5rem 1rem 2.5rem; }
[data-testid='stMainBlockContainer'] h1 { font-size: 1.7rem; padding: 0; }
[data-testid='stMainBlockContainer'] h3 { font-size: 1.3rem; padding: 0; }
[data-testid='stMainBlockContainer'] [data-testid='stVerticalBlock'] { gap: 0.6rem; }
[data-testid='stMain'] [data-testid='stAlert'] > div { padding: 0.45rem 0.8rem; }
[data-testid='stMain'] [data-testid='stMetricValue'] { font-size: 1.6rem; }
[data-testid='stMain'] [data-testid='stExpander'] summary { min-height: 0; padding-block: 0.3rem; }
[data-testid='stLayoutWrapper']:has(> [class*='st-key-kv_hidden_']),
[class*='st-key-kv_hidden_'] { display: none !important; }
.st-key-kv_screen_png { position: fixed; top: 0.3rem; right: 3.6rem; z-index: 999991; width: auto !important; }
</style>"""
# At 1280×720 the default 6rem top padding, a 2.75rem title and 1rem between elements took a third of the screen: a
# lower fixed header (it holds the sidebar's button), a smaller title and closer elements leave it to the idea (labels
# wrap rather than being cut short on every page: kvviz.app.a11y). A folded expander is a line, not a bar (a draft
# model's grid folded under the target's on Speculative Decoding's step).


def lecture_head(title: str | None = None, widths: tuple[float, float] = (2.5, 2.5)) -> tuple[Any, Any]:
    """The page's title, and where its introduction and settings go: in lecture mode one row holds all three, the
    title first (so the demo's controls and the idea fit one screen); otherwise the title, then each wherever the
    page enters it. A page that draws its own title (its idea stepper sits right under it) passes none: the row then
    holds the introduction and the settings in `widths`."""
    if not st.session_state.get("kv_lecture"):
        if title is not None:
            st.title(title)
        return contextlib.nullcontext(), contextlib.nullcontext()
    if title is None:
        intro, settings = st.columns(list(widths), vertical_alignment="center")
        return intro, settings
    heading, intro, settings = st.columns([5, *widths], vertical_alignment="center")
    heading.title(title)
    return intro, settings


def intro_box() -> Any:
    """Where a page's introduction goes: on the page, or folded away in lecture mode (the presenter says it) and on
    a lecture room follower's screen (`?room=`: on a phone it took the whole first screen from the lecture)."""
    folded = st.session_state.get("kv_lecture") or st.query_params.get("room")
    return st.expander(tr("lecture.about")) if folded else st.container()


def settings_box(label: str | None = None, *, border: bool = False) -> Any:
    """Where a page's settings go: on the page, or in lecture mode behind one button (`label`, or "Settings"), so
    that one screen holds the controls a demo clicks and the idea on screen."""
    if st.session_state.get("kv_lecture"):
        return st.popover(label or tr("lecture.settings"), icon=":material/tune:")
    return st.container(border=border)


def ideas(titles: Sequence[str], key: str) -> list[int]:
    """Which sections a page renders: all of them, or in lecture mode one idea per screen (kept in `?idea=`).

    In lecture mode a stepper heads the page: previous / next buttons around the ideas' numbers, and the current
    idea's title beside them (so every title shows whole, however many ideas); idea_title() then draws nothing.
    The choice is in the link, so a slide can be shared.
    """
    if not st.session_state.get("kv_lecture"):
        return list(range(len(titles)))
    state = url_state("idea", 1, int_in(1, len(titles)), state=f"kv_idea_{key}")

    def move(by: int) -> None:
        st.session_state[state] = min(max(st.session_state[state] + by, 1), len(titles))

    with st.container(horizontal=True, vertical_alignment="center", gap="small"):
        st.button("←", key=f"kv_idea_back_{key}", on_click=move, args=(-1,), disabled=st.session_state[state] == 1,
                  help=tr("lecture.previous"))
        persisted(st.segmented_control, state, tr("lecture.idea"), options=range(1, len(titles) + 1),
                  required=True, width="content", label_visibility="collapsed",
                  help=" · ".join(f"{i}. {t}" for i, t in enumerate(titles, 1)))
        st.button("→", key=f"kv_idea_next_{key}", on_click=move, args=(1,),
                  disabled=st.session_state[state] == len(titles), help=tr("lecture.next"))
        st.subheader(titles[st.session_state[state] - 1], width="stretch")
    return [st.session_state[state] - 1]


def idea_title(title: str, *, small: bool = False) -> None:
    """A section's heading on the page (`small`: a subheader); in lecture mode the stepper already shows it."""
    if not st.session_state.get("kv_lecture"):
        (st.subheader if small else st.header)(title)


def lecture_tabs(titles: Sequence[str], key: str, *, first_on_page: bool = False,
                 screens: Sequence[tuple[int, str]] | None = None) -> list[Any]:
    """Where a page's sections go: tabs (the first section above them when `first_on_page`), or in lecture mode one
    section per screen with the ideas() stepper. Each section's code runs either way (its widgets keep their state);
    in lecture mode the others draw into hidden containers. `screens`: a section too long for one screen shown over
    several, as (its index, the screen's title) in order; `shown_idea(key)` tells the section which is on screen."""
    if not st.session_state.get("kv_lecture"):
        first = [st.container()] if first_on_page else []
        return first + list(st.tabs(list(titles[len(first):])))
    screens = list(enumerate(titles)) if screens is None else screens
    shown = screens[ideas([title for _, title in screens], key)[0]][0]
    return [_box(i == shown, f"{key}_{i}") for i in range(len(titles))]


def shown_idea(key: str) -> int | None:
    """Which idea (0-based) of ideas(..., key) a lecture screen shows; None outside lecture mode (all of them)."""
    return st.session_state[f"kv_idea_{key}"] - 1 if st.session_state.get("kv_lecture") else None


def screen_part(key: str, idea: int, part: str) -> Any:
    """Where one part of a section that lecture_tabs(screens=...) spreads over several screens goes: drawn on its
    screen `idea` (0-based) and outside lecture mode, hidden on the section's other screens (its widgets keep
    their state)."""
    return _box(shown_idea(key) in (None, idea), f"{key}_{part}")


def _box(shown: bool, name: str) -> Any:
    """A container, or one the lecture CSS hides (drawn all the same, so the widgets in it keep their state)."""
    return st.container() if shown else st.container(key=f"kv_hidden_{name}")


def demo_seed(seed: int) -> int:
    """The seed a demo uses: the user's, or in lecture mode the fixed one."""
    return LECTURE_SEED if st.session_state.get("kv_lecture") else seed


# The screen as the audience sees it, drawn by html-to-image (vendored from npm, inlined: no CDN) into a PNG the
# browser downloads: the app's root at the window's size, without this button. Only the browser has the screen
# (its fonts, its layout, the charts as drawn), so it is captured there, not on the server.
_CAPTURE_JS = BUTTON_JS + """
export default function(component) {
  const { parentElement } = component;
  const [data] = component.data;  // one-item list, as the stepper's (kvviz.app.widgets.stepper)
  const btn = componentButton(parentElement, 'kv-shot');
  btn.textContent = data.label;
  btn.title = data.help;
  btn.onclick = async () => {
    btn.disabled = true;
    btn.dataset.state = 'busy';
    await new Promise((r) => setTimeout(r, 0));  // let the click end and the button show it is busy first
    try {
      const root = document.querySelector("[data-testid='stApp']") || document.body;
      const w = window.innerWidth, h = window.innerHeight;
      // Not copied: this button, the collapsed sidebar, and the other screens' sections (drawn but hidden) — two
      // thirds of a lecture page's nodes, each of whose styles html-to-image would copy.
      const skip = (n) => n.classList && (n.classList.contains('st-key-kv_screen_png')
        || n.dataset.testid === 'stSidebar' || [...n.classList].some((c) => c.startsWith('st-key-kv_hidden_')));
      const url = await globalThis.htmlToImage.toPng(root, {
        width: w, height: h, canvasWidth: w, canvasHeight: h, pixelRatio: 1, backgroundColor: '#ffffff',
        filter: (n) => !skip(n) });
      const a = document.createElement('a');
      a.href = url;
      a.download = data.filename;
      document.body.appendChild(a);
      a.click();
      a.remove();
      btn.dataset.state = 'saved';
    } catch (e) {
      btn.dataset.state = 'failed';  // said on the button for a while; the page itself is untouched
      btn.textContent = data.failed + ' ' + String((e && e.message) || e).slice(0, 80);
      setTimeout(() => { btn.textContent = data.label; }, 8000);
    } finally {
      btn.disabled = false;
    }
  };
}
"""
_CAPTURE_CSS = """
button.kv-shot { font: inherit; font-size: 0.8rem; padding: 0.15rem 0.6rem; border-radius: 0.5rem; cursor: pointer;
  border: 1px solid rgba(49, 51, 63, 0.2); background: #fff; color: rgb(49, 51, 63); white-space: nowrap; }
button.kv-shot:hover:not(:disabled) { border-color: #c53948; color: #c53948; }
button.kv-shot:focus-visible { outline: 2px solid #c53948; outline-offset: 2px; }
button.kv-shot:disabled { opacity: 0.45; cursor: progress; }
"""


@cache
def _capture_component() -> Any:
    vendored = resources.files("kvviz.assets").joinpath("vendor/html-to-image.js").read_text(encoding="utf-8")
    return st.components.v2.component("kvviz_screen_png", js=vendored + "\n" + _CAPTURE_JS, css=_CAPTURE_CSS)


def screen_capture(name: str) -> None:
    """In lecture mode, a button at the top of the screen that saves what the screen shows as `kvviz-<name>.png`
    (the window's size: 1280×720 on the projector the layout is made for)."""
    if not st.session_state.get("kv_lecture"):
        return
    data = {"label": tr("lecture.save_screen"), "help": tr("lecture.save_screen_help"),
            "failed": tr("lecture.save_screen_failed"), "filename": f"kvviz-{name}.png"}
    _capture_component()(key="kv_screen_png", data=[data], width="content")  # a dict would import pandas
