"""The app's widgets beyond Streamlit's own, the same on every page:

- `persisted()`: a widget whose value survives a switch to another page (seeded from, and saved to, a session key);
- `number_in_range()`: a number box whose range is checked here, so a value outside it is refused with a message
  naming the range while the last valid value stays in use (`number_text()` writes the numbers it names);
- `chart()` and `table()`: a Plotly figure with its toolbar, a table with its CSV download;
- `stepper()`: a Step button that counts every click and the → / Space / R keys, so no click is lost.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from kvviz.app.language import tr

if TYPE_CHECKING:  # pandas alone takes ~0.5-1.6 s to import: not on the path to the first page drawn
    import pandas as pd
    import plotly.graph_objects as go

# Plotly's toolbar always shown, its camera button saving a PNG at twice the screen resolution.
PLOTLY_CONFIG = {"displayModeBar": True, "displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def persisted(widget, key: str, label: str, **kwargs):  # noqa: ANN001, ANN202 - any st widget
    """A widget whose value survives page switches: seeded from and written back to `key`."""
    st.session_state["_w_" + key] = st.session_state[key]

    def save() -> None:
        st.session_state[key] = st.session_state["_w_" + key]

    return widget(label, key="_w_" + key, on_change=save, **kwargs)


def number_text(x: float) -> str:
    """1,000 or 2.5 (never 1e+03 or 1000.0)."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def number_in_range(where: Any, label: str, low: float, high: float, default: float | None, key: str, *,
                    whole: bool = True, **kwargs: Any) -> Any:
    """A number box whose bounds are checked here, not by the widget: a value outside [low, high] is refused with a
    message that names the box and the range, and the last valid value (`default` before any) is used.

    Streamlit's own min/max are left off on purpose: with them the browser keeps an out-of-range entry in the box
    while the app silently goes on with the previous value. An emptied box keeps the last valid value; with
    `default=None` (an optional number, such as a prediction or an unknown memory size) it returns None until a
    valid value is entered. Other keyword arguments go to st.number_input.
    """
    valid_key = f"_valid_{key}"
    valid = st.session_state.get(valid_key, default)
    if valid is not None and not low <= valid <= high:  # the range itself changed (another model): start again
        valid = None if default is None else min(max(default, low), high)
    if valid is not None:
        st.session_state.setdefault(key, int(valid) if whole else float(valid))
    elif key not in st.session_state:
        kwargs["value"] = None  # an optional number starts empty
    kwargs.setdefault("step", 1 if whole else None)
    value = where.number_input(label, key=key, **kwargs)
    if value is None:
        return valid
    if not low <= value <= high or (whole and value != int(value)):
        kept = "" if valid is None else tr("common.out_of_range_kept", kept=number_text(valid))
        where.error(tr("common.out_of_range", name=label, value=number_text(value), low=number_text(low),
                       high=number_text(high), kept=kept))
        return valid
    st.session_state[valid_key] = int(value) if whole else float(value)
    return st.session_state[valid_key]



def chart(fig: go.Figure, key: str) -> None:
    """A Plotly chart with its toolbar on (PNG download named after `key`).

    theme=None: the figure's own layout (charts.base.style: lecture type sizes, room for the toolbar) is what
    shows; Streamlit's theme would override its fonts and margins.
    """
    config = {**PLOTLY_CONFIG, "toImageButtonOptions": {**PLOTLY_CONFIG["toImageButtonOptions"], "filename": key}}
    st.plotly_chart(fig, key=key, config=config, width="stretch", theme=None)


def table(df: pd.DataFrame, key: str, *, prose: bool = False) -> None:
    """A table and a button that downloads it as CSV (UTF-8 with BOM, so spreadsheets read Korean).

    `prose`: cells of sentences, shown as a static table that wraps them instead of a scrolling grid.
    """
    if prose:
        st.table(df, hide_index=True)
    else:
        st.dataframe(df, hide_index=True, width="stretch")
    st.download_button(tr("lecture.download_csv"), df.to_csv(index=False).encode("utf-8-sig"),
                       file_name=f"{key}.csv", mime="text/csv", key=f"{key}_csv")


# ---- a Step button that never loses a click --------------------------------------------------------------
# st.button sends a one-shot trigger: two clicks that reach the server before it picks the first up are
# merged into one (Streamlit coalesces pending triggers), so a fast lecturer loses steps. This button sends
# a running count of its clicks instead; the newest count always wins, and the page advances one token per
# click it has not yet served. It also listens for the → and Space keys (outside text fields) and R, which
# clicks the page's Reset button (Streamlit reserves R for its own shortcuts, so `shortcut="R"` is refused).
_STEPPER_JS = """
export default function(component) {
  const { data, setStateValue, parentElement } = component;
  let btn = parentElement.querySelector('button.kv-step');
  if (!btn) {
    btn = document.createElement('button');
    btn.className = 'kv-step';
    btn.type = 'button';
    parentElement.appendChild(btn);
  }
  btn.textContent = data.label;
  btn.title = data.title;
  btn.disabled = !!data.disabled;
  btn.dataset.served = String(data.base);
  // The count only grows: after a remount (another page and back) it restarts from what the server served.
  const st = parentElement.__kv || (parentElement.__kv = { clicks: 0 });
  if (data.base > st.clicks) st.clicks = data.base;
  const send = () => {
    if (btn.disabled) return;
    st.clicks += 1;
    btn.dataset.clicks = String(st.clicks);
    setStateValue('clicks', st.clicks);
  };
  btn.onclick = send;
  const typing = (el) => el && (el.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName));
  const onKey = (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
    if (e.key === 'ArrowRight' || e.key === ' ') {
      e.preventDefault(); e.stopImmediatePropagation(); send();
    } else if ((e.key === 'r' || e.key === 'R') && data.reset_selector) {
      const reset = document.querySelector(data.reset_selector);
      if (reset && !reset.disabled) { e.preventDefault(); e.stopImmediatePropagation(); reset.click(); }
    }
  };
  if (window.__kvStepKey) window.removeEventListener('keydown', window.__kvStepKey, true);
  window.__kvStepKey = onKey;
  window.addEventListener('keydown', onKey, true);
  return () => {
    if (window.__kvStepKey === onKey) { window.removeEventListener('keydown', onKey, true); window.__kvStepKey = null; }
  };
}
"""
_STEPPER_CSS = """
button.kv-step { font: inherit; font-size: 1rem; line-height: 1.6; padding: 0.25rem 0.75rem; min-height: 2.5rem;
  border-radius: 0.5rem; border: 1px solid rgba(49, 51, 63, 0.2); background: #fff; color: rgb(49, 51, 63);
  cursor: pointer; white-space: nowrap; }
button.kv-step:hover:not(:disabled) { border-color: #ff4b4b; color: #ff4b4b; }
button.kv-step:active:not(:disabled) { background: #ff4b4b; color: #fff; }
button.kv-step:disabled { opacity: 0.45; cursor: not-allowed; }
"""
_stepper_component = None


def _no_callback() -> None:
    """The page reads the click count on its rerun; nothing else to do when it changes."""


def stepper(label: str, *, key: str, served: int, disabled: bool, help: str = "",
            reset_key: str | None = None) -> int:
    """A Step button that returns how many times it was clicked in this session (never fewer than `served`).

    The page serves `clicks - served` steps, one token each, and keeps `served` in its own state.
    """
    global _stepper_component
    if _stepper_component is None:
        _stepper_component = st.components.v2.component("kvviz_stepper", js=_STEPPER_JS, css=_STEPPER_CSS)
    data = {"label": label, "title": help, "disabled": disabled, "base": served,
            "reset_selector": f".st-key-{reset_key} button" if reset_key else None}
    result = _stepper_component(key=key, data=data, default={"clicks": served}, width="content",
                                on_clicks_change=_no_callback)
    clicks = getattr(result, "clicks", None)
    return served if clicks is None else max(int(clicks), 0)
