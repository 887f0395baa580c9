"""Reusing Past K/V in the system Chromium: Prefill, Step, Play/Pause, and two sessions kept apart."""
from harness import IDLE, wait_idle
from playwright.sync_api import expect

from kvviz.engine.loading import shipped_tokenizer
from kvviz.i18n import t

PROMPT = t("reuse.preset_1", "en")  # the first English preset
N_PROMPT = len(shipped_tokenizer().encode(PROMPT))  # on the default model, the shipped tiny
KO_PROMPT = t("reuse.preset_1", "ko")
N_KO_PROMPT = len(shipped_tokenizer().encode(KO_PROMPT))
PLOTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => ({
  title: g.layout.title ? g.layout.title.text.replace(/<[^>]+>/g, '') : '',
  rows: g.data[0].z ? g.data[0].z.length : null,
  cols: g.data[0].z ? Math.max(...g.data[0].z.map(r => r.filter(v => v !== null).length)) : null}))"""


def _open(page, query: str = "", link: str = "Reusing Past K/V") -> None:  # noqa: ANN001
    """Home, then the sidebar link, as a user goes (a direct page URL makes Streamlit probe two 404s)."""
    page.set_default_timeout(90_000)  # the machine may be shared and slow; no time is asserted
    page.goto_app(query=query)
    page.get_by_role("link", name=link).first.click()
    page.wait_for_timeout(300)
    wait_idle(page)


def _click(page, name: str) -> None:
    page.get_by_role("button", name=name, exact=True).click()
    page.wait_for_timeout(150)  # let the rerun start before waiting for it to end
    wait_idle(page)


def _chips(page) -> int:
    return page.locator(".kv-chip").count()


def _shoot(page, path) -> None:  # noqa: ANN001
    """The whole page: Streamlit scrolls inside its own container, so grow the viewport instead."""
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": 4400})
    page.wait_for_timeout(800)  # charts re-layout to the new size
    page.screenshot(path=path)
    page.set_viewport_size(size)


def _plot(page, prefix: str, **expected: int) -> dict:
    """The chart whose title starts with `prefix`, once it shows `expected` (charts redraw after the rerun)."""
    plot: dict = {}
    for _ in range(50):
        plots = [p for p in page.evaluate(PLOTS) if p["title"].startswith(prefix)]
        plot = plots[0] if plots else {}
        if plot and all(plot[k] == v for k, v in expected.items()):
            return plot
        page.wait_for_timeout(200)
    raise AssertionError(f"chart {prefix!r} is {plot}, expected {expected}")


def test_prefill_step_play_pause(page, shots):
    _open(page)
    expect(page.get_by_role("heading", name="Reusing Past K/V")).to_be_visible()
    _click(page, "Prefill")
    expect(page.locator(".kv-chip.newest")).to_have_count(1)
    assert _chips(page) == N_PROMPT + 1  # prompt chips and the prefill's token
    _plot(page, "Cached positions per layer", rows=8, cols=N_PROMPT)  # K and V rows of 4 layers
    _plot(page, "Layer 0", rows=8, cols=N_PROMPT)
    _shoot(page, shots / "reuse_prefill.png")

    _click(page, "Step")
    expect(page.locator(".kv-chip")).to_have_count(N_PROMPT + 2)
    growth = _plot(page, "Cached positions per layer", cols=N_PROMPT + 1)
    assert growth["title"] == f"Cached positions per layer: {N_PROMPT + 1}"
    _plot(page, "Layer 0", rows=8, cols=N_PROMPT + 1)  # 8 query heads × the whole prefix
    _click(page, "Step")
    _plot(page, "K of layer 0", rows=N_PROMPT + 2)  # the real K grew a row per step
    _shoot(page, shots / "reuse_step.png")

    before = _chips(page)
    page.get_by_role("button", name="▶ Play", exact=True).click()  # no idle wait: the timer keeps it running
    page.wait_for_function(f"document.querySelectorAll('.kv-chip').length >= {before + 3}", timeout=20_000)
    # force: the page redraws several times a second while playing, so it is never "stable" for Playwright
    page.get_by_role("button", name="‖ Pause").click(force=True)
    expect(page.get_by_role("button", name="▶ Play", exact=True)).to_be_visible()  # the pause rerun has drawn
    page.wait_for_selector(IDLE)
    paused = _chips(page)
    page.wait_for_timeout(1500)
    assert _chips(page) == paused  # nothing moves while paused
    assert paused > before + 2
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.console_errors == []


def test_korean_page(page, shots):
    _open(page, "?lang=ko", "과거 K/V 재사용")
    expect(page.get_by_role("heading", name="과거 K/V 재사용")).to_be_visible()
    page.get_by_role("combobox", name="예시 프롬프트").click()
    page.get_by_role("option", name=KO_PROMPT).click()
    wait_idle(page)
    _click(page, "프리필")
    _click(page, "한 단계")
    expect(page.locator(".kv-chip.newest")).to_have_count(1)
    _plot(page, "레이어별 캐시된 위치 수", cols=N_KO_PROMPT + 1)
    # Korean words are tokens of the shipped BPE: no chip shows a raw byte.
    chips = page.locator(".kv-chip").all_inner_texts()
    assert not any("<0x" in c for c in chips), chips
    assert "".join(chips).replace("␣", " ").startswith(KO_PROMPT)
    assert page.locator("[data-testid='stException']").count() == 0
    _shoot(page, shots / "reuse_ko.png")


def test_two_sessions_keep_separate_generations(browser, app_url):
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(2)]
    a, b = (c.new_page() for c in contexts)
    try:
        for pg in (a, b):
            pg.goto_app = lambda path="", query="", pg=pg: (pg.goto(f"{app_url}/{path}{query}"), wait_idle(pg))
            _open(pg)
            _click(pg, "Prefill")
        for _ in range(3):
            _click(a, "Step")
        assert _chips(a) == N_PROMPT + 4
        _click(b, "Step")  # a rerun of b reads b's own session state
        assert _chips(b) == N_PROMPT + 2
        _plot(b, "Cached positions per layer", cols=N_PROMPT + 1)
        _plot(a, "Cached positions per layer", cols=N_PROMPT + 3)
    finally:
        for c in contexts:
            c.close()
