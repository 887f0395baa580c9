"""Reusing Past K/V in the system Chromium: Prefill, Step, Play/Pause, and two sessions kept apart."""
import pytest
from playwright.sync_api import expect

from kvviz.engine.loading import shipped_tokenizer
from kvviz.i18n import t
from tests.browser.harness import IDLE, TOKENS_JS, app_server, goto_idle, lowest_on_screen, wait_idle

PROMPT = t("reuse.preset_1", "en")  # the first English preset
N_PROMPT = len(shipped_tokenizer().encode(PROMPT))  # on the default model, the shipped tiny
KO_PROMPT = t("reuse.preset_1", "ko")
PLOTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => ({
  title: g.layout.title ? g.layout.title.text.replace(/<[^>]+>/g, '') : '',
  rows: g.data[0].z ? g.data[0].z.length : null,
  cols: g.data[0].z ? Math.max(...g.data[0].z.map(r => r.filter(v => v !== null).length)) : null}))"""


@pytest.fixture(scope="module")
def app_url():
    """A server of this module's own: the decode page's timing-sensitive clicks do not share a server that earlier
    modules' sweeps and compression runs have loaded."""
    with app_server() as url:
        yield url



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
    # Prefill, Play and Reset go through the stepper's ordered log: wait until the page has applied the press.
    sent = page.locator("button.kv-step").get_attribute("data-sent") if page.locator("button.kv-step").count() else None
    if sent:
        page.wait_for_selector(f"button.kv-step[data-served='{sent}']")
        wait_idle(page)




def _chips(page) -> int:
    """Tokens shown in the strip (a run of byte tokens is one chip spanning them all)."""
    return page.evaluate(TOKENS_JS)


def _shoot(page, path) -> None:  # noqa: ANN001
    """The whole page: Streamlit scrolls inside its own container, so grow the viewport instead."""
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": 4400})
    page.wait_for_timeout(800)  # charts re-layout to the new size
    page.screenshot(path=path)
    page.set_viewport_size(size)


def _grid(page) -> dict:
    """The cache grid as drawn: positions, row names and cached positions per row."""
    return page.evaluate("""() => { const g = document.querySelector('.kv-grid'); if (!g) return {};
      const rows = Array.from(g.querySelectorAll('.kv-row'));
      return {positions: +g.dataset.positions, rows: rows.map(r => r.dataset.row),
              cached: rows.map(r => +r.dataset.cached),
              newest: (g.querySelector('.kv-newest') || {}).textContent || ''}; }""")


def _wait_grid(page, positions: int) -> dict:
    page.wait_for_function(f"document.querySelector('.kv-grid[data-positions=\"{positions}\"]') !== null")
    return _grid(page)


def _step(page, n: int = 1) -> None:
    before = _chips(page)
    page.locator("button.kv-step").click()
    page.wait_for_function(f"({TOKENS_JS}) >= {before + n}")
    wait_idle(page)


def _tab(page, name: str) -> None:
    page.get_by_role("radio", name=name).click()  # the tab row is a radio group (views/reuse.py: pick_tab)
    page.wait_for_timeout(200)
    wait_idle(page)


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
    grid = _wait_grid(page, N_PROMPT)
    assert grid["rows"] == [f"L{i} {kv}" for i in range(4) for kv in "KV"]  # K and V rows of 4 layers, all labelled
    _shoot(page, shots / "reuse_prefill.png")

    _step(page)
    expect(page.locator(".kv-chip")).to_have_count(N_PROMPT + 2)
    grid = _wait_grid(page, N_PROMPT + 1)
    assert grid["cached"] == [N_PROMPT + 1] * 8
    _tab(page, "Attention row")
    _plot(page, "Layer 0", rows=8, cols=N_PROMPT + 1)  # 8 query heads × the whole prefix
    _step(page)
    _tab(page, "Cached K/V values")
    _plot(page, "K of layer 0", rows=N_PROMPT + 2)  # the real K grew a row per step
    _tab(page, "Cache growth")
    _shoot(page, shots / "reuse_step.png")

    before = _chips(page)
    page.locator(".st-key-reuse_btn_play button").click()  # no idle wait: the timer keeps it running
    page.wait_for_function(f"({TOKENS_JS}) >= {before + 3}", timeout=20_000)
    # force: the page redraws several times a second while playing, so it is never "stable" for Playwright
    page.locator(".st-key-reuse_btn_pause button").click(force=True)
    expect(page.locator(".st-key-reuse_btn_play button")).to_be_visible()  # the pause rerun has drawn
    page.wait_for_selector(IDLE)
    paused = _chips(page)
    page.wait_for_timeout(1500)
    assert _chips(page) == paused  # nothing moves while paused
    assert paused > before + 2
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.console_errors == []


def test_rapid_clicks_and_keys_each_give_one_token(page):
    """Issue 13: 10 quick clicks gave 9 tokens (Streamlit merged button triggers); now each counts."""
    _open(page)
    _click(page, "Prefill")
    expect(page.locator(".kv-chip.newest")).to_have_count(1)  # the prefill's page is drawn before counting
    wait_idle(page)
    before = _chips(page)
    assert before == N_PROMPT + 1
    page.locator("button.kv-step").evaluate("b => { for (let i = 0; i < 12; i++) b.click(); }")
    page.wait_for_function(f"({TOKENS_JS}) >= {before + 12}")
    page.wait_for_timeout(1500)
    wait_idle(page)
    assert _chips(page) == before + 12
    page.locator("h1").first.click()  # focus outside any text field
    for key in ("ArrowRight", " ", "ArrowRight"):
        page.keyboard.press(key)
    page.wait_for_function(f"({TOKENS_JS}) >= {before + 15}")
    page.wait_for_timeout(1000)
    wait_idle(page)
    assert _chips(page) == before + 15
    page.keyboard.press("p")  # Play
    expect(page.locator(".st-key-reuse_btn_pause button")).to_be_visible()
    page.wait_for_function(f"({TOKENS_JS}) >= {before + 17}")
    page.keyboard.press("p")  # Pause
    expect(page.locator(".st-key-reuse_btn_play button")).to_be_visible()
    wait_idle(page)
    page.keyboard.press("r")  # Reset
    expect(page.locator(".kv-chip")).to_have_count(0)
    page.get_by_role("textbox", name="Prompt").press("r")  # typing in the prompt is not a shortcut
    assert page.locator("[data-testid='stException']").count() == 0


def _ten_steps_and_shoot(page, shots, name: str, query: str, link: str, prefill: str, size: dict) -> None:
    page.set_viewport_size(size)
    page.set_default_timeout(90_000)
    page.goto_app("Reusing_Past_KV", query)  # lecture mode collapses the sidebar and its links
    _click(page, prefill)
    for _ in range(10):
        _step(page)
    grid = _wait_grid(page, _chips(page) - 1)  # every token but the newest is cached
    assert len(grid["rows"]) == 8 and grid["newest"].startswith("▲")
    page.wait_for_timeout(800)
    page.screenshot(path=shots / f"{name}.png")  # what a projector or a 1400 px screen shows, unscrolled
    _shoot(page, shots / f"{name}_full.png")
    assert page.locator("[data-testid='stException']").count() == 0


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_ten_steps_screenshots(page, shots, lang):
    link, prefill = ("Reusing Past K/V", "Prefill") if lang == "en" else ("과거 K/V 재사용", "프리필")
    _ten_steps_and_shoot(page, shots, f"reuse_10_steps_{lang}", f"?lang={lang}", link, prefill,
                         {"width": 1400, "height": 1000})


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_lecture_mode_screenshots(page, shots, lang):
    link, prefill = ("Reusing Past K/V", "Prefill") if lang == "en" else ("과거 K/V 재사용", "프리필")
    _ten_steps_and_shoot(page, shots, f"reuse_lecture_{lang}", f"?lang={lang}&lecture=1", link, prefill,
                         {"width": 1280, "height": 720})


def test_korean_page(page, shots):
    _open(page, "?lang=ko", "과거 K/V 재사용")
    expect(page.get_by_role("heading", name="과거 K/V 재사용")).to_be_visible()
    page.get_by_role("combobox", name="예시 프롬프트").click()
    page.get_by_role("option", name=KO_PROMPT).click()
    wait_idle(page)
    _click(page, "프리필")
    n = _chips(page)
    _step(page)
    expect(page.locator(".kv-chip.newest")).to_have_count(1)
    assert _wait_grid(page, n)["cached"][0] == n  # prompt + the prefill's token, now fed back in
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
            pg.goto_app = lambda path="", query="", pg=pg: goto_idle(pg, f"{app_url}/{path}{query}")
            _open(pg)
            _click(pg, "Prefill")
        for _ in range(3):
            _step(a)
        assert _chips(a) == N_PROMPT + 4
        _step(b)  # a rerun of b reads b's own session state
        assert _chips(b) == N_PROMPT + 2
        assert _wait_grid(b, N_PROMPT + 1)["cached"][0] == N_PROMPT + 1
        assert _wait_grid(a, N_PROMPT + 3)["cached"][0] == N_PROMPT + 3
    finally:
        for c in contexts:
            c.close()


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_lecture_cache_growth_on_smollm2_fits_the_screen(page, shots, smollm2_dir, lang):
    """Issue 38.5: on a projector the Cache growth idea drew all 60 K/V rows of SmolLM2's 30 layers at full height and
    ended at 1,903 px on a 720 px screen. Now the layers charts.decode.grid_layers chooses (the first, the last, two
    between), the title naming them: after Prefill and 10 steps it ends above 720 px at 1280×720."""
    page.set_viewport_size({"width": 1280, "height": 720})
    page.set_default_timeout(120_000)
    page.goto_app("Reusing_Past_KV", f"?model=smollm2&lecture=1&lang={lang}")
    _click(page, t("reuse.prefill", lang))
    for _ in range(10):
        _step(page)
    grid = _wait_grid(page, _chips(page) - 1)  # every token but the newest is cached
    assert grid["rows"] == [f"L{i} {kv}" for i in (0, 10, 19, 29) for kv in "KV"]
    expect(page.locator(".kv-grid")).to_contain_text(
        t("common.grid_layers", lang, title="", shown="0, 10, 19, 29", n=30).strip(" ·"))
    lowest_on_screen(page, shots / f"reuse_smollm2_lecture_growth_{lang}.png", f"Cache growth on SmolLM2 ({lang})")
