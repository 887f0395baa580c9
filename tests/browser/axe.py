"""axe-core (Deque's rules engine, pinned from npm: .ci/run installs it into build/axe) run in a page that
Playwright drives: the WCAG 2.1 A and AA violations it finds, per rule; and the labels drawn cut short. Shared by
tests/browser/test_a11y_browser.py, test_pages_browser.py and bench/axe_counts.py (which puts this folder on
sys.path)."""
from __future__ import annotations

from pathlib import Path

AXE_VERSION = "4.14.1"
AXE = Path(__file__).resolve().parents[2] / "build" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
WCAG21_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
# axe's run, its violations only: per rule, the elements' count and the first four (selector — what fails)
_RUN = """async (tags) => {
  const r = await axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
  return r.violations.map(v => ({id: v.id, impact: v.impact, count: v.nodes.length,
    nodes: v.nodes.slice(0, 4).map(n => n.target.join(' ') + ' — ' + (n.failureSummary || '').split('\\n')[1])}));
}"""


def violations(page) -> list[dict]:  # noqa: ANN001 - a Playwright Page
    """axe's WCAG 2.1 A/AA violations on the page as drawn now: [{id, impact, count (elements), nodes (first 4)}]."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    return page.evaluate(_RUN, WCAG21_AA)


# Labels Streamlit cut short with "…" (on screen only: a collapsed sidebar's links are drawn off it)
_CUT = """() => Array.from(document.querySelectorAll("[data-testid='stAppViewContainer'] *")).filter(e =>
  e.checkVisibility() && e.getBoundingClientRect().right > 0 && getComputedStyle(e).textOverflow === 'ellipsis'
  && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.trim().slice(0, 60))"""


def cut_labels(page) -> list[str]:  # noqa: ANN001 - a Playwright Page
    """The texts of the labels drawn cut short now (a button's, a metric's: "+4 sharing the syste…")."""
    return page.evaluate(_CUT)


def count(found: list[dict]) -> int:
    """Elements in violation, over all rules (what the per-page tables report)."""
    return sum(v["count"] for v in found)
