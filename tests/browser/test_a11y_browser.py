"""Issue 51, in the system Chromium: WCAG 2.1 A/AA on every page by axe-core (pinned from npm, tests/browser/axe.py)
in English and Korean, in both modes, where the other browser tests already open each page (normal mode:
test_pages_browser.py at 1280×720; lecture mode: test_tour_browser.py's lecture screens, Reusing Past K/V after
Prefill and ten Steps), and here Reusing Past K/V after its main action (Prefill, three Steps); the
document's language is the session's; every chart a visible tab draws has an accessible name and a text alternative
from its data, the cache grid and token strip are said in order, each Step is announced in a polite live region;
the single-key shortcuts can be turned off. axe's findings are printed with the page (pytest -s)."""

import pytest
from playwright.sync_api import expect

from kvviz.i18n import t
from tests.browser.axe import AXE, cut_labels, violations
from tests.browser.harness import TOKENS_JS, settle, wait_idle

if not AXE.exists():
    pytest.skip("axe-core is not installed: npm install --prefix build/axe axe-core (.ci/run does)",
                allow_module_level=True)

PROJECTOR = {"width": 1280, "height": 720}  # the size the layout is made for: no label may be cut there either
# Every Plotly chart on the page: its accessible name and description, read through aria-labelledby/-describedby,
# and the rows of the data table beside it.
CHARTS = """() => Array.from(document.querySelectorAll("[data-testid='stPlotlyChart']"))
  .filter(c => c.checkVisibility()).map(c => {
    const text = (id) => { const e = id && document.getElementById(id); return e ? e.textContent.trim() : ''; };
    const alt = document.querySelector(`.kv-chart-alt[data-chart='${(c.getAttribute('aria-labelledby') || '')
      .replace(/-name$/, '')}']`);
    return {role: c.getAttribute('role'), name: text(c.getAttribute('aria-labelledby')),
            summary: text(c.getAttribute('aria-describedby')),
            title: (c.querySelector('.js-plotly-plot').layout.title || {}).text || '',
            rows: alt ? alt.querySelectorAll('tbody tr').length : 0,
            svg_hidden: Array.from(c.querySelectorAll('svg.main-svg')).every(s => s.getAttribute('aria-hidden'))};
  })"""


def _prefill_and_step(page, steps: int = 3) -> None:  # noqa: ANN001 - a Playwright Page
    """Reusing Past K/V's main action: Prefill, then `steps` Steps, each waited for in the strip."""
    page.locator(".st-key-reuse_btn_prefill button").click()
    page.wait_for_function(f"({TOKENS_JS}) > 0", timeout=90_000)
    for _ in range(steps):
        before = page.evaluate(TOKENS_JS)
        page.locator("button.kv-step").click()
        page.wait_for_function(f"({TOKENS_JS}) > {before}", timeout=60_000)
    wait_idle(page)
    settle(page)


def test_document_language_follows_the_session(page):
    """<html lang> is the session's language: from the link, and switched in the sidebar with no reload."""
    page.goto_app("Memory_Footprint", "?lang=ko")
    assert page.evaluate("document.documentElement.lang") == "ko"
    page.get_by_test_id("stSidebarUserContent").get_by_text("English", exact=True).click()
    page.wait_for_function("document.documentElement.lang === 'en'")
    wait_idle(page)
    page.get_by_test_id("stSidebarUserContent").get_by_text("한국어", exact=True).click()
    page.wait_for_function("document.documentElement.lang === 'ko'")


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_decode_page_is_read_by_a_screen_reader(page, shots, lang):
    """After Prefill and three Steps: no axe violation; the live region says the last pass; the strip and the grid are
    said in order;
    every chart of the bytes, K/V and attention tabs has its title as its name, a summary and its data's rows."""
    page.set_default_timeout(90_000)
    page.set_viewport_size(PROJECTOR)
    page.goto_app("Reusing_Past_KV", f"?lang={lang}")
    _prefill_and_step(page)
    found = violations(page)  # the page after its main action (test_pages_browser.py checks it as it opens)
    assert found == [] and cut_labels(page) == [], found
    expect(page.locator("#kv-live")).to_have_attribute("aria-live", "polite")
    expect(page.locator("#kv-live")).to_contain_text(t("reuse.announce", lang, n_steps=3, token="", n_cached=0,
                                                       bytes="").split("“")[0].strip())
    grid = page.locator(".kv-grid-text li")
    assert grid.count() >= 1 and t("reuse.legend_prefill", lang) in grid.first.inner_text()
    strip = page.get_by_text(t("reuse.said_prompt", lang) + ":", exact=False)
    assert strip.count() >= 1
    # What a screen reader reads, saved per tab: the strip and the cache grid, the bytes chart, the attention row
    said = [f"# {t('reuse.tab_growth', lang)}", page.locator("[data-testid='stMain']").aria_snapshot()]
    seen = {}
    for tab in ("bytes", "values", "attention"):
        picked = page.get_by_role("radiogroup", name=t("reuse.tab_pick", lang)).get_by_role(
            "radio", name=t(f"reuse.tab_{tab}", lang))  # the tab row, named, says which tab is picked
        picked.click()
        page.wait_for_timeout(300)
        wait_idle(page)
        expect(picked).to_be_checked()
        settle(page)
        page.wait_for_function("""() => Array.from(document.querySelectorAll("[data-testid='stPlotlyChart']"))
            .filter(c => c.checkVisibility()).every(c => c.getAttribute('aria-labelledby'))""")
        charts = page.evaluate(CHARTS)
        assert charts, tab
        for c in charts:
            assert c["role"] == "figure" and c["name"] and c["summary"] and c["rows"] > 0 and c["svg_hidden"], c
            assert c["name"] == " ".join(c["title"].replace("<br>", " ").split()), c
        seen[tab] = charts[0]
        said += [f"# {t(f'reuse.tab_{tab}', lang)}", page.locator("[data-testid='stMain']").aria_snapshot()]
    bytes_summary = seen["bytes"]["summary"]
    assert t("reuse.bytes_equal", lang) in bytes_summary, bytes_summary  # live == formula on the native decoder
    assert "%" in seen["attention"]["summary"]
    (shots / f"aria-reuse_{lang}.yaml").write_text("\n".join(said))
    page.screenshot(path=shots / f"a11y-reuse-attention_{lang}.png")


def test_single_key_shortcuts_can_be_turned_off(page):
    """WCAG 2.1.4: with the sidebar's switch off, → does not step; on again, it does."""
    page.set_default_timeout(90_000)
    page.goto_app("Reusing_Past_KV")
    page.locator(".st-key-reuse_btn_prefill button").click()
    page.wait_for_function(f"({TOKENS_JS}) > 0")
    wait_idle(page)
    switch = page.get_by_test_id("stSidebarUserContent").get_by_text(t("a11y.shortcuts", "en"))
    switch.click()
    # the stepper's code given the rerun's settings (a loaded browser can apply them after the script is idle)
    page.wait_for_selector("button.kv-step[data-shortcuts='off']")
    wait_idle(page)
    before = page.evaluate(TOKENS_JS)
    page.locator("h1").first.click()  # focus outside any text field
    page.keyboard.press("ArrowRight")
    page.wait_for_timeout(1500)
    wait_idle(page)
    assert page.evaluate(TOKENS_JS) == before
    switch.click()
    page.wait_for_selector("button.kv-step[data-shortcuts='on']")
    wait_idle(page)
    page.locator("h1").first.click()  # focus outside any text field
    page.keyboard.press("ArrowRight")
    page.wait_for_function(f"({TOKENS_JS}) > {before}")
