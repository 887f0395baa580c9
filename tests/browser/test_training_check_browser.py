"""Training · Prefill · Decode and Check in a real browser: Korean, lecture mode, toolbar, no errors."""
import re

import pytest
from playwright.sync_api import expect

from tests.browser.harness import wait_idle

TRAINING = "Training_Prefill_Decode"
CHECK = "Check"
# Opened directly at a page's URL, Streamlit's frontend first probes <page>/_stcore/... for a base path (404).
expect.set_options(timeout=30_000)  # a model runs on every rerun; the test machine's CPUs are shared
BASE_PATH_PROBE = re.compile(r"/[^/]+/_stcore/(health|host-config)$")


@pytest.fixture
def bad_responses(page):
    bad = []
    page.on("response", lambda r: r.status >= 400 and not BASE_PATH_PROBE.search(r.url) and bad.append(r.url))
    return bad


def full_shot(page, path) -> None:  # noqa: ANN001
    """Streamlit scrolls inside its own container: a tall viewport captures the whole page."""
    height = page.evaluate("Math.max(...[...document.querySelectorAll('[data-testid=stMain], "
                           "[data-testid=stAppViewContainer], [data-testid=stMainBlockContainer]')]"
                           ".map(e => e.scrollHeight))")
    page.set_viewport_size({"width": 1400, "height": min(max(height, 1000), 6000)})
    wait_idle(page)
    page.wait_for_timeout(500)  # let Plotly redraw at the new size
    page.screenshot(path=path)
    page.set_viewport_size({"width": 1400, "height": 1000})


def no_errors(page, bad_responses) -> None:  # noqa: ANN001 - a Playwright Page
    assert page.locator("[data-testid='stException']").count() == 0
    assert bad_responses == []
    assert [e for e in page.console_errors if "Failed to load resource" not in e] == []


def test_training_page_in_korean(page, shots, bad_responses):
    page.goto_app(TRAINING, "?lang=ko")
    expect(page.get_by_role("heading", name="학습 · 프리필 · 디코드").first).to_be_visible()
    expect(page.get_by_text("부동소수점 반올림 오차 범위에서 동일합니다").first).to_be_visible()
    expect(page.locator(".js-plotly-plot").first).to_be_visible()
    # Plotly's toolbar is always shown, with its PNG download.
    expect(page.get_by_role("button", name="Download plot as a PNG")).to_have_count(7)
    page.get_by_text("양방향, 마스크 없음 (인코더)").click()
    wait_idle(page)
    expect(page.get_by_text("양방향, 마스크 없음 (인코더): 토큰 하나를 덧붙이자").first).to_be_visible()
    assert "attn=bidirectional" in page.url and "lang=ko" in page.url
    full_shot(page, shots / "training_ko.png")
    no_errors(page, bad_responses)


def test_training_page_in_lecture_mode(page, shots, bad_responses):
    page.goto_app(TRAINING, "?lecture=1&idea=3&attn=bidirectional")
    expect(page.get_by_role("heading", name="The condition for reuse: the causal mask")).to_be_visible()
    expect(page.get_by_role("heading", name="Why Q is not cached")).to_have_count(0)  # one idea per screen
    expect(page.locator("[data-testid='stSidebar']")).to_have_attribute("data-collapsed", "true")
    full_shot(page, shots / "training_lecture.png")
    page.get_by_role("radio", name="4", exact=True).click()  # the stepper's numbers (a segmented control)
    wait_idle(page)
    expect(page.get_by_role("heading", name="Why Q is not cached")).to_be_visible()
    assert "idea=4" in page.url
    full_shot(page, shots / "training_lecture_idea3.png")
    no_errors(page, bad_responses)


def test_check_page_in_korean_and_lecture_mode(page, shots, bad_responses):
    page.goto_app(CHECK, "?lang=ko")
    expect(page.get_by_role("heading", name="확인 문제").first).to_be_visible()
    box = page.get_by_label("예상값 (GiB)")
    box.fill("64")
    box.press("Enter")
    reveal = page.get_by_role("button", name="정답 보기").nth(1)
    expect(reveal).to_be_enabled()  # unlocked by the prediction
    reveal.click()
    wait_idle(page)
    expect(page.get_by_text("정답입니다: 64 GiB. 계산기 결과는 64.00 GiB입니다.")).to_be_visible()
    full_shot(page, shots / "check_ko.png")
    no_errors(page, bad_responses)
    page.goto_app(CHECK, "?lecture=1&lang=ko&idea=2")
    expect(page.get_by_text("정답 보기")).to_have_count(1)  # one question per screen
    full_shot(page, shots / "check_lecture_ko.png")
    no_errors(page, bad_responses)
