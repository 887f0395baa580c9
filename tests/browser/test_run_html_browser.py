"""A run exported as one HTML file, opened in the system Chromium with the network off: it draws (Plotly's charts hold
data, the cache grid is there) and steps (slider, arrow keys, Play), in English and Korean, requesting nothing but
the file itself."""
import pytest

from kvviz.charts.run_html import read_run, run_html
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend
from kvviz.lessons.run_record import decode_record, paged_record, spec_record

N_NEW = 12


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from kvviz.engine.paged.demo import shared_prefix_ids, suffix_ids
    from kvviz.engine.paged.scheduler import PagedEngine
    from kvviz.engine.spec.decoding import SpeculativeGeneration
    from kvviz.engine.spec.drafts import NgramDraft

    out = tmp_path_factory.mktemp("run_html")
    backend = load_backend("tiny", device="cpu")
    gen = Generation(backend, max_new_tokens=N_NEW, capture_attention=True)
    gen.run("The cache grows one token at a time")
    record = decode_record(gen, {"prompt": "The cache grows one token at a time", "max_new_tokens": N_NEW})
    paths = {}
    for lang in ("en", "ko"):
        paths[f"decode-{lang}"] = out / f"decode-{lang}.html"
        paths[f"decode-{lang}"].write_text(run_html(record, lang), encoding="utf-8")
    spec = SpeculativeGeneration(backend, NgramDraft(), k=3, max_new_tokens=N_NEW)
    spec.run("apple, banana, cherry, apple, banana, cherry, apple,")
    paths["speculative"] = out / "spec.html"
    paths["speculative"].write_text(run_html(spec_record(spec), "en"), encoding="utf-8")
    engine = PagedEngine(backend.model, 12, 8, record_views=True)
    for i in range(3):
        engine.add(shared_prefix_ids(backend.tokenizer, 16) + suffix_ids(backend.model.cfg.vocab_size, 5, i), 4,
                   "shared")
    engine.run()
    paths["paged"] = out / "paged.html"
    paths["paged"].write_text(run_html(paged_record(engine, model_name=backend.spec.name), "en"), encoding="utf-8")
    return paths


def _open(browser, path):  # noqa: ANN001, ANN202 - Playwright objects
    """The file in a fresh context with the network off; every request other than the file's own is refused and
    recorded."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_offline(True)
    refused = []

    def refuse(route) -> None:  # noqa: ANN001 - a Playwright Route
        refused.append(route.request.url)
        route.abort()

    context.route(lambda url: not url.startswith("file:"), refuse)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
    return context, page, refused, errors


STEP = "Number(document.body.dataset.step)"
PLOTTED = "id => { const g = document.getElementById(id); return !!g && !!g.data && g.data.length > 0 && " \
          "!!g.querySelector('.main-svg'); }"


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_a_decode_run_draws_and_steps_offline(browser, files, shots, lang):
    path = files[f"decode-{lang}"]
    record = read_run(path.read_text(encoding="utf-8"))
    n = len(record["steps"])
    context, page, refused, errors = _open(browser, path)
    try:
        assert page.evaluate(STEP) == n - 1  # opens on the run's last step
        for fig in ("kv-bytes", "kv-attention-fig"):
            assert page.evaluate(PLOTTED, fig), fig
        # The grid holds what the cache held after each step: the prompt after the prefill, one more per step.
        grid = "Number(document.querySelector('#kv-grid .kv-grid').dataset.positions)"
        assert page.evaluate(grid) == record["steps"][-1]["cache_lengths"][0]
        page.keyboard.press("Home")
        assert page.evaluate(STEP) == 0
        assert page.evaluate(grid) == record["prompt_tokens"]
        assert page.evaluate("document.getElementById('kv-slider').value") == "0"
        page.keyboard.press("ArrowRight")
        assert page.evaluate(STEP) == 1
        assert page.evaluate(grid) == record["prompt_tokens"] + 1
        # The attention heatmap of step 1 spans its keys: the prompt and the first new token.
        assert page.evaluate("document.getElementById('kv-attention-fig').data[0].z[0].length") == \
            record["steps"][1]["position"] + 1
        # The bytes line is the run's own number at that step.
        assert f"{record['steps'][1]['live_bytes']:,}" in page.inner_text("#kv-bytes_text")
        page.click("#kv-play")
        page.wait_for_function(f"{STEP} >= 3", timeout=15_000)
        page.click("#kv-play")  # pause
        page.eval_on_selector("#kv-slider", f"s => {{ s.value = {n // 2}; s.dispatchEvent(new Event('input')); }}")
        assert page.evaluate(STEP) == n // 2
        page.keyboard.press("End")
        page.screenshot(path=shots / f"run_html_{lang}.png", full_page=True)
        heading = page.inner_text("h1")
        assert ("기록된 실행" in heading) == (lang == "ko")
        assert not refused, refused
        assert not errors, errors
    finally:
        context.close()


@pytest.mark.parametrize("kind", ["speculative", "paged"])
def test_speculative_and_paged_runs_draw_and_step_offline(browser, files, shots, kind):
    path = files[kind]
    record = read_run(path.read_text(encoding="utf-8"))
    n = len(record["steps"])
    context, page, refused, errors = _open(browser, path)
    try:
        figs = ("kv-bytes",) if kind == "speculative" else ("kv-usage", "kv-tables", "kv-pool")
        for fig in figs:
            assert page.evaluate(PLOTTED, fig), fig
        page.keyboard.press("Home")
        first = page.inner_html("#kv-timing")
        page.keyboard.press("ArrowRight")
        assert page.evaluate(STEP) == 1 and page.inner_html("#kv-timing") != first
        if kind == "paged":  # the block tables redrawn for step 1: one row per request added
            assert len(page.evaluate("document.getElementById('kv-tables').data[0].z")) == \
                len(record["steps"][1]["requests"])
        page.keyboard.press("End")
        assert page.evaluate(STEP) == n - 1
        page.screenshot(path=shots / f"run_html_{kind}.png", full_page=True)
        assert not refused, refused
        assert not errors, errors
    finally:
        context.close()


def test_the_pages_download_opens_offline_in_the_pages_language(page, browser, tmp_path, shots):
    """Reusing Past K/V in Korean: prefill, three steps, "Download this run"; the file replays those four passes in
    Korean, with the generation's own token ids and bytes."""
    from playwright.sync_api import expect

    from kvviz.i18n import t
    from tests.browser.harness import TOKENS_JS, wait_idle

    page.goto_app("Reusing_Past_KV", "?lang=ko")
    button = page.get_by_role("button", name=t("run_html.download", "ko"))
    assert button.is_disabled()  # nothing ran yet
    page.get_by_role("button", name=t("reuse.prefill", "ko"), exact=True).click()
    page.wait_for_function(f"({TOKENS_JS}) > 0")
    wait_idle(page)
    for _ in range(3):
        before = page.evaluate(TOKENS_JS)
        page.locator("button.kv-step").click()
        page.wait_for_function(f"({TOKENS_JS}) > {before}")
        wait_idle(page)
    expect(button).to_be_enabled()
    with page.expect_download(timeout=120_000) as download:
        button.click()
    path = tmp_path / download.value.suggested_filename
    download.value.save_as(path)
    assert path.suffix == ".html"
    run = read_run(path.read_text(encoding="utf-8"))
    assert len(run["steps"]) == 4 and run["steps"][-1]["live_bytes"] == run["cache_live_bytes"]
    context, opened, refused, errors = _open(browser, path)
    try:
        assert opened.evaluate(STEP) == 3 and opened.evaluate("document.documentElement.lang") == "ko"
        assert "기록된 실행" in opened.inner_text("h1")
        opened.keyboard.press("Home")
        assert opened.evaluate(STEP) == 0
        assert not refused and not errors, (refused, errors)
        opened.keyboard.press("End")
        opened.screenshot(path=shots / "run_html_from_page_ko.png")
    finally:
        context.close()
