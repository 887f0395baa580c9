"""Memory Footprint in a real browser: a link's scenario, a preset and a factor changed, screenshots."""

import re

from harness import wait_idle
from playwright.sync_api import expect

PAGE = "Memory_Footprint"


def metric(page, label):
    box = page.locator("[data-testid='stMetric']").filter(has=page.get_by_text(label, exact=True)).first
    return box.locator("[data-testid='stMetricValue']")


def test_memory_page_preset_and_factor(page, shots):
    bad = []
    page.on("response", lambda r: r.status >= 400 and bad.append(r.url))
    page.set_viewport_size({"width": 1400, "height": 2200})  # the app scrolls inside its own container
    page.goto_app(PAGE, "?preset=Llama-2-7B&tokens=4096&batch=32")
    expect(page.get_by_role("heading", name="Memory Footprint").first).to_be_visible()
    expect(metric(page, "All requests")).to_have_text("64.00 GiB")
    page.screenshot(path=shots / "memory_llama2_en.png", full_page=True)

    # change the preset
    page.locator("[data-testid='stSelectbox']").filter(has_text="Model preset").click()
    page.get_by_role("option", name="Llama-3.1-8B").click()
    wait_idle(page)
    expect(page.locator("[data-testid='stMetricValue']").filter(has_text="16.00 GiB").first).to_be_visible()
    # and a factor: the KV dtype
    page.locator("[data-testid='stSelectbox']").filter(has_text="KV cache dtype").click()
    page.get_by_role("option", name="fp8").click()
    wait_idle(page)
    expect(page.locator("[data-testid='stMetricValue']").filter(has_text="8.00 GiB").first).to_be_visible()
    # the URL is rewritten at the end of the rerun: wait for it rather than read it once
    expect(page).to_have_url(re.compile(r"(?=.*kv_dtype=fp8)(?=.*preset=Llama-3\.1-8B)"))
    page.screenshot(path=shots / "memory_llama31_fp8_en.png", full_page=True)

    page.get_by_role("tab", name="Cache vs weights").click()
    page.screenshot(path=shots / "memory_growth_en.png", full_page=True)
    page.get_by_role("tab", name="Capacity planner").click()
    page.screenshot(path=shots / "memory_capacity_en.png", full_page=True)
    page.get_by_role("tab", name="Measured cache").click()
    page.get_by_role("button", name="Run one here").click()
    wait_idle(page)
    page.get_by_role("tab", name="Measured cache").click()
    expect(page.get_by_text("The measured cache bytes equal the formula exactly.")).to_be_visible()
    page.screenshot(path=shots / "memory_live_en.png", full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0

    page.goto_app(PAGE, "?lang=ko&preset=DeepSeek-V3&tokens=32768&batch=8")
    expect(page.get_by_role("heading", name="메모리 사용량").first).to_be_visible()
    page.screenshot(path=shots / "memory_deepseek_ko.png", full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0
    # Streamlit probes /<page>/_stcore/* before its base path when a page URL is opened directly (404s).
    assert [u for u in bad if "/_stcore/" not in u] == []
    assert [e for e in page.console_errors if not e.startswith("Failed to load resource")] == []
