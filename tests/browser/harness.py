"""Start the app with `streamlit run` on a free loopback port and drive the system Chromium.

Shared by the browser tests and the bench/ scripts (which put this folder on sys.path).
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from kvviz.serving.llamacpp import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
# What an iPhone's Safari sends: a phone-sized test screen says it is a phone, as a room's followers' do
PHONE_UA = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
            "Version/17.5 Mobile/15E148 Safari/604.1")
# Per Plotly chart on the page: its width, its plot area's (the drag layer's) and the legend's top under the plot's
PLOT_BOXES = """() => Array.from(document.querySelectorAll("[data-testid='stPlotlyChart']")).map(c => {
    const plot = c.querySelector('.nsewdrag').getBoundingClientRect(), legend = c.querySelector('.legend');
    return {width: c.getBoundingClientRect().width, plot: plot.width,
            legend_below: legend ? legend.getBoundingClientRect().top >= plot.bottom : null};
})"""
# Tokens on the decode page's strip: a chip spans data-tokens tokens (a run of byte tokens is one chip).
TOKENS_JS = "Array.from(document.querySelectorAll('.kv-chip')).reduce((n, c) => n + Number(c.dataset.tokens || 1), 0)"
# The lowest edge of anything drawn in the page's main block: elements, and expanders (blocks, not elements: a
# folded one at the foot of a screen was not counted); a folded expander's content is not drawn.
LOWEST = """() => Math.max(...Array.from(document.querySelectorAll(
  "[data-testid='stMainBlockContainer'] :is([data-testid='stElementContainer'], [data-testid='stExpander'])"))
  .filter(e => e.offsetHeight > 0 && e.checkVisibility({visibilityProperty: true}))
  .map(e => e.getBoundingClientRect().bottom))"""
# Opened directly at a page's URL (/Check), Streamlit's frontend first probes /Check/_stcore/... for its
# base path and gets 404s, then uses the right one: those two console errors are not the app's.
BASE_PATH_PROBE = re.compile(r"/[^/]+/_stcore/(health|host-config)$")


class AppURL(str):
    """The app's base URL; `.pid` is the server's process id (bench/ reads its memory)."""

    pid: int


def url_path(page_file: str) -> str:
    """The URL path Streamlit serves a page file at: app.py -> "", pages/1_Reusing_Past_KV.py -> "Reusing_Past_KV"."""
    if page_file == "app.py":
        return ""
    return re.sub(r"^\d+_", "", Path(page_file).stem)


@contextlib.contextmanager
def app_server(env: dict[str, str] | None = None, timeout_s: float = 90, *, hosted: bool = False,
               root: Path = ROOT, lecture: bool = False) -> Iterator[str]:
    """Yield the base URL of a running app, started as a user or a host does (`python -m kvviz serve`, which execs
    `streamlit run app.py`, so the process is Streamlit's); stop it afterwards. `root`: another checkout's app
    (bench/app_step_latency.py --compare). `lecture`: started the lecture way (`serve --lecture`: every interface,
    so a room's link carries the machine's network address); the URL yielded is still the loopback one."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="kvviz-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvviz", "serve", "--port", str(port),
         *(["--lecture"] if lecture else ["--address", "127.0.0.1"]), *(["--hosted"] if hosted else [])],
        cwd=root, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )
    url = AppURL(f"http://127.0.0.1:{port}")
    url.pid = proc.pid
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited early; see {log.name}")
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not become healthy in {timeout_s}s; see {log.name}")
            time.sleep(0.3)
        yield url
    finally:
        stop_process(proc)


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A Playwright Browser on the system Chromium (Playwright cannot download its own here)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Tabs:
    """Browser tabs reused from test to test, one context per screen (its size, and a phone's user agent at 480 px
    and less). A new context parses and compiles Streamlit's and Plotly's code again (~3 s of CPU per page opened on
    a 2-core machine; the same tab, opening its next URL, keeps what Chromium compiled: bench/browser_tab_reuse.py).
    Opening a URL in a tab is a fresh Streamlit session (a new websocket; session state is per connection), so a
    test still starts from a new session. `open` gives a tab no test holds; `release` ends the sessions of the tabs
    handed out (each tab shown a page of no script, its socket closed) and hands them back."""

    def __init__(self, browser) -> None:  # noqa: ANN001 - a Playwright Browser
        self.browser, self.contexts, self.held = browser, {}, []

    def open(self, width: int, height: int, timeout_ms: float = 30_000):  # noqa: ANN201 - a Playwright Page
        phone = width <= 480
        context = self.contexts.get((width, height))
        if context is None:
            context = self.contexts[(width, height)] = self.browser.new_context(
                viewport={"width": width, "height": height},
                **({"user_agent": PHONE_UA, "is_mobile": True} if phone else {}))
        free = [p for p in context.pages if not p.is_closed() and p not in self.held]
        page = free[0] if free else context.new_page()
        page.set_viewport_size({"width": width, "height": height})  # a test before may have resized it
        page.set_default_timeout(timeout_ms)
        self.held.append(page)
        return page

    def release(self) -> None:
        """End the held tabs' sessions: each shows its server's health check (the same site: the tab keeps its
        compiled code) until a test opens it again."""
        for page in self.held:
            if page.is_closed():
                continue
            parts = urlsplit(page.url)
            try:
                if parts.scheme.startswith("http"):
                    page.goto(f"{parts.scheme}://{parts.netloc}/_stcore/health")
            except Exception:  # noqa: BLE001 - a tab that cannot navigate (its server gone) is closed instead
                page.close()
        self.held.clear()

    def close(self) -> None:
        for context in self.contexts.values():
            context.close()


def wait_idle(page, timeout_ms: int = 60_000) -> None:  # noqa: ANN001 - a Playwright Page
    """Wait until the current Streamlit rerun has finished."""
    page.wait_for_selector(IDLE, timeout=timeout_ms)


def wait_charts(page, timeout_ms: int = 30_000) -> None:  # noqa: ANN001 - a Playwright Page
    """Wait until the script is idle and every Plotly chart on the page has drawn its SVG (they render after
    the rerun ends). One check in the page, repeated: a rerun that follows another (a widget's callback, the
    URL's update) replaces the charts while a chart-by-chart wait would still hold the old ones."""
    # "attached", not "visible": a chart in a closed tab or expander is drawn but hidden
    page.wait_for_function(f"""() => document.querySelector("{IDLE}") !== null && Array.from(
        document.querySelectorAll("[data-testid='stPlotlyChart']")).every(c => c.querySelector('.main-svg'))""",
                           timeout=timeout_ms)


def settle(page, timeout_ms: int = 30_000) -> None:  # noqa: ANN001 - a Playwright Page
    """After a rerun: let lazily loaded widget code, fonts and Plotly finish drawing (before a screenshot)."""
    # The page's own load, not "networkidle" (500 ms with no request, after every rerun): Streamlit talks over its
    # websocket, which networkidle does not see, and the lazily loaded code is waited for below (its skeletons)
    page.wait_for_load_state("load", timeout=timeout_ms)
    # Widgets' code loads lazily: until it runs, each shows a grey placeholder (stSkeleton).
    page.wait_for_function("!document.querySelector(\"[data-testid='stSkeleton']\")", timeout=timeout_ms)
    page.evaluate("document.fonts.ready.then(() => true)")
    wait_charts(page, timeout_ms)


def next_idea(page, stepper: str, timeout_ms: int = 30_000) -> None:  # noqa: ANN001 - a Playwright Page
    """In lecture mode, click the stepper's → and wait until its number shows the next idea, then until it is drawn.
    A fixed 500 ms pause was not enough: on a page that reruns on its own (a live run's fragment) a test once clicked
    twice and never found the screen two ideas on; now each click's screen is there before the next click."""
    active = f".st-key-_w_kv_idea_{stepper} button[role='radio'][aria-checked='true']"
    before = int(page.locator(active).inner_text())
    page.locator(f".st-key-kv_idea_next_{stepper} button").first.click()
    page.wait_for_function(f"""() => {{ const b = document.querySelector("{active}");
        return b !== null && b.innerText.trim() === "{before + 1}"; }}""", timeout=timeout_ms)
    wait_idle(page, timeout_ms)
    settle(page, timeout_ms)


def screenshot_dir() -> Path:
    out = Path(os.environ.get("KVVIZ_SCREENSHOTS", ROOT / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def lowest_on_screen(page, path: Path, what: str, height: int = 720) -> float:  # noqa: ANN001 - a Playwright Page
    """Settled, the screen as a projector shows it saved to `path`, and the lowest edge of what is drawn: above
    `height` px, with no exception on the page (the report's number printed, pytest -s)."""
    settle(page)
    lowest = page.evaluate(LOWEST)
    page.screenshot(path=path)
    print(f"{what}: lowest edge {lowest:.0f} px")
    assert lowest <= height, f"{what} ends at {lowest:.0f} px, below the {height} px screen"
    assert page.locator("[data-testid='stException']").count() == 0
    return lowest


def download_text(page, button, timeout_ms: float = 60_000, tries: int = 3) -> str:  # noqa: ANN001 - Playwright
    """Click a download button and read the file. A page that reruns on its own (a lecture room's tally, redrawn
    every few seconds) can replace the button's file while the browser fetches it, and the browser then cancels
    that download (Streamlit's media race, as MEDIA_RACE in conftest.py): clicked again, up to `tries` times."""
    for attempt in range(tries):
        with page.expect_download(timeout=timeout_ms) as download:
            button.click()
        try:
            return Path(download.value.path()).read_text(encoding="utf-8-sig")
        except Exception as exc:  # noqa: BLE001 - Playwright's Error "canceled"
            if "canceled" not in str(exc) or attempt == tries - 1:
                raise
            wait_idle(page)
    raise AssertionError("unreachable")


def network_changed(request) -> bool:  # noqa: ANN001 - a Playwright Request
    """Whether a failed request was aborted by a network change on this host (see goto_idle)."""
    return "ERR_NETWORK_CHANGED" in (request.failure or "")


def goto_idle(page, url: str, timeout_ms: float = 120_000, tries: int = 3) -> None:  # noqa: ANN001 - a Page
    """Open `url` and wait until its script is idle. A network interface that appears on this host (the lecture
    tests' namespace, made by a test on another worker) makes every Chromium here abort the requests it has in
    flight (net::ERR_NETWORK_CHANGED), and a page caught loading stays blank: it is loaded again, as a user would."""
    changed: list[str] = []

    def on_failed(request) -> None:  # noqa: ANN001 - a Playwright Request
        if network_changed(request):
            changed.append(request.url)

    page.on("requestfailed", on_failed)
    try:
        for attempt in range(tries):
            changed.clear()
            page.goto(url)
            deadline = time.monotonic() + timeout_ms / 1000
            while not changed:
                try:
                    page.wait_for_selector(IDLE, timeout=1_000)
                    return
                except Exception:  # noqa: BLE001 - Playwright's TimeoutError: not idle yet
                    if time.monotonic() > deadline:
                        raise
            print(f"\n{url}: the network changed while it loaded ({len(changed)} requests aborted), load {attempt + 2}")
        page.wait_for_selector(IDLE, timeout=timeout_ms)
    finally:
        page.remove_listener("requestfailed", on_failed)
