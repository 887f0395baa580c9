"""Speculative Decoding in the system Chromium: a step whose verify had rejections, the rolled-back positions drawn
striped in the cache grid, in both languages, normal and lecture mode (screenshots/ for the report)."""
import pytest

from kvviz.i18n import t
from tests.browser.harness import lowest_on_screen, settle, wait_idle

REJECTED = "document.querySelectorAll(\".kv-grid .kv-seg[data-kind='rejected']\").length"


def _open(page, query: str, lang: str) -> None:  # noqa: ANN001 - a Playwright Page
    page.set_default_timeout(90_000)  # a shared machine may be slow; no time is asserted
    if "lecture" in query:  # the sidebar is folded away on a projector: open the page's own URL
        page.goto_app(path="Speculative_Decoding", query=query)
        return
    page.goto_app(query=query)
    page.get_by_role("link", name=t("nav.speculative", lang)).first.click()
    page.wait_for_timeout(300)
    wait_idle(page)


def _click(page, name: str) -> None:  # noqa: ANN001
    page.get_by_role("button", name=name, exact=True).first.click()
    page.wait_for_timeout(150)
    wait_idle(page)


def _step_until_rejection(page, lang: str, limit: int = 12) -> int:  # noqa: ANN001
    """Step (the → key, as a presenter does) until the latest verify rolled positions back."""
    for i in range(limit):
        page.locator("button.kv-step").click()
        page.wait_for_timeout(200)
        wait_idle(page)
        if page.evaluate(REJECTED):
            return i + 1
    raise AssertionError("no step rejected a draft")


@pytest.mark.parametrize(("lang", "lecture"), [("en", False), ("ko", False), ("en", True), ("ko", True)])
def test_rejection_drawn_in_the_cache_grid(page, lang, lecture):
    query = f"?lang={lang}" + ("&lecture=1" if lecture else "")
    _open(page, query, lang)
    if lecture:  # the settings sit behind one button on a projector
        page.get_by_role("button", name=t("spec.settings", lang)).first.click()
        page.wait_for_timeout(300)
    page.get_by_text(t("spec.method_early-exit", lang), exact=True).first.click()
    wait_idle(page)
    if lecture:
        page.keyboard.press("Escape")
        page.wait_for_timeout(300)
    _click(page, t("spec.prefill", lang))
    _step_until_rejection(page, lang)
    rows = page.evaluate("""() => Array.from(document.querySelectorAll('.kv-grid .kv-row')).map(r =>
        [r.dataset.row, Array.from(r.querySelectorAll('.kv-seg')).map(s => s.dataset.kind)])""")
    kinds = {name: segs for name, segs in rows}
    assert kinds and all(segs[-1] == "rejected" for segs in kinds.values()), kinds
    # the early exit's shared layers are drawn as the draft's writes (kept), the others as the verify's
    before = [segs[-2] if len(segs) > 1 else None for segs in kinds.values()]
    assert "draft" in before and "newest" in before, kinds
    assert not page.console_errors
    settle(page)
    from tests.browser.harness import screenshot_dir

    # The whole page: Streamlit scrolls inside its own container, so grow the viewport instead.
    page.set_viewport_size({"width": 1400, "height": 2600})
    page.wait_for_timeout(800)
    page.screenshot(path=str(screenshot_dir() / f"speculative_rejection_{lang}{'_lecture' if lecture else ''}.png"))


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_lecture_step_on_smollm2_fits_the_screen(page, shots, smollm2_dir, lang):
    """Issue 38.5, the same rule as Reusing Past K/V's (charts.decode.grid_layers): on a projector SmolLM2's grid draws
    4 of its 30 layers at full height (it thinned 60 rows to 2 px each), the title naming them; after Prefill and four
    steps of prompt lookup (the lecture's default) the step idea ends above 720 px at 1280×720."""
    page.set_viewport_size({"width": 1280, "height": 720})
    _open(page, f"?model=smollm2&lecture=1&lang={lang}", lang)
    _click(page, t("spec.prefill", lang))
    for _ in range(4):
        page.locator("button.kv-step").click()
        page.wait_for_timeout(200)
        wait_idle(page)
    rows = page.evaluate("() => Array.from(document.querySelectorAll('.kv-grid .kv-row')).map(r => r.dataset.row)")
    assert rows == [f"L{i} {kv}" for i in (0, 10, 19, 29) for kv in "KV"]
    title = t("common.grid_layers", lang, title="", shown="0, 10, 19, 29", n=30).strip(" ·")
    assert title in page.locator(".kv-grid").inner_text()
    lowest_on_screen(page, shots / f"speculative_smollm2_lecture_step_{lang}.png",
                     f"Speculative Decoding's step on SmolLM2 ({lang})")
