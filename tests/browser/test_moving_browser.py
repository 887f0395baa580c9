"""Moving the Cache in a real browser (issue 25): nine requests through the tiers, the per-tier costs, the
break-even chart with this machine's points, a kvviz handoff (and llama.cpp's where it is built); the same session
then in Korean. Screenshots of both."""
import pytest
from playwright.sync_api import expect

from kvviz.serving.llamacpp import binary
from tests.browser.harness import settle, wait_idle


@pytest.mark.llama_server(optional=True)  # the llama-server handoff when built; after a build in progress
def test_tiers_break_even_and_handoff(page, shots):
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto_app()
    page.get_by_test_id("stSidebarUserContent").get_by_role("link", name="Moving the Cache").click()
    wait_idle(page)
    expect(page.get_by_role("heading", name="Moving the Cache", exact=True)).to_be_visible()
    page.get_by_role("button", name="Serve the next request").click()
    expect(page.get_by_text("Request 1 (first)")).to_be_visible(timeout=120_000)
    page.get_by_role("button", name="Serve all the rest").click()
    expect(page.get_by_text("All nine requests are served")).to_be_visible(timeout=300_000)
    wait_idle(page)
    expect(page.get_by_text("Request 9 (damaged file)")).to_be_visible()
    page.get_by_role("button", name="Measure the tiers").click()
    expect(page.get_by_text("interleaved runs on cpu")).to_be_visible(timeout=120_000)
    page.get_by_role("button", name="Run with two kvviz workers").click()
    # the chart's own title (its text alternative beside it repeats the name for a screen reader)
    expect(page.locator(".gtitle", has_text="Prefill → decode handoff, measured")).to_be_visible(timeout=300_000)
    if binary() is not None:
        page.get_by_role("button", name="Run with two llama-servers").click()
        expect(page.get_by_text("The llama.cpp file, byte by byte")).to_be_visible(timeout=300_000)
    wait_idle(page)
    settle(page)
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(height + 200, 9000)})
    settle(page)
    page.screenshot(path=shots / "moving_the_cache_en.png", full_page=True)
    page.get_by_test_id("stSidebar").locator("label").filter(has_text="한국어").click()
    expect(page.get_by_role("heading", name="캐시 옮기기", exact=True)).to_be_visible()
    wait_idle(page)
    expect(page.get_by_text("요청 아홉 개를 모두 처리했습니다")).to_be_visible()  # the same session's requests
    settle(page)
    page.screenshot(path=shots / "moving_the_cache_ko.png", full_page=True)
