"""Memory Footprint in a real browser: a link's scenario, a preset and a factor changed, screenshots."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.harness import wait_idle

PAGE = "Memory_Footprint"
WAIT = 30_000  # ms: a rerun on a shared 2-core machine can take several seconds


def metric(page, label):
    box = page.locator("[data-testid='stMetric']").filter(has=page.get_by_text(label, exact=True)).first
    return box.locator("[data-testid='stMetricValue']")


def test_memory_page_preset_and_factor(page, shots):
    bad = []
    page.on("response", lambda r: r.status >= 400 and bad.append(r.url))
    page.set_viewport_size({"width": 1400, "height": 2200})  # the app scrolls inside its own container
    page.goto_app(PAGE, "?preset=Llama-2-7B&tokens=4096&batch=32")
    expect(page.get_by_role("heading", name="Memory Footprint").first).to_be_visible(timeout=WAIT)
    expect(metric(page, "All requests")).to_have_text("64.00 GiB", timeout=WAIT)
    page.screenshot(path=shots / "memory_llama2_en.png", full_page=True, timeout=3 * WAIT)

    # change the preset
    page.locator("[data-testid='stSelectbox']").filter(has_text="Model preset").click()
    page.get_by_role("option", name="Llama-3.1-8B").click()
    wait_idle(page)
    expect(page.locator("[data-testid='stMetricValue']").filter(has_text="16.00 GiB").first).to_be_visible(timeout=WAIT)
    # and a factor: the KV dtype
    page.locator("[data-testid='stSelectbox']").filter(has_text="KV cache dtype").click()
    page.get_by_role("option", name="fp8").click()
    wait_idle(page)
    expect(page.locator("[data-testid='stMetricValue']").filter(has_text="8.00 GiB").first).to_be_visible(timeout=WAIT)
    # the URL is rewritten at the end of the rerun: wait for it rather than read it once
    expect(page).to_have_url(re.compile(r"(?=.*kv_dtype=fp8)(?=.*preset=Llama-3\.1-8B)"))
    page.screenshot(path=shots / "memory_llama31_fp8_en.png", full_page=True, timeout=3 * WAIT)

    page.get_by_role("tab", name="Cache vs weights").click()
    page.screenshot(path=shots / "memory_growth_en.png", full_page=True, timeout=3 * WAIT)
    page.get_by_role("tab", name="Capacity planner").click()
    page.screenshot(path=shots / "memory_capacity_en.png", full_page=True, timeout=3 * WAIT)
    page.get_by_role("tab", name="Measured cache").click()
    page.get_by_role("button", name="Run one here").click()
    wait_idle(page)
    page.get_by_role("tab", name="Measured cache").click()
    expect(page.get_by_text("The measured cache bytes equal the formula exactly.")).to_be_visible(timeout=WAIT)
    page.screenshot(path=shots / "memory_live_en.png", full_page=True, timeout=3 * WAIT)
    assert page.locator("[data-testid='stException']").count() == 0

    page.goto_app(PAGE, "?lang=ko&preset=DeepSeek-V3&tokens=32768&batch=8")
    expect(page.get_by_role("heading", name="메모리 사용량").first).to_be_visible(timeout=WAIT)
    page.screenshot(path=shots / "memory_deepseek_ko.png", full_page=True, timeout=3 * WAIT)
    assert page.locator("[data-testid='stException']").count() == 0
    # Streamlit probes /<page>/_stcore/* before its base path when a page URL is opened directly (404s).
    assert [u for u in bad if "/_stcore/" not in u] == []
    assert [e for e in page.console_errors if not e.startswith("Failed to load resource")] == []


def test_config_upload_and_a_bad_one(page, shots, tmp_path):
    import json

    from tests.kv.test_formula import GEMMA2_CONFIG

    good, bad = tmp_path / "config.json", tmp_path / "broken.json"
    good.write_text(json.dumps(GEMMA2_CONFIG))
    bad.write_text("{ this is not json")
    page.set_viewport_size({"width": 1400, "height": 1600})
    page.goto_app(PAGE, "?src=upload&tokens=8192")
    page.locator("[data-testid='stFileUploader'] input[type='file']").set_input_files(str(good))
    expect(metric(page, "Per token (all layers)")).to_have_text("336.00 KiB", timeout=WAIT)
    wait_idle(page)  # the upload's rerun has finished: a file set mid-rerun can be dropped by the uploader
    page.locator("[data-testid='stFileUploader'] input[type='file']").set_input_files(str(bad))
    # The page reads each file with a fresh uploader: this choice is a new upload, not a replace of the first
    # (Streamlit's replace, a DELETE and a PUT, lost the new file in 3 of 5 runs when the two overlapped).
    expect(page.get_by_text("The file is not valid JSON", exact=False)).to_be_visible(timeout=WAIT)
    # the last valid config stays on screen
    expect(metric(page, "Per token (all layers)")).to_have_text("336.00 KiB", timeout=WAIT)
    page.screenshot(path=shots / "memory_upload_bad_en.png", full_page=True, timeout=3 * WAIT)
    assert page.locator("[data-testid='stException']").count() == 0


# SmolLM2-135M's shape (30 layers, 9 heads, 3 KV heads, d_head 64) at llama-server's `-c 4096 -np 2 -ctk q8_0`: two
# streams of 2048 cells, which llama.cpp logs as "size = 47.81 MiB ... K (q8_0): 23.91 MiB"
# (tests/engine/test_llamacpp_kv.py)
SMOLLM2_Q8_0 = "src=custom&layers=30&heads=9&kv_heads=3&d_head=64&params_b=0.135&tokens=2048&batch=2&kv_dtype=q8_0"


@pytest.mark.parametrize("lang, title, all_requests", [("en", "Memory Footprint", "All requests"),
                                                       ("ko", "메모리 사용량", "전체 요청")])
def test_llamacpp_q8_0_sizes_what_llamacpp_logs(page, shots, lang, title, all_requests):
    page.set_viewport_size({"width": 1400, "height": 1800})
    page.goto_app(PAGE, f"?lang={lang}&{SMOLLM2_Q8_0}")
    expect(page.get_by_role("heading", name=title).first).to_be_visible(timeout=WAIT)
    expect(metric(page, all_requests)).to_have_text("47.81 MiB", timeout=WAIT)
    expect(page.get_by_text("q8_0:", exact=False).first).to_be_visible(timeout=WAIT)  # the block's note
    page.screenshot(path=shots / f"issue23b_memory_smollm2_q8_0_{lang}.png", full_page=True, timeout=3 * WAIT)
    assert page.locator("[data-testid='stException']").count() == 0


@pytest.mark.parametrize("lang, tab, fmt, derived", [
    ("en", "Capacity planner", "Weights: MXFP4 experts, from the preset's checkpoint", "is derived, not a count"),
    ("ko", "용량 계획", "가중치: MXFP4 전문가, 출처: 프리셋의 체크포인트", "파생된 값입니다"),
])
def test_planner_weights_format_and_derived_groups(page, shots, lang, tab, fmt, derived):
    """Issue 46: gpt-oss-120b's weights in the MXFP4 its checkpoint ships, where the format came from, and the
    KV-cache groups behind 'GPU KV cache size', labelled as derived."""
    page.set_viewport_size({"width": 1400, "height": 2200})
    page.goto_app(PAGE, f"?lang={lang}&preset=gpt-oss-120b&tokens=131072&gpu=H200&vllm=0.29.0")
    wait_idle(page)
    page.get_by_role("tab", name=tab).click()
    expect(page.get_by_text(fmt, exact=False).first).to_be_visible(timeout=WAIT)
    expect(page.get_by_text(derived, exact=False).first).to_be_visible(timeout=WAIT)
    page.get_by_text(derived, exact=False).first.scroll_into_view_if_needed()
    page.screenshot(path=shots / f"memory_planner_weights_{lang}.png", full_page=False, timeout=3 * WAIT)
    assert page.locator("[data-testid='stException']").count() == 0
