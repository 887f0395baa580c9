"""Home in a real browser: renders, navigation is translated, no exception box or console error."""
from playwright.sync_api import expect


def test_home_renders_in_both_languages(page, shots):
    page.goto_app()
    expect(page.get_by_role("heading", name="kvviz — the KV cache, seen and measured")).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=shots / "home_en.png", full_page=True)
    page.goto_app(query="?lang=ko")
    expect(page.get_by_role("heading", name="kvviz — KV 캐시를 눈으로 보고 측정하기")).to_be_visible()
    expect(page.get_by_role("link", name="홈")).to_be_visible()
    page.screenshot(path=shots / "home_ko.png", full_page=True)
    assert page.console_errors == []
