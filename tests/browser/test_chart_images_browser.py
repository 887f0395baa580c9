"""Charts for slides in a real browser: the toolbar's camera saves a 1920×1080 PNG, the SVG button a server-drawn SVG
with the Korean text in it, and lecture mode's button the screen as a PNG of the window's size."""
from __future__ import annotations

import io
import re

import numpy as np
from PIL import Image
from playwright.sync_api import expect

from tests.browser.harness import settle

PAGE = "Memory_Footprint"
HANGUL = re.compile(r"[\uac00-\ud7a3]")


def _ink(png: bytes) -> float:
    """The share of pixels that are not background white (a blank export has none)."""
    grey = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    return float((grey < 200).mean())


def test_a_korean_chart_saves_as_png_and_svg_for_a_slide(page, shots):
    page.goto_app(PAGE, "?lang=ko")
    chart = page.locator("[data-testid='stPlotlyChart']").first
    chart.hover()
    page.screenshot(path=shots / "chart_with_svg_button_ko.png")
    with page.expect_download(timeout=60_000) as png_download:
        chart.locator(".modebar-btn[data-title='Download plot as a PNG']").click()
    png_file = png_download.value
    png = open(png_file.path(), "rb").read()
    (shots / "chart_export_ko.png").write_bytes(png)
    key = png_file.suggested_filename.removesuffix(".png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(io.BytesIO(png)).size == (1920, 1080)
    assert _ink(png) > 0.01

    # the same chart's SVG, drawn on the server (kaleido in Chromium) when the button is pressed
    with page.expect_download(timeout=120_000) as svg_download:
        page.locator(f".st-key-{key}_svg").get_by_role("button", name="SVG").click()
    assert svg_download.value.suggested_filename == f"{key}.svg"
    svg = open(svg_download.value.path(), encoding="utf-8").read()
    (shots / "chart_export_ko.svg").write_text(svg, encoding="utf-8")
    assert svg.startswith("<svg") and 'width="1920" height="1080"' in svg
    assert len(HANGUL.findall(svg)) > 10  # the title and labels in Korean, as text
    assert page.locator("[data-testid='stException']").count() == 0


def test_lecture_mode_saves_the_screen_as_png(page, shots):
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto_app(PAGE, "?lang=ko&lecture=1&idea=2")  # the screen with the MHA/GQA/MQA/MLA chart
    button = page.get_by_role("button", name="화면을 PNG로 저장")
    expect(button).to_be_visible()
    settle(page)
    shown = page.screenshot()
    with page.expect_download(timeout=120_000) as download:  # ~10 s in the browser on a loaded 2-core machine
        button.click()
    assert download.value.suggested_filename == "kvviz-memory.png"
    png = open(download.value.path(), "rb").read()
    (shots / "lecture_screen_ko.png").write_bytes(png)
    assert Image.open(io.BytesIO(png)).size == (1280, 720)
    assert _ink(png) > 0.02  # text and a chart, not a blank frame
    # What the screen shows (Chromium's own screenshot): the same picture, bar the button itself and anti-aliasing.
    saved, screen = (np.asarray(Image.open(io.BytesIO(b)).convert("L"), dtype=np.int16) for b in (png, shown))
    differ = float((np.abs(saved - screen) > 64).mean())
    print(f"lecture screen PNG: {differ:.2%} of pixels differ from Chromium's screenshot")
    assert differ < 0.03, differ
    assert page.locator("button.kv-shot").get_attribute("data-state") == "saved"

    # A capture the browser cannot draw says so on the button, and the page stays as it was.
    page.evaluate("() => { globalThis.htmlToImage.toPng = () => Promise.reject(new Error('no canvas')); }")
    button.click()
    expect(page.locator("button.kv-shot")).to_have_text("브라우저가 화면을 이미지로 그리지 못했습니다: no canvas")
    assert page.locator("button.kv-shot").get_attribute("data-state") == "failed"
    assert page.locator("[data-testid='stException']").count() == 0
