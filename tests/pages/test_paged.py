"""The Paged Blocks page headless (AppTest): shared blocks in the block tables, the hit boundary, a preemption."""
import json

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.i18n import t
from tests.pages.pagetest import APP, chart, open_page

PAGE = "pages/9_Paged_Blocks.py"


def _open(lang: str, **query: str) -> AppTest:
    return open_page(PAGE, lang, **query)


@pytest.mark.parametrize("lang, title, tables", [
    ("en", "Paged Blocks & Prefix Sharing", "Block tables: logical → physical"),
    ("ko", "페이지 블록과 프리픽스 공유", "블록 테이블: 논리 → 물리"),
])
def test_four_requests_share_the_system_prompt(lang, title, tables):
    at = _open(lang)
    assert at.title[0].value == title
    assert at.number_input(key="paged_blocks").value == 20
    at.button(key="paged_add4").click().run()
    at.button(key="paged_step").click().run()  # one scheduler step admits all four (vLLM: same-step prefix hits)
    assert not at.exception
    engine = at.session_state["paged_engine"]
    assert [r.admitted_step for r in engine.requests] == [0, 0, 0, 0]
    assert [r.cached_tokens for r in engine.requests] == [0, 48, 48, 48]  # ⌊48/16⌋·16 of a 48-token system prompt
    heat = chart(at, tables)["data"][0]
    first_blocks = [row[:3] for row in heat["text"]]
    assert first_blocks[0] == first_blocks[1] == first_blocks[2] == first_blocks[3]  # the same physical blocks
    assert heat["z"][0][:3] == [5, 5, 5]  # coloured "shared by 4+"
    assert all(row[3] != first_blocks[0][0] for row in heat["text"])  # own blocks differ
    shapes = chart(at, tables)["layout"]["shapes"]
    assert [s["x0"] for s in shapes] == [2.5, 2.5, 2.5]  # the hit boundary after 3 blocks, for R1..R3


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_finished_requests_show_released_blocks(lang):
    """After R0..R3 finish, their rows showed block ids that other requests had since taken (read as sharing);
    a finished row now only shows how many blocks it released."""
    at = _open(lang)
    max_len = at.session_state["paged_engine"].model.cfg.max_seq_len
    at.number_input(key=f"paged_new_{max_len}").set_value(2).run()
    at.button(key="paged_add4").click().run()
    for _ in range(2):
        at.button(key="paged_step").click().run()
    at.button(key="paged_add_own").click().run()
    at.button(key="paged_step").click().run()  # R4 runs in blocks the four released
    assert not at.exception
    engine = at.session_state["paged_engine"]
    assert [r.status for r in engine.requests] == ["finished"] * 4 + ["running"]
    heat = chart(at, t("paged.c_tables_title", lang))["data"][0]
    released = t("paged.c_released", lang)
    for row, z, r in zip(heat["text"], heat["z"], engine.requests[:4], strict=False):
        assert [c for c in row if c] == [released] * r.n_released and r.n_released > 0
        assert {v for v in z if v is not None} == {0}  # drawn as free, not as shared
    assert all(c.isdigit() or "/" in c for c in heat["text"][4] if c)  # the running one shows its physical ids


def test_small_pool_preempts_and_recomputes():
    at = _open("en")
    at.number_input(key="paged_blocks").set_value(13).run()  # 12 to hand out and the null block: one victim
    at.button(key="paged_add4").click().run()
    for _ in range(40):
        at.button(key="paged_step").click().run()
        if any(r.n_preemptions for r in at.session_state["paged_engine"].requests):
            break
    assert not at.exception
    engine = at.session_state["paged_engine"]
    victim = next(r for r in engine.requests if r.n_preemptions)
    assert victim.request_id == max(r.request_id for r in engine.requests if r.status != "finished")
    usage = chart(at, "Pool usage over time")
    marks = next(d for d in usage["data"] if d.get("name") == "preempted")
    assert marks["text"] == [f"R{victim.request_id}"]
    assert any(m.value == "1" for m in at.metric)


def test_hosted_pool_past_the_kv_budget_is_refused(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_KV_BUDGET_BYTES", str(2**20))  # 1 MiB: 512 token slots of the shipped model
    at = _open("en")
    assert at.session_state["paged_engine"] is not None  # 20 blocks × 16 = 320 slots fit
    at.number_input(key="paged_blocks").set_value(64).run()  # 1024 slots do not
    assert not at.exception
    assert any("hosted demo" in e.value for e in at.error)
    assert at.session_state["paged_key"][2] == 20  # the larger pool is never allocated; the one before is kept


def test_hugging_face_choice_says_why_and_runs_the_shipped_model():
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["kv_model"] = "hf"
    at.switch_page(PAGE).run()
    assert not at.exception
    assert any("contiguous cache per request" in i.value for i in at.info)
    assert at.session_state["paged_engine"].model.cfg.max_seq_len > 0  # the native engine is ready


def _titles(at: AppTest) -> set[str]:
    return {json.loads(c.proto.spec)["layout"]["title"]["text"].replace("<br>", " ") for c in at.get("plotly_chart")}


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_lecture_mode_shows_one_idea_per_screen(lang):
    """On a projector the page is five screens: block tables, the pool, requests, what hits saved, memory."""
    t_ = {k: t(f"paged.c_{k}", lang) for k in ("tables_title", "pool_title", "savings_title", "usage_title",
                                              "frag_title")}
    at = _open(lang, lecture="1", idea="5")
    at.button(key="paged_add4").click().run()
    for _ in range(3):
        at.button(key="paged_step").click().run()
    assert not at.exception
    assert _titles(at) == {t_["usage_title"], t_["frag_title"]}
    assert not at.dataframe  # the requests table is another screen
    at.button(key="kv_idea_back_paged").click().run()
    assert _titles(at) == {t_["savings_title"]} and not at.dataframe
    at.button(key="kv_idea_back_paged").click().run()
    assert not _titles(at) and len(at.dataframe) == 1
    at.button(key="kv_idea_back_paged").click().run()
    assert _titles(at) == {t_["pool_title"]}
    at.button(key="kv_idea_back_paged").click().run()
    assert _titles(at) == {t_["tables_title"]}
    assert at.button(key="kv_idea_back_paged").disabled
    at.toggle(key="_w_kv_lecture").set_value(False).run()
    assert _titles(at) == set(t_.values()) and len(at.dataframe) == 1  # every idea on one page


def test_download_this_run_after_a_step_holds_every_step():
    from kvviz.charts.run_html import read_run, run_html
    from kvviz.i18n import t
    from kvviz.lessons.run_record import paged_record

    at = _open("en")
    button = next(b.proto for b in at.get("download_button") if b.proto.id.endswith("-paged_download"))
    assert button.disabled and button.help == t("run_html.download_none")
    at.button(key="paged_add4").click().run()
    for _ in range(2):
        at.button(key="paged_step").click().run()
    button = next(b.proto for b in at.get("download_button") if b.proto.id.endswith("-paged_download"))
    assert not button.disabled
    engine = at.session_state["paged_engine"]
    run = read_run(run_html(paged_record(engine), "en"))  # what the button's file holds: the page's engine's steps
    assert [s["report"]["step"] for s in run["steps"]] == [0, 1]
    assert [len(s["requests"]) for s in run["steps"]] == [4, 4]
