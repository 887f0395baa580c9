"""What a screen reader, a keyboard and a Korean voice need on every page (WCAG 2.1 AA), in one small component:

- `page_a11y()` (page_setup calls it): the document's language set to the session's (`<html lang="ko">`: Streamlit's
  page says "en" whatever the app shows), a polite live region kept at the document's end, and each chart drawn by
  widgets.chart() given its name and description (`role="figure"`, `aria-labelledby`, `aria-describedby`) from the
  text alternative drawn beside it (kvviz.charts.alt_text), its SVG hidden from screen readers (the table says it);
- `announce()`: a page's news (a decode Step's new token, positions cached, bytes) said through that live region;
- `shortcuts_on()`: whether kvviz's single-key shortcuts (→ Space P R) are on: the sidebar can turn them off.

A v2 component runs in the page's own document (no iframe), as the decode pages' stepper does: it can set the
document's language and reach the charts. Hidden: its element takes no room (a Step redraws it with the page).
"""
from __future__ import annotations

from functools import cache
from typing import Any

import streamlit as st

from kvviz.app.language import lang
from kvviz.i18n import SR_ONLY

# The component's element and the charts' text alternatives take no room on the page (no gap either).
# Labels wrap onto a second line rather than being cut short (Streamlit ends a long one with "…", and a screen's
# reader of the page then cannot read it whole): buttons, page links, widgets' and metrics' labels, expanders and
# popovers; at 1280×720 Paged Blocks' "+4 sharing the syste…" was cut, in both languages. A segmented control's
# picked option (Reusing Past K/V's tab row) is written in the theme's red on its pale tint, #c53948 on #f9ebed:
# 4.47:1, under AA's 4.5:1 at its 17.5 px (axe-core); #b8303f is 5.1:1 there and 5.9:1 on white.
A11Y_CSS = """<style>
.st-key-kv_a11y, .st-key-kv_announce { display: none !important; }
[data-testid='stMain'] [data-testid^='stBaseButton'] p { white-space: normal; }
[data-testid='stMain'] [data-testid='stPageLink-NavLink'] span { white-space: normal; }
[data-testid='stMain'] :is([data-testid='stWidgetLabel'], [data-testid='stMetricLabel']) * { white-space: normal; }
[data-testid='stMain'] :is(summary, [data-testid='stPopover'] button) :is(p, span) { white-space: normal; }
[data-testid='stMain'] [data-variant='segmented_control'][aria-checked='true'] p { color: #b8303f; }
</style>"""

_A11Y_JS = """
export default function(component) {
  const [data] = component.data;  // one-item list, as the stepper's (kvviz.app.widgets.stepper)
  document.documentElement.lang = data.lang;
  let live = document.getElementById('kv-live');
  if (!live) {  // created once and kept: a screen reader announces changes to a region it already knows
    live = document.createElement('div');
    live.id = 'kv-live';
    live.setAttribute('role', 'status');
    live.setAttribute('aria-live', 'polite');
    live.setAttribute('style', data.sr_only);
    document.body.appendChild(live);
  }
  if (data.say != null && data.say !== live.dataset.said) {
    live.dataset.said = data.say;
    live.textContent = data.say;
  }
  if (!data.charts) return;
  // Each chart's text alternative (charts.alt_text) names and describes the Plotly chart drawn just before it.
  const label = () => {
    for (const alt of document.querySelectorAll('.kv-chart-alt[data-chart]')) {
      const box = alt.closest("[data-testid='stVerticalBlock']");
      const fig = box && box.querySelector("[data-testid='stPlotlyChart']");
      if (!fig) continue;
      const id = alt.dataset.chart;
      if (fig.getAttribute('aria-labelledby') !== id + '-name') {
        fig.setAttribute('role', 'figure');
        fig.setAttribute('aria-labelledby', id + '-name');
        fig.setAttribute('aria-describedby', id + '-summary');
      }
      const svgs = fig.querySelectorAll('svg.main-svg:not([aria-hidden])');
      for (const svg of svgs) svg.setAttribute('aria-hidden', 'true');
    }
  };
  label();
  if (!window.__kvA11yObserver) {
    window.__kvA11yObserver = new MutationObserver(() => {
      clearTimeout(window.__kvA11yTimer);
      window.__kvA11yTimer = setTimeout(label, 50);
    });
    window.__kvA11yObserver.observe(document.body, { childList: true, subtree: true });
  }
}
"""


@cache
def _component() -> Any:
    return st.components.v2.component("kvviz_a11y", js=_A11Y_JS)


def _mount(key: str, say: str | None, charts: bool) -> None:
    data = {"lang": lang(), "say": say, "sr_only": SR_ONLY, "charts": charts}
    _component()(key=key, data=[data], width="content")  # a dict would import pandas (see widgets.stepper)


def page_a11y() -> None:
    """Every page, first: the document's language, the live region, the charts' names (page_setup calls it)."""
    st.html(A11Y_CSS)
    _mount("kv_a11y", None, True)


def announce(text: str) -> None:
    """Say `text` politely to a screen reader (once; the same text again is not repeated): a Step's result."""
    _mount("kv_announce", text, False)


def shortcuts_on() -> bool:
    """Whether kvviz's single-key shortcuts are on (the sidebar's "Single-key shortcuts"; WCAG 2.1.4)."""
    return bool(st.session_state.get("kv_shortcuts", True))
