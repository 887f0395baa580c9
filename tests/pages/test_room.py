"""A lecture room on the Check page: a lecturer and a follower, two sessions on one in-process store."""
import dataclasses
import json
import time

import pytest

from kvviz.app.room.session import room_store
from kvviz.i18n import t
from kvviz.room.store import LECTURER_GONE_S
from tests.pages.pagetest import open_page

CHECK = "pages/6_Check.py"
SERVING = "pages/7_Serving_Engine.py"
CACHE_UPDATE_IDEA = "5"  # the fifth idea: "cache_update" (append / rebuild / logits / last_layer), answer "append"


def _open_room(store):
    lecturer = open_page(CHECK, lecture="1", idea=CACHE_UPDATE_IDEA)
    lecturer.button(key="room_share").click().run()
    assert not lecturer.exception
    room_id, secret = lecturer.session_state["room_id"], lecturer.session_state["room_secret"]
    assert len(room_id) == 22 and store.read(room_id)[1]["path"] == CHECK  # followers elsewhere are linked here
    return lecturer, room_id, secret


def test_follower_answers_lecturer_tallies_and_reveals(store):
    lecturer, room_id, secret = _open_room(store)
    link = lecturer.code[0].value
    assert link.endswith(f"?room={room_id}") and secret not in link  # the followers' link: the id, never the secret
    assert len(lecturer.get("image")) == 1  # the link's QR code
    assert [b.key for b in lecturer.button if b.key == "room_share"] == []  # shared: the button gave way to the link
    lecturer.button(key="room_ask_cache_update").click().run()
    assert store.tally(room_id).counts == {"append": 0, "rebuild": 0, "logits": 0, "last_layer": 0}

    follower = open_page(CHECK, lang="ko", room=room_id)
    assert "room_secret" not in follower.session_state or follower.session_state["room_secret"] is None
    radio = follower.radio(key="room_answer_cache_update")
    assert len(radio.options) == 4 and radio.label == "내 답"  # the follower's own language
    radio.set_value("rebuild").run()
    assert not follower.exception
    assert store.tally(room_id).counts["rebuild"] == 1

    assert "답변은 익명입니다: 강의자는 집계만 봅니다." in [c.value for c in follower.caption]
    assert follower.get("progress") == []  # the tally hidden on the follower's screen until the reveal (the default)

    lecturer.run()
    captions = [c.value for c in lecturer.caption]
    assert "1 answer from the room" in captions and t("room.tally_hidden", "en") in captions
    assert lecturer.get("progress") == []  # and on the projector: only how many answered
    follower.radio(key="room_answer_cache_update").set_value("append").run()  # changed: still one answer
    assert store.tally(room_id).counts == {"append": 1, "rebuild": 0, "logits": 0, "last_layer": 0}

    lecturer.button(key="room_reveal_cache_update").click().run()
    assert not lecturer.exception and store.tally(room_id).revealed
    texts = [p.proto.text for p in lecturer.get("progress")]  # revealed: the counts per option
    assert texts[0].endswith("✓ — 1") and texts[1].endswith("— 0")
    assert any("The answer:" in s.value for s in lecturer.success)
    follower.run()
    assert follower.radio(key="room_answer_cache_update").disabled
    assert any(s.value.startswith("정답:") for s in follower.success)  # the follower reads it in Korean
    assert [p.proto.text for p in follower.get("progress")][0].endswith("✓ — 1")


def test_the_lecturer_can_show_the_tally_while_answers_come_in(store):
    lecturer, room_id, _ = _open_room(store)
    lecturer.checkbox(key="room_show_tally_cache_update").check().run()
    lecturer.button(key="room_ask_cache_update").click().run()
    assert store.tally(room_id).show_tally
    follower = open_page(CHECK, room=room_id)
    follower.radio(key="room_answer_cache_update").set_value("rebuild").run()
    assert [p.proto.text for p in follower.get("progress")][1].endswith("— 1")  # rebuild: 1, before any reveal
    lecturer.run()
    assert [p.proto.text for p in lecturer.get("progress")][1].endswith("— 1")


def test_the_results_download_and_the_summary_when_the_room_ends(store):
    lecturer, room_id, secret = _open_room(store)
    assert lecturer.get("download_button") == []  # nothing asked yet: nothing to download
    lecturer.button(key="room_ask_cache_update").click().run()
    for i, option in enumerate(("append", "append", "logits")):
        store.answer(room_id, "cache_update", f"f{i}", option)
    lecturer.button(key="room_reveal_cache_update").click().run()
    assert [b.proto.label for b in lecturer.get("download_button")] == ["Download the results (CSV)"]
    asked = store.results(room_id, secret)
    assert [(a.question, a.counts, a.answer) for a in asked] == [
        ("cache_update", {"append": 2, "rebuild": 0, "logits": 1, "last_layer": 0}, "append")]
    lecturer.button(key="room_end").click().run()
    assert not lecturer.exception and lecturer.session_state["room_id"] is None
    table = lecturer.get("table")[0].proto.arrow_data.data  # the summary, once: 3 answered, 2 right (67 %)
    import pyarrow as pa

    rows = pa.ipc.open_stream(table).read_all().to_pylist()
    assert [(r["answered"], r["right"], r["right (%)"]) for r in rows] == [(3, 2, "67")]
    lecturer.run()
    assert lecturer.get("table") == []  # shown once


def test_an_unknown_room_says_so_and_links_the_page_on_its_own(store):
    follower = open_page(CHECK, room="no-such-room")
    assert "unknown or has ended" in follower.error[0].value
    link = follower.main.get("page_link")[-1].proto
    assert (link.label, link.page) == ("Open this page on your own", "Check") and "room" not in link.query_string


def test_ending_the_room_deletes_it(store):
    lecturer, room_id, _ = _open_room(store)
    lecturer.button(key="room_end").click().run()
    assert lecturer.session_state["room_id"] is None
    follower = open_page(CHECK, room=room_id)
    assert "unknown or has ended" in follower.error[0].value


def test_a_follower_draws_the_lecturers_run_without_running_the_model(store):
    from tests.pages.test_reuse import PROMPT, _grid_rows, _page, _prefill_and_step, click_step

    lecturer = _page(lecture=True)
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    _prefill_and_step(lecturer, 2)
    version, view = store.read(room_id)
    gen = lecturer.session_state["reuse_gen"]
    assert view["n_steps"] == 2 and view["n_gen"] == gen.n_generated == 3
    assert view["written_at"] == [[0] * len(PROMPT) + [1, 2]] * 3  # 3 layers: the prompt by the prefill, then steps

    on_check = open_page(CHECK, lang="ko", room=room_id)  # a follower left on another page: a link to the lecturer's
    link = on_check.main.get("page_link")[0].proto
    assert link.label == "강의자는 “과거 K/V 재사용” 페이지에 있습니다: 그곳에서 따라 보기"
    assert f"room={room_id}" in link.query_string and "lang=ko" in link.query_string

    follower = open_page("pages/1_Reusing_Past_KV.py", lang="ko", room=room_id)
    assert "reuse_gen" not in follower.session_state or follower.session_state["reuse_gen"] is None
    assert _grid_rows(follower) == _grid_rows(lecturer)  # the same cache grid, drawn from the published data
    # the lecturer's numbers (the timings measured by the lecturer's run), in the follower's language
    status = t("reuse.status", "ko", n_prompt=len(PROMPT), n_steps=2, n_gen=3, n_cached=len(PROMPT) + 2,
               ttft_ms=f"{view['ttft_ms']:.1f}", step_ms=f"{view['step_ms']:.1f}")
    if view["compiled"] == "kernels":  # the lecturer's steps ran on kvviz's C step: the follower is told so too
        status += " " + t("reuse.on_c_step", "ko")
    captions = [c.value for c in follower.caption]
    assert "강의를 따라 보고 있습니다" in captions and status in captions

    click_step(lecturer)
    assert store.read(room_id)[0] == version + 1
    follower.run()  # the follower's next poll
    assert _grid_rows(follower) == _grid_rows(lecturer)
    assert [k for k, _, _ in next(iter(_grid_rows(follower).values()))] == ["prefill", "step", "newest"]


def test_a_follower_sees_the_lecturers_bytes_and_attention_row(store):
    from tests.pages.test_reuse import _chart, _page, _prefill_and_step, open_tab

    lecturer = _page(lecture=True)
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    _prefill_and_step(lecturer, 1)
    open_tab(lecturer, "attention")
    lecturer.selectbox(key="reuse_attn_layer").set_value(2).run()  # the lecturer shows layer 2
    gen = lecturer.session_state["reuse_gen"]
    view = store.read(room_id)[1]
    assert view["attention"]["layer"] == 2
    assert view["attention"]["rows"] == [[round(float(p), 5) for p in row] for row in gen.events[-1].attention[2]]

    follower = open_page("pages/1_Reusing_Past_KV.py", room=room_id)
    follower.session_state["room_reuse_tab"] = "attention"
    follower.run()
    ours, theirs = _chart(lecturer, "reuse_attn"), _chart(follower, "reuse_attn")
    assert theirs["layout"]["title"]["text"] == ours["layout"]["title"]["text"]
    assert theirs["data"][0]["z"] == [[round(float(p), 5) for p in row] for row in gen.events[-1].attention[2]]
    follower.session_state["room_reuse_tab"] = "bytes"
    follower.run()
    live = [e.live_bytes for e in gen.events]
    assert next(d["y"] for d in _chart(follower, "reuse_bytes")["data"] if d["y"][-1] == live[-1]) == live


def test_redis_stopped_mid_lecture_stops_sharing_not_the_lecture(monkeypatch):
    from tests.pages.test_reuse import _page, _prefill_and_step, click_step
    from tests.room.conftest import redis_server

    with redis_server() as (url, proc):
        monkeypatch.setenv("KVVIZ_ROOM_STORE", url)
        room_store.clear()
        try:
            lecturer = _page(lecture=True)
            lecturer.button(key="room_share").click().run()
            room_id = lecturer.session_state["room_id"]
            _prefill_and_step(lecturer, 1)
            assert room_store().read(room_id)[1]["n_steps"] == 1  # shared through Redis
            proc.terminate()
            proc.wait(timeout=10)
            click_step(lecturer)
        finally:
            room_store.clear()
    assert not lecturer.exception
    assert any(e.value.startswith("Sharing with the room stopped") for e in lecturer.error)
    assert lecturer.session_state["room_id"] is None  # the room is dropped here: the lecture goes on locally
    assert lecturer.session_state["reuse_gen"].n_generated == 3  # the step ran: prefill's token and two steps
    click_step(lecturer)
    assert not lecturer.exception  # the lecture goes on; the reason stays said, once, until dismissed
    assert [e.value for e in lecturer.main.error if e.value.startswith("Sharing with the room stopped")] == [
        lecturer.error[0].value]
    assert lecturer.session_state["reuse_gen"].n_generated == 4
    lecturer.button(key="room_stopped_ok").click().run()
    assert not lecturer.main.error


def test_explore_from_here_then_follow_again(store):
    from tests.pages.test_reuse import _grid_rows, _page, _prefill_and_step, click_step

    lecturer = _page(lecture=True)
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    _prefill_and_step(lecturer, 2)
    ours = lecturer.session_state["reuse_gen"]

    follower = open_page("pages/1_Reusing_Past_KV.py", room=room_id)
    follower.button(key="room_btn_explore").click().run()
    assert not follower.exception
    mine = follower.session_state["reuse_gen"]  # the follower's own run, on the lecturer's model and prompt
    assert mine is not None and mine is not ours
    assert mine.token_ids == ours.token_ids and len(mine.events) == len(ours.events)  # at the lecturer's step
    assert follower.session_state["kv_shape"] == lecturer.session_state["kv_shape"]
    click_step(follower)  # the follower steps on their own; the lecture does not move
    assert len(mine.events) == len(ours.events) + 1 and store.read(room_id)[1]["n_steps"] == 2

    follower.button(key="room_btn_follow_again").click().run()
    assert not follower.exception and "room_btn_explore" in [b.key for b in follower.button]
    assert _grid_rows(follower) == _grid_rows(lecturer)  # back to the lecturer's run


def test_the_lecturer_leaving_keeps_the_last_state(store, monkeypatch):
    from tests.pages.test_reuse import _grid_rows, _page, _prefill_and_step

    lecturer = _page(lecture=True)
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    _prefill_and_step(lecturer, 2)
    follower = open_page("pages/1_Reusing_Past_KV.py", room=room_id)
    assert not follower.warning
    monkeypatch.setattr(store, "clock", lambda: time.time() + LECTURER_GONE_S + 1)  # no beat since: the tab closed
    follower.run()
    assert follower.warning[0].value == "The lecturer left at step 2: this is the last state they shared."
    assert _grid_rows(follower) == _grid_rows(lecturer)


def test_a_full_room_says_so_and_links_the_page_on_its_own(store):
    _, room_id, _ = _open_room(store)
    store.max_followers = 1  # a hosted demo's cap (KVVIZ_MAX_ROOM_FOLLOWERS), here one seat
    try:
        first = open_page(CHECK, room=room_id)
        assert not first.error
        second = open_page(CHECK, lang="ko", room=room_id)
        assert second.error[0].value.startswith("이 방은 가득 찼습니다") and "1명" in second.error[0].value
        link = second.main.get("page_link")[-1].proto
        assert link.page == "Check" and "room" not in link.query_string
        first.run()  # the follower already in keeps its seat
        assert not first.error
    finally:
        store.max_followers = None


def test_every_page_is_followed_and_the_lecturer_on_home_is_said(store):
    from kvviz.app.navigation import FOLLOWED, HOME, PAGES

    assert [p for p in PAGES if p is not HOME] == list(FOLLOWED)  # Share with the room on every page
    lecturer, room_id, _ = _open_room(store)
    follower = open_page(CHECK, lang="ko", room=room_id)
    lecturer.switch_page(HOME.path).run()  # Home: the map of the lecture, nothing to follow; the room is told where
    assert not lecturer.exception and "room_share" not in [b.key for b in lecturer.button]
    assert store.read(room_id)[1] == {"page": None, "path": HOME.path}
    follower.run()
    assert follower.info[0].value == t("room.lecturer_on_unfollowed", "ko", page=t(HOME.title_key, "ko"))
    link = follower.main.get("page_link")[-1].proto
    assert "room" not in link.query_string  # that page, on one's own
    lecturer.switch_page(SERVING).run()  # a followed page, nothing run there yet: a link to follow there
    assert store.read(room_id)[1]["path"] == SERVING
    follower.run()
    link = follower.main.get("page_link")[0].proto
    assert link.label == t("room.lecturer_on", "ko", page=t("serving.title", "ko"))
    assert link.page == "Serving_Engine" and f"room={room_id}" in link.query_string
    lecturer.switch_page(CHECK).run()  # back: the room's question box again
    assert store.read(room_id)[1]["path"] == CHECK
    follower.run()
    assert [i.value for i in follower.info] == [t("room.waiting", "ko")]


MEMORY = "pages/3_Memory_Footprint.py"
SCENARIO = {"preset": "Qwen2.5-7B", "tokens": "8192", "batch": "4", "kv_dtype": "float16"}


def _formula_table(at, lang: str = "en") -> str:
    """The formula's four steps as the page's table draws them (factors, bytes, binary and decimal units)."""
    return next(md.value for md in at.main.markdown if md.value.startswith(f"| {t('memory.col_step', lang)} |"))


def _memory_room(store):
    lecturer = open_page(MEMORY, lecture="1", **SCENARIO)
    lecturer.button(key="room_share").click().run()
    assert not lecturer.exception
    room_id = lecturer.session_state["room_id"]
    return lecturer, room_id


def test_a_follower_sees_the_lecturers_memory_scenario_in_their_language(store):
    from kvviz.kv.formula import kv_footprint
    from kvviz.kv.presets import PRESETS

    lecturer, room_id = _memory_room(store)
    version, view = store.read(room_id)
    assert view["page"] == "memory" and view["screen"] == 0  # the formula's screen on the projector
    assert {k: view["scenario"][k] for k in ("preset", "tokens", "batch", "kv_dtype")} == {
        "preset": "Qwen2.5-7B", "tokens": 8192, "batch": 4, "kv_dtype": "float16"}
    lecturer.run()
    assert store.read(room_id)[0] == version  # a rerun that changes nothing is no new version for the room

    total = kv_footprint(PRESETS["Qwen2.5-7B"], 8192, 4, "float16").total
    en = open_page(MEMORY, room=room_id)
    assert _formula_table(en) == _formula_table(lecturer)  # the lecturer's figures, the same to the byte
    assert f"{total:,} B" in _formula_table(en)
    ko = open_page(MEMORY, lang="ko", room=room_id)
    alone = open_page(MEMORY, lang="ko", **SCENARIO)  # the page on its own, in Korean, with the same scenario
    assert _formula_table(ko, "ko") == _formula_table(alone, "ko") and f"{total:,} B" in _formula_table(ko, "ko")
    assert "강의를 따라 보고 있습니다" in [c.value for c in ko.caption]
    scenario = next(md.value for md in ko.main.markdown if md.value.startswith("| 설정 |"))
    assert "| 컨텍스트 길이 n (토큰) | 8,192 |" in scenario and "| 동시 요청 수 B | 4 |" in scenario
    # read-only: no box of the follower's; its query cannot put another scenario in the room's place
    for kind in ("number_input", "selectbox", "text_input", "radio", "slider", "checkbox"):
        assert not ko.main.get(kind), kind
    sneaky = open_page(MEMORY, room=room_id, tokens="1", batch="999", preset="Llama-3.1-8B")
    assert _formula_table(sneaky) == _formula_table(lecturer) and store.read(room_id)[0] == version

    lecturer.number_input(key="memory_tokens").set_value(32768).run()  # the lecturer changes the scenario
    assert store.read(room_id)[0] == version + 1
    ko.run()  # the follower's next poll
    total = kv_footprint(PRESETS["Qwen2.5-7B"], 32768, 4, "float16").total
    assert f"{total:,} B" in _formula_table(ko, "ko") and _formula_table(en.run(), "en") == _formula_table(lecturer)

    lecturer.button(key="kv_idea_next_memory").click().run()  # the next idea: the attention variants
    assert store.read(room_id)[1]["screen"] == 1
    ko.run()
    ours, theirs = _chart(lecturer, "memory_compare_chart"), _chart(ko, "memory_compare_chart")
    assert theirs["data"][0]["y"] == ours["data"][0]["y"]  # the same bytes per token, the follower's words
    assert theirs["layout"]["title"]["text"] == t("memory.compare_title", "ko", layers=28, heads=28, d_head=128,
                                                 dtype="float16")
    assert not any(md.value.startswith("| 단계 |") for md in ko.main.markdown)  # only the screen on the projector

    lecturer.switch_page("pages/2_Prefill_and_Decode.py").run()  # another followed page, nothing measured there yet
    assert store.read(room_id)[1]["path"] == "pages/2_Prefill_and_Decode.py"
    ko.run()  # not the memory screen of before: a link to follow there
    link = ko.main.get("page_link")[0].proto
    assert link.label == t("room.lecturer_on", "ko", page=t("prefill.title", "ko"))
    assert link.page == "Prefill_and_Decode" and f"room={room_id}" in link.query_string


def test_a_memory_follower_explores_the_scenario_then_follows_again(store, monkeypatch):
    lecturer, room_id = _memory_room(store)
    version = store.read(room_id)[0]
    follower = open_page(MEMORY, lang="ko", room=room_id)
    follower.button(key="room_btn_explore").click().run()
    assert not follower.exception
    assert follower.number_input(key="memory_tokens").value == 8192  # the lecturer's scenario, now this session's own
    assert follower.selectbox(key="memory_preset").value == "Qwen2.5-7B"
    assert _formula_table(follower, "ko") == _formula_table(open_page(MEMORY, lang="ko", **SCENARIO), "ko")
    follower.number_input(key="memory_tokens").set_value(1024).run()  # the follower's own change
    assert follower.query_params["room"] == room_id  # the way back kept in the link
    assert store.read(room_id)[0] == version and store.read(room_id)[1]["scenario"]["tokens"] == 8192

    follower.button(key="room_btn_follow_again").click().run()
    assert not follower.exception and "room_btn_explore" in [b.key for b in follower.button]
    assert _formula_table(follower, "ko") == _formula_table(open_page(MEMORY, lang="ko", **SCENARIO), "ko")
    monkeypatch.setattr(store, "clock", lambda: time.time() + LECTURER_GONE_S + 1)  # the lecturer's tab closed
    follower.run()
    assert follower.warning[0].value == t("room.lecturer_left_page", "ko")  # no step on this page: none said


def _explore(follower, store, room_id: str) -> int:  # noqa: ANN001 - an AppTest, a store
    """"Explore from here" pressed: the follower on its own run of the page, "Follow again" shown, the link still the
    room's; returns the room's version (the follower's own changes must leave it as it is)."""
    version = store.read(room_id)[0]
    follower.button(key="room_btn_explore").click().run()
    assert not follower.exception
    assert "room_btn_follow_again" in [b.key for b in follower.button] and follower.query_params["room"] == room_id
    return version


def _follow_again(follower, store, room_id: str, version: int) -> None:  # noqa: ANN001 - an AppTest, a store
    """The follower's own changes left the room's version as it was; "Follow again" returns to the lecture."""
    assert not follower.exception and store.read(room_id)[0] == version
    follower.button(key="room_btn_follow_again").click().run()
    assert not follower.exception and "room_btn_explore" in [b.key for b in follower.button]
    assert t("room.following", follower.query_params.get("lang", "en")) in [c.value for c in follower.caption]


def _array(data: dict):
    """A Plotly array as its figure JSON carries a numpy one (base64 bytes, dtype and shape)."""
    import base64

    import numpy as np

    flat = np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"])
    return flat.reshape([int(n) for n in data["shape"].split(",")]) if "shape" in data else flat


def _chart(at, key: str) -> dict:
    import json

    return json.loads(next(c for c in at.get("plotly_chart") if key in c.proto.id).proto.spec)


PREFILL = "pages/2_Prefill_and_Decode.py"


def _sharing(page: str, shape, **query: str):  # noqa: ANN001, ANN202 - a DecoderConfig; (AppTest, room id)
    """A lecturer in lecture mode on a small random model (quick runs) who shared `page`."""
    from streamlit.testing.v1 import AppTest

    from tests.pages.pagetest import APP

    lecturer = AppTest.from_file(APP, default_timeout=300)
    lecturer.query_params.update(lang="en", lecture="1", **query)
    lecturer.session_state["kv_model"] = "random"
    lecturer.session_state["kv_shape"] = shape
    lecturer.switch_page(page).run()
    lecturer.button(key="room_share").click().run()
    return lecturer, lecturer.session_state["room_id"]


def test_a_follower_draws_the_lecturers_prefill_and_decode_runs(store):
    from tests.pages.test_prefill_and_latency import SMALL, _until

    lecturer, room_id = _sharing(PREFILL, SMALL)
    view = store.read(room_id)[1]
    model = {k: v for k, v in view.pop("explore").items() if k.startswith("kv_")}  # for "Explore from here"
    assert model == {"kv_model": "random", "kv_dtype": "float32", "kv_device": "cpu", "kv_hf_model": "",
                     "kv_engine": "auto", "kv_shape": dataclasses.asdict(lecturer.session_state["kv_shape"])}
    assert view == {"page": "prefill", "shown": [0], "measuring": False, "results": None, "path": PREFILL}
    follower = open_page(PREFILL, lang="ko", room=room_id)
    assert [i.value for i in follower.info] == [t("room.waiting_run", "ko")]

    max_len = SMALL.max_seq_len
    lecturer.number_input(key=f"prefill_prompt_{max_len}").set_value(40)
    lecturer.number_input(key=f"prefill_new_{max_len}_{max_len - 1}").set_value(12)
    lecturer.number_input(key="prefill_repeats").set_value(3)
    lecturer.button(key="prefill_run").click().run()
    assert store.read(room_id)[1]["measuring"]  # the runs are not drawn until they are done: only that they run
    follower.run()
    assert [i.value for i in follower.info] == [t("room.measuring", "ko")]
    _until(lecturer, lambda: not lecturer.session_state["prefill_running"])
    lecturer.run()
    runs = lecturer.session_state["prefill_request"].finished_runs
    view = store.read(room_id)[1]["results"]
    assert len(view["summaries"]) == 3 and view["n_prompt"] == 40
    assert view["seconds"] == [e.seconds for e in runs[view["run"]].events]  # the lecturer's measured passes

    follower.run()
    ours, theirs = _chart(lecturer, "prefill_timeline"), _chart(follower, "prefill_timeline")
    assert [d["y"] for d in theirs["data"]] == [d["y"] for d in ours["data"]]  # the same passes, to the digit
    assert theirs["layout"]["title"]["text"] == t("prefill.chart_title_run", "ko", run=view["run"] + 1,
                                                  runs=3)
    for kind in ("number_input", "button", "text_input"):  # no Run, no box: nothing of the follower's is the room's
        assert not [w for w in follower.main.get(kind) if w.key and w.key.startswith("prefill_")], kind

    lecturer.button(key="kv_idea_next_prefill").click().run()  # the lecturer's next idea: the cards
    assert store.read(room_id)[1]["shown"] == [1]
    follower.run()
    assert [(m.label, m.value) for m in follower.metric] == [
        (t(f"prefill.{k}", "ko"), m.value) for k, m in zip(("ttft", "tpot_p50", "tokens_per_s", "e2e"),
                                                                  lecturer.metric, strict=True)]

    # Explore from here: the lecturer's model and request in the follower's own boxes, measured there on Run
    version = _explore(follower, store, room_id)
    assert follower.session_state["kv_model"] == "random"
    assert follower.session_state["kv_shape"] == lecturer.session_state["kv_shape"]
    boxes = (f"prefill_prompt_{max_len}", f"prefill_new_{max_len}_{max_len - 1}", "prefill_repeats")
    assert [follower.number_input(key=k).value for k in boxes] == [40, 12, 3]
    follower.number_input(key="prefill_repeats").set_value(2).run()  # the follower's own change
    _follow_again(follower, store, room_id, version)
    assert not [w for w in follower.main.get("number_input") if w.key and w.key.startswith("prefill_")]


HEADS = "pages/12_Attention_Patterns.py"


def test_a_follower_sees_the_lecturers_attention_patterns(store):
    import numpy as np

    lecturer = open_page(HEADS, lecture="1")
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    view = store.read(room_id)[1]
    assert view["shown"] == [0] and view["sinks"]["n"] > 16 and "induction" not in view  # the idea on screen only
    follower = open_page(HEADS, lang="ko", room=room_id)
    sink_keys = ("metric_sink_heads", "metric_mean_share", "metric_uniform")
    assert [(m.label, m.value) for m in follower.metric] == [
        (t(f"heads.{k}", "ko"), m.value) for k, m in zip(sink_keys, lecturer.metric, strict=True)]
    ours, theirs = _chart(lecturer, "heads_sinks"), _chart(follower, "heads_sinks")
    assert theirs["data"][0]["z"] == ours["data"][0]["z"]  # the same bytes
    # the lecturer's model's shares (in percent)
    assert _array(theirs["data"][0]["z"]).tolist() == (np.asarray(view["sinks"]["share"]) * 100).tolist()
    assert theirs["layout"]["title"]["text"] == t("heads.sink_heatmap_title", "ko", n=view["sinks"]["n"])
    for kind in ("number_input", "radio", "text_area"):  # none of the lecturer's inputs on the follower's page
        assert not [w for w in follower.main.get(kind) if w.key and "heads" in w.key], kind

    lecturer.button(key="kv_idea_next_heads").click().run()  # the induction heads
    view = store.read(room_id)[1]
    assert view["shown"] == [1] and "sinks" not in view
    follower.run()
    induction_keys = ("metric_first_copy", "metric_second_copy", "metric_induction_heads", "metric_best_prefix")
    assert [(m.label, m.value, m.proto.delta) for m in follower.metric] == [
        (t(f"heads.{k}", "ko"), m.value, m.proto.delta) for k, m in zip(induction_keys, lecturer.metric, strict=True)]
    assert _chart(follower, "heads_loss")["data"][0]["y"] == _chart(lecturer, "heads_loss")["data"][0]["y"]

    lecturer.number_input(key="heads_n_random").set_value(20).run()
    follower.run()  # the follower's next poll
    version = _explore(follower, store, room_id)  # the lecturer's model and boxes, computed here
    assert follower.number_input(key="heads_n_random").value == 20
    assert follower.radio(key="_w_kv_url_text").value == "en"
    assert [m.value for m in follower.metric][-4:] == [m.value for m in lecturer.metric]  # the same induction
    assert _chart(follower, "heads_loss")["data"][0]["y"] == _chart(lecturer, "heads_loss")["data"][0]["y"]
    follower.number_input(key="heads_seed").set_value(7).run()  # the follower's own change
    _follow_again(follower, store, room_id, version)


PAGED = "pages/9_Paged_Blocks.py"


def test_a_follower_sees_the_lecturers_block_pool(store):
    from tests.pages.pagetest import chart

    lecturer = open_page(PAGED, lecture="1")
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    lecturer.button(key="paged_add4").click().run()
    lecturer.button(key="paged_step").click().run()  # one step admits all four: the system prompt's blocks shared
    engine = lecturer.session_state["paged_engine"]
    view = store.read(room_id)[1]
    assert view["step"] == engine.n_steps == 1 and view["shown"] == ["tables"]
    assert [r["cached_tokens"] for r in view["requests"]] == [r.cached_tokens for r in engine.requests] == [
        0, 48, 48, 48]

    follower = open_page(PAGED, lang="ko", room=room_id)
    assert "paged_engine" not in follower.session_state or follower.session_state["paged_engine"] is None  # no engine
    ours = chart(lecturer, "Block tables: logical → physical")["data"][0]
    theirs = chart(follower, t("paged.c_tables_title", "ko"))["data"][0]
    assert theirs["z"] == ours["z"] and theirs["text"] == ours["text"]  # the same physical blocks, shared the same
    metric_keys = ("m_step", "m_requests", "m_hit_rate", "m_blocks", "m_preemptions")
    assert [(m.label, m.value) for m in follower.metric] == [
        (t(f"paged.{k}", "ko"), m.value) for k, m in zip(metric_keys, lecturer.metric, strict=True)]
    assert not [b for b in follower.main.button if b.key and b.key.startswith("paged_")]  # no Add, Step, Play, Reset

    lecturer.button(key="paged_step").click().run()  # the lecturer's next step reaches the follower at its next poll
    lecturer.button(key="kv_idea_next_paged").click().run()  # and the pool's idea
    assert store.read(room_id)[1]["step"] == 2
    follower.run()
    assert follower.metric[0].value == "2"
    pool = chart(lecturer, t("paged.c_pool_title", "en"))["data"][0]
    assert chart(follower, t("paged.c_pool_title", "ko"))["data"][0]["z"] == pool["z"]

    version = _explore(follower, store, room_id)  # the lecturer's requests, replayed here to the lecturer's step
    from kvviz.engine.paged.scheduler import snapshot

    mine = follower.session_state["paged_engine"]
    assert mine is not engine and mine.n_steps == engine.n_steps == 2
    def state(e):  # noqa: ANN001, ANN202 - the pool's blocks and requests, the time to a first token left out
        blocks, requests = snapshot(e)
        return blocks, [dataclasses.replace(r, ttft_s=None) for r in requests]

    assert state(mine) == state(engine)  # the same blocks, tables, hits and tokens
    assert [r.output_ids for r in mine.requests] == [r.output_ids for r in engine.requests]
    for key in ("paged_blocks", f"paged_system_{view['max_len']}", f"paged_own_{view['max_len']}"):
        assert follower.number_input(key=key).value == lecturer.number_input(key=key).value, key
    assert follower.selectbox(key="paged_block").value == lecturer.selectbox(key="paged_block").value
    follower.button(key="paged_step").click().run()  # the follower steps on their own; the lecture does not move
    assert mine.n_steps == 3 and store.read(room_id)[1]["step"] == 2
    _follow_again(follower, store, room_id, version)


LATENCY = "pages/4_Latency_and_Capacity.py"


def test_a_follower_sees_the_lecturers_sweep_and_roofline(store):
    from tests.pages.test_prefill_and_latency import SMALL, _until

    lecturer, room_id = _sharing(LATENCY, SMALL, idea="3")  # the batch sweep's screen
    assert store.read(room_id)[1]["shown"] == ["batch"]
    follower = open_page(LATENCY, lang="ko", room=room_id)
    assert [i.value for i in follower.info] == [t("room.waiting_run", "ko")]

    lecturer.text_input(key="latency_b_batches").set_value("1, 2")
    lecturer.number_input(key=f"latency_b_prompt_{SMALL.max_seq_len}").set_value(8)
    lecturer.number_input(key="latency_b_new").set_value(3)
    lecturer.button(key="latency_start_batch").click().run()
    assert store.read(room_id)[1]["sweeps"] == {"batch": {"measuring": True}}
    _until(lecturer, lambda: lecturer.session_state["latency_run_batch"].finished)
    lecturer.run()
    rows = lecturer.session_state["latency_run_batch"].rows
    assert store.read(room_id)[1]["sweeps"]["batch"]["rows"] == rows  # the lecturer's measured rows, as they are
    follower.run()
    ours, theirs = _chart(lecturer, "latency_chart_batch"), _chart(follower, "latency_chart_batch")
    assert [d["y"] for d in theirs["data"]] == [d["y"] for d in ours["data"]]
    assert theirs["layout"]["title"]["text"] == t("latency.bchart_title", "ko")
    assert not [w for w in follower.main.get("button") if w.key and w.key.startswith("latency_")]  # no Start, no Cancel

    lecturer.button(key="kv_idea_next_latency").click().run()  # dtype
    lecturer.button(key="kv_idea_next_latency").click().run()  # the roofline's bounds
    lecturer.number_input(key="latency_r_batch").set_value(8).run()
    view = store.read(room_id)[1]
    assert view["shown"] == ["roof_bounds"] and view["roof"]["batch"] == 8
    follower.run()
    assert [m.value for m in follower.metric] == [m.value for m in lecturer.metric]  # the bounds at the lecturer's B
    assert not follower.main.get("number_input") and not follower.main.get("selectbox")  # its inputs are not here

    version = _explore(follower, store, room_id)  # the lecturer's model and boxes, now the follower's own
    assert follower.session_state["kv_shape"] == lecturer.session_state["kv_shape"]
    assert follower.number_input(key="latency_r_batch").value == 8
    for key in ("latency_r_hw", "latency_r_model", "latency_r_wdtype", "latency_r_kvdtype"):
        assert follower.selectbox(key=key).value == lecturer.selectbox(key=key).value, key
    assert [m.value for m in follower.metric] == [m.value for m in lecturer.metric]  # the same bounds, here
    follower.number_input(key="latency_r_batch").set_value(16).run()  # the follower's own change
    assert store.read(room_id)[1]["roof"]["batch"] == 8
    _follow_again(follower, store, room_id, version)


COMPRESSING = "pages/8_Compressing_the_Cache.py"


def _widgets(at, *kinds: str) -> list:
    """The page's input widgets of these kinds (the sidebar's own language and model boxes left out)."""
    return [w for kind in kinds for w in at.main.get(kind)]


def test_a_follower_sees_the_lecturers_compression_rows(store):
    from tests.pages.test_compressing import SMALL, TEXT, finished

    lecturer, room_id = _sharing(COMPRESSING, SMALL, text="own", tokens="256")
    view = store.read(room_id)[1]
    assert view.pop("explore")["kv_url_text"] == "own"  # the lecturer's boxes, for "Explore from here"
    assert view == {"page": "compression", "shown": [0], "measuring": False, "result": None, "path": COMPRESSING}
    follower = open_page(COMPRESSING, lang="ko", room=room_id)
    assert [i.value for i in follower.info] == [t("room.waiting_run", "ko")]

    lecturer.text_area(key="compression_own_text").input(TEXT).run()
    lecturer.button(key="compression_run").click().run()  # (on a quick machine measured within the first tick: no
    finished(lecturer)  # "measuring" view to wait for, as on Prefill & Decode)
    rows = lecturer.session_state["compression_result"][1]
    version, view = store.read(room_id)
    assert not view["measuring"] and view["picks"] == {"kv_dtype": "bfloat16", "metric": "kl"}
    published = view["result"]["rows"]
    assert [(r["method"], r["perplexity"], r["kl_divergence"], r["kv_bytes"]) for r in published] == [
        (r.method, r.perplexity, r.kl_divergence, r.kv_bytes) for r in rows]  # the lecturer's measured rows

    follower.run()
    ours, theirs = _chart(lecturer, "compression_tradeoff"), _chart(follower, "compression_tradeoff")
    assert [(d["x"], d["y"]) for d in theirs["data"]] == [(d["x"], d["y"]) for d in ours["data"]]
    assert theirs["layout"]["yaxis"]["title"]["text"] == t("compression.chart_kl", "ko")
    table = follower.dataframe[0].value
    assert list(table.columns)[0] == t("compression.table_method", "ko")
    assert (table.iloc[:, 1:].values == lecturer.dataframe[0].value.iloc[:, 1:].values).all()  # the same figures
    assert t("compression.method_fp8", "ko") + " (scale=1.0)" in list(table.iloc[:, 0])  # named in Korean
    assert "강의를 따라 보고 있습니다" in [c.value for c in follower.caption]
    for kind in ("button", "radio", "selectbox", "select_slider", "text_area", "multiselect"):
        # no Run, no box: nothing of the follower's reaches the room (Explore from here takes the follower away)
        assert not [w for w in _widgets(follower, kind) if w.key != "room_btn_explore"], kind
    assert store.read(room_id)[0] == version  # the follower changed nothing
    sneaky = open_page(COMPRESSING, room=room_id, kvdtype="float32", metric="top1")  # its link cannot either
    assert _chart(sneaky, "compression_tradeoff")["layout"]["yaxis"]["title"]["text"] == t("compression.chart_kl",
                                                                                           "en")
    assert store.read(room_id)[0] == version

    lecturer.radio(key="_w_kv_url_metric").set_value("top1").run()  # the lecturer's choice reaches the room
    follower.run()
    assert [d["y"] for d in _chart(follower, "compression_tradeoff")["data"]] == [
        d["y"] for d in _chart(lecturer, "compression_tradeoff")["data"]]
    lecturer.button(key="kv_idea_next_compression").click().run()  # the kept positions
    lecturer.selectbox(key="_w_compression_layer").set_value(1).run()
    view = store.read(room_id)[1]
    assert view["shown"] == [1] and view["picks"]["layer"] == 1
    follower.run()
    ours, theirs = _chart(lecturer, "compression_strip"), _chart(follower, "compression_strip")
    assert theirs["data"][0]["z"] == ours["data"][0]["z"] and not _chart_or_none(follower, "compression_tradeoff")
    assert theirs["layout"]["title"]["text"] == t("compression.chart_strip_title", "ko", layer=1,
                                                 step=view["picks"]["step"])
    lecturer.button(key="kv_idea_next_compression").click().run()  # one method's attention beside the full cache's
    lecturer.selectbox(key="_w_compression_attn_method").set_value(2).run()
    follower.run()
    ours, theirs = _chart(lecturer, "compression_attention"), _chart(follower, "compression_attention")
    assert [(d["x"], d["y"]) for d in theirs["data"]] == [(d["x"], d["y"]) for d in ours["data"]]
    assert not _widgets(follower, "selectbox", "select_slider")

    version = _explore(follower, store, room_id)  # the lecturer's text, sizes and picks, the follower's own to run
    assert follower.radio(key="_w_kv_url_text").value == "own"
    assert follower.text_area(key="compression_own_text").value == TEXT
    for key in ("_w_kv_url_seq", "_w_kv_url_tokens"):
        assert follower.selectbox(key=key).value == lecturer.selectbox(key=key).value, key
    budgets = "_w_compression_budgets"
    assert follower.multiselect(key=budgets).value == lecturer.multiselect(key=budgets).value
    assert [follower.session_state[k] for k in ("compression_layer", "compression_attn_method",
                                                "kv_url_metric")] == [1, 2, "top1"]
    follower.selectbox(key="_w_kv_url_seq").set_value(128).run()  # the follower's own change
    _follow_again(follower, store, room_id, version)


def test_a_long_pasted_text_is_not_carried_and_sharing_goes_on(store):
    """A 200,000-character Korean text (the box's limit) escaped to JSON is 1.2 MB, past the store's limit on a view:
    sent with every view it stopped the page's updates. Longer than SHARED_TEXT_CHARS it stays with the lecturer."""
    from kvviz.app.room.explore import SHARED_TEXT_CHARS
    from kvviz.room.store import MAX_SNAPSHOT_BYTES
    from tests.pages.test_compressing import SMALL

    lecturer, room_id = _sharing(COMPRESSING, SMALL, text="own", tokens="256")
    long_text = "키와 값을 캐시에 둔다. " * 14_000
    assert len(long_text) <= 200_000 and len(json.dumps(long_text)) > MAX_SNAPSHOT_BYTES
    lecturer.text_area(key="compression_own_text").input(long_text).run()
    assert not lecturer.exception and not lecturer.error  # no "too large" refusal on the lecturer's page
    version, view = store.read(room_id)
    assert "compression_own_text" not in view["explore"] and view["explore"]["kv_url_text"] == "own"
    short = long_text[:SHARED_TEXT_CHARS]
    lecturer.text_area(key="compression_own_text").input(short).run()
    later, view = store.read(room_id)
    assert later > version and view["explore"]["compression_own_text"] == short  # up to the limit it travels whole


def _chart_or_none(at, key: str) -> dict | None:
    return next((c for c in at.get("plotly_chart") if key in c.proto.id), None)


SPECULATIVE = "pages/10_Speculative_Decoding.py"


def test_a_follower_sees_the_lecturers_speculative_run(store):
    from tests.pages.test_speculative import _chart as spec_chart
    from tests.pages.test_speculative import _grid, _page, _run, _step

    lecturer = _page(lecture=True)
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    _run(lecturer, "ngram", 3)
    gen = lecturer.session_state["spec_gen"]
    version, view = store.read(room_id)
    assert view["page"] == "spec" and view["shown"] == ["step"] and view["n_steps"] == 3
    assert [e["accepted"] for e in view["run"]["events"]] == [e.accepted for e in gen.events]
    assert view["run"]["rollback_tokens"] == gen.rollback_tokens

    follower = open_page(SPECULATIVE, lang="ko", room=room_id)
    assert "spec_gen" not in follower.session_state or follower.session_state["spec_gen"] is None  # no model here
    assert _grid(follower) == _grid(lecturer)  # the target's cache through verify and rollback, the same cells
    last = gen.events[-1]
    status = t("spec.status", "ko", n_prompt=len(gen.prompt_ids), n_gen=gen.n_generated, passes=gen.target_passes,
               plain=gen.plain_passes, rolled=gen.rollback_tokens, mal=f"{gen.stats.mean_acceptance_length:.2f}",
               step_ms=f"{last.seconds * 1e3:.1f}")
    captions = [c.value for c in follower.caption]
    assert status in captions and "강의를 따라 보고 있습니다" in captions  # the lecturer's numbers, in Korean
    for kind in ("button", "text_area", "number_input", "radio", "selectbox", "slider"):
        assert not [w for w in follower.main.get(kind) if w.key and "spec" in w.key], kind  # no Step, no box
    assert store.read(room_id)[0] == version  # the follower changed nothing

    _step(lecturer)
    assert store.read(room_id)[1]["n_steps"] == 4
    follower.run()  # the follower's next poll
    assert _grid(follower) == _grid(lecturer)
    lecturer.button(key="kv_idea_next_spec").click().run()  # the acceptance
    follower.run()
    for key in ("spec_acceptance", "spec_per_position", "spec_bytes"):
        ours, theirs = spec_chart(lecturer, key), spec_chart(follower, key)
        assert [d["y"] for d in theirs["data"]] == [d["y"] for d in ours["data"]], key
    assert spec_chart(follower, "spec_acceptance")["layout"]["title"]["text"] == t("spec.c_acceptance_title", "ko")
    assert [(m.label, m.value) for m in follower.metric] == [
        (t(f"spec.{k}", "ko"), m.value) for k, m in zip(("m_mal", "m_passes", "m_rolled", "m_draft_kv"),
                                                        lecturer.metric, strict=True)]
    lecturer.button(key="kv_idea_next_spec").click().run()  # the speed: measured by the lecturer's session
    lecturer.button(key="spec_btn_measure").click().run()
    assert store.read(room_id)[1]["speed"]["measured"]
    follower.run()
    ours, theirs = lecturer.dataframe[-1].value, follower.dataframe[-1].value
    assert list(theirs.columns) == [t(f"spec.col_{k}", "ko") for k in ("where", "plain", "spec", "speedup")]
    assert (theirs.iloc[:, 1:].values == ours.iloc[:, 1:].values).all() and len(theirs) == 2  # here, and the GPU
    assert not [b for b in follower.main.button if b.key and b.key.startswith("spec_")]  # no Measure

    version = _explore(follower, store, room_id)  # the lecturer's run, replayed here to the lecturer's step
    mine = follower.session_state["spec_gen"]
    assert mine is not None and mine is not gen and mine.seed == gen.seed
    assert mine.token_ids == gen.token_ids and [e.accepted for e in mine.events] == [e.accepted for e in gen.events]
    assert follower.radio(key="_w_spec_method").value == "ngram" and follower.number_input(key="spec_k").value == (
        lecturer.number_input(key="spec_k").value)
    assert follower.text_area(key="_w_spec_prompt").value == lecturer.text_area(key="_w_spec_prompt").value
    _step(follower)  # the follower steps on their own; the lecture does not move
    assert len(mine.events) == len(gen.events) + 1 and store.read(room_id)[1]["n_steps"] == 4
    _follow_again(follower, store, room_id, version)

    served = lecturer.session_state["spec_served"]
    lecturer.session_state["spec_stepper"] = {"events": [[served + 1, "reset"]]}  # the lecturer's Reset
    lecturer.run()
    assert lecturer.session_state["spec_gen"] is None
    follower.run()  # not the run of before: waiting for the next one
    assert [i.value for i in follower.info] == [t("room.waiting_run", "ko")] and not follower.get("plotly_chart")


TRAINING = "pages/5_Training_Prefill_Decode.py"


def test_a_follower_sees_the_lecturers_training_passes(store):
    import numpy as np

    from tests.pages.test_training_check import figure
    from tests.pages.test_training_check import open_page as training_page

    lecturer = training_page(TRAINING, lang="en", lecture="1")  # a small random model: the passes are quick
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    version, view = store.read(room_id)
    assert view["page"] == "training" and view["shown"] == [0] and view["run"]["steps"] == 8
    follower = open_page(TRAINING, lang="ko", room=room_id)
    ours, theirs = figure(lecturer, "training_logits_diff"), figure(follower, "training_logits_diff")
    assert [d["customdata"] for d in theirs["data"][:2]] == [d["customdata"] for d in ours["data"][:2]]
    assert theirs["data"][0]["customdata"] == view["result"]["logits_max_diff"][:len(view["run"]["ids"]) - 8]
    said = lecturer.success[0].value  # the verdict: the lecturer's differences and tolerances, in Korean
    assert sorted(_numbers(follower.success[0].value)) == sorted(_numbers(said)) and len(_numbers(said)) == 6
    assert follower.success[0].value.startswith("부동소수점 반올림 오차")
    assert theirs["layout"]["title"]["text"] == t("training.logits_title", "ko")
    for kind in ("selectbox", "radio", "slider", "text_input"):
        assert not follower.main.get(kind), kind  # no text, no steps, no layer: nothing of the follower's
    assert store.read(room_id)[0] == version  # the follower changed nothing

    lecturer.button(key="kv_idea_next_training").click().run()  # K/V side by side
    lecturer.selectbox(key="s1_layer").set_value(1).run()
    lecturer.radio(key="s1_tensor").set_value("V").run()
    assert store.read(room_id)[1]["kv"]["layer"] == 1
    follower.run()
    ours, theirs = figure(lecturer, "training_kv"), figure(follower, "training_kv")
    kv = store.read(room_id)[1]["kv"]
    # the lecturer's layer 1 V from both paths, to the bit (the projector draws positions down, a phone across)
    assert [np.asarray(d["z"]).T.tolist() for d in theirs["data"]] == [d["z"] for d in ours["data"]]
    assert np.asarray(theirs["data"][0]["z"]).T.tolist() == np.asarray(kv["parallel"], dtype=kv["dtype"]).tolist()
    lecturer.button(key="kv_idea_next_training").click().run()  # the mask
    lecturer.radio(key="_w_kv_url_attn").set_value("bidirectional").run()
    follower.run()
    assert [d["y"] for d in figure(follower, "training_drift")["data"]] == [
        d["y"] for d in figure(lecturer, "training_drift")["data"]]
    (moved,) = follower.error  # the past K/V moved above layer 0, said in Korean with the lecturer's numbers
    assert t("training.mode_bidirectional", "ko") in moved.value and sorted(_numbers(moved.value)) == sorted(
        _numbers(lecturer.error[0].value))  # (each language orders them its own way)
    lecturer.button(key="kv_idea_next_training").click().run()  # the attention rows
    lecturer.selectbox(key="s3_head").set_value(3).run()
    follower.run()
    for key in ("training_attention", "training_decode_row"):  # the masked cells drawn blank (NaN) on both
        for ours, theirs in zip(figure(lecturer, key)["data"], figure(follower, key)["data"], strict=True):
            assert np.array_equal(np.asarray(theirs.get("z", theirs.get("y")), dtype=float),
                                  np.asarray(ours.get("z", ours.get("y")), dtype=float), equal_nan=True), key
    assert figure(follower, "training_attention")["layout"]["title"]["text"] == t("training.attn_title", "ko",
                                                                                 layer=0, head=3)
    assert not follower.main.get("selectbox") and store.read(room_id)[0] > version

    # An English follower explores (AppTest formats a Korean selectbox's options in English on its next run)
    follower = open_page(TRAINING, room=room_id)
    version = _explore(follower, store, room_id)  # the lecturer's model, text and picks, run here
    assert follower.session_state["kv_shape"] == lecturer.session_state["kv_shape"]
    assert follower.selectbox(key="s3_head").value == 3 and follower.radio(key="_w_kv_url_attn").value == (
        "bidirectional")
    for key in ("training_attention", "training_decode_row"):  # the same rows, computed by the follower's session
        for ours, theirs in zip(figure(lecturer, key)["data"], figure(follower, key)["data"], strict=True):
            assert np.array_equal(np.asarray(theirs.get("z", theirs.get("y")), dtype=float),
                                  np.asarray(ours.get("z", ours.get("y")), dtype=float), equal_nan=True), key
    follower.selectbox(key="s3_head").set_value(0).run()  # the follower's own change
    _follow_again(follower, store, room_id, version)


def _numbers(text: str) -> list[str]:
    """The figures a sentence states (1.49e-07, 0.5, 3), in its order."""
    import re

    return re.findall(r"\d+(?:\.\d+)?(?:e[-+]\d+)?", text)


MOVING = "pages/11_Moving_the_Cache.py"


def test_a_follower_sees_the_lecturers_requests_and_break_even(store):
    from kvviz.engine.offload.serve import SCRIPT

    lecturer = open_page(MOVING, lecture="1")
    lecturer.button(key="room_share").click().run()
    room_id = lecturer.session_state["room_id"]
    lecturer.selectbox(key="moving_chunk").set_value(16).run()  # small chunks keep the requests quick
    lecturer.button(key="moving_next").click().run()
    lecturer.button(key="moving_next").click().run()
    demo = lecturer.session_state["moving_demo"]
    version, view = store.read(room_id)
    assert view["shown"] == ["tiers"] and len(view["store"]["results"]) == 2
    assert [r["ttft_s"] for r in view["store"]["results"]] == [r["ttft_s"] for r in demo.results]  # as measured

    follower = open_page(MOVING, lang="ko", room=room_id)
    assert "moving_demo" not in follower.session_state or follower.session_state["moving_demo"] is None  # no store here
    ours, theirs = _chart(lecturer, "moving_tiers"), _chart(follower,
                                                            "moving_tiers")  # each tier's chunks, named in Korean
    assert [d.get("y") for d in theirs["data"]] == [d.get("y") for d in ours["data"]]
    assert [_numbers(str(d["text"])) for d in theirs["data"]] == [_numbers(str(d["text"])) for d in ours["data"]]
    assert theirs["data"][0]["x"][0] == t("moving.c_device", "ko")
    assert theirs["layout"]["title"]["text"] == t("moving.c_tiers_title", "ko")
    assert len(follower.dataframe[0].value) == len(lecturer.dataframe[0].value) == 2  # every request's row
    assert t("moving.next", "ko", n=3, what=t(f"moving.about_{SCRIPT[2][0]}", "ko")) in [i.value for i in follower.info]
    for kind in ("button", "selectbox", "number_input", "multiselect"):
        assert not [w for w in follower.main.get(kind) if w.key and w.key.startswith("moving_")], kind
    assert store.read(room_id)[0] == version  # the follower changed nothing

    lecturer.button(key="kv_idea_next_moving").click().run()  # TTFT both ways
    follower.run()
    ours, theirs = _chart(lecturer, "moving_ttft"), _chart(follower, "moving_ttft")
    assert [d["y"] for d in theirs["data"]] == [d["y"] for d in ours["data"]]  # the lecturer's measured TTFTs
    lecturer.button(key="kv_idea_next_moving").click().run()  # the break-even, on the lecturer's deployment
    lecturer.selectbox(key="moving_gpu").set_value("H100 SXM").run()
    view = store.read(room_id)[1]
    assert view["deployment"]["gpu"] == "H100 SXM" and view["links"]["links"]
    follower.run()
    ours, theirs = _chart(lecturer, "moving_break_even"), _chart(follower, "moving_break_even")
    assert [(d.get("x"), d.get("y")) for d in theirs["data"]] == [(d.get("x"), d.get("y")) for d in ours["data"]]
    cells = [[_numbers(str(c)) for c in row] for row in follower.table[0].value.values]  # where loading wins, per link
    assert cells == [[_numbers(str(c)) for c in row] for row in lecturer.table[0].value.values] and cells
    assert not [w for w in follower.main.get("selectbox") if w.key and w.key.startswith("moving_")]

    follower = open_page(MOVING, room=room_id)  # (an English one: AppTest formats options in English)
    version = _explore(follower, store, room_id)  # the lecturer's settings; the requests are the follower's to serve
    assert follower.selectbox(key="moving_chunk").value == 16
    assert follower.selectbox(key="moving_gpu").value == "H100 SXM"
    assert follower.session_state.get("moving_demo") is None or not follower.session_state["moving_demo"].results
    ours, theirs = _chart(lecturer, "moving_break_even"), _chart(follower, "moving_break_even")  # computed here
    assert [(d.get("x"), d.get("y")) for d in theirs["data"]] == [(d.get("x"), d.get("y")) for d in ours["data"]]
    follower.selectbox(key="moving_gpu").set_value("A100 80GB").run()  # the follower's own change
    assert store.read(room_id)[1]["deployment"]["gpu"] == "H100 SXM"
    _follow_again(follower, store, room_id, version)



@pytest.mark.llama_server
def test_a_follower_sees_the_lecturers_prefix_experiment_and_load_run(store, tmp_path):
    """A real llama-server on the shipped model: the lecturer's page connects and runs (in its worker processes);
    a follower draws the workers' latest states, and reaches no server."""
    from kvviz.engine.export import export_gguf
    from kvviz.engine.loading import load_backend
    from kvviz.serving.llamacpp import LlamaServer
    from tests.pages.test_prefill_and_latency import _until

    backend = load_backend("tiny", device="cpu")
    gguf = export_gguf(backend.model, backend.tokenizer, tmp_path / "kvviz-tiny.gguf", name="kvviz-tiny")
    with LlamaServer(gguf, log=tmp_path / "llama-server.log") as server:
        lecturer = open_page(SERVING, lecture="1", idea="5")  # the prefix experiment's screen
        lecturer.button(key="room_share").click().run()
        room_id = lecturer.session_state["room_id"]
        lecturer.text_input(key="serving_url").set_value(server.base_url).run()
        next(b for b in lecturer.button if b.label == "Connect").click().run()
        view = store.read(room_id)[1]
        assert (view["shown"], view["engine"], view["prefix"]) == ("prefix", "llama.cpp", None)
        follower = open_page(SERVING, lang="ko", room=room_id)
        assert t("room.waiting_run", "ko") in [i.value for i in follower.info]

        lecturer.number_input(key="serving_prefix_repeats").set_value(1).run()
        lecturer.button(key="serving_prefix_run").click().run()
        _until(lecturer, lambda: lecturer.session_state["serving_prefix_worker"] is None, limit=180, pause_s=1.0)
        finished = lecturer.session_state["serving_prefix_state"]
        assert finished.final and finished.result["rows"]
        version, view = store.read(room_id)
        assert view["prefix"]["result"] == json.loads(json.dumps(finished.result))  # as the worker wrote it
        follower.run()
        ours, theirs = _chart(lecturer, "serving_prefix"), _chart(follower, "serving_prefix")
        assert [d.get("y") for d in theirs["data"]] == [d.get("y") for d in ours["data"]]  # the lecturer's TTFTs
        said = next(m.value for m in follower.markdown if m.value.startswith(t("serving.prefix_result", "ko")[:6]))
        assert sorted(_numbers(said)) == sorted(_numbers(next(
            m.value for m in lecturer.markdown if m.value.startswith(t("serving.prefix_result", "en")[:6]))))
        server_line = t("serving.room_server", "ko", engine="llama.cpp", model="kvviz-tiny")
        assert server_line in [c.value for c in follower.caption]
        for kind in ("button", "text_input", "number_input", "selectbox", "radio"):
            assert not [w for w in follower.main.get(kind) if w.key and w.key.startswith("serving_")], kind
        # no server here
        assert "serving_conn" not in follower.session_state or follower.session_state["serving_conn"] is None
        assert store.read(room_id)[0] == version  # the follower changed nothing

        lecturer.session_state["kv_idea_serving"] = 1  # the load run's chart
        lecturer.run()
        for key, value in (("serving_requests", 4), ("serving_prompt", 16), ("serving_max_tokens", 4)):
            lecturer.number_input(key=key).set_value(value).run()
        lecturer.text_input(key="serving_conc").set_value("1, 2").run()
        lecturer.button(key="serving_start").click().run()
        _until(lecturer, lambda: lecturer.session_state["serving_worker"] is None, limit=180, pause_s=1.0)
        points = lecturer.session_state["serving_state"].result["points"]
        view = store.read(room_id)[1]
        assert view["shown"] == "load" and view["load"]["status"] == "done"
        assert view["load"]["result"]["points"] == json.loads(json.dumps(points)) and len(points) == 2
        follower.run()
        ours, theirs = _chart(lecturer, "serving_load"), _chart(follower, "serving_load")
        assert [d.get("y") for d in theirs["data"]] == [d.get("y") for d in ours["data"]]  # the lecturer's points
        assert theirs["layout"]["xaxis"]["title"]["text"] == t("serving.cc_x", "ko")
        assert not [b for b in follower.main.button if b.key and b.key.startswith("serving_")]  # no Start, no Cancel
