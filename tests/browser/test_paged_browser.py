"""Paged Blocks & Prefix Sharing in a real browser: four requests share a system prompt, one is preempted when
the pool runs short; the same session then switches to Korean. Screenshots of both."""
import re

import pytest
from playwright.sync_api import expect

from tests.browser.harness import app_server, settle, wait_idle


@pytest.fixture(scope="module")
def app_url():
    with app_server(env={"OMP_NUM_THREADS": "1"}) as url:
        yield url


def _metric(page, label: str) -> str:
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue").inner_text()


def _value(page, label: str):  # noqa: ANN202 - a Playwright Locator
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue")


def _click(page, name: str, metric: str, after: str) -> None:
    """Click, then wait for the metric the click changes (a bare idle wait can return before the rerun starts)."""
    page.get_by_role("button", name=name, exact=True).click()
    expect(_value(page, metric)).to_have_text(after, timeout=60_000)
    wait_idle(page)


def _step(page) -> None:
    n = int(_value(page, "Scheduler step").inner_text())
    _click(page, "Step", "Scheduler step", str(n + 1))


def test_shared_prefix_and_preemption(page, shots):
    page.set_viewport_size({"width": 1400, "height": 3400})  # the whole page in one shot (it scrolls inside)
    page.goto_app()
    page.get_by_test_id("stSidebarUserContent").get_by_role("link", name="Paged Blocks & Prefix Sharing").click()
    wait_idle(page)
    expect(page.get_by_role("heading", name="Paged Blocks & Prefix Sharing")).to_be_visible()
    expect(page.get_by_role("spinbutton", name="Pool size (blocks)")).to_have_value("20")
    _click(page, "+4 sharing the system prompt", "Running / waiting / done", "0 / 4 / 0")  # all arrive now
    _click(page, "+1 without it", "Running / waiting / done", "0 / 5 / 0")
    _step(page)  # one step admits all five: R1..R3 hit R0's system-prompt blocks, hashed at allocation
    assert _metric(page, "Running / waiting / done") == "5 / 0 / 0"
    assert _metric(page, "Prefix hit rate") == f"{3 * 48 / (4 * 68 + 20):.0%}"
    settle(page)
    page.screenshot(path=shots / "paged_same_step_en.png", full_page=True)
    for _ in range(3):
        _step(page)
    _click(page, "+1 with system prompt", "Running / waiting / done", "5 / 1 / 0")
    for _ in range(30):  # the pool of 20 blocks runs short as the six requests grow: the newest is preempted
        if _metric(page, "Preemptions") != "0":
            break
        _step(page)
    assert _metric(page, "Preemptions") == "1"
    expect(page.get_by_text(re.compile(r"R[0-3] · system \+ own · running")).first).to_be_visible()
    hover_text = page.locator("[data-testid='stPlotlyChart']").first.inner_text()
    assert "shared by 4+" in hover_text  # the legend: four requests point at the system prompt's blocks
    settle(page)
    page.screenshot(path=shots / "paged_blocks_en.png", full_page=True)
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.locator("label").filter(has_text="한국어").click()  # the same session: the same pool, in Korean
    expect(page.get_by_role("heading", name="페이지 블록과 프리픽스 공유")).to_be_visible()
    wait_idle(page)
    assert _metric(page, "선점 횟수") == "1"
    settle(page)
    page.screenshot(path=shots / "paged_blocks_ko.png", full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.console_errors == []


def test_finished_requests_show_released_blocks(page, shots):
    """Finished requests' rows show their released blocks (no physical ids, which others may hold by then)."""
    page.set_viewport_size({"width": 1400, "height": 3400})
    page.goto_app("Paged_Blocks", "?lang=ko")
    wait_idle(page)
    page.get_by_role("spinbutton", name="요청당 새 토큰 수").fill("3")
    page.keyboard.press("Enter")
    page.wait_for_timeout(1000)  # the rerun the new value starts, before waiting for it to end
    wait_idle(page)
    _click(page, "+4 시스템 프롬프트 공유", "실행 / 대기 / 완료", "0 / 4 / 0")
    for n in range(3):
        _click(page, "한 단계", "스케줄러 단계", str(n + 1))
    assert _metric(page, "실행 / 대기 / 완료") == "0 / 0 / 4"
    _click(page, "+1 포함 안 함", "실행 / 대기 / 완료", "0 / 1 / 4")
    _click(page, "한 단계", "스케줄러 단계", "4")  # R4 takes blocks the four released
    tables = page.locator("[data-testid='stPlotlyChart']").first
    expect(tables.get_by_text("해제됨").first).to_be_visible()
    settle(page)
    page.screenshot(path=shots / "paged_finished_ko.png", full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0


def test_play_steps_until_paused(page):
    page.goto_app()
    page.get_by_test_id("stSidebarUserContent").get_by_role("link", name="Paged Blocks & Prefix Sharing").click()
    wait_idle(page)
    _click(page, "+4 sharing the system prompt", "Running / waiting / done", "0 / 4 / 0")
    page.get_by_role("button", name="Play", exact=True).click()
    # The fragment ticks on its own: the step counter climbs with no further click.
    expect(page.get_by_test_id("stMetric").filter(has_text="Scheduler step").get_by_test_id("stMetricValue")
           ).to_have_text(re.compile(r"^([4-9]|\d\d+)$"), timeout=90_000)
    page.get_by_role("button", name="Pause", exact=True).click()
    wait_idle(page)
    expect(page.get_by_role("button", name="Play", exact=True)).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0
