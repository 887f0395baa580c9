"""The Serving Engine page in a real browser against a real llama-server: a closed-loop sweep (screenshots while
it runs and after), an open-loop run at three request rates with goodput, the prefix experiment, both languages.
The page only reads what its worker process measures; the numbers it offers for download are checked against
the server's own clock (llama.cpp's per-request timings)."""
import json
import re

from playwright.sync_api import expect

from tests.browser.harness import settle, wait_idle


def _open(page, link: str, query: str = "") -> None:
    page.goto_app(query=query)
    page.get_by_test_id("stSidebarUserContent").get_by_role("link", name=link).click()
    wait_idle(page)


def _fill(page, label, value) -> None:
    box = page.get_by_label(label, exact=True).and_(page.locator("input"))
    box.fill(str(value))
    box.press("Enter")
    wait_idle(page)


def _connect(page, words, url) -> None:
    _fill(page, words["url"], url)
    page.get_by_role("button", name=words["connect"], exact=True).click()
    wait_idle(page)
    expect(page.get_by_text(re.compile(words["connected"]))).to_be_visible()


def _sweep(page, shots, lang, words):
    _fill(page, words["conc"], "1, 2, 4")
    _fill(page, words["requests"], 6)
    _fill(page, words["out"], 16)
    page.get_by_role("button", name=words["start"], exact=True).click()
    running = page.get_by_text(re.compile(words["running"]))
    expect(running.or_(page.get_by_text(re.compile(words["done"])))).to_be_visible(timeout=60_000)
    if running.is_visible():  # the tiny model can finish before a loaded machine draws the running state
        expect(page.get_by_text(words["quiet"])).to_be_visible()  # nothing drawn while it measures
        assert page.locator("[data-testid='stPlotlyChart']:visible").count() == 0
        running.scroll_into_view_if_needed()
        page.screenshot(path=shots / f"serving_sweep_running_{lang}.png", full_page=True)
    expect(page.get_by_text(re.compile(words["done"]))).to_be_visible(timeout=600_000)
    wait_idle(page)
    settle(page)
    assert page.locator("[data-testid='stException']").count() == 0
    expect(page.get_by_role("button", name=words["start"], exact=True)).to_be_enabled()  # the buttons flipped back
    page.get_by_text(re.compile(words["done"])).scroll_into_view_if_needed()
    page.screenshot(path=shots / f"serving_sweep_done_{lang}.png", full_page=True)
    for i, name in enumerate(("load", "timeline", "metrics")):
        chart = page.locator("[data-testid='stPlotlyChart']:visible").nth(i)
        chart.scroll_into_view_if_needed()
        chart.screenshot(path=shots / f"serving_{name}_{lang}.png")


EN = {"url": "Base URL", "connect": "Connect", "connected": "Connected to .*engine llama.cpp",
      "conc": "Concurrency (comma-separated)", "requests": "Requests per point", "out": "Output tokens",
      "start": "Start", "running": r"Measuring: \d+ of 18 requests",
      "quiet": re.compile("The results are drawn when the run ends"), "done": "Done: 18 of 18 requests"}
KO = {"url": "기본 URL", "connect": "연결", "connected": "연결됨: 엔진 llama.cpp",
      "conc": "동시성 (쉼표로 구분)", "requests": "지점당 요청 수", "out": "출력 토큰",
      "start": "시작", "running": r"측정 중: 요청 18개 중 \d+개",
      "quiet": re.compile("결과는 실행이 끝나면 그립니다"), "done": "완료: 요청 18개 중 18개"}


def test_sweep_and_prefix_en(page, shots, llama):
    _open(page, "Serving Engine")
    _connect(page, EN, llama.base_url)
    _sweep(page, shots, "en", EN)
    page.get_by_role("tab", name="Prefix cache").click()
    _fill(page, "Shared prefix (words)", 200)
    page.get_by_role("button", name="Run the prefix experiment").click()
    expect(page.get_by_text(re.compile("The shared prefix saved"))).to_be_visible(timeout=600_000)
    expect(page.get_by_role("button", name="Run the prefix experiment")).to_be_enabled(timeout=600_000)  # all trials
    wait_idle(page)
    settle(page)
    page.get_by_text(re.compile("The shared prefix saved")).scroll_into_view_if_needed()
    page.screenshot(path=shots / "serving_prefix_en.png", full_page=True)
    chart = page.locator("[data-testid='stPlotlyChart']:visible").first
    chart.scroll_into_view_if_needed()
    chart.screenshot(path=shots / "serving_prefix_chart_en.png")
    # A server that went away: said clearly, and the measurements already on the page stay.
    _fill(page, "Base URL", "http://127.0.0.1:9")
    page.get_by_role("button", name="Connect", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text(re.compile("cannot reach http://127.0.0.1:9"))).to_be_visible()
    page.get_by_role("tab", name="Load sweep").click()
    expect(page.get_by_text("Done: 18 of 18 requests")).to_be_visible()
    assert page.locator("[data-testid='stPlotlyChart']:visible").count() >= 3
    page.screenshot(path=shots / "serving_unreachable_keeps_results_en.png", full_page=True)
    assert page.console_errors == []


def test_open_loop_ko(page, shots, llama):
    _open(page, "서빙 엔진", "?lang=ko")
    _connect(page, KO, llama.base_url)
    page.get_by_text("요청 속도 (열린 루프)").click()
    wait_idle(page)
    _fill(page, "초당 요청 속도 (쉼표로 구분)", "0.5, 1, 2")
    _fill(page, KO["requests"], 6)
    _fill(page, KO["out"], 16)
    _fill(page, "굿풋 SLO: TTFT (ms, 0: 없음)", 2000)
    page.get_by_role("button", name="시작", exact=True).click()
    expect(page.get_by_text(re.compile("완료: 요청 18개 중 18개"))).to_be_visible(timeout=600_000)
    wait_idle(page)
    settle(page)
    assert page.locator("[data-testid='stException']").count() == 0
    page.get_by_text(re.compile("완료: 요청 18개 중 18개")).scroll_into_view_if_needed()
    page.screenshot(path=shots / "serving_open_loop_ko.png", full_page=True)
    chart = page.locator("[data-testid='stPlotlyChart']:visible").first
    chart.scroll_into_view_if_needed()
    chart.screenshot(path=shots / "serving_open_loop_chart_ko.png")
    assert page.console_errors == []


def test_sweep_ko_measures_the_servers_own_time(page, shots, llama):
    """The page's downloaded numbers: at every point its TPOT equals llama.cpp's own clock for the same requests
    within their spread, so drawing the page did not distort the measurement (a client timed in the page's process
    read 5–20× the server's time). Whether the server itself was slower than under serve-bench is another matter:
    bench/serving_page_vs_cli.py shows both."""
    _open(page, "서빙 엔진", "?lang=ko")
    _connect(page, KO, llama.base_url)
    _sweep(page, shots, "ko", KO)
    with page.expect_download() as download:
        page.get_by_role("button", name=re.compile("결과 내려받기")).click()
    points = json.loads(open(download.value.path(), encoding="utf-8").read())
    assert len(points) == 3
    for point in points.values():
        timings = point["kvviz"]["server_timings"]
        assert timings["n_with_server_timings"] == 6 and timings["tpot_agree"] is True, timings
    expect(page.get_by_text(re.compile("클라이언트의 TPOT이 서버 자체의 TPOT과"))).to_be_visible()
    assert page.console_errors == []
