"""The app's widgets beyond Streamlit's own, the same on every page:

- `persisted()`: a widget whose value survives a switch to another page (seeded from, and saved to, a session key);
- `number_in_range()`: a number box whose range is checked here, so a value outside it is refused with a message
  naming the range while the last valid value stays in use (`number_text()` writes the numbers it names;
  `current_number()` is its value as a callback sees it);
- `chart()` and `table()`: a Plotly figure with its toolbar (laid out for a phone where `on_phone()`: the
  browser says it is one), a table with its CSV download;
- `run_download()`: "Download this run", the page's run as one self-contained .html (kvviz.charts.run_html);
- `stepper()` and `pending_actions()`: a Step button and one numbered log of a page's presses (its clicks, the
  → / Space / P / R keys, the page's own buttons), to be applied once each and in order, so no press is lost or
  reordered (kvviz/app/decode_controls.py applies them for the stepping pages);
- `own_html()`: HTML kvviz built itself (the token strips, the cache grids), redrawn without a sanitizer pass.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import streamlit as st

from kvviz.app.a11y import shortcuts_on
from kvviz.app.language import lang, tr
from kvviz.charts.base import phone_layout
from kvviz.charts.image import PROJECTOR, SCALE, can_export, slide_svg
from kvviz.errors import InputError

if TYPE_CHECKING:  # pandas alone takes ~0.5-1.6 s to import: not on the path to the first page drawn
    import pandas as pd
    import plotly.graph_objects as go

# Plotly's toolbar always shown, its camera button saving a PNG for a slide: the chart laid out at half a projector's
# size and drawn at twice the scale (1920×1080 px, type twice as large as on screen), as charts.image draws the SVG.
PLOTLY_CONFIG = {"displayModeBar": True, "displaylogo": False, "toImageButtonOptions": {
    "format": "png", "width": PROJECTOR[0] // SCALE, "height": PROJECTOR[1] // SCALE, "scale": SCALE}}


def persisted(widget, key: str, label: str, **kwargs):  # noqa: ANN001, ANN202 - any st widget
    """A widget whose value survives page switches: seeded from and written back to `key`.

    A key no one seeded yet (a page that forgot to declare it) is not an error: the widget starts at its own default
    and that value is saved, so a missing seed can never show a traceback."""
    if key in st.session_state:
        st.session_state["_w_" + key] = st.session_state[key]

    def save() -> None:
        st.session_state[key] = st.session_state["_w_" + key]

    value = widget(label, key="_w_" + key, on_change=save, **kwargs)
    st.session_state[key] = value
    return value


def number_text(x: float) -> str:
    """1,000 or 2.5 (never 1e+03 or 1000.0); a number too long to read whole (1e99) in scientific notation."""
    if abs(x) >= 1e15:
        return f"{x:.3g}"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def _in_range(value: float, low: float, high: float, whole: bool) -> bool:
    return low <= value <= high and (not whole or value == int(value))


def number_in_range(where: Any, label: str, low: float, high: float, default: float | None, key: str, *,
                    whole: bool = True, optional: bool | None = None, **kwargs: Any) -> Any:
    """A number box whose bounds are checked here, not by the widget: a value outside [low, high] is refused with a
    message that names the box and the range, and the last valid value (`default` before any) is used.

    Streamlit's own min/max are left off on purpose: with them the browser keeps an out-of-range entry in the box
    while the app silently goes on with the previous value. An emptied box keeps the last valid value, and says so.
    An `optional` number (the default when `default` is None: a prediction, a memory size to estimate) starts empty
    and returns None while it is empty. Other keyword arguments go to st.number_input. A callback, which runs before
    the page draws the box, reads its value with `current_number(key)`.
    """
    optional = default is None if optional is None else optional
    valid_key = f"_valid_{key}"
    valid = st.session_state.get(valid_key, default)
    if valid is not None and not low <= valid <= high:  # the range itself changed (another model): start again
        valid = None if default is None else min(max(default, low), high)
    st.session_state[f"_range_{key}"] = (low, high, whole, optional)
    if valid is not None:
        st.session_state.setdefault(key, float(valid))
    elif key not in st.session_state:
        kwargs["value"] = None  # an optional number starts empty
    # A float box even for whole numbers: Streamlit reads an integer box with parseInt, so "1e3" became 1 and
    # "2.5" became 2 without a word; as a float each reaches the checks below and is refused or taken whole. The
    # step too: an int step made Streamlit warn, with a stack in the server's log, on every run.
    step = kwargs.get("step", 1.0 if whole else None)
    kwargs["step"] = None if step is None else float(step)
    if whole:
        kwargs.setdefault("format", "%.0f")
    value = where.number_input(label, key=key, **kwargs)
    if value is None and optional:
        st.session_state.pop(valid_key, None)  # emptied on purpose: unknown, or estimated
        return None
    if value is None:
        if valid is not None:
            where.warning(tr("common.number_empty", name=label, kept=number_text(valid)))
        return valid
    if not _in_range(value, low, high, whole):
        kept = "" if valid is None else tr("common.out_of_range_kept", kept=number_text(valid))
        why = "common.not_whole" if low <= value <= high else "common.out_of_range"
        where.error(tr(why, name=label, value=number_text(value), low=number_text(low), high=number_text(high),
                       kept=kept))
        return valid
    st.session_state[valid_key] = int(value) if whole else float(value)
    return st.session_state[valid_key]


def current_number(key: str, before: Any = None) -> Any:
    """A number box's value as a callback sees it (before the page draws the box again): what was just entered when
    number_in_range would accept it, else the last valid value (None for an emptied optional box); `before` while the
    box has not been drawn yet."""
    if f"_range_{key}" not in st.session_state:
        return before
    low, high, whole, optional = st.session_state[f"_range_{key}"]
    value = st.session_state.get(key)
    if value is not None and _in_range(value, low, high, whole):
        return int(value) if whole else float(value)
    return None if value is None and optional else st.session_state.get(f"_valid_{key}")


def on_phone() -> bool:
    """Whether this session's browser says it is a phone: "Mobile" in its User-Agent (iOS Safari, Chrome and Firefox
    on Android phones; a tablet's says it not). The server learns no screen width, so this is what it can tell."""
    return "Mobile" in (st.context.headers.get("User-Agent") or "")  # none (AppTest, a bare script): not a phone


def chart(fig: go.Figure, key: str, *, summary: str | None = None) -> None:
    """A Plotly chart for a slide: its toolbar's camera saves `key`.png at a projector's size (drawn by the browser),
    and a button under it `key`.svg (drawn on the server by charts.image when this machine can: kaleido and a
    Chromium; not in lecture mode, like the tables' CSV).

    Every chart has a text alternative (WCAG 1.1.1) from its own data (charts.alt_text): its title as its name, a
    summary (`summary`, the page's sentence, else one the figure's numbers give) and its data as a table, visually
    hidden beside it; kvviz.app.a11y makes them the chart's accessible name and description.

    theme=None: the figure's own layout (charts.base.style: lecture type sizes, room for the toolbar) is what
    shows; Streamlit's theme would override its fonts and margins.
    """
    from kvviz.charts.alt_text import alt_html  # numpy: not on the path of a page without charts (the stepper's)

    config = {**PLOTLY_CONFIG, "toImageButtonOptions": {**PLOTLY_CONFIG["toImageButtonOptions"], "filename": key}}
    lecture = st.session_state.get("kv_lecture")
    # On a phone (a room's follower holds one) the legend under the plot, titles in lines (charts.base); a copy: the
    # SVG below is the slide's, at a projector's size.
    phone = on_phone()
    shown = phone_layout(fig) if phone else fig
    if lecture or phone:
        config["displayModeBar"] = "hover"  # on a projector or a phone the toolbar would sit on a wrapped title
    with st.container(gap=None):  # the hidden text alternative adds no gap under the chart
        st.plotly_chart(shown, key=key, config=config, width="stretch", theme=None)
        st.html(alt_html(fig, key, lang(), summary))
    if not lecture and can_export():
        # Drawn only when pressed (a callable), on Streamlit's download thread: ~1-10 s of Chromium per image.
        failed = tr("lecture.download_svg_failed")  # read here: the callable runs outside the script
        st.download_button(tr("lecture.download_svg"), lambda: slide_svg(fig, failed), file_name=f"{key}.svg",
                           mime="image/svg+xml", key=f"{key}_svg", on_click="ignore", type="tertiary",
                           icon=":material/download:", help=tr("lecture.download_svg_help"))


COMPACT_LABEL = ":material/download:"  # run_download's label on a projector: the icon alone


def run_download(where: Any, key: str, file_name: str, record: Callable[[], dict] | None,
                 size: tuple[int, int] = (0, 0), *, compact: bool = False) -> None:
    """"Download this run": the run as one .html that replays it offline, built only when clicked (`record` then
    gives the run record; a download reruns nothing, so Play goes on). Disabled, its tooltip saying why, while
    nothing ran (`record` None) or when the run is too large for one file (`size`: steps, attention values).
    `compact`: the icon alone, the tooltip naming it (a projector's row of buttons has no room for the words)."""
    from kvviz.charts.run_html import check_size

    reason = tr("run_html.download_none") if record is None else None
    if record is not None:
        try:
            check_size(*size)
        except InputError as exc:
            reason = exc.message(lang())
    language = lang()  # the callable runs on another thread, without the session

    def document() -> str:
        from kvviz.charts.run_html import run_html

        return run_html(record(), language)

    where.download_button(COMPACT_LABEL if compact else tr("run_html.download"),
                          data=document if reason is None else "", file_name=file_name, mime="text/html", key=key,
                          disabled=reason is not None, help=reason or tr("run_html.download_help"), on_click="ignore",
                          icon=None if compact else ":material/download:")


def table(df: pd.DataFrame | list[dict] | dict[str, list], key: str, *, prose: bool = False) -> None:
    """A table and a button that downloads it as CSV (UTF-8 with BOM, so spreadsheets read Korean; not in lecture
    mode). Rows (a list of dicts, column name → cell) or columns (a dict of lists) become a DataFrame here, so a
    view imports no pandas itself.

    `prose`: cells of sentences, shown as a static table that wraps them instead of a scrolling grid.
    """
    if isinstance(df, list | dict):
        import pandas as pd  # ~1,000 modules with pyarrow: only once a table is drawn, never before a page's title

        df = pd.DataFrame(df)
    if prose:
        st.table(df, hide_index=True)
    else:
        st.dataframe(df, hide_index=True, width="stretch")
    if not st.session_state.get("kv_lecture"):  # nobody downloads from a projector: the table keeps the screen
        st.download_button(tr("lecture.download_csv"), df.to_csv(index=False).encode("utf-8-sig"),
                           file_name=f"{key}.csv", mime="text/csv", key=f"{key}_csv")


# ---- one ordered channel for a page's controls: no click or key is lost or reordered --------------------------
# st.button sends a one-shot trigger, and Streamlit merges the triggers that reach the server before it picks the
# first up: two clicks on Step became one token, and Prefill, R, Prefill, R pressed quickly ran as one Prefill and one
# Reset in widget order, not press order, leaving a fresh generation. This component keeps a numbered log of every
# press instead — its own Step button, the → / Space / P / R keys (outside text fields) and clicks on the page's
# Streamlit buttons it is given (caught before Streamlit sees them) — and sends the whole unserved log each time; the
# newest log always wins, and the page applies each action once, in order (pending_actions). While the page plays,
# it also says so when one redraw shows more than one new token (the browser fell behind the server).
# BUTTON_JS: a component's own button, made once per mount (every v2 component button here starts with it).
BUTTON_JS = """
function componentButton(parentElement, className) {
  let btn = parentElement.querySelector('button.' + className);
  if (!btn) {
    btn = document.createElement('button');
    btn.className = className;
    btn.type = 'button';
    parentElement.appendChild(btn);
  }
  return btn;
}
"""
_STEPPER_JS = BUTTON_JS + """
export default function(component) {
  const { setStateValue, parentElement } = component;
  const [data] = component.data;  // one-item list: see stepper()
  const btn = componentButton(parentElement, 'kv-step');
  btn.textContent = data.label;
  btn.title = data.title;
  btn.disabled = !!data.disabled;
  btn.dataset.served = String(data.base);
  btn.dataset.shortcuts = Object.keys(data.keys).length ? 'on' : 'off';  // what the keys do now (WCAG 2.1.4)
  // Numbers only grow: after a remount (another page and back) they restart from what the server served.
  const st = parentElement.__kv || (parentElement.__kv = { seq: 0, log: [] });
  if (data.base > st.seq) st.seq = data.base;
  st.log = st.log.filter((e) => e[0] > data.base);  // served: no need to send them again
  const send = (action) => {
    st.seq += 1;
    st.log.push([st.seq, action]);
    btn.dataset.sent = String(st.seq);
    setStateValue('events', st.log.slice());
  };
  // Sent even while the button looks disabled: the page may not have drawn the Prefill that enables it yet.
  btn.onclick = () => send('step');
  const typing = (el) => el && (el.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName));
  const onKey = (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
    const action = data.keys[e.key.length === 1 ? e.key.toLowerCase() : e.key];
    if (action) { e.preventDefault(); e.stopImmediatePropagation(); send(action); }
  };
  const onClick = (e) => {
    for (const [selector, action] of Object.entries(data.buttons)) {
      const b = e.target.closest && e.target.closest(selector);
      if (b) {
        e.preventDefault(); e.stopImmediatePropagation();
        if (!b.disabled) send(action);
        return;
      }
    }
  };
  for (const [name, fn] of [['keydown', onKey], ['click', onClick]]) {
    const slot = '__kvControls_' + name;
    if (window[slot]) window.removeEventListener(name, window[slot], true);
    window[slot] = fn;
    window.addEventListener(name, fn, true);
  }
  // Falling behind: one redraw while playing shows more than one new token.
  let note = parentElement.querySelector('div.kv-behind');
  if (!note) {
    note = document.createElement('div');
    note.className = 'kv-behind';
    note.setAttribute('role', 'status');
    parentElement.appendChild(note);
  }
  const jump = st.shown == null ? 0 : data.shown - st.shown;
  if (data.playing && st.playing && jump > 1) {
    note.textContent = data.behind.replace('{n}', String(jump));
    st.noteUntil = Date.now() + 4000;
  }
  note.hidden = !(data.playing && st.noteUntil && Date.now() < st.noteUntil);
  st.shown = data.shown;
  st.playing = data.playing;
  return () => {
    for (const [name, fn] of [['keydown', onKey], ['click', onClick]]) {
      const slot = '__kvControls_' + name;
      if (window[slot] === fn) { window.removeEventListener(name, fn, true); window[slot] = null; }
    }
  };
}
"""
_STEPPER_CSS = """
button.kv-step { font: inherit; font-size: 1rem; line-height: 1.6; padding: 0.25rem 0.75rem; min-height: 2.5rem;
  border-radius: 0.5rem; border: 1px solid rgba(49, 51, 63, 0.2); background: #fff; color: rgb(49, 51, 63);
  cursor: pointer; white-space: nowrap; }
button.kv-step:hover:not(:disabled) { border-color: #c53948; color: #c53948; }
button.kv-step:active:not(:disabled) { background: #c53948; color: #fff; }
button.kv-step:focus-visible { outline: 2px solid #c53948; outline-offset: 2px; }
button.kv-step:disabled { opacity: 0.45; cursor: not-allowed; }
div.kv-behind { position: fixed; top: 3.75rem; right: 1rem; z-index: 1000; max-width: 28rem; padding: 0.5rem 0.75rem;
  border-radius: 0.5rem; background: #fffce7; color: #926c05; border: 1px solid #f4e3a1; font-size: 0.9rem; }
div.kv-behind[hidden] { display: none; }
"""
_stepper_component = None


def _no_callback() -> None:
    """The page reads the log on its rerun (pending_actions); nothing else to do when it changes."""


def stepper(label: str, *, key: str, served: int, disabled: bool, help: str = "", buttons: dict[str, str] | None = None,
            keys: dict[str, str] | None = None, shown: int = 0, playing: bool = False, behind: str = "") -> None:
    """A Step button, and the channel that keeps a page's presses in order: every press of it, of `keys` ({key:
    action}, e.g. {"ArrowRight": "step", "p": "toggle_play"}) and clicks on the Streamlit buttons keyed in `buttons`
    ({widget key: action}) becomes one numbered action; the page applies them with pending_actions(key, served).

    `shown` (tokens on screen) and `playing`: while playing, a redraw that shows more than one new token says so,
    with `behind` ({n}: how many at once).
    """
    global _stepper_component
    if _stepper_component is None:
        _stepper_component = st.components.v2.component("kvviz_stepper", js=_STEPPER_JS, css=_STEPPER_CSS)
    data = {"label": label, "title": help, "disabled": disabled, "base": served, "shown": shown, "playing": playing,
            # single-key shortcuts only while the sidebar leaves them on (WCAG 2.1.4)
            "behind": behind, "keys": {"ArrowRight": "step", " ": "step", **(keys or {})} if shortcuts_on() else {},
            "buttons": {f".st-key-{k} button": action for k, action in (buttons or {}).items()}}
    # In a one-item list: Streamlit scans a dict's values for dataframes, which imports numpy, pandas and pyarrow
    # (~1,000 modules) on the first screen of every page with a stepper; a list passes as plain JSON.
    _stepper_component(key=key, data=[data], default={"events": []}, width="content", on_events_change=_no_callback)


def pending_actions(key: str, served: int) -> list[tuple[int, str]]:
    """The presses the stepper `key` has logged past `served`, oldest first: (number, action). Read them before
    drawing the page's controls, apply each once, and keep the last number as the new `served`."""
    state = st.session_state.get(key)
    events = state.get("events") if hasattr(state, "get") else getattr(state, "events", None)
    return sorted((int(n), str(action)) for n, action in (events or []) if int(n) > served)


_OWN_HTML_JS = """
export default function(component) {
  const { parentElement } = component;
  const [body] = component.data;  // one-item list: see stepper()
  if (parentElement.__kvBody !== body) {  // a Play tick that stepped nothing, a tab switched back: nothing to redo
    parentElement.__kvBody = body;
    parentElement.innerHTML = body;
  }
}
"""
_own_html_component = None


def own_html(body: str, *, key: str) -> None:
    """HTML that kvviz built itself, every text in it escaped where it was built (the token strips, the cache grids),
    drawn where st.html would draw it, by a component that sets it as it is: st.html passes each redraw through the
    browser's sanitizer (DOMPurify) and leaves its parsed copies for the collector: a decode Step's redraw on
    SmolLM2 took 10–20 ms more of Chromium's script and left 14,000–23,000 DOM nodes more (docs/measurements.md).
    Never for text from outside that was not escaped."""
    global _own_html_component
    if _own_html_component is None:
        _own_html_component = st.components.v2.component("kvviz_own_html", js=_OWN_HTML_JS, isolate_styles=False)
    # In a one-item list, as the stepper's data: a plain string would do, but one way for every component here.
    _own_html_component(key=key, data=[body], width="stretch")
