"""The app started exactly as the Dockerfile starts it (`python -m kvviz serve --hosted`, on a loopback port), in a
real browser: the hosted caps and allow-lists are in force (what tests/app/test_hosted.py checks in-process)."""
from dataclasses import replace

from playwright.sync_api import expect

from kvviz.app.hosted import HostedCaps
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.units import format_binary
from tests.browser.harness import app_server, goto_idle, wait_idle

ALLOW = "http://127.0.0.1:8080, http://127.0.0.1:9000/v1"
ALLOWED = ["http://127.0.0.1:8080", "http://127.0.0.1:9000"]  # normalized: the /v1 suffix is the client's


def test_hosted_caps_and_allow_lists_are_in_force_in_the_started_app(browser, shots):
    caps = replace(HostedCaps(), max_layers=3)
    with app_server({"KVVIZ_MAX_LAYERS": "3", "KVVIZ_SERVE_ALLOW": ALLOW}, hosted=True) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        goto_idle(page, url)
        sidebar = page.get_by_test_id("stSidebar")
        limits = t("hosted.sidebar_caption", max_layers=3, max_d_model=caps.max_d_model,
                   max_params=f"{caps.max_params:,}", max_new_tokens=caps.max_new_tokens, max_batch=caps.max_batch,
                   max_sweep_points=caps.max_sweep_points, kv_budget=format_binary(caps.kv_budget_bytes),
                   offload_store=format_binary(caps.offload_store_bytes), max_rooms=caps.max_rooms,
                   max_room_followers=caps.max_room_followers)
        expect(sidebar.get_by_text(limits)).to_be_visible(timeout=60_000)
        # a custom model past the layer cap is refused, with the cap's own message
        sidebar.get_by_test_id("stSelectbox").first.click()
        page.get_by_role("option", name=t("common.model_random")).click()
        wait_idle(page)
        box = sidebar.get_by_label(t("common.layers"), exact=True)
        box.fill("4")
        box.press("Enter")
        wait_idle(page)
        expect(page.get_by_text(InputError("hosted.layers", limit=3, value=4).message("en"))).to_be_visible()
        # the Serving page offers the allow-listed servers only: a choice, not a box to type a URL into
        goto_idle(page, f"{url}/Serving_Engine")
        page.locator("[data-testid='stSelectbox']").filter(has_text=t("serving.url")).click()
        assert [o.inner_text().strip() for o in page.get_by_role("option").all()] == ALLOWED
        assert page.get_by_role("textbox", name=t("serving.url"), exact=True).count() == 0
        page.screenshot(path=shots / "serve_hosted_serving_en.png", full_page=True)
        page.close()
