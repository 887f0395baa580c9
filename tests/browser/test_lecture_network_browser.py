"""The lecture way in a real browser: a server started with `python -m kvviz serve --lecture`, the lecturer's page
opened at 127.0.0.1, the room's link and QR code on the machine's network address, and a follower that opens it
from a network namespace of its own (a veth pair this test sets up, as a phone on another host) following the
lecturer's steps; a server that listens on loopback only says why phones cannot follow and the command that
fixes it; a live question with its tally hidden, then revealed, and the room's results as CSV."""
import base64
import contextlib
import csv
import io
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from kvviz.app.room.share import qr_svg
from kvviz.room.network import is_loopback, network_address
from tests.browser.harness import CHROMIUM, CHROMIUM_ARGS, Tabs, download_text, settle
from tests.browser.test_reuse_browser import _click, _step
from tests.browser.test_room_browser import _open, _same_as, _seen, _share

NETWORK_SETTLE_S = 2.0  # Chromium reports an address's change after a delay of its own (about a second)
NS_NET = "10.213.{}.{}"  # the test's own /30 between the namespace and this host (nothing else routes there)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def _namespace() -> "contextlib.AbstractContextManager[tuple[str, str] | str]":
    """A network namespace joined to this host by a veth pair: yields (its name, the Chromium wrapper that runs in
    it), or the reason it cannot be made here (not root, no `ip`, no CAP_NET_ADMIN). Removed after."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield "needs root and iproute2's ip"
        return
    tag = os.getpid() % 250 + 1
    ns, host_end, ns_end = f"kvviz-follow-{tag}", f"kvh{tag}", f"kvn{tag}"
    try:
        _ip("netns", "add", ns)
    except (subprocess.CalledProcessError, OSError) as e:
        yield f"ip netns add refused: {getattr(e, 'stderr', '') or e}".strip()
        return
    wrapper = Path(tempfile.mkdtemp(prefix="kvviz-netns-")) / "chromium"
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        _ip("link", "set", ns_end, "netns", ns)
        _ip("addr", "add", NS_NET.format(tag, 1) + "/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", ns, "addr", "add", NS_NET.format(tag, 2) + "/30", "dev", ns_end)
        _ip("-n", ns, "link", "set", ns_end, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", NS_NET.format(tag, 1))  # to this host, and only to it
        # Every running Chromium watches this host's interfaces and aborts the requests it has in flight when one
        # appears (net::ERR_NETWORK_CHANGED: a page then loads blank, half its code missing): past the veth's news
        time.sleep(NETWORK_SETTLE_S)
        wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {ns} {CHROMIUM} "$@"\n')
        wrapper.chmod(0o755)
        yield ns, str(wrapper)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _ip("link", "del", host_end)  # its peer goes with it
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _ip("netns", "del", ns)
        shutil.rmtree(wrapper.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def follower_browser(browser):
    """Tabs (harness.Tabs) of a Chromium in a network namespace of its own (a phone on another host); of the test
    session's own Chromium, said so, where a namespace cannot be made here. With the namespace's name, or None."""
    with _namespace() as made:
        if isinstance(made, str):
            print(f"\nfollower: in this host's network (no namespace: {made})")
            tabs = Tabs(browser)
            yield tabs, None
            tabs.close()
            return
        ns, wrapper = made
        # the same Playwright as the session's browser (one per thread), a second Chromium run through the wrapper
        b = browser.browser_type.launch(executable_path=wrapper, args=CHROMIUM_ARGS)
        try:
            yield Tabs(b), ns
        finally:
            b.close()


def _image(page, src: str, base: str) -> str:  # noqa: ANN001 - a Playwright Page
    """The text of an <img>'s source: a data: URI decoded, or the file the server serves."""
    if src.startswith("data:"):
        head, _, data = src.partition(",")
        return base64.b64decode(data).decode() if head.endswith(";base64") else urllib.parse.unquote(data)
    return page.request.get(src if src.startswith("http") else base + src).text()


def test_the_lecture_way_link_reaches_a_follower_in_its_own_network(tabs, follower_browser, lecture_url, shots):
    projector = _open(tabs, f"{lecture_url}/Reusing_Past_KV?lecture=1", 1280, 720)
    assert urlsplit(lecture_url).hostname == "127.0.0.1"  # the lecturer's own browser, on loopback
    link = _share(projector, "Reusing_Past_KV", settings="Prompt, length and speed")
    parts = urlsplit(link)
    assert parts.hostname == network_address() and not is_loopback(parts.hostname), link
    assert parts.port == urlsplit(lecture_url).port
    # the QR code is this link: the image the page serves is the code of exactly this text
    src = projector.locator("[data-testid='stImage'] img").first.get_attribute("src")
    assert _image(projector, src, lecture_url).strip() == qr_svg(link).strip()
    settle(projector)
    projector.locator("[data-testid='stExpander']").filter(has_text="The room's link").screenshot(
        path=shots / "room_share_box_network.png")

    _click(projector, "Prefill")
    _step(projector)
    ours = _seen(projector)
    follower, ns = follower_browser
    phone = _open(follower, link, 390, 844)  # a tab of the follower's own browser, not of the session's
    if ns is not None:  # the follower's browser really is elsewhere: its only way here is the veth pair
        out = subprocess.run(["ip", "netns", "exec", ns, "ip", "-4", "-o", "addr"], capture_output=True, text=True)
        assert "127.0.0.1" in out.stdout and "10.213." in out.stdout and parts.hostname not in out.stdout
        print(f"\nfollower in network namespace {ns} opened {link}")
    expect(phone.get_by_text("You are following the lecture")).to_be_visible()
    assert _same_as(phone, ours) == ours
    _step(projector)  # the lecturer's next step reaches the follower
    ours = _seen(projector)
    assert ours["status"][1] == "2" and _same_as(phone, ours) == ours
    settle(phone)
    phone.screenshot(path=shots / "room_follower_netns_390x844.png")
    follower.release()  # its session ends here


def test_a_loopback_only_server_says_why_phones_cannot_follow(tabs, app_url, shots):
    """app_url listens on 127.0.0.1 only (`python -m kvviz serve`): no link a phone cannot open, but why and the fix."""
    for lang, share, why, box in (("en", "Share with the room", "this server listens on this machine only (127.0.0.1)",
                                   "The room's link"),
                                  ("ko", "청중과 공유", "이 서버는 이 컴퓨터 안(127.0.0.1)에서만", "방 링크")):
        projector = _open(tabs, f"{app_url}/Check?lecture=1&idea=5&lang={lang}", 1280, 720)
        projector.get_by_role("button", name=share).click()
        expect(projector.get_by_text(why, exact=False)).to_be_visible()
        expect(projector.get_by_text("python -m kvviz serve --lecture", exact=False).first).to_be_visible()
        assert projector.locator("[data-testid='stCode']").count() == 0  # no link
        assert projector.locator("[data-testid='stImage']").count() == 0  # and no QR code
        settle(projector)
        projector.locator("[data-testid='stExpander']").filter(has_text=box).screenshot(
            path=shots / f"room_share_box_loopback_{lang}.png")
        assert projector.locator("[data-testid='stException']").count() == 0


def test_a_live_question_hidden_then_revealed_and_its_results_csv(tabs, lecture_url, shots):
    projector = _open(tabs, f"{lecture_url}/Check?lecture=1&idea=5", 1280, 720)
    link = _share(projector, "Check")
    projector.get_by_role("button", name="Ask the room").click()  # "Show the tally" left off: the default
    expect(projector.get_by_text("0 answers from the room")).to_be_visible()
    phones = []
    for lang, option in (("en", 0), ("ko", 0), ("en", 2)):
        phone = _open(tabs, link + f"&lang={lang}", 390, 844)
        phones.append(phone)
        phone.locator("[data-testid='stMain'] [data-testid='stRadioOption'] p").nth(option).click()
        anonymous = "Answers are anonymous" if lang == "en" else "답변은 익명입니다"
        expect(phone.get_by_text(anonymous, exact=False)).to_be_visible()
    expect(projector.get_by_text("3 answers from the room")).to_be_visible(timeout=15_000)
    expect(projector.get_by_text("The counts are shown when the lecturer reveals", exact=False)).to_be_visible()
    en = phones[0]
    for screen in (projector, en):  # hidden: no bar per option anywhere
        assert screen.locator("[data-testid='stProgress']").count() == 0
    settle(projector)
    projector.screenshot(path=shots / "room_tally_hidden_lecturer.png")
    settle(en)
    en.screenshot(path=shots / "room_tally_hidden_follower_390x844.png", full_page=True)

    projector.get_by_role("button", name="Reveal to the room").click()
    expect(en.get_by_text("The answer:", exact=False)).to_be_visible(timeout=15_000)
    bars = en.locator("[data-testid='stProgress']")
    expect(bars).to_have_count(4)
    texts = [t.strip() for t in en.locator("[data-testid='stProgress'] p").all_inner_texts()]
    assert texts[0].endswith("✓ — 2") and texts[2].endswith("— 1"), texts
    settle(en)
    en.screenshot(path=shots / "room_tally_revealed_follower_390x844.png", full_page=True)

    text = download_text(projector, projector.get_by_role("button", name="Download the results (CSV)"))
    (shots / "room_results.csv").write_text(text, encoding="utf-8")
    print("\nroom_results.csv:\n" + text)
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["question", "asked (UTC)", "revealed (UTC)", "option", "answers", "correct"]
    assert [(r[4], r[5]) for r in rows[1:]] == [("2", "1"), ("0", "0"), ("1", "0"), ("0", "0")]
    assert all(r[1] and r[2] and r[1] <= r[2] for r in rows[1:])  # asked, then revealed (ISO times in UTC)

    projector.get_by_role("button", name="End the room").click()
    dialog = projector.get_by_role("dialog")
    expect(dialog.get_by_text("The room's results")).to_be_visible()
    expect(dialog.locator("td").filter(has_text="67")).to_have_count(1)  # 2 of 3 right
    dialog.screenshot(path=shots / "room_results_when_ended.png")
