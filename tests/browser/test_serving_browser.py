"""The Serving Engine page in a real browser against a real llama-server: a concurrency sweep (screenshots
while it runs and after), the prefix experiment, both languages."""
import re

import pytest
from harness import wait_idle
from playwright.sync_api import expect

from kvviz.engine.export import export_gguf
from kvviz.engine.loading import load_backend
from kvviz.serving.llamacpp import LlamaServer, binary

pytestmark = pytest.mark.skipif(
    binary() is None, reason="llama-server is not built here: run scripts/build_llama_server.sh (.ci/run does)")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    backend = load_backend("tiny", device="cpu")
    gguf = export_gguf(backend.model, backend.tokenizer, tmp_path_factory.mktemp("gguf") / "kvviz-tiny.gguf",
                       name="kvviz-tiny")
    with LlamaServer(gguf, n_parallel=4, ctx_size=2048) as srv:
        yield srv


def _open(page, link: str, query: str = "") -> None:
    page.goto_app(query=query)
    page.get_by_test_id("stSidebarUserContent").get_by_role("link", name=link).click()
    wait_idle(page)


def _fill(page, label, value) -> None:
    box = page.get_by_label(label, exact=True).and_(page.locator("input"))
    box.fill(str(value))
    box.press("Enter")
    wait_idle(page)


def _sweep(page, shots, lang, words):
    _fill(page, words["url"], page.llama_url)
    page.get_by_role("button", name=words["connect"]).click()
    wait_idle(page)
    expect(page.get_by_text(re.compile(words["connected"]))).to_be_visible()
    _fill(page, words["conc"], "1, 2, 4")
    _fill(page, words["requests"], 12)
    _fill(page, words["out"], 64)
    page.get_by_role("button", name=words["start"]).click()
    expect(page.get_by_text(re.compile(words["running"]))).to_be_visible(timeout=60_000)
    expect(page.locator("[data-testid='stPlotlyChart']").first).to_be_visible(timeout=60_000)
    page.screenshot(path=shots / f"serving_sweep_running_{lang}.png", full_page=True)
    expect(page.get_by_text(re.compile(words["done"]))).to_be_visible(timeout=240_000)
    wait_idle(page)
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=shots / f"serving_sweep_done_{lang}.png", full_page=True)
    for i, name in enumerate(("concurrency", "timeline", "metrics")):
        chart = page.locator("[data-testid='stPlotlyChart']:visible").nth(i)
        chart.scroll_into_view_if_needed()
        chart.screenshot(path=shots / f"serving_{name}_{lang}.png")


EN = {"url": "Base URL", "connect": "Connect", "connected": "Connected to .*engine llama.cpp",
      "conc": "Concurrency (comma-separated)", "requests": "Requests per point", "out": "Output tokens",
      "start": "Start sweep", "running": r"Measuring: \d+ of 36 requests", "done": "Done: 36 of 36 requests"}
KO = {"url": "기본 URL", "connect": "연결", "connected": "연결됨: 엔진 llama.cpp",
      "conc": "동시성 (쉼표로 구분)", "requests": "지점당 요청 수", "out": "출력 토큰",
      "start": "스윕 시작", "running": r"측정 중: 요청 36개 중 \d+개", "done": "완료: 요청 36개 중 36개"}


def test_sweep_and_prefix_en(page, shots, llama):
    page.llama_url = llama.base_url
    _open(page, "Serving Engine")
    _sweep(page, shots, "en", EN)
    page.get_by_role("tab", name="Prefix cache").click()
    _fill(page, "Shared prefix (words)", 200)
    page.get_by_role("button", name="Run the prefix experiment").click()
    expect(page.get_by_text(re.compile("the shared prefix saved"))).to_be_visible(timeout=120_000)
    wait_idle(page)
    page.screenshot(path=shots / "serving_prefix_en.png", full_page=True)
    chart = page.locator("[data-testid='stPlotlyChart']:visible").first
    chart.scroll_into_view_if_needed()
    chart.screenshot(path=shots / "serving_prefix_chart_en.png")
    # A server that went away: said clearly, and the measurements already on the page stay.
    _fill(page, "Base URL", "http://127.0.0.1:9")
    page.get_by_role("button", name="Connect").click()
    wait_idle(page)
    expect(page.get_by_text(re.compile("cannot reach http://127.0.0.1:9"))).to_be_visible()
    page.get_by_role("tab", name="Concurrency sweep").click()
    expect(page.get_by_text("Done: 36 of 36 requests")).to_be_visible()
    assert page.locator("[data-testid='stPlotlyChart']:visible").count() >= 3
    page.screenshot(path=shots / "serving_unreachable_keeps_results_en.png", full_page=True)
    assert page.console_errors == []


def test_sweep_ko(page, shots, llama):
    page.llama_url = llama.base_url
    _open(page, "서빙 엔진", "?lang=ko")
    _sweep(page, shots, "ko", KO)
    assert page.console_errors == []
