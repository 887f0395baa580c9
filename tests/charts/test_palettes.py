"""Issue 51 #2 and #4: the colours kvviz owns. Every categorical palette stays apart under simulated colour-vision
deficiency (colorspacious' CVD model at full severity: deuteranopia, protanopia, tritanopia), by at least
MIN_DELTA_E in CAM02-UCS (about the difference between two clearly named colours; 1 is barely noticeable); every
line and mark colour is at least 3:1 against its background (WCAG 1.4.11); the theme's text and captions at least
4.5:1 (WCAG 1.4.3) on the page's and the sidebar's backgrounds. The figures are printed (pytest -s)."""
import itertools
import tomllib
from pathlib import Path

import numpy as np
import pytest
from colorspacious import cspace_convert, deltaE

from kvviz.charts import compression, decode, latency, memory, paged, serving, speculative, training

ROOT = Path(__file__).resolve().parents[2]
MIN_DELTA_E = 10.0  # CAM02-UCS
CVD = {"normal": None, "deuteranopia": "deuteranomaly", "protanopia": "protanomaly", "tritanopia": "tritanomaly"}
WHITE, SIDEBAR, GRID_TRACK = "#ffffff", "#f8f8f7", "#f7f8fa"  # Streamlit's light theme; the cache grid's empty track
# Colours that tell categories apart on one chart (the paged pool's ramp is ordinal, its cells marked ↺ ×2 ×3 ×4+)
PALETTES = {
    "cache grid": [decode.PREFILL_COLOR, decode.STEP_COLOR, decode.NEWEST_COLOR, decode.DRAFT_COLOR,
                   decode.REJECTED_COLOR],
    "compression families": list(compression.FAMILY_COLORS.values()),
    "latency": [latency.PREFILL, latency.DECODE, latency.NO_CACHE, latency.FIT],
    "attention kinds": list(memory.KIND_COLORS.values()),
    "paged hit/preempt": [paged.HIT, paged.PREEMPT],
    "serving": [serving.TTFT, serving.TPOT, serving.THROUGHPUT, serving.FIT, serving.GAUGE_COLORS["kv_usage"]],
    "speculative": [speculative.ACCEPTED_COLOR, decode.REJECTED_COLOR, decode.DRAFT_COLOR, decode.STEP_COLOR],
    "training K/V": [training.K_COLOR, training.V_COLOR],
    "training prefill/decode": [training.PREFILL_COLOR, training.DECODE_COLOR],
}


def _rgb(hex_color: str) -> np.ndarray:
    h = hex_color.lstrip("#")
    return np.array([int(h[i:i + 2], 16) for i in (0, 2, 4)]) / 255


def _seen(color: np.ndarray, cvd: str | None) -> np.ndarray:
    if cvd is None:
        return color
    return np.clip(cspace_convert(color, {"name": "sRGB1+CVD", "cvd_type": cvd, "severity": 100}, "sRGB1"), 0, 1)


def min_delta_e(colors: list[str], cvd: str | None) -> tuple[float, str, str]:
    """The closest two colours of a palette as seen with `cvd`: their CAM02-UCS ΔE and the pair."""
    seen = {c: _seen(_rgb(c), cvd) for c in colors}
    return min((float(deltaE(seen[a], seen[b], input_space="sRGB1", uniform_space="CAM02-UCS")), a, b)
               for a, b in itertools.combinations(colors, 2))


def contrast(a: str, b: str) -> float:
    """WCAG 2.1's contrast ratio of two sRGB colours."""
    def lum(c: str) -> float:
        lin = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in _rgb(c)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _over(fg: str, bg: str, alpha: float) -> str:
    """`fg` at `alpha` opacity over `bg`, as the browser composites it."""
    mixed = alpha * _rgb(fg) + (1 - alpha) * _rgb(bg)
    return "#" + "".join(f"{round(v * 255):02x}" for v in mixed)


@pytest.mark.parametrize("name", list(PALETTES))
def test_palette_apart_under_colour_vision_deficiency(name):
    colors = PALETTES[name]
    found = {cvd: min_delta_e(colors, sim) for cvd, sim in CVD.items()}
    print(f"\n{name}: " + " | ".join(f"{cvd} ΔE {d:.1f} ({a}/{b})" for cvd, (d, a, b) in found.items()))
    low = {cvd: round(d, 1) for cvd, (d, _, _) in found.items() if d < MIN_DELTA_E}
    assert not low, f"{name}: closest pair under {low} is below ΔE {MIN_DELTA_E}"


def test_lines_and_marks_stand_out_from_their_background():
    lines = {c for name, colors in PALETTES.items() if name != "cache grid" for c in colors}
    lines |= {"#767676"}  # the grey of the decode charts' reference lines and bars
    ratios = {c: round(contrast(c, WHITE), 2) for c in sorted(lines)}
    print("\nlines on white: " + ", ".join(f"{c} {r:.2f}" for c, r in ratios.items()))
    assert min(ratios.values()) >= 3.0, {c: round(r, 2) for c, r in ratios.items() if r < 3}
    grid = {c: round(contrast(c, GRID_TRACK), 2) for c in PALETTES["cache grid"]}
    print("cache grid blocks on its track: " + ", ".join(f"{c} {r:.2f}" for c, r in grid.items()))
    assert min(grid.values()) >= 3.0


def test_theme_text_and_captions_reach_aa():
    theme = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())["theme"]
    text = theme["textColor"]
    # Streamlit draws captions (st.caption, widget help, the sidebar's section titles) in the text colour at 60 %
    found = {f"{what} on {bg}": contrast(_over(text, bg, alpha), bg)
             for what, alpha in (("text", 1.0), ("caption", 0.6)) for bg in (WHITE, SIDEBAR)}
    print("\n" + ", ".join(f"{k} {v:.2f}" for k, v in found.items()))
    assert min(found.values()) >= 4.5, found
