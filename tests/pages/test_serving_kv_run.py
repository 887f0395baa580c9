"""The Serving Engine page (AppTest) subscribed to a server's KV events runs a load run against that server and
shows each request attributed to the cached blocks: the server is tests/serving/vllm_standin_server.py, whose prefix
cache is vLLM's own KVCacheManager publishing with vLLM's ZmqEventPublisher. Every request shares a 16-token system
prompt (4 blocks): the first finds nothing cached, the others hit its blocks and diverge after them; the page's
table says so, equal to the hits vLLM's manager reported, in English and Korean; the view is plain data (what a lecture
room's followers get); the tree's hover names each chain's first tokens by the server's own /detokenize."""
import json
import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.engine.loading import shipped_tokenizer
from tests.serving.standin import INSTALLED, caught_up, standin_server, wake

HOME, PAGE = str(Path(__file__).resolve().parents[2] / "app.py"), "pages/7_Serving_Engine.py"

pytestmark = pytest.mark.skipif(not INSTALLED, reason="vLLM reference not installed here: run "
                                "scripts/install_vllm_ref.sh (.ci/run does)")


def _load_run(at, url: str, requests: int, prefix_len: int) -> list[int]:  # noqa: ANN001 - an AppTest
    """The page's load run (concurrency 1, prompts of 12 tokens after a shared prefix, 3 new tokens each) against
    the stand-in, waited for; the hits vLLM's manager reported per request."""
    for key, value in (("serving_requests", requests), ("serving_prompt", 12), ("serving_max_tokens", 3),
                       ("serving_prefix_len", prefix_len)):
        at.number_input(key=key).set_value(value).run()
    at.text_input(key="serving_conc").set_value("1").run()
    at.button(key="serving_start").click().run()
    deadline = time.monotonic() + 120
    while at.session_state["serving_worker"] is not None and time.monotonic() < deadline:
        time.sleep(1.0)
        at.run()
    assert not at.exception
    hits = [h["hits"] for h in caught_up(url, at.session_state["kv_events_watch"])["hits"]]
    at.run()
    return hits


def test_load_run_attributed_on_the_page():
    with standin_server(block_size=4, num_blocks=64) as (url, endpoint, replay):
        at = AppTest.from_file(HOME, default_timeout=60)
        at.run()
        at = at.switch_page(PAGE)
        at.run()
        at.text_input(key="serving_url").set_value(url).run()
        at.button[0].click().run()  # Connect
        assert not at.exception and at.session_state["serving_conn"]["engine"] == "vllm"
        at.text_input(key="kv_events_endpoint").set_value(endpoint).run()
        at.text_input(key="kv_events_replay").set_value(replay).run()
        at.button(key="kv_events_subscribe").click().run()
        watch = at.session_state["kv_events_watch"]
        wake(url, watch)
        hits = _load_run(at, url, requests=4, prefix_len=16)
        view = at.session_state["kv_events_run"]
        chains = at.session_state["kv_events_last"]["chains"]["chains"]
        at.button(key="kv_events_stop").click().run()
    assert not at.exception
    assert json.loads(json.dumps(view, allow_nan=False)) == view  # plain data: what room.publish sends
    att = view["attribution"]
    rows = att["rows"]
    assert view["kept"] and [r["ids_from"] for r in rows] == ["sent"] * 4  # exact ids from the server's /tokenize
    assert [r["hit_tokens"] for r in rows] == hits == [0, 16, 16, 16]  # vLLM's manager, request by request
    assert [r["reason"] for r in rows] == ["never", "diverged", "diverged", "diverged"]
    assert [r["first_miss"] for r in rows] == [0, 4, 4, 4]
    # the table on the page: blocks hit per request and each first miss in words
    table = next(df.value for df in at.dataframe if "blocks hit" in df.value.columns)
    assert table["blocks hit"].tolist() == [h // 4 for h in hits]
    assert table["first miss"].tolist() == ["block 0: never stored"] + ["block 4: diverged (the cached prefix ends "
                                                                        "here)"] * 3
    assert table["cached tokens (server's usage)"].tolist() == hits
    assert any(c.value.startswith("The server's own count of each request's cached tokens (its usage) equals this "
                                  "attribution for 4 of 4 requests") for c in at.caption)
    text = " ".join(m.value for m in at.markdown)
    assert "4 requests: 12 of " in text
    # the blocks stored and removed per second under the timeline, on its clock
    width = 2 * view["rates"][0]["t_s"]  # a bin's width: its middle is half of it
    assert sum(r["stored"] for r in view["rates"]) * width == pytest.approx(watch.tree.stored) and watch.tree.stored
    assert any(c.value.startswith("Under the requests: the server's blocks stored") for c in at.caption)
    timeline = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                    if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("Every request of the point"))
    stored_bars = next(d for d in timeline["data"] if d.get("name") == "stored")
    assert stored_bars["xaxis"] == "x2" and timeline["layout"]["xaxis"]["matches"] == "x2"  # the requests' x axis
    # the tree's hover names each chain's first tokens as the server's /detokenize wrote them
    tok = shipped_tokenizer()
    assert chains and all(c["first_text"] == tok.decode(c["first_tokens"]) for c in chains)
    # in Korean: the table's headers and the reasons translated
    at.radio(key="_w_kv_lang").set_value("ko").run()
    assert not at.exception
    table = next(df.value for df in at.dataframe if "적중한 블록" in df.value.columns)
    assert table["첫 미스"].tolist()[0] == "블록 0: 저장된 적 없음"
    headers = [c for df in at.dataframe for c in df.value.columns]
    assert not [h for h in headers if re.fullmatch(r"[a-z0-9_]+", h) or h.startswith("kv_events.")], headers
    assert any("요청 4개: 조회한 블록" in m.value for m in at.markdown)


def test_a_follower_sees_the_lecturers_attribution(store):
    """In lecture mode the lecturer subscribes on the cache events' screen, then runs the load from the numbers'
    screen; a follower in Korean draws the attribution the lecturer's page published, and subscribes to nothing."""
    from tests.pages.pagetest import open_page

    with standin_server(block_size=4, num_blocks=64) as (url, endpoint, replay):
        lecturer = open_page(PAGE, lecture="1", idea="6")  # the cache events' screen
        lecturer.button(key="room_share").click().run()
        room_id = lecturer.session_state["room_id"]
        lecturer.text_input(key="serving_url").set_value(url).run()
        next(b for b in lecturer.button if b.label == "Connect").click().run()
        lecturer.text_input(key="kv_events_endpoint").set_value(endpoint).run()
        lecturer.text_input(key="kv_events_replay").set_value(replay).run()
        lecturer.button(key="kv_events_subscribe").click().run()
        wake(url, lecturer.session_state["kv_events_watch"])
        lecturer.session_state["kv_idea_serving"] = 4  # the numbers' screen
        lecturer.run()
        hits = _load_run(lecturer, url, requests=3, prefix_len=8)
        lecturer.session_state["kv_events_watch"].close()  # its Stop is on the cache events' screen
    assert hits == [0, 8, 8]
    shared = store.read(room_id)[1]["kv_run"]
    assert [r["hit_tokens"] for r in shared["attribution"]["rows"]] == hits
    follower = open_page(PAGE, lang="ko", room=room_id)
    assert not follower.exception
    table = next(df.value for df in follower.dataframe if "적중한 블록" in df.value.columns)
    assert table["적중한 블록"].tolist() == [h // 4 for h in hits]
    assert table["첫 미스"].tolist() == ["블록 0: 저장된 적 없음"] + ["블록 2: 분기 (캐시된 접두사가 여기서 끝남)"] * 2
    assert not [b for b in follower.main.button if b.key and b.key.startswith("kv_events_")]  # no Subscribe here
    assert "kv_events_watch" not in follower.session_state or follower.session_state["kv_events_watch"] is None
