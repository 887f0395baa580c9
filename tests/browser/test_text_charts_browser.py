"""Issue 29 #8, as Chromium draws it: on the decode page, the Work tab's legends sit under their x-axis titles, and
the cached-values heatmap's position labels do not overlap at 13 positions (where they did), at 1400 px and in
lecture mode at 1280×720."""
import pytest
from playwright.sync_api import expect

from tests.browser.harness import TOKENS_JS, wait_charts, wait_idle

# Every drawn chart: its legend's and x-axis title's boxes, and its y tick labels' boxes.
GEOMETRY = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => {
  const box = (e) => { if (!e) return null; const r = e.getBoundingClientRect(); return [r.top, r.bottom]; };
  return {title: g.layout.title ? g.layout.title.text.replace(/<[^>]+>/g, '') : '',
          legend: box(g.querySelector('.legend')), xtitle: box(g.querySelector('.xtitle')),
          yticks: Array.from(g.querySelectorAll('.yaxislayer-above .ytick text')).map(box)}; })"""


def _apart(a, b) -> bool:  # noqa: ANN001 - [top, bottom] boxes
    return a[1] <= b[0] + 0.5 or b[1] <= a[0] + 0.5


@pytest.mark.parametrize("query, size", [("", {"width": 1400, "height": 1000}),
                                         ("?lecture=1", {"width": 1280, "height": 720})], ids=["page", "lecture"])
def test_work_legends_and_value_labels_do_not_overlap(page, shots, query, size):
    page.set_viewport_size(size)
    page.set_default_timeout(90_000)
    page.goto_app("Reusing_Past_KV", query)
    page.locator(".st-key-reuse_btn_prefill button").click()
    page.wait_for_function(f"({TOKENS_JS}) > 0")
    while page.evaluate(TOKENS_JS) < 14:  # 13 positions cached, and the newest token
        before = page.evaluate(TOKENS_JS)
        page.locator("button.kv-step").click()
        page.wait_for_function(f"({TOKENS_JS}) > {before}")
    wait_idle(page)
    page.get_by_role("radio", name="Cached K/V values").click()
    wait_idle(page)
    page.wait_for_function("Array.from(document.querySelectorAll('.js-plotly-plot')).some(g => "
                           "g.layout.title && g.layout.title.text.includes('13 positions'))")
    wait_charts(page)
    heatmap = next(c for c in page.evaluate(GEOMETRY) if "13 positions" in c["title"])
    ticks = heatmap["yticks"]
    assert len(ticks) >= 2 and all(_apart(a, b) for a, b in zip(ticks, ticks[1:], strict=False)), ticks
    page.get_by_role("radio", name="Work saved").click()
    wait_idle(page)
    expect(page.locator(".js-plotly-plot")).to_have_count(2)
    wait_charts(page)
    page.screenshot(path=shots / f"work_tab{query.replace('?', '_').replace('=', '-')}.png")
    for chart in page.evaluate(GEOMETRY):
        assert chart["legend"] and _apart(chart["legend"], chart["xtitle"] or [0, 0]), chart
