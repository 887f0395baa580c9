"""The hosted app run as an unprivileged user with a fresh HOME, a checkout it cannot write and no apt-get or dpkg
on its PATH (tests/guest.py), every page opened in Chromium and its main button pressed: no traceback on any page,
a feature that needs a system tool (llama-server for Serving Engine) says so in one line and the page works on, and
nothing is written outside HOME's cache and the temp directory. Skipped, with why, where no user can be created."""
import contextlib
import time
import urllib.request

import pytest

from kvviz.serving.llamacpp import free_port
from tests.browser.harness import goto_idle, settle, wait_idle
from tests.guest import guest

# Each page (its URL path) and its main button's key (None: the page computes on opening). In the order of the
# sidebar.
PAGES = {
    "": None,
    "Reusing_Past_KV": "reuse_btn_prefill",
    "Prefill_and_Decode": "prefill_run",
    "Memory_Footprint": "memory_run_here",
    "Latency_and_Capacity": "latency_start_prompt-length",
    "Training_Prefill_Decode": None,
    "Check": None,
    "Serving_Engine": "serving_start",
    "Compressing_the_Cache": "compression_run",
    "Paged_Blocks": "paged_add4",
    "Speculative_Decoding": "spec_btn_prefill",
    "Moving_the_Cache": "moving_next",
    "Attention_Patterns": None,
}
BUSY = "document.querySelector('[data-testid=\"stStatusWidget\"]') !== null"


@pytest.fixture(scope="module")
def hosted_as_guest(tmp_path_factory):
    """`python -m kvviz serve --hosted` started as the user, on a free loopback port; (the user, its URL)."""
    with guest() as user:
        port = free_port()
        log = open(tmp_path_factory.mktemp("guest") / "server.log", "w+b")  # noqa: SIM115 - closed below
        proc = user.popen(["python", "-m", "kvviz", "serve", "--hosted", "--port", str(port)], stdout=log,
                          stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                with contextlib.suppress(OSError):
                    if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"the app did not start as {user.user}: {log.read().decode()[-2000:]}")
                time.sleep(0.3)
            yield user, url, log
        finally:
            proc.terminate()
            with contextlib.suppress(Exception):
                proc.wait(timeout=15)
            user.end_processes()
            log.close()


def _press(page, key: str) -> bool:  # noqa: ANN001 - a Playwright Page
    """Press the button if it is there and enabled; wait until the page has finished what it started."""
    button = page.locator(f".st-key-{key} button").first
    if button.count() and not button.is_visible():  # in a tab not shown (Memory Footprint's live cache): open it
        for tab in page.get_by_role("tab").all():
            tab.click()
            wait_idle(page)
            if button.is_visible():
                break
    if not button.count() or not button.is_visible() or not button.is_enabled():
        return False
    button.click()
    page.wait_for_timeout(300)
    wait_idle(page, timeout_ms=300_000)
    # a measuring page runs in a fragment after the click: until its buttons are enabled again and nothing runs
    page.wait_for_function(f"""() => Array.from(document.querySelectorAll('.st-key-{key} button'))
        .every(b => !b.disabled)""", timeout=300_000)
    wait_idle(page, timeout_ms=300_000)
    return True


def test_every_page_as_another_user_without_apt(browser, hosted_as_guest, shots):
    user, url, log = hosted_as_guest
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)
    pressed, took = [], {}
    for path, key in PAGES.items():
        start = time.monotonic()
        goto_idle(page, f"{url}/{path}", 180_000)
        settle(page, timeout_ms=120_000)
        if key is not None and _press(page, key):
            pressed.append(key)
            settle(page, timeout_ms=120_000)
        took[path or "Home"] = round(time.monotonic() - start, 1)
        assert page.locator("[data-testid='stException']").count() == 0, f"{path}: a traceback on the page"
        text = page.locator("[data-testid='stMain']").inner_text()
        assert "Traceback" not in text and "apt-get" not in text, path
        if path == "Serving_Engine":  # no llama-server on this user's PATH or beside the checkout: said, in a line
            page.screenshot(path=shots / "guest_serving_engine.png", full_page=True)
    print(f"\npressed {pressed}; seconds per page as {user.user}: {took}")
    assert {"reuse_btn_prefill", "prefill_run", "memory_run_here", "latency_start_prompt-length", "compression_run",
            "paged_add4", "spec_btn_prefill", "moving_next"} <= set(pressed)  # Serving: no server allowed, said
    page.close()
    log.seek(0)
    server_log = log.read().decode()
    assert "Traceback" not in server_log and "apt-get" not in server_log, server_log[-3000:]
    user.end_processes()
    assert user.written() == []  # nothing outside HOME's cache and the temp directory
