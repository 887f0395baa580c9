"""Compressing the Cache in a real browser, English and Korean: every method measured on the shipped model's
held-out text, the chart, the strips and the attention row drawn, no errors."""
import pytest
from playwright.sync_api import expect

from tests.browser.harness import settle, wait_idle
from tests.browser.test_training_check_browser import bad_responses, full_shot, no_errors  # noqa: F401 - a fixture

PAGE = "Compressing_the_Cache"
QUERY = "seq=128&tokens=256"  # two short chunks keep a shared CPU's run to seconds


@pytest.mark.parametrize("lang, title, run, heading", [
    ("en", "Compressing the Cache", "Measure all methods", "Memory saved against quality lost"),
    ("ko", "캐시 압축하기", "모든 방법 측정", "절약한 메모리 대 잃은 품질"),
])
def test_compression_page(page, shots, bad_responses, lang, title, run, heading):  # noqa: F811
    page.goto_app(PAGE, f"?lang={lang}&{QUERY}")
    expect(page.get_by_role("heading", name=title).first).to_be_visible()
    page.get_by_role("button", name=run).click()
    # measured a second per tick, the progress and the time left drawn between: done when the results are drawn
    expect(page.get_by_role("heading", name=heading)).to_be_visible(timeout=300_000)
    wait_idle(page, timeout_ms=300_000)
    settle(page)
    expect(page.locator("[data-testid='stPlotlyChart']")).to_have_count(3)
    full_shot(page, shots / f"compression_{lang}.png")
    no_errors(page, bad_responses)
    if lang == "en":  # then the same session in Korean: the quality axis chosen before the switch stays chosen
        page.locator("label").filter(has_text="Top-1 disagreement").first.click()
        wait_idle(page)
        page.get_by_test_id("stSidebar").locator("label").filter(has_text="한국어").click()
        expect(page.get_by_role("heading", name="절약한 메모리 대 잃은 품질")).to_be_visible()
        wait_idle(page)
        settle(page)
        checked = page.locator("[data-testid='stRadio'] input[type=radio]:checked")
        labels = [c.evaluate("e => e.closest('label').innerText") for c in checked.all()]
        assert "Top-1 불일치" in labels  # main showed neither option selected after the switch
        full_shot(page, shots / "compression_switched_ko.png")
        no_errors(page, bad_responses)
