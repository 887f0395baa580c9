"""Serving Engine's cache events in a real browser, drawn from vLLM's own publisher: vLLM's KVCacheManager and
BlockPool (build/vllm-ref) run a stream of requests sharing three system prompts and publish their events with
vLLM's ZmqEventPublisher on loopback ports (tests/serving/vllm_kv_events_publisher.py, "auto"); the page subscribes
(the replay socket gives it every batch sent before) and draws the tree. On a projector (1280×720, lecture mode) and
on a phone (390 px), in English and Korean; the numbers on the page are the tree's, checked against the blocks the
publisher's last pool holds."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.harness import PHONE_UA, goto_idle, settle, wait_idle
from tests.serving.kv_fake_publisher import free_port

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "build" / "vllm-ref"
RUNNER = ROOT / "tests" / "serving" / "vllm_kv_events_publisher.py"

pytestmark = pytest.mark.skipif(not (REF / ".installed-0.34.0").exists(),
                                reason="vLLM reference not installed here: run scripts/install_vllm_ref.sh")

WORDS = {"en": {"endpoint": "Events endpoint", "replay": "Replay endpoint", "subscribe": "Subscribe",
                "blocks": "Cached blocks"},
         "ko": {"endpoint": "이벤트 엔드포인트", "replay": "재전송 엔드포인트", "subscribe": "구독",
                "blocks": "캐시된 블록"}}


def demo_stream() -> list[dict]:
    """Three system prompts, each with its users' questions, then a second wave that reuses them and evicts."""
    rng = random.Random(11)
    systems = [[rng.randrange(300) for _ in range(n)] for n in (16, 12, 8)]

    def wave(n: int, arrive_every: int) -> list[dict]:
        out = []
        for i in range(n):
            prompt = systems[i % 3] + [rng.randrange(300) for _ in range(rng.randint(4, 12))]
            out.append({"prompt": prompt, "max_new": rng.randint(2, 6), "arrive": i * arrive_every})
        return out

    seg = {"block_size": 4, "max_model_len": 256, "vocab": 300, "reset_after": False}
    return [[{**seg, "num_blocks": 40, "requests": wave(9, 1)}, {**seg, "num_blocks": 40, "requests": wave(9, 2)}]]


@pytest.fixture(scope="module")
def vllm_server():
    port, replay = free_port(), free_port()
    plan = {"port": port, "replay_port": replay, "algo": "sha256", "seed": 0, "streams": demo_stream(),
            "auto": True, "pause_s": 0.0, "keep_last": True, "linger_s": 900}
    proc = subprocess.Popen([sys.executable, str(RUNNER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REF), VLLM_LOGGING_LEVEL="ERROR"))
    proc.stdin.write(json.dumps(plan) + "\n")
    proc.stdin.flush()
    done = json.loads(proc.stdout.readline())
    assert done.get("done"), proc.stderr.read()[-2000:]
    yield {"endpoint": f"tcp://127.0.0.1:{port}", "replay": f"tcp://127.0.0.1:{replay}", "vllm": done["vllm"]}
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("lang", ["en", "ko"])
@pytest.mark.parametrize("screen", ["projector", "phone"])
def test_tree_from_vllms_publisher(browser, app_url, shots, vllm_server, lang, screen):
    width, height = (1280, 720) if screen == "projector" else (390, 844)
    context = browser.new_context(viewport={"width": width, "height": height},
                                  **({"user_agent": PHONE_UA, "is_mobile": True} if screen == "phone" else {}))
    page = context.new_page()
    page.set_default_timeout(90_000)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    query = f"?lang={lang}" + ("&lecture=1" if screen == "projector" else "")
    goto_idle(page, f"{app_url}/Serving_Engine{query}", 120_000)
    words = WORDS[lang]
    for label, value in ((words["endpoint"], vllm_server["endpoint"]), (words["replay"], vllm_server["replay"])):
        box = page.get_by_label(label, exact=True).and_(page.locator("input"))
        box.fill(value)
        box.press("Enter")
        wait_idle(page)
    page.get_by_role("button", name=words["subscribe"], exact=True).click()
    chart = page.locator("[data-testid='stPlotlyChart']").first
    expect(chart).to_be_visible(timeout=60_000)
    settle(page)
    metric = page.locator("[data-testid='stMetric']").filter(has_text=words["blocks"])
    blocks = int(metric.locator("[data-testid='stMetricValue']").inner_text().replace(",", ""))
    assert blocks > 10  # the last pool's cached blocks: three shared prompts and their branches
    assert page.locator("[data-testid='stException']").count() == 0 and not errors
    chart.scroll_into_view_if_needed()
    page.screenshot(path=shots / f"kv_events_{screen}_{lang}.png")
    print(f"\nvLLM {vllm_server['vllm']}: {screen} {lang}: {blocks} cached blocks drawn")
    context.close()
