"""A lecture room in a real browser: the lecturer's projector (1280×720) shares a page, followers on phone-sized
screens (390×844, some in Korean) follow it, answer live, explore on their own and follow again; the room ending,
the lecturer leaving and Redis stopping mid-lecture are each said on the screens concerned."""
import re

import pytest
from playwright.sync_api import expect

from kvviz.room.store import LECTURER_GONE_S
from tests.browser.harness import PLOT_BOXES, TOKENS_JS, app_server, goto_idle, settle, wait_idle
from tests.browser.test_reuse_browser import _click, _grid, _step

STATUS = re.compile(r"(\d+(?:\.\d+)?)")  # the numbers of the status line, in its order in both languages
LINK = r"/{page}\?room=[A-Za-z0-9_-]{{22}}"


def _open(tabs, url: str, width: int, height: int):  # noqa: ANN001, ANN202 - Playwright objects
    """A tab of that size on `url`, drawn: a fresh session, ended after the test (the tabs fixture). A phone-sized
    screen is a phone's browser: it says so (kvviz.app.widgets.on_phone)."""
    page = tabs.open(width, height, timeout_ms=90_000)  # a loaded machine: no time is asserted
    goto_idle(page, url)
    settle(page)
    return page


def _share(projector, page: str, settings: str | None = None) -> str:  # noqa: ANN001
    """Press "Share with the room" (behind the page's settings button, if named); the followers' link."""
    if settings is not None:
        projector.get_by_role("button", name=settings).click()
    projector.get_by_role("button", name="Share with the room").click()
    expect(projector.get_by_text("Scan to follow the lecture")).to_be_visible()
    link = projector.locator("[data-testid='stCode'] code").inner_text().strip()
    assert re.search(LINK.format(page=page) + "$", link), link
    qr = projector.locator("[data-testid='stImage'] img").first
    expect(qr).to_be_visible()
    assert qr.bounding_box()["width"] >= 300  # large enough to scan from the back of a room
    return link


def _seen(page) -> dict:  # noqa: ANN001
    """What a Reusing Past K/V screen shows of a run: its tokens, the status line's numbers, the cache grid (read once
    the status line is there: a follower's page reruns on its own, and mid-rerun it can be gone for a moment)."""
    page.wait_for_function("""() => Array.from(document.querySelectorAll("[data-testid='stCaptionContainer']"))
        .some(c => (c.innerText.match(/·/g) || []).length === 5)""")
    captions = page.locator("[data-testid='stCaptionContainer']").all_inner_texts()
    status = next(c for c in captions if c.count("·") == 5)
    return {"tokens": page.locator(".kv-chip").all_inner_texts(), "chips": page.evaluate(TOKENS_JS),
            "status": STATUS.findall(status), "grid": _grid(page)}


def _same_as(follower, lecturer_seen: dict) -> dict:  # noqa: ANN001
    """Wait for the follower's next poll to draw the lecturer's step; what it shows."""
    follower.wait_for_function(f"document.querySelector('.kv-grid[data-positions=\"{lecturer_seen['grid']['positions']}\"]')"
                               " !== null")
    wait_idle(follower)
    return _seen(follower)


@pytest.fixture(scope="module")
def reuse_room(browser, lecture_url, shots):
    """A lecturer on Reusing Past K/V at 1280×720 who shared the page, prefilled and stepped twice (a context of
    its own: the lecturer stays across the module's tests, and the last one closes it)."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    projector = context.new_page()
    projector.set_default_timeout(90_000)
    goto_idle(projector, f"{lecture_url}/Reusing_Past_KV?lecture=1")
    settle(projector)
    link = _share(projector, "Reusing_Past_KV", settings="Prompt, length and speed")
    _click(projector, "Prefill")
    _step(projector)
    _step(projector)
    settle(projector)
    projector.screenshot(path=shots / "room_lecturer_reuse_qr.png")
    yield projector, link
    context.close()


def test_followers_see_the_lecturers_step_in_their_own_language(tabs, reuse_room, shots):
    projector, link = reuse_room
    ours = _seen(projector)
    assert ours["status"][1] == "2" and ours["grid"]["cached"][0] == ours["chips"] - 1
    phones = {lang: _open(tabs, f"{link}&lang={lang}", 390, 844) for lang in ("en", "ko")}
    en, ko = phones["en"], phones["ko"]
    expect(en.get_by_text("You are following the lecture")).to_be_visible()
    expect(ko.get_by_text("강의를 따라 보고 있습니다")).to_be_visible()
    for phone in (en, ko):  # the same tokens, step, cached positions and timings as the lecturer's screen
        assert _same_as(phone, ours) == ours
    expect(ko.get_by_text("디코드 2단계", exact=False)).to_be_visible()  # the Korean status line
    settle(ko)
    ko.screenshot(path=shots / "room_follower_reuse_ko_390x844.png")

    _step(projector)  # the lecturer's click reaches both phones at their next poll
    ours = _seen(projector)
    assert ours["status"][1] == "3"
    for phone in (en, ko):
        assert _same_as(phone, ours) == ours
        assert phone.locator("button.kv-step").count() == 0  # read-only: no stepper
        assert phone.locator("[data-testid='stException']").count() == 0


def test_explore_from_here_then_follow_again(tabs, reuse_room):
    projector, link = reuse_room
    ours = _seen(projector)
    phone = _open(tabs, link, 390, 844)
    assert _same_as(phone, ours) == ours
    phone.get_by_role("button", name="Explore from here").click()
    phone.wait_for_selector("button.kv-step")  # the follower's own run: the stepper, at the lecturer's step
    wait_idle(phone)
    mine = _seen(phone)
    assert mine["tokens"] == ours["tokens"] and mine["grid"] == ours["grid"]
    assert mine["status"][:4] == ours["status"][:4]  # its own timings, the lecturer's counts
    _step(phone)  # a step of the follower's own; the lecture does not move
    assert _seen(phone)["status"][1] == str(int(ours["status"][1]) + 1)
    assert _seen(projector) == ours

    phone.get_by_role("button", name="Follow again").click()
    expect(phone.get_by_text("You are following the lecture")).to_be_visible()
    assert _same_as(phone, ours) == ours


def test_the_lecturer_leaving_is_said_and_the_last_state_kept(tabs, reuse_room):
    """"Left": the lecturer's page beats every LECTURER_BEAT_S (5 s) while its tab is open; no beat for
    LECTURER_GONE_S (15 s) and the followers are told. This test closes the lecturer's tab (the module's last)."""
    projector, link = reuse_room
    ours = _seen(projector)
    phone = _open(tabs, f"{link}&lang=ko", 390, 844)
    assert _same_as(phone, ours) == ours
    assert phone.get_by_text("강의자가", exact=False).count() == 0
    projector.context.close()  # the lecturer's browser closes
    expect(phone.get_by_text(f"강의자가 {ours['status'][1]}단계에서", exact=False)).to_be_visible(
        timeout=(LECTURER_GONE_S + 30) * 1000)
    assert _same_as(phone, ours) == ours  # the last state stays


def test_a_live_question_answered_by_three_followers_then_the_room_ended(tabs, lecture_url, shots):
    projector = _open(tabs, f"{lecture_url}/Check?lecture=1&idea=5", 1280, 720)
    _share(projector, "Check")
    link = projector.locator("[data-testid='stCode'] code").inner_text().strip()
    settle(projector)
    projector.screenshot(path=shots / "room_lecturer_qr.png")
    projector.get_by_role("button", name="Ask the room").click()
    expect(projector.get_by_text("0 answers from the room")).to_be_visible()

    followers = []
    for lang, option in (("ko", 0), ("en", 0), ("en", 1)):
        phone = _open(tabs, link + f"&lang={lang}", 390, 844)
        followers.append(phone)
        phone.locator("[data-testid='stMain'] [data-testid='stRadioOption'] p").nth(option).click()
        saved = "You can change it" if lang == "en" else "바꿀 수 있습니다"
        expect(phone.get_by_text(saved, exact=False)).to_be_visible()
    expect(projector.get_by_text("3 answers from the room")).to_be_visible(timeout=15_000)  # polled once a second
    settle(projector)
    projector.screenshot(path=shots / "room_lecturer_tally.png")

    projector.get_by_role("button", name="Reveal to the room").click()
    korean = followers[0]
    expect(korean.get_by_text("정답:", exact=False)).to_be_visible(timeout=15_000)
    settle(korean)
    korean.screenshot(path=shots / "room_follower_ko_390x844.png", full_page=True)

    projector.get_by_role("button", name="End the room").click()  # every follower is told, and linked to Check alone
    for phone, text in zip(followers, ("끝난 방", "has ended", "has ended"), strict=True):
        expect(phone.get_by_text(text, exact=False)).to_be_visible(timeout=15_000)
        # the link comes in the run that says so, perhaps a moment after the words: waited for, not read at once
        expect(phone.locator("[data-testid='stPageLink'] a").last).to_have_attribute(
            "href", re.compile(r"^(.*/)?Check\?lang=(en|ko)$"), timeout=15_000)
        assert phone.locator("[data-testid='stException']").count() == 0


def test_redis_stopped_mid_lecture(tabs, shots):
    """The rooms in a real redis-server; it stops after the lecturer's first step: the lecturer is told sharing
    stopped and why, steps on, and the follower is told the room cannot be reached. No traceback anywhere."""
    from tests.room.conftest import redis_server

    with redis_server() as (redis_url, proc), app_server({"KVVIZ_ROOM_STORE": redis_url}, lecture=True) as url:
        projector = _open(tabs, f"{url}/Reusing_Past_KV?lecture=1", 1280, 720)
        link = _share(projector, "Reusing_Past_KV", settings="Prompt, length and speed")
        _click(projector, "Prefill")
        _step(projector)
        ours = _seen(projector)
        phone = _open(tabs, link, 390, 844)
        assert _same_as(phone, ours) == ours  # followed through Redis

        proc.terminate()
        proc.wait(timeout=10)
        _step(projector)
        stopped = projector.get_by_text("Sharing with the room stopped", exact=False)
        expect(stopped).to_be_visible()
        assert stopped.bounding_box()["width"] > 600  # read from the back of the room, not squeezed beside a button
        assert _seen(projector)["status"][1] == "2"  # the lecture went on
        _step(projector)
        assert _seen(projector)["status"][1] == "3"
        expect(phone.get_by_text("cannot be reached", exact=False)).to_be_visible(timeout=15_000)
        projector.screenshot(path=shots / "room_lecturer_redis_stopped.png")
        for pg in (projector, phone):
            assert pg.locator("[data-testid='stException']").count() == 0


def test_a_korean_phone_follows_the_memory_scenario_as_the_lecturer_changes_it(tabs, lecture_url, shots):
    """Memory Footprint: the lecturer's scenario, computed and drawn on a Korean phone; the lecturer's change of the
    context length reaches it at its next poll; the phone has no box of its own to change it."""
    from kvviz.kv.formula import kv_footprint
    from kvviz.kv.presets import PRESETS

    def total(tokens: int) -> str:
        return f"{kv_footprint(PRESETS['Qwen2.5-7B'], tokens, 4, 'bfloat16').total:,} B"

    projector = _open(
        tabs, f"{lecture_url}/Memory_Footprint?lecture=1&preset=Qwen2.5-7B&tokens=8192&batch=4", 1280, 720)
    link = _share(projector, "Memory_Footprint", settings="Model and scenario")
    projector.keyboard.press("Escape")  # the settings closed: the formula and the room's code on the projector
    settle(projector)
    projector.screenshot(path=shots / "room_lecturer_memory_qr.png")
    phone = _open(tabs, f"{link}&lang=ko", 390, 844)
    expect(phone.get_by_text("강의를 따라 보고 있습니다")).to_be_visible()
    table = phone.locator("[data-testid='stMarkdownContainer'] table").filter(has_text="단계").first
    expect(table).to_contain_text(total(8192))
    scenario = phone.locator("[data-testid='stMarkdownContainer'] table").filter(has_text="강의자의 값").first
    expect(scenario).to_contain_text("동시 요청 수 B")  # the lecturer's scenario, in the phone's language
    expect(scenario).to_contain_text("8,192")
    assert phone.locator("[data-testid='stMain'] input").count() == 0  # read-only: no box to change the room with
    settle(phone)
    phone.screenshot(path=shots / "room_follower_memory_ko_390x844.png", full_page=True)

    projector.get_by_role("button", name="Model and scenario").click()
    box = projector.get_by_label("Context length n (tokens)")
    box.fill("32768")
    box.press("Enter")
    wait_idle(projector)
    expect(table).to_contain_text(total(32768), timeout=15_000)  # the phone's next poll, once a second
    settle(phone)
    table.scroll_into_view_if_needed()  # the formula's figures on the phone's screen
    phone.screenshot(path=shots / "room_follower_memory_ko_changed_390x844.png")
    assert phone.locator("[data-testid='stException']").count() == 0


def test_a_korean_phone_follows_compression_with_the_plot_across_its_width(tabs, lecture_url, shots):
    """Compressing the Cache: the lecturer's measured methods on a Korean phone. Its legend of 13 methods stood right
    of the plot and squeezed it to ~150 of 390 px; on a phone it stands under the plot, which takes the width."""
    projector = _open(tabs, f"{lecture_url}/Compressing_the_Cache?lecture=1&tokens=256", 1280, 720)
    link = _share(projector, "Compressing_the_Cache", settings="Settings")
    projector.keyboard.press("Escape")
    projector.get_by_role("button", name="Measure all methods").click()
    expect(projector.locator("[data-testid='stPlotlyChart']").first).to_be_visible(timeout=300_000)
    wait_idle(projector)
    desk = projector.evaluate(PLOT_BOXES)[0]
    assert desk["legend_below"] is False  # on the projector the legend stands beside the plot
    phone = _open(tabs, f"{link}&lang=ko", 390, 844)
    expect(phone.get_by_text("강의를 따라 보고 있습니다")).to_be_visible()
    expect(phone.locator("[data-testid='stPlotlyChart']").first).to_be_visible(timeout=15_000)
    settle(phone)
    boxes = phone.evaluate(PLOT_BOXES)
    assert boxes and all(b["legend_below"] is not False for b in boxes)
    tradeoff = boxes[0]
    assert tradeoff["plot"] >= 0.7 * tradeoff["width"], tradeoff  # was ~0.4 with the legend beside it
    phone.locator("[data-testid='stPlotlyChart']").first.screenshot(path=shots / "room_follower_compression_ko_390.png")
    assert phone.locator("[data-testid='stException']").count() == 0


CHART_DATA = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(p => p.data.map(t => [t.x, t.y]))"""


def test_a_sweep_with_a_room_open_shows_its_progress_then_the_korean_phone_its_chart(tabs, lecture_url, shots):
    """Latency & Capacity with a room open: the lecturer's sweep shows its progress as it runs (a progress bar drawn
    after each tick's measuring never reached the browser), and a Korean phone draws the finished sweep's chart
    from the lecturer's rows: the same points."""
    projector = _open(tabs, f"{lecture_url}/Latency_and_Capacity?lecture=1", 1280, 720)
    link = _share(projector, "Latency_and_Capacity", settings="Settings")
    projector.keyboard.press("Escape")
    projector.get_by_role("button", name="Settings").click()
    lengths = projector.get_by_label(re.compile("Prompt lengths"))
    lengths.fill(", ".join(str(n) for n in range(16, 513, 16)))  # 32 lengths, 6 runs each: several ticks' work
    lengths.press("Enter")
    wait_idle(projector)
    projector.keyboard.press("Escape")
    phone = _open(tabs, f"{link}&lang=ko", 390, 844)
    projector.get_by_role("button", name="Start sweep").click()
    expect(projector.get_by_text(re.compile(r"Measuring… [1-9]\d* / 192 runs"))).to_be_visible(timeout=60_000)
    expect(projector.locator("[data-testid='stPlotlyChart']").first).to_be_visible(timeout=240_000)
    wait_idle(projector)
    ours = projector.evaluate(CHART_DATA)[0]
    expect(phone.locator("[data-testid='stPlotlyChart']").first).to_be_visible(timeout=15_000)
    settle(phone)
    assert phone.evaluate(CHART_DATA)[0] == ours  # the lecturer's measured points, drawn on the phone
    box = phone.evaluate(PLOT_BOXES)[0]
    assert box["legend_below"] is not False and box["plot"] >= 0.7 * box["width"]  # the legend under the plot
    phone.locator("[data-testid='stPlotlyChart']").first.screenshot(path=shots / "room_follower_latency_ko_390.png")
    assert phone.locator("[data-testid='stException']").count() == 0
