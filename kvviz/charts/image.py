"""A figure as an image for a slide: PNG or SVG at a projector's size, drawn by Plotly's own exporter (kaleido, which
drives the system Chromium; no network).

The figure is laid out at half the projector's size and drawn at twice its scale, so a 1920×1080 PNG holds the
chart's type twice as large as it is on screen: readable from the back of a room. The SVG has the same layout.
"""
from __future__ import annotations

import os
import shutil
from functools import cache
from html import escape
from importlib.util import find_spec

import plotly.graph_objects as go

from kvviz.charts.base import FONT_FAMILY

PROJECTOR = (1920, 1080)  # px of a full-HD projector (16:9)
SCALE = 2  # layout px → image px
FORMATS = {"png": "image/png", "svg": "image/svg+xml"}
# The names choreographer (kaleido's browser driver) looks for, after BROWSER_PATH.
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


@cache  # asked for every chart drawn
def can_export() -> bool:
    """Whether this machine can draw a figure server-side: kaleido installed and a Chromium/Chrome to drive."""
    if find_spec("kaleido") is None:
        return False
    return bool(os.environ.get("BROWSER_PATH")) or any(shutil.which(name) for name in _BROWSERS)


def slide_figure(fig: go.Figure) -> go.Figure:
    """A copy of `fig` laid out for a slide: the projector's shape, the CJK font, and no page-only settings."""
    out = go.Figure(fig)
    width, height = PROJECTOR
    out.update_layout(width=width // SCALE, height=height // SCALE, font_family=FONT_FAMILY, uirevision=None)
    return out


def figure_image(fig: go.Figure, fmt: str) -> bytes:
    """`fig` as a PNG (PROJECTOR px) or an SVG (the same layout), drawn by kaleido in the system Chromium."""
    if fmt not in FORMATS:
        raise ValueError(f"image format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return slide_figure(fig).to_image(format=fmt, scale=SCALE)


def slide_svg(fig: go.Figure, failed: str) -> bytes:
    """`fig` as an SVG for a slide; should the exporter fail (no Chromium it can start, a crash), an SVG of the same
    size that says so (`failed`, then the reason), so a download never ends in an empty or broken file."""
    try:
        return figure_image(fig, "svg")
    except Exception as e:  # noqa: BLE001 - any exporter failure becomes the message, never a broken download
        width, height = PROJECTOR
        lines = [failed, f"{type(e).__name__}: {e}"[:200]]
        text = "".join(f'<text x="40" y="{80 + 50 * i}" font-size="32" font-family="{escape(FONT_FAMILY)}">'
                       f"{escape(line)}</text>" for i, line in enumerate(lines))
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
                f'<rect width="100%" height="100%" fill="#fff"/>{text}</svg>').encode()
