"""Fixtures for real-browser tests: one app server and one Chromium per test session."""
import os
import re

import pytest
from playwright.sync_api import expect  # noqa: E402

from tests.browser.harness import (  # noqa: E402
    BASE_PATH_PROBE,
    Tabs,
    app_server,
    chromium,
    goto_idle,
    network_changed,
    screenshot_dir,
    settle,
)

MEDIA_RACE = re.compile(r"Download Button source error - 404")
DYNAMIC_IMPORT = re.compile(r"Failed to fetch dynamically imported module: (\S+)")
expect.set_options(timeout=30_000)  # a loaded CI machine can take seconds per rerun; 5 s flakes

if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("the system Chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


@pytest.fixture(scope="session")
def app_url():
    with app_server() as url:
        yield url


@pytest.fixture(scope="session")
def lecture_url():
    """The app started the lecture way (`serve --lecture`), for the rooms' tests: a room's link on the machine's
    network address, which the followers' browsers open."""
    from kvviz.room.network import network_address

    if network_address() is None:
        pytest.skip("this machine has no network address: a room's link has nowhere to point")
    with app_server(lecture=True) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture(scope="session")
def tabs(browser):
    """Tabs reused from test to test (harness.Tabs): each test opens its URL in one no other test holds."""
    pool = Tabs(browser)
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def _release_tabs(request):
    """After each browser test, the tabs it opened end their sessions and go back to the pool."""
    yield
    if "tabs" in request.fixturenames:
        request.getfixturevalue("tabs").release()


@pytest.fixture
def page(tabs, app_url):
    """A tab on the app, a fresh Streamlit session once it opens a URL (goto_app); console errors collected."""
    pg = tabs.open(1400, 1000)
    pg.console_errors = []
    aborted: set[str] = set()  # what this host's network change aborted in flight (see goto_idle)

    def on_failed(request) -> None:  # noqa: ANN001 - a Playwright Request
        if network_changed(request):
            aborted.add(request.url)

    pg.on("requestfailed", on_failed)

    def on_console(message) -> None:  # noqa: ANN001 - a Playwright ConsoleMessage
        if message.type != "error":
            return
        if "Failed to load resource" in message.text and BASE_PATH_PROBE.search(message.location.get("url", "")):
            return  # Streamlit's own probe when a page URL is opened directly; it then finds the real base
        url = message.location.get("url", "")
        if MEDIA_RACE.search(message.text) or ("Failed to load resource" in message.text and "/media/" in url):
            return  # a rerun replaced a download button's file while the browser fetched the old one (Streamlit)
        if "ERR_NETWORK_CHANGED" in message.text:
            return  # this host's network changed (the lecture test's namespace, on another worker): see goto_idle
        if (chunk := DYNAMIC_IMPORT.search(message.text)) and chunk.group(1) in aborted:
            return  # a lazily loaded widget's code the same change aborted: the test's own checks say if it is missed
        pg.console_errors.append(f"{message.text} ({message.location.get('url', '')})")

    pg.on("console", on_console)
    # An uncaught exception in the frontend (React's "Cannot set a node at a delta path" blanks the page) is an error.
    def on_error(exc) -> None:  # noqa: ANN001 - a Playwright Error
        pg.console_errors.append(f"uncaught: {exc}")

    pg.on("pageerror", on_error)

    def goto_app(path: str = "", query: str = "") -> None:
        goto_idle(pg, f"{app_url}/{path}{query}")
        settle(pg)  # lazily loaded widgets, fonts and charts drawn: screenshots show the real page

    pg.goto_app = goto_app
    yield pg
    if not pg.is_closed():  # the tab goes on to the next test: its listeners do not
        pg.remove_listener("console", on_console)
        pg.remove_listener("pageerror", on_error)
        pg.remove_listener("requestfailed", on_failed)
    if pg.console_errors:
        print("\nconsole errors:", *pg.console_errors, sep="\n  ")  # shown with a failing test's output
    uncaught = [e for e in pg.console_errors if e.startswith("uncaught: ")]
    assert not uncaught, f"the frontend threw (a blank page): {uncaught}"  # every browser test, whatever it asserts


@pytest.fixture(scope="session")
def shots():
    out = screenshot_dir()
    print(f"\nscreenshots: {out}")
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A real llama-server serving the shipped tiny model (exported to GGUF), once per module that asks for it."""
    from kvviz.engine.export import export_gguf
    from kvviz.engine.loading import load_backend
    from kvviz.serving.llamacpp import LlamaServer, binary

    if binary() is None:
        pytest.skip("llama-server is not built here: run scripts/build_llama_server.sh (.ci/run does)")
    backend = load_backend("tiny", device="cpu")
    gguf = export_gguf(backend.model, backend.tokenizer, tmp_path_factory.mktemp("gguf") / "kvviz-tiny.gguf",
                       name="kvviz-tiny")
    with LlamaServer(gguf, n_parallel=4, ctx_size=2048) as srv:
        yield srv
