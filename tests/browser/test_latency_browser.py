"""Prefill & Decode and Latency & Capacity in a real browser: a streamed request, a sweep, the roofline."""
import re

import pytest
from playwright.sync_api import expect

from tests.browser.harness import app_server, goto_idle, wait_idle


@pytest.fixture(scope="module")
def app_url():
    # One torch thread: on a shared, oversubscribed CPU two spinning threads time out these sweeps.
    with app_server(env={"OMP_NUM_THREADS": "1"}) as url:
        yield url


def _open(page, link: str, query: str = "") -> None:
    # Through the sidebar: loading a page's URL directly makes Streamlit probe _stcore under it (404s).
    page.goto_app(query=query)
    page.get_by_test_id("stSidebarUserContent").get_by_role("link", name=link).click()
    wait_idle(page)


def _chart_shot(page, index: int, path) -> None:
    """The page scrolls inside Streamlit's main block, so a full-page shot stops at the fold: shoot the chart."""
    chart = page.locator("[data-testid='stPlotlyChart']:visible").nth(index)
    chart.scroll_into_view_if_needed()
    chart.screenshot(path=path)


def _set_number(page, label: str, value: int) -> None:
    box = page.get_by_role("spinbutton", name=label, exact=True)
    box.fill(str(value))
    box.press("Enter")
    wait_idle(page)


def test_prefill_decode_streams(page, shots):
    _open(page, "Prefill & Decode")
    expect(page.get_by_role("heading", name="Prefill & Decode")).to_be_visible()
    _set_number(page, "Prompt length (tokens)", 256)
    _set_number(page, "New tokens N", 32)
    _set_number(page, "Runs", 3)
    page.get_by_role("button", name="Run request").click()
    done = page.get_by_text("32 / 32 tokens generated after a 256-token prompt, 3 runs")
    expect(done).to_be_visible(timeout=180_000)
    wait_idle(page)
    expect(page.get_by_role("button", name="Run request")).to_be_enabled()
    assert page.locator("[data-testid='stException']").count() == 0
    expect(page.get_by_text("T = TTFT + (32 − 1)·mean TPOT")).to_be_visible()
    page.get_by_role("button", name="Check noise").click()
    wait_idle(page)
    expect(page.get_by_text(re.compile(r"Machine now: (quiet|busy|noisy) — 30 identical passes"))).to_be_visible()
    # a number out of range is refused, with its range (issue 19.7)
    _set_number(page, "New tokens N", 100000)
    expect(page.get_by_text(re.compile(r"100,000 is outside the allowed range 1 … [\d,]+, so it was not used\. "
                                       r"The previous value, 32, stays\."))).to_be_visible()
    _set_number(page, "New tokens N", 32)
    page.screenshot(path=shots / "prefill_decode_en.png", full_page=True)
    _chart_shot(page, 0, shots / "prefill_decode_timeline_en.png")
    _open(page, "프리필과 디코드", "?lang=ko")
    expect(page.get_by_role("heading", name="프리필과 디코드")).to_be_visible()
    page.get_by_role("button", name="요청 실행").click()
    expect(page.get_by_text(re.compile(r"\d+ / \d+개 토큰 생성, 실행 3회"))).to_be_visible(timeout=180_000)
    wait_idle(page)
    page.screenshot(path=shots / "prefill_decode_ko.png", full_page=True)
    _chart_shot(page, 0, shots / "prefill_decode_timeline_ko.png")
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.console_errors == []


def test_cancel_and_edits_during_a_sweep_keep_the_rows(page, shots):
    """Issue 19.1: Cancel, or editing a widget, mid-sweep replaced the page with 'generator already executing'."""
    _open(page, "Latency & Capacity")
    page.get_by_role("tab", name="Cache vs no cache").click()
    contexts = page.get_by_label(re.compile("Context lengths"))
    runs = 6 * 2 * len(range(8, 2000, 12))  # enough work that the sweep is still running when Cancel comes
    contexts.fill(", ".join(str(n) for n in range(8, 2000, 12)))
    contexts.press("Enter")
    wait_idle(page)
    panel = page.get_by_role("tabpanel")
    panel.get_by_role("button", name="Start sweep").click()
    expect(panel.get_by_text(re.compile(rf"Measuring… [1-9]\d* / {runs} runs"))).to_be_visible(timeout=60_000)
    # and it moves on while the sweep runs (drawn after the measuring, the bar stood at 0 until the end)
    first = int(re.search(r"Measuring… (\d+)", panel.inner_text()).group(1))
    expect(panel.get_by_text(re.compile(rf"Measuring… (?!{first} )\d+ / {runs} runs"))).to_be_visible(timeout=30_000)
    page.get_by_role("tab", name="Prompt length").click()  # a widget edit mid-sweep (another tab's input)
    lengths = page.get_by_label(re.compile("Prompt lengths"))
    lengths.fill("16, 32")
    lengths.press("Enter")
    page.wait_for_timeout(1500)
    assert page.locator("[data-testid='stException']").count() == 0
    page.get_by_role("tab", name="Cache vs no cache").click()
    panel.get_by_role("button", name="Cancel").click()
    cancelled = re.compile(rf"Cancelled after \d+ of {runs} runs")
    expect(panel.get_by_text(cancelled)).to_be_visible(timeout=60_000)
    wait_idle(page)
    assert page.locator("[data-testid='stException']").count() == 0
    expect(panel.get_by_text("generator already executing")).to_have_count(0)
    page.screenshot(path=shots / "latency_cancelled_en.png", full_page=True)


def test_latency_sweeps_and_roofline(page, shots):
    _open(page, "Latency & Capacity")
    expect(page.get_by_role("heading", name="Latency & Capacity")).to_be_visible()
    lengths = page.get_by_label(re.compile("Prompt lengths"))
    expect(lengths).to_be_visible(timeout=90_000)
    lengths.fill("16, 64, 128, 256")  # within the shipped model's 512-token context
    lengths.press("Enter")
    wait_idle(page)
    page.get_by_role("tabpanel").get_by_role("button", name="Start sweep").click()
    expect(page.get_by_text("Done: 4 settings, 24 runs")).to_be_visible(timeout=240_000)
    wait_idle(page)
    expect(page.get_by_text(re.compile("Fitted to all 20 runs"))).to_be_visible()
    page.screenshot(path=shots / "latency_prompt_sweep_en.png", full_page=True)
    _chart_shot(page, 0, shots / "latency_prompt_chart_en.png")

    page.get_by_role("tab", name="Cache vs no cache").click()
    contexts = page.get_by_label(re.compile("Context lengths"))
    contexts.fill("8, 64, 256")
    contexts.press("Enter")
    wait_idle(page)
    page.get_by_role("tabpanel").get_by_role("button", name="Start sweep").click()
    expect(page.get_by_text("Done: 6 settings, 36 runs")).to_be_visible(timeout=180_000)
    wait_idle(page)
    page.screenshot(path=shots / "latency_cache_sweep_en.png", full_page=True)
    _chart_shot(page, 0, shots / "latency_cache_chart_en.png")

    for tab, done, name in (("Batch size", "4 settings, 16 runs", "batch"), ("dtype", "3 settings, 3 runs", "dtype")):
        page.get_by_role("tab", name=tab, exact=True).click()
        if name == "batch":
            batches = page.get_by_label("Batch sizes (comma-separated)")
            batches.fill("1, 2, 4, 8")
            batches.press("Enter")
            wait_idle(page)
        page.get_by_role("tabpanel").get_by_role("button", name="Start sweep").click()
        expect(page.get_by_role("tabpanel").get_by_text(f"Done: {done}")).to_be_visible(timeout=180_000)
        wait_idle(page)
        _chart_shot(page, 0, shots / f"latency_{name}_chart_en.png")

    page.get_by_role("tab", name="Roofline & capacity").click()
    page.screenshot(path=shots / "latency_roofline_en.png", full_page=True)
    _chart_shot(page, 0, shots / "latency_roofline_chart_en.png")
    _chart_shot(page, 1, shots / "latency_kv_weights_chart_en.png")
    assert page.locator("[data-testid='stException']").count() == 0
    _open(page, "지연 시간과 처리 용량", "?lang=ko")
    expect(page.get_by_role("heading", name="지연 시간과 처리 용량")).to_be_visible()
    page.get_by_role("tab", name="루프라인과 용량").click()
    page.screenshot(path=shots / "latency_roofline_ko.png", full_page=True)
    _chart_shot(page, 0, shots / "latency_roofline_chart_ko.png")
    page.get_by_role("tab", name="프롬프트 길이").click()
    page.get_by_role("tabpanel").get_by_role("button", name="스윕 시작").click()
    expect(page.get_by_text(re.compile(r"완료: 설정 \d+개, 실행 \d+회"))).to_be_visible(timeout=240_000)
    wait_idle(page)
    page.screenshot(path=shots / "latency_prompt_sweep_ko.png", full_page=True)
    _chart_shot(page, 0, shots / "latency_prompt_chart_ko.png")
    assert page.console_errors == []


def test_roofline_in_lecture_mode(browser, app_url, shots):
    """Lecture mode at 1280×720: the roofline's legend stays clear of its axis title (issue 19.20)."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    # the sidebar is collapsed in lecture mode; idea 6 of the stepper is the bound against the batch
    goto_idle(page, f"{app_url}/Latency_and_Capacity?lecture=1&idea=6", 90_000)
    page.wait_for_timeout(1000)
    _chart_shot(page, 0, shots / "latency_roofline_chart_lecture.png")
    context.close()
