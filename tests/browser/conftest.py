"""Fixtures for real-browser tests: one app server and one Chromium per test session."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import IDLE, app_server, chromium, screenshot_dir, settle  # noqa: E402

from playwright.sync_api import expect  # noqa: E402

expect.set_options(timeout=30_000)  # a loaded CI machine can take seconds per rerun; 5 s flakes

if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("the system Chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


@pytest.fixture(scope="session")
def app_url():
    with app_server() as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, app_url):
    """A fresh browser context (its own Streamlit session) on the app; console errors collected."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.console_errors = []
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))

    def goto_app(path: str = "", query: str = "") -> None:
        pg.goto(f"{app_url}/{path}{query}")
        pg.wait_for_selector(IDLE, timeout=60_000)
        settle(pg)  # lazily loaded widgets, fonts and charts drawn: screenshots show the real page

    pg.goto_app = goto_app
    yield pg
    context.close()


@pytest.fixture(scope="session")
def shots():
    out = screenshot_dir()
    print(f"\nscreenshots: {out}")
    return out
