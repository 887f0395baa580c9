"""The tour (issue 19): risky sequences a curious user, a lecturer and a hosted visitor try, replayed in Chromium.

- Check: Try again after a reveal clears the shown answer, and the same answer can be revealed again.
- A number typed out of range is refused with the range named (sidebar, Check).
- A round trip Training → Check → Home → Training keeps the view; the Reusing page's generation survives a visit
  elsewhere; a sidebar change (dtype) under the Training page redraws with verdicts that agree with their numbers.
- Hosted mode (`KVVIZ_HOSTED=1`, a 20,000-byte KV budget): every cap on the pages that run the model.
- Screenshots of Home, Training and Check, English and Korean at 1400 px and lecture mode at 1280×720.
- Issue 29 #3: every number box (decode page, Memory page) refuses 0, -1, 1e3 and 99999999999 with its range,
  keeps the previous value in use and says so; Prefill then runs with that value.
- Issue 29 #6: Prefill, R, Prefill, R, Space pressed faster than the server redraws, six times over, end with no
  generation (every press applied, in order); Play on a slowed browser never jumps several tokens unannounced.
"""
import pytest
from playwright.sync_api import expect

from kvviz.i18n import t
from tests.browser.axe import AXE, violations
from tests.browser.harness import LOWEST, TOKENS_JS, app_server, goto_idle, next_idea, settle, wait_idle

HOSTED = {"KVVIZ_HOSTED": "1", "KVVIZ_KV_BUDGET_BYTES": "2000"}  # about one token of the shipped model
BUDGET = "hosted demo: this request's KV cache needs"


def key(name: str) -> str:
    """Streamlit marks a keyed widget's container with the class st-key-<key>."""
    return f".st-key-{name}"


def type_number(page, widget_key: str, value: str) -> None:  # noqa: ANN001 - a Playwright Page
    box = page.locator(f"{key(widget_key)} input")
    box.fill(value)
    box.press("Enter")
    wait_idle(page)


def no_exception(page) -> None:  # noqa: ANN001
    assert page.locator("[data-testid='stException']").count() == 0


def sidebar_link(page, name: str) -> None:  # noqa: ANN001
    page.locator("[data-testid='stSidebar']").get_by_role("link", name=name, exact=True).click()
    wait_idle(page)
    settle(page)


# ---- the ordinary app -------------------------------------------------------------------------------------
def test_check_try_again_clears_the_answer_and_reveal_works(page):
    page.goto_app("Check")
    question = page.locator(key("predict_m_training"))
    question.get_by_text("True", exact=True).click()
    wait_idle(page)
    page.locator(f"{key('reveal_m_training')} button").click()
    wait_idle(page)
    expect(page.get_by_text("Not quite. The answer: False")).to_be_visible()
    page.locator(f"{key('again_m_training')} button").click()
    wait_idle(page)
    expect(question.locator("input:checked")).to_have_count(0)  # the old answer is no longer shown
    expect(page.get_by_text("Not quite. The answer: False")).to_have_count(0)
    question.get_by_text("True", exact=True).click()  # the same answer again unlocks Reveal
    wait_idle(page)
    reveal = page.locator(f"{key('reveal_m_training')} button")
    expect(reveal).to_be_enabled()
    reveal.click()
    wait_idle(page)
    expect(page.get_by_text("Not quite. The answer: False")).to_be_visible()
    no_exception(page)


def test_out_of_range_numbers_are_refused_with_their_range(page):
    page.goto_app("Check", "?model=random")
    for typed in ("0", "513", "100000"):
        type_number(page, "_w_layers", typed)
        expect(page.get_by_text(f"Layers: {int(typed):,} is outside the allowed range 1 … 48")).to_be_visible()
    type_number(page, "_w_layers", "3")
    expect(page.get_by_text("is outside the allowed range")).to_have_count(0)
    type_number(page, "predict_cache_size", "-5")
    expect(page.get_by_text("is outside the allowed range 0 … 1,000,000")).to_be_visible()
    expect(page.locator(f"{key('reveal_cache_size')} button")).to_be_disabled()
    no_exception(page)


def test_number_boxes_refuse_with_their_range_and_keep_the_previous_value(page):
    page.goto_app("Reusing_Past_KV")
    kept = "so it was not used. The previous value, 24, stays."
    for typed, shown in (("0", "0"), ("1e3", "1,000"), ("-1", "-1"), ("99999999999", "99,999,999,999")):
        type_number(page, "_w_reuse_max_new", typed)
        message = f"Max new tokens: {shown} is outside the allowed range 1 … 512, {kept}"
        expect(page.get_by_text(message)).to_be_visible()
    type_number(page, "_w_reuse_max_new", "2.5")
    expect(page.get_by_text(f"Max new tokens: 2.5 is not a whole number, {kept}")).to_be_visible()
    box = page.locator(f"{key('_w_reuse_max_new')} input")
    for typed in ("", "abc"):  # the browser takes no letters; emptied, the box shows its last entry again
        box.fill("")
        box.press_sequentially(typed)
        box.press("Enter")
        wait_idle(page)
        assert box.input_value() != ""
        expect(page.get_by_text(kept)).to_be_visible()
    page.locator(f"{key('reuse_btn_prefill')} button").click()
    wait_idle(page)
    expect(page.get_by_text("1 tokens generated").or_(page.get_by_text("1 token generated"))).to_be_visible()
    expect(page.get_by_text("Generation finished")).to_have_count(0)  # 24 new tokens to go, not 1
    page.locator("button.kv-step").click()
    wait_idle(page)
    expect(page.get_by_text("Generation finished")).to_have_count(0)

    page.goto_app("Memory_Footprint", "?src=custom")
    results = page.locator("[data-testid='stMetricValue']")
    before = results.all_inner_texts()
    for widget_key, label, bounds in (("memory_layers", "Layers L", "1 … 1,000"),
                                      ("memory_tokens", "Context length n (tokens)", "1 … 10,000,000"),
                                      ("memory_batch", "Concurrent requests B", "1 … 100,000"),
                                      ("memory_block", "Block size (tokens)", "1 … 4,096")):
        if widget_key == "memory_block":
            page.get_by_role("tab", name="Capacity planner").click()
        for typed in ("0", "-1", "99999999999"):
            type_number(page, widget_key, typed)
            shown = f"{int(typed):,}"
            expect(page.get_by_text(f"{label}: {shown} is outside the allowed range {bounds}")).to_be_visible()
            assert results.all_inner_texts() == before  # nothing was computed from the refused value
        box = page.locator(f"{key(widget_key)} input")
        previous = {"memory_layers": "32", "memory_tokens": "4096", "memory_batch": "1",
                    "memory_block": "16"}[widget_key]
        type_number(page, widget_key, previous)
        expect(page.get_by_text("is outside the allowed range")).to_have_count(0)  # no earlier error stays
        assert box.input_value() == previous
    no_exception(page)


# The stepper draws inside a shadow root: find its elements there.
DEEP = """const deep = (sel) => { const roots = [document];
  while (roots.length) { const r = roots.shift(); const e = r.querySelector(sel); if (e) return e;
    for (const h of r.querySelectorAll('*')) if (h.shadowRoot) roots.push(h.shadowRoot); }
  return null; };"""
FAST_PRESSES = """(presses) => { DEEP
  const prefill = document.querySelector('.st-key-reuse_btn_prefill button');
  const key = (k) => window.dispatchEvent(new KeyboardEvent('keydown', {key: k, bubbles: true, cancelable: true}));
  for (const p of presses) { if (p === 'prefill') prefill.click(); else key(p); }
  return Number(deep('button.kv-step').dataset.sent);
}""".replace("DEEP", DEEP)


# Each animation frame: its time, the tokens shown, and whether a falling-behind notice is on screen.
FRAMES = r"""() => { DEEP window.__kvFrames = []; let note = null; const seen = () => {
  if (!note || !note.isConnected) note = deep('div.kv-behind');
  const alert = Array.from(document.querySelectorAll("[data-testid='stAlert']"))
    .some(a => /falling behind|keeps .* steps\/s/i.test(a.textContent));
  window.__kvFrames.push([performance.now(), TOKENS, !!(note && !note.hidden) || alert]);
  if (window.__kvFrames.length < 100000) requestAnimationFrame(seen); };
  requestAnimationFrame(seen); }"""


def _all_served(page, sent: int) -> None:  # noqa: ANN001
    page.wait_for_selector(f"button.kv-step[data-served='{sent}']", timeout=60_000)
    wait_idle(page)


def test_fast_presses_on_the_decode_page_are_applied_in_order(page):
    page.goto_app("Reusing_Past_KV")
    for _ in range(6):  # issue 29 #6: 5 of 6 tries ended with a fresh generation (the last R and Space lost)
        sent = page.evaluate(FAST_PRESSES, ["prefill", "r", "prefill", "r", " "])
        _all_served(page, sent)
        assert page.evaluate(TOKENS_JS) == 0
        expect(page.get_by_text("press Prefill")).to_be_visible()  # the empty page's hint: no generation
    sent = page.evaluate(FAST_PRESSES, ["prefill", " ", "ArrowRight", "r", "prefill", " "])
    _all_served(page, sent)
    n_prompt = page.evaluate(TOKENS_JS) - 2  # the prompt, the prefill's token and one step
    # The same with real key presses and a real click (Playwright's), as a hand would.
    page.locator(f"{key('reuse_btn_prefill')} button").click()
    for k in ("r", "p", "p"):
        page.keyboard.press(k)
    page.locator(f"{key('reuse_btn_prefill')} button").click()
    for k in (" ", " ", "ArrowRight"):
        page.keyboard.press(k)
    _all_served(page, int(page.locator("button.kv-step").get_attribute("data-sent")))
    assert page.evaluate(TOKENS_JS) == n_prompt + 1 + 3
    no_exception(page)


def test_play_under_load_says_when_a_redraw_jumps(page):
    """On a browser slowed fourfold, Play at 8 steps/s: every redraw that shows more than one new token is
    announced ("falling behind") at once, and the server itself never steps more than one token per redraw."""
    page.goto_app("Reusing_Past_KV")
    page.locator(f"{key('reuse_btn_prefill')} button").click()
    wait_idle(page)
    page.locator(f"{key('_w_reuse_speed')} input[type='range']").focus()
    page.keyboard.press("End")  # the fastest speed
    wait_idle(page)
    page.locator("h1").first.click()  # focus outside the slider, so P is Play
    cdp = page.context.new_cdp_session(page)
    cdp.send("Emulation.setCPUThrottlingRate", {"rate": 4})
    try:
        page.evaluate(FRAMES.replace("TOKENS", TOKENS_JS).replace("DEEP", DEEP))
        page.keyboard.press("p")
        page.wait_for_timeout(8_000)
        page.keyboard.press("p")
        frames = page.evaluate("window.__kvFrames")
    finally:
        cdp.send("Emulation.setCPUThrottlingRate", {"rate": 1})
    # A frame sampled while the strip is being replaced may count fewer chips: tokens only ever grow, so a jump is
    # a frame showing more than one token past the most seen before it
    jumps, seen = [], frames[0][1]
    for i in range(1, len(frames)):
        if frames[i][1] - seen > 1:
            jumps.append(i)
        seen = max(seen, frames[i][1])
    unannounced = [i for i in jumps if not any(f[2] for f in frames[i:] if f[0] - frames[i][0] < 1500)]
    print(f"{len(frames)} frames, {seen - frames[0][1]} tokens, {len(jumps)} jumps, {len(unannounced)} unannounced")
    assert seen > frames[0][1]  # it played
    assert unannounced == []
    wait_idle(page)
    no_exception(page)


def test_round_trip_between_pages_keeps_the_view(page):
    page.goto_app("Training_Prefill_Decode", "?preset=code&steps=5")
    expect(page.get_by_text("and then runs 5 decode steps").first).to_be_visible()
    sidebar_link(page, "Check")
    sidebar_link(page, "Home")
    sidebar_link(page, "Training · Prefill · Decode")
    expect(page.get_by_text("and then runs 5 decode steps").first).to_be_visible()
    assert "preset=code" in page.url and "steps=5" in page.url
    expect(page.get_by_role("heading", name="Training, prefill and decode compared")).to_be_visible()
    # A sidebar change under the page: it redraws, and its verdicts agree with the numbers beside them.
    page.locator(key("_w_kv_dtype")).click()
    page.get_by_role("option", name="bfloat16").click()
    wait_idle(page)
    settle(page)
    expect(page.get_by_text("Identical up to floating-point rounding").first).to_be_visible()
    expect(page.get_by_text("the two paths disagree")).to_have_count(0)
    expect(page.get_by_role("heading", name="Training, prefill and decode compared")).to_be_visible()
    # The Reusing page's generation survives a visit to another page.
    sidebar_link(page, "Reusing Past K/V")
    page.locator(f"{key('reuse_btn_prefill')} button").click()
    wait_idle(page)
    page.locator("button.kv-step").click()  # the Step button that counts clicks
    wait_idle(page)
    sidebar_link(page, "Check")
    sidebar_link(page, "Reusing Past K/V")
    expect(page.locator("button.kv-step")).to_be_enabled()  # the generation is still there
    no_exception(page)


def test_korean_breaks_between_words(page):
    page.goto_app("Check", "?lang=ko")
    paragraph = page.locator("[data-testid='stMarkdownContainer'] p").first
    assert paragraph.evaluate("e => getComputedStyle(e).wordBreak") == "keep-all"


# ---- hosted mode -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hosted(browser):
    """A hosted app server (tiny KV budget) and a page on it."""
    with app_server(env=HOSTED) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        pg = context.new_page()

        def goto(path: str = "", query: str = "") -> None:
            goto_idle(pg, f"{url}/{path}{query}")
            settle(pg)

        pg.goto_app = goto
        yield pg
        context.close()


def test_hosted_shape_caps_in_the_sidebar(hosted):
    hosted.goto_app("", "?model=random")
    type_number(hosted, "_w_layers", "12")
    expect(hosted.get_by_text("hosted demo: at most 8 layers, got 12")).to_be_visible()
    type_number(hosted, "_w_layers", "4")
    type_number(hosted, "_w_d_model", "1024")
    expect(hosted.get_by_text("hosted demo: d_model at most 512, got 1024")).to_be_visible()
    no_exception(hosted)


def test_hosted_caps_on_training_and_prefill_decode(hosted):
    hosted.goto_app("Training_Prefill_Decode")
    expect(hosted.get_by_text(BUDGET).first).to_be_visible()  # refused before the model runs
    expect(hosted.get_by_role("heading", name="Training, prefill and decode compared")).to_be_visible()
    hosted.goto_app("Prefill_and_Decode")
    hosted.locator(f"{key('prefill_run')} button").click()
    wait_idle(hosted)
    expect(hosted.get_by_text(BUDGET).first).to_be_visible()
    no_exception(hosted)


def test_hosted_caps_on_latency_sweeps(hosted):
    hosted.goto_app("Latency_and_Capacity")
    hosted.get_by_role("tab", name="Batch size").click()
    batches = hosted.locator(f"{key('latency_b_batches')} input")
    batches.fill("1, 2, 3, 4, 5, 6, 7, 8, 9")
    batches.press("Enter")
    wait_idle(hosted)
    hosted.locator(f"{key('latency_start_batch')} button").click()
    wait_idle(hosted)
    expect(hosted.get_by_text("hosted demo: at most 8 points per sweep, got 9")).to_be_visible()
    batches.fill("1, 8")
    batches.press("Enter")
    wait_idle(hosted)
    hosted.locator(f"{key('latency_start_batch')} button").click()
    wait_idle(hosted)
    expect(hosted.get_by_text("hosted demo: a batch of at most 4 requests, got 8")).to_be_visible()
    no_exception(hosted)


def test_hosted_caps_on_reusing(hosted):
    hosted.goto_app("Reusing_Past_KV")
    hosted.locator(f"{key('reuse_btn_prefill')} button").click()
    wait_idle(hosted)
    expect(hosted.get_by_text(BUDGET).first).to_be_visible(timeout=5_000)
    no_exception(hosted)


def test_hosted_caps_on_memory_run_here(hosted):
    hosted.goto_app("Memory_Footprint")
    hosted.get_by_role("tab", name="Measured cache").click()
    hosted.locator(f"{key('memory_run_here')} button").click()
    wait_idle(hosted)
    expect(hosted.get_by_text(BUDGET).first).to_be_visible(timeout=5_000)
    no_exception(hosted)


# ---- issue 29: Cancel that cancels; the latency pages one idea per 1280×720 screen ------------------------------


# Text the browser ends with "…" because it does not fit its box.
CUT_SHORT = """() => Array.from(document.querySelectorAll("[data-testid='stMainBlockContainer'] *"))
  .filter(e => e.checkVisibility() && getComputedStyle(e).textOverflow === 'ellipsis'
               && e.scrollWidth > e.clientWidth + 1)
  .map(e => e.innerText)"""


def progress_text(page) -> str:  # noqa: ANN001
    bar = page.locator("[data-testid='stProgress']")
    return bar.first.inner_text() if bar.count() else ""


def test_cancel_stops_the_sweep_and_draws_the_kept_rows(page, shots):
    """Issue 29.1: after 'Cancelled: kept the 14 of 16 settings', measuring went on (14 → 15), Start stayed disabled
    and no chart came for more than 90 s, nor after leaving the page and coming back. Cancel now stops within one
    run, re-enables Start and draws every setting measured in the rounds already complete."""
    import re
    import time

    page.goto_app("Latency_and_Capacity")
    page.get_by_role("tab", name="Cache vs no cache").click()
    panel = page.get_by_role("tabpanel")
    contexts = panel.get_by_label(re.compile("Context lengths"))
    contexts.fill("8, 18, 39, 86, 190, 420, 927, 2047")  # the shipped model's defaults: 16 settings
    contexts.press("Enter")
    wait_idle(page)
    # 20 rounds (16 settings × 21 runs): long enough to cancel midway even when a quiet machine runs the tiny
    # model's 96 default runs within one progress tick
    rounds = panel.locator(f"{key('latency_c_repeats')} input")
    rounds.fill("20")
    rounds.press("Enter")
    wait_idle(page)
    panel.locator(f"{key('latency_start_cache')} button").click()
    # The first round warms up, the second is the first measured: cancel once both are done (32 runs).
    page.wait_for_function("""() => { const m = /Measuring… (\\d+) \\/ 336 runs/.exec(document.body.innerText);
                                      return m && Number(m[1]) >= 34; }""", timeout=240_000)
    panel.locator(f"{key('latency_cancel_cache')} button").click()
    clicked = time.monotonic()
    cancelled = re.compile(r"Cancelled after (\d+) of 336 runs: the 16 settings below are kept")
    expect(panel.get_by_text(cancelled)).to_be_visible(timeout=60_000)
    expect(panel.locator(f"{key('latency_start_cache')} button")).to_be_enabled(timeout=30_000)
    expect(panel.locator(f"{key('latency_cancel_cache')} button")).to_be_disabled()
    expect(panel.locator("[data-testid='stPlotlyChart']")).to_have_count(1)
    stopped_s = time.monotonic() - clicked
    done = int(cancelled.search(progress_text(panel)).group(1))
    page.wait_for_timeout(3000)
    assert int(cancelled.search(progress_text(panel)).group(1)) == done  # nothing measured after the Cancel
    points = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
        .flatMap(g => g.data.filter(d => d.mode === 'lines+markers').map(d => d.x.length))""")
    assert points == [8, 8]  # every context, with and without the cache
    print(f"\nCancel → Start enabled and the chart drawn: {stopped_s:.1f} s; {done} of 336 runs measured")
    page.screenshot(path=shots / "latency_after_cancel_en.png", full_page=True)
    sidebar_link(page, "Home")  # leave and come back: the kept rows are still drawn
    sidebar_link(page, "Latency & Capacity")
    page.get_by_role("tab", name="Cache vs no cache").click()
    expect(page.get_by_role("tabpanel").locator("[data-testid='stPlotlyChart']")).to_have_count(1)
    expect(page.get_by_role("tabpanel").get_by_text(cancelled)).to_be_visible()
    no_exception(page)


def _lecture_page(tabs, app_url, path: str, lang: str):  # noqa: ANN001, ANN202
    pg = tabs.open(1280, 720)
    page, _, query = path.partition("?")  # a page's own settings may come with it ("Page?seq=128")
    goto_idle(pg, f"{app_url}/{page}?{query + '&' if query else ''}lecture=1&lang={lang}")
    settle(pg)
    no_violations(pg, f"{page or 'Home'} {lang} lecture")
    return pg


def no_violations(pg, what: str) -> None:  # noqa: ANN001
    """Issue 51 in lecture mode, where each page is opened here (normal mode: test_pages_browser.py): the document's
    language is the link's, and axe-core finds no WCAG 2.1 A/AA violation (printed per page, pytest -s)."""
    lang = what.split()[1]
    # set by the page's a11y component once its code has loaded, which can be after the script run ends
    pg.wait_for_function("lang => document.documentElement.lang === lang", arg=lang, timeout=15_000)
    if AXE.exists():  # .ci/run installs it (test_a11y_browser.py says so where it is missing)
        found = violations(pg)
        print(f"{what}: axe " + (", ".join(f"{v['id']}×{v['count']} {v['nodes'][:2]}" for v in found) or "0"))
        assert found == [], f"{what}: {found}"


def _fill_setting(pg, label: str, value: str) -> None:  # noqa: ANN001
    import re

    pg.locator("[data-testid='stPopover'] button").first.click()
    box = pg.get_by_label(re.compile(label))
    box.fill(value)
    box.press("Enter")
    wait_idle(pg)
    pg.keyboard.press("Escape")
    settle(pg)


def _wait_measured(pg, button_key: str) -> None:  # noqa: ANN001
    """The click's rerun began (the button disabled), then measuring ended (every copy of it enabled again)."""
    buttons = f"Array.from(document.querySelectorAll('{key(button_key)} button'))"
    pg.wait_for_function(f"() => {buttons}.some(b => b.disabled)", timeout=120_000)
    measuring = "/Measuring|측정 중/.test(document.body.innerText)"
    pg.wait_for_function(f"() => {buttons}.every(b => !b.disabled) && !{measuring}", timeout=300_000)
    settle(pg)


def _each_idea_fits(pg, stepper: str, n: int, name: str, shots, each=None) -> None:  # noqa: ANN001
    """Step through the page's n ideas (`each(pg)` first on each: what a lecture clicks there); each ends above 720 px
    and shows no label cut short with "…"."""
    for i in range(1, n + 1):
        if each is not None:
            each(pg)
        lowest = pg.evaluate(LOWEST)
        cut = pg.evaluate(CUT_SHORT)
        pg.screenshot(path=shots / f"{name}_idea{i}.png")
        print(f"{name} idea {i}: lowest {lowest:.0f} px")  # the report's numbers (pytest -s)
        assert lowest <= 720, f"{name}: idea {i} ends at {lowest:.0f} px, below the 720 px screen"
        assert not cut, f"{name}: idea {i} cuts short {cut}"
        if i < n:
            next_idea(pg, stepper)
            expect(pg.locator("[data-testid='stException']")).to_have_count(0)


LECTURE_PAGES = {
    # page: (its setting to shorten, en and ko labels, the value; the button that measures; stepper key, ideas)
    "Prefill_and_Decode": (("Prompt length", "프롬프트 길이"), "256", "prefill_run", "prefill", 4),
    "Latency_and_Capacity": (("Prompt lengths", "프롬프트 길이"), "16, 64, 256", "latency_start_prompt-length",
                             "latency", 7),
}


@pytest.mark.parametrize("lang", ["en", "ko"])
@pytest.mark.parametrize("path", list(LECTURE_PAGES))
def test_latency_pages_lecture_one_idea_per_screen(tabs, app_url, shots, path, lang):
    """Issue 29.7: in lecture mode all of Prefill & Decode's results sat below the fold, and Latency & Capacity had
    no one-idea-per-screen stepper. Each idea (Prefill & Decode: the timeline, the figures, the formula, the phases;
    Latency: four sweeps, the bounds, the bound against batch, the cache against the weights) is whole on one
    1280×720 screen, measured results included."""
    labels, value, button, stepper, n = LECTURE_PAGES[path]
    pg = _lecture_page(tabs, app_url, path, lang)
    _fill_setting(pg, labels[lang == "ko"], value)
    pg.locator(f"{key(button)} button").first.click()
    _wait_measured(pg, button)
    expect(pg.locator("[data-testid='stPlotlyChart']")).to_have_count(1)
    _each_idea_fits(pg, stepper, n, f"{path.lower()}_lecture_{lang}", shots)


def _reveal(pg) -> None:  # noqa: ANN001
    """Check: answer the question on screen and reveal it (the explanation is the longest state of an idea)."""
    question = pg.locator("[data-testid='stMainBlockContainer'] [class*='st-key-predict_']").first
    if question.locator("input[type='number']").count():
        question.locator("input").fill("1")
        question.locator("input").press("Enter")
    else:
        question.locator("label").last.click()
    wait_idle(pg)
    pg.locator("[class*='st-key-reveal_'] button").first.click()
    expect(pg.locator("[class*='st-key-again_'] button")).to_be_visible()  # revealed: the explanation drawn
    wait_idle(pg)
    settle(pg)


def _press(*keys: str):  # noqa: ANN202
    """What a lecture clicks on an idea: each of these buttons that is on screen and enabled, once."""
    def each(pg) -> None:  # noqa: ANN001
        for k in keys:
            button = pg.locator(f"{key(k)} button")
            if button.count() and button.first.is_visible() and button.first.is_enabled():
                button.first.click()
                pg.wait_for_timeout(300)
                wait_idle(pg, 120_000)
                settle(pg)
    return each


def _press_and_wait(button_key: str):  # noqa: ANN202
    """What a lecture clicks on an idea: this button, if on screen, then its measuring to end (a worker's run)."""
    def each(pg) -> None:  # noqa: ANN001
        button = pg.locator(f"{key(button_key)} button")
        if button.count() and button.first.is_visible():
            button.first.click()
            _wait_measured(pg, button_key)
    return each


def _speculate(pg, steps: int = 4) -> None:  # noqa: ANN001
    """Speculative Decoding: Prefill and a few Steps (the → button, as a presenter does)."""
    _press("spec_btn_prefill")(pg)
    for _ in range(steps):
        pg.locator("button.kv-step").click()
        pg.wait_for_timeout(200)
        wait_idle(pg)
    settle(pg)


LECTURE_IDEAS = {
    # page: its stepper's key, how many ideas, what a lecture does on each before the screen is measured, and what it
    # does once first
    "": ("home", 3, None),
    "Check": ("check", 10, _reveal),
    # every request served, the tiers measured, the handoff run in kvviz's workers: each idea with its results
    "Moving_the_Cache": ("moving", 4, _press("moving_all", "moving_measure", "moving_run_kvviz")),
    # every method measured on the shipped model (a short text: seconds), then each idea
    "Compressing_the_Cache?seq=128&tokens=256": ("compression", 3, None, _press_and_wait("compression_run")),
    "Speculative_Decoding": ("spec", 3, _press("spec_btn_measure"), _speculate),
    # the planner is two screens (the answer, then how it did on real start-up logs); the last one runs a cache here
    "Memory_Footprint": ("memory", 7, _press("memory_run_here")),
    "Training_Prefill_Decode": ("training", 5, None),
    # four requests sharing the system prompt, one more, a few scheduler steps: every idea with its blocks
    "Paged_Blocks": ("paged", 5, None, _press("paged_add4", "paged_step", "paged_step", "paged_add_shared",
                                              "paged_step")),
    "Attention_Patterns": ("heads", 2, None),
}


def _popover(pg, i: int) -> None:  # noqa: ANN001
    """Open the i-th settings button on screen (lecture mode puts a page's settings behind them)."""
    pg.locator("[data-testid='stPopover']:visible button").nth(i).click()
    settle(pg)


def _serve(pg, url: str, lang: str) -> None:  # noqa: ANN001
    """Serving Engine: connect to a real llama-server (behind the Server button), then measure a small closed-loop
    sweep (concurrency 1 and 2, 4 requests of 8 tokens each) from the Load settings button."""
    _popover(pg, 0)
    type_number(pg, "serving_url", url)  # a text box: filled and entered like a number
    pg.get_by_role("button", name="연결" if lang == "ko" else "Connect", exact=True).click()
    wait_idle(pg)
    pg.keyboard.press("Escape")
    settle(pg)
    _popover(pg, 1)
    for box, value in (("serving_conc", "1, 2"), ("serving_requests", "4"), ("serving_max_tokens", "8")):
        type_number(pg, box, value)
    pg.keyboard.press("Escape")
    pg.locator(f"{key('serving_start')} button").click()
    _wait_measured(pg, "serving_start")


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_serving_ideas_fit_a_lecture_screen(tabs, app_url, shots, llama, lang):
    """Issue 29.7 on the Serving Engine: after it has measured a real llama-server, each of its seven ideas (the load
    chart, every request, the server's counters, the numbers, the prefix experiment run on its screen, the cache
    events before subscribing, the definitions) is whole on one 1280×720 screen, in English and Korean."""
    pg = _lecture_page(tabs, app_url, "Serving_Engine", lang)
    _serve(pg, llama.base_url, lang)
    _each_idea_fits(pg, "serving", 7, f"serving_engine_lecture_{lang}", shots, _press_and_wait("serving_prefix_run"))


@pytest.mark.parametrize("lang", ["en", "ko"])
@pytest.mark.parametrize("path", list(LECTURE_IDEAS), ids=lambda p: p.partition("?")[0] or "Home")
def test_every_idea_fits_a_lecture_screen(tabs, app_url, shots, path, lang):
    """Issue 29.7: on every page, in lecture mode, the idea on screen is whole on one 1280×720 screen, in English and
    Korean, with what a lecture clicks there done (Check: a question answered and revealed)."""
    stepper, n, each, *first = LECTURE_IDEAS[path]
    pg = _lecture_page(tabs, app_url, path, lang)
    for action in first:
        action(pg)
    _each_idea_fits(pg, stepper, n, f"{(path.partition('?')[0] or 'home').lower()}_lecture_{lang}", shots, each)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_decode_page_tabs_fit_a_lecture_screen(tabs, app_url, shots, lang):
    """Issue 29.7 on the decode page, whose lessons are tabs (one demo, no idea stepper): after Prefill and ten
    steps, each tab is whole on one 1280×720 screen with nothing cut short."""
    pg = _lecture_page(tabs, app_url, "Reusing_Past_KV", lang)
    _press("reuse_btn_prefill")(pg)
    for _ in range(10):
        pg.locator("button.kv-step").click()
        pg.wait_for_timeout(200)
        wait_idle(pg)
    settle(pg)
    no_violations(pg, f"Reusing_Past_KV {lang} lecture, after Prefill and ten Steps")
    tab_list = pg.get_by_role("radiogroup", name=t("reuse.tab_pick", lang)).get_by_role("radio")
    expect(tab_list).to_have_count(6)
    for i in range(6):
        tab_list.nth(i).click()
        pg.wait_for_timeout(500)
        wait_idle(pg)
        settle(pg)
        lowest, cut = pg.evaluate(LOWEST), pg.evaluate(CUT_SHORT)
        pg.screenshot(path=shots / f"reusing_past_kv_lecture_{lang}_tab{i + 1}.png")
        assert lowest <= 720, f"tab {i + 1} ends at {lowest:.0f} px, below the 720 px screen"
        assert not cut, f"tab {i + 1} cuts short {cut}"
    expect(pg.locator("[data-testid='stException']")).to_have_count(0)
