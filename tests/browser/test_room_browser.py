"""A lecture room in a real browser: the lecturer's projector (1280×720) shares the Check page, three followers on
phone-sized screens (390×844, one in Korean) answer live, the tally reaches the projector, the reveal reaches them."""
import re

from playwright.sync_api import expect

from tests.browser.harness import IDLE, settle


def _open(browser, url: str, width: int, height: int):  # noqa: ANN001, ANN202 - Playwright objects
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector(IDLE, timeout=60_000)
    settle(page)
    return context, page


def test_a_live_question_answered_by_three_followers(browser, app_url, shots):
    lecture, projector = _open(browser, f"{app_url}/Check?lecture=1&idea=5", 1280, 720)
    projector.get_by_role("button", name="Share with the room").click()
    expect(projector.get_by_text("Scan to follow the lecture")).to_be_visible()
    link = projector.locator("[data-testid='stCode'] code").inner_text().strip()
    assert re.fullmatch(rf"{re.escape(app_url)}/Check\?room=[A-Za-z0-9_-]{{22}}", link), link
    qr = projector.locator("[data-testid='stImage'] img").first
    expect(qr).to_be_visible()
    assert qr.bounding_box()["width"] >= 300  # large enough to scan from the back of a room
    settle(projector)
    projector.screenshot(path=shots / "room_lecturer_qr.png")
    projector.get_by_role("button", name="Ask the room").click()
    expect(projector.get_by_text("0 answers from the room")).to_be_visible()

    followers = []
    for lang, option in (("ko", 0), ("en", 0), ("en", 1)):
        context, phone = _open(browser, link + f"&lang={lang}", 390, 844)
        followers.append((context, phone))
        phone.locator("[data-testid='stMain'] [data-testid='stRadioOption'] p").nth(option).click()
        saved = "You can change it" if lang == "en" else "바꿀 수 있습니다"
        expect(phone.get_by_text(saved, exact=False)).to_be_visible()
    expect(projector.get_by_text("3 answers from the room")).to_be_visible(timeout=15_000)  # polled once a second
    settle(projector)
    projector.screenshot(path=shots / "room_lecturer_tally.png")

    projector.get_by_role("button", name="Reveal to the room").click()
    korean = followers[0][1]
    expect(korean.get_by_text("정답:", exact=False)).to_be_visible(timeout=15_000)
    settle(korean)
    korean.screenshot(path=shots / "room_follower_ko_390x844.png", full_page=True)
    for context, _ in followers:
        context.close()
    lecture.close()
