"""A chart for a slide, drawn by Plotly's exporter (kaleido) in the system Chromium: the projector's size, and Korean
drawn in glyphs, not in boxes."""
from __future__ import annotations

import io

import kaleido
import numpy as np
import plotly.graph_objects as go
import pytest
from PIL import Image

from kvviz.charts.base import style
from kvviz.charts.image import PROJECTOR, can_export, figure_image, slide_svg


@pytest.fixture(scope="module", autouse=True)
def one_browser():
    """One Chromium for the module's images (each export would otherwise start its own)."""
    kaleido.start_sync_server(silence_warnings=True)
    yield
    kaleido.stop_sync_server(silence_warnings=True)


def _figure(title: str) -> go.Figure:
    return style(go.Figure(go.Bar(x=["키", "값"], y=[3, 5])), title=title)


def _title_ink(title: str) -> np.ndarray:
    """The PNG's title band (the top 12 % of the image) as grey levels."""
    png = figure_image(_figure(title), "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(png))
    assert image.size == PROJECTOR
    grey = np.asarray(image.convert("L"), dtype=np.int16)
    return grey[: PROJECTOR[1] * 12 // 100]


def test_png_is_the_projector_size_and_korean_is_drawn_in_glyphs():
    assert can_export()
    first, second = _title_ink("가나다라 캐시"), _title_ink("마바사아 캐시")
    for band in (first, second):
        assert (band < 128).sum() > 600  # a title is drawn (dark ink on white)
    # A missing glyph draws the same box for every character: two different Korean titles of the same length would
    # then give the same pixels. Drawn in the CJK font, they differ in shape.
    changed = (np.abs(first - second) > 64).sum()
    assert changed > 300, changed


def test_svg_keeps_the_text_and_the_projector_size():
    svg = figure_image(_figure("캐시 크기 (KV 캐시)"), "svg").decode("utf-8")
    assert svg.startswith("<svg")
    assert f'width="{PROJECTOR[0]}" height="{PROJECTOR[1]}"' in svg
    assert "캐시 크기 (KV 캐시)" in svg and ">키<" in svg
    assert "Noto Sans CJK KR" in svg  # the font the text asks for


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="png, svg"):
        figure_image(_figure("x"), "jpeg")


def test_an_export_that_fails_says_so_in_the_file(monkeypatch):
    """No Chromium the exporter can start: the SVG download says why instead of failing."""
    kaleido.stop_sync_server(silence_warnings=True)
    try:
        monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chromium")
        svg = slide_svg(_figure("캐시"), "이 차트를 그리지 못했습니다.").decode("utf-8")
    finally:
        monkeypatch.delenv("BROWSER_PATH")
        kaleido.start_sync_server(silence_warnings=True)
    assert svg.startswith("<svg") and f'width="{PROJECTOR[0]}"' in svg
    assert "이 차트를 그리지 못했습니다." in svg and "Error" in svg
    assert "<g " not in svg  # no chart in it: the message alone
