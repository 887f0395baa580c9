"""Speculative Decoding in the system Chromium: a step whose verify had rejections, the rolled-back positions drawn
striped in the cache grid, in both languages, normal and lecture mode (screenshots/ for the report)."""
import pytest
from playwright.sync_api import expect

from kvviz.i18n import t
from tests.browser.harness import lowest_on_screen, settle, wait_idle

REJECTED = "document.querySelectorAll(\".kv-grid .kv-seg[data-kind='rejected']\").length"


def _open(page, query: str, lang: str) -> None:  # noqa: ANN001 - a Playwright Page
    page.set_default_timeout(90_000)  # a shared machine may be slow; no time is asserted
    if "lecture" in query:  # the sidebar is folded away on a projector: open the page's own URL
        page.goto_app(path="Speculative_Decoding", query=query)
        return
    page.goto_app(query=query)
    page.get_by_role("link", name=t("spec.title", lang)).first.click()
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


def _pick_method(page, method: str, lang: str) -> None:  # noqa: ANN001
    """On a projector: the draft method chosen behind the settings button, the button folded again."""
    page.get_by_role("button", name=t("spec.settings", lang)).first.click()
    page.wait_for_timeout(300)
    page.get_by_text(t(f"spec.method_{method}", lang), exact=True).first.click()
    wait_idle(page)
    page.keyboard.press("Escape")
    page.wait_for_timeout(300)


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
@pytest.mark.parametrize("method", ["ngram", "early-exit", "draft"])
@pytest.mark.parametrize("lang", ["en", "ko"])
def test_lecture_step_fits_the_screen(page, shots, smollm2_dir, model, method, lang):
    """Issue 38.5: on a projector (1280×720) the step idea ends above 720 px for every draft method, in both
    languages, on the shipped model and on SmolLM2 — after Prefill and steps up to a verify that rolled positions
    back (the early exit's legend names five kinds, the most any step draws; its shared layers' explanation is the
    grid title's tooltip). SmolLM2's grid draws 4 of its 30 layers (charts.decode.grid_layers), the title naming them;
    with an early exit after layer m the layers either side of it are among them."""
    page.set_viewport_size({"width": 1280, "height": 720})
    _open(page, f"?model={model}&lecture=1&lang={lang}", lang)
    if method != "ngram":  # prompt lookup is the default
        _pick_method(page, method, lang)
    _click(page, t("spec.prefill", lang))
    step, steps = page.locator("button.kv-step"), 0
    for steps in range(1, 9):  # a verify with rejections draws every kind the legend names; else to the run's end
        try:  # the component (in its shadow root) redraws after the rerun: wait for its button to follow
            expect(step).to_be_enabled(timeout=10_000)
        except AssertionError:  # the run has ended
            steps -= 1
            break
        step.click()
        page.wait_for_timeout(200)
        wait_idle(page)
        if page.evaluate(REJECTED):
            break
    lowest_on_screen(page, shots / f"speculative_lecture_step_{model}_{method}_{lang}.png",
                     f"Speculative Decoding's step, {method}, on {model} ({lang})")
    assert steps >= 1
    kinds = page.evaluate("() => Array.from(document.querySelectorAll('.kv-grid .kv-seg')).map(s => s.dataset.kind)")
    assert ("draft" in kinds) == (method == "early-exit"), kinds
    if method == "early-exit":  # the shared layers' explanation is kept, as the title's tooltip
        tip = page.locator(".kv-grid .kv-grid-help").first.get_attribute("title")
        assert tip.startswith(t("spec.shared_caption", lang, m=0, last=0)[:12]), tip
    if model == "smollm2":
        rows = page.evaluate("() => [...new Set(Array.from(document.querySelectorAll('.kv-grid')[0].querySelectorAll("
                             "'.kv-row'))"
                             ".map(r => r.dataset.row.split(' ')[0]))]")
        assert len(rows) == 4 and rows[0] == "L0" and rows[-1] == "L29", rows
        shown = ", ".join(r.removeprefix("L") for r in rows)
        title = t("common.grid_layers", lang, title="", shown=shown, n=30).strip(" ·")
        assert title in page.locator(".kv-grid").first.inner_text()
