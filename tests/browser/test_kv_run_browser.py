"""The Serving Engine page in a real browser, subscribed to the KV events of an OpenAI-compatible stand-in whose
prefix cache is vLLM's own KVCacheManager (tests/serving/vllm_standin_server.py), runs a load run against it: the
blocks stored per second under the request timeline, and each request's lookup in a table, in English and Korean.
Six requests share a 16-token system prompt (4 blocks of 4): the first stores it, the five others hit it; a pool of
15 blocks evicts earlier requests' own blocks. Then on a projector (lecture mode, 1280×720): the timeline's screen and
the numbers' screen, with the attribution, each fit the screen."""
import re
import time

import httpx
import pytest
from playwright.sync_api import expect

from kvviz.i18n import t
from tests.browser.harness import LOWEST, goto_idle, next_idea, settle, wait_idle
from tests.serving.standin import INSTALLED, standin_server

pytestmark = pytest.mark.skipif(not INSTALLED, reason="vLLM reference not installed here: run "
                                "scripts/install_vllm_ref.sh")


def _fill(page, label: str, value) -> None:  # noqa: ANN001 - a Playwright page
    box = page.get_by_label(label, exact=True).and_(page.locator("input"))
    box.fill(str(value))
    box.press("Enter")
    wait_idle(page)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_load_run_attributed_in_the_browser(browser, app_url, shots, lang):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(90_000)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    with standin_server(block_size=4, num_blocks=16) as (url, endpoint, replay):
        goto_idle(page, f"{app_url}/Serving_Engine?lang={lang}", 60_000)
        _fill(page, t("serving.url", lang), url)
        page.get_by_role("button", name=t("serving.connect", lang), exact=True).click()
        wait_idle(page)
        page.get_by_role("tab", name=t("kv_events.tab", lang)).click()
        _fill(page, t("kv_events.endpoint", lang), endpoint)
        _fill(page, t("kv_events.replay", lang), replay)
        page.get_by_role("button", name=t("kv_events.subscribe", lang), exact=True).click()
        wait_idle(page)
        # Empty batches until the page says it receives (its numbers drawn, no waiting, silent or unreachable box):
        # ZMQ's PUB reads a new subscription only as it sends, and a run published before that is lost to the page
        # (CI met it once after a fixed ten wakes: "0 of 0 blocks looked up", every request "unknown").
        numbers = page.get_by_text(t("kv_events.m_blocks", lang), exact=True)
        quiet = [page.get_by_text(t(f"kv_events.{k}", lang, endpoint=endpoint)) for k in
                 ("waiting", "silent_page", "unreachable")]
        deadline = time.monotonic() + 60
        while not numbers.count() or any(q.count() for q in quiet):
            assert time.monotonic() < deadline, "no batch reached the page's subscriber"
            httpx.post(f"{url}/standin/wake")
            time.sleep(0.2)
        page.get_by_role("tab", name=t("serving.tab_sweep", lang)).click()
        _fill(page, t("serving.concurrency", lang), "1")
        for key, value in (("requests", 6), ("prompt_tokens", 12), ("max_tokens", 3), ("prefix_len", 16)):
            _fill(page, t(f"serving.{key}", lang), value)
        page.get_by_role("button", name=t("serving.start", lang), exact=True).click()
        done = t("serving.progress_done", lang, done=6, total=6)
        expect(page.get_by_text(done)).to_be_visible(timeout=120_000)
        wait_idle(page)
        settle(page)
        hits = [h["hits"] for h in httpx.get(f"{url}/standin/hits").json()["hits"]]
    assert hits == [0] + [16] * 5
    summary = page.get_by_text(re.compile(re.escape(t("kv_events.run_summary", lang, requests=6, hit=20, lookup=36,
                                                      pct="56%", never=1, evicted=0, diverged=5, reset=0,
                                                      unseeded=0, unknown=0))))
    expect(summary).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0 and not errors
    timeline = page.locator("[data-testid='stPlotlyChart']").filter(has_text=t("kv_events.run_rates_y", lang)).first
    timeline.scroll_into_view_if_needed()
    page.screenshot(path=shots / f"kv_run_timeline_{lang}.png")
    table = page.locator("[data-testid='stDataFrame']").last
    table.scroll_into_view_if_needed()
    page.screenshot(path=shots / f"kv_run_attribution_{lang}.png")
    # on a projector (lecture mode, 1280×720): the timeline's screen, the blocks per second under the requests
    page.set_viewport_size({"width": 1280, "height": 720})
    page.get_by_text(t("lecture.toggle", lang), exact=True).click()
    wait_idle(page)
    next_idea(page, "serving")  # the load's screen, then the timeline's
    page.evaluate("window.scrollTo(0, 0)")
    lowest = page.evaluate(LOWEST)
    page.screenshot(path=shots / f"kv_run_lecture_{lang}.png")
    print(f"\n{lang}: the timeline's screen in lecture mode ends at {lowest:.0f} px")
    assert lowest <= 720 and page.locator("[data-testid='stException']").count() == 0
    for _ in range(2):  # the numbers' screen: the attribution's summary under the points' table
        next_idea(page, "serving")
    expect(page.get_by_text(t("kv_events.run_header", lang).strip("*"))).to_be_visible()
    page.evaluate("window.scrollTo(0, 0)")
    numbers = page.evaluate(LOWEST)
    page.screenshot(path=shots / f"kv_run_lecture_numbers_{lang}.png")
    print(f"{lang}: the numbers' screen in lecture mode ends at {numbers:.0f} px")
    assert numbers <= 720 and page.locator("[data-testid='stException']").count() == 0
    context.close()
