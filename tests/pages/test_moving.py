"""The Moving the Cache page headless (AppTest, issue 25): requests served through the tiers with their reasons,
TTFT both ways, the break-even chart and table, the per-rank calculator, hosted bounds, both languages."""

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.i18n import t
from tests.pages.pagetest import chart, open_page

PAGE = "pages/11_Moving_the_Cache.py"


def _open(lang: str) -> AppTest:
    return open_page(PAGE, lang)


def _table(at: AppTest, n: int):
    return at.dataframe[n].value


def _break_even(at: AppTest):
    return next(x.value for x in at.table if "loading wins from" in x.value.columns)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_requests_through_the_tiers(lang):
    at = _open(lang)
    assert at.title[0].value == t("moving.title", lang)
    at.selectbox(key="moving_chunk").set_value(16).run()
    for _ in range(3):
        at.button(key="moving_next").click().run()
    assert not at.exception
    demo = at.session_state["moving_demo"]
    assert [r["kind"] for r in demo.results] == ["first", "shared", "changed"]
    boxes = chart(at, t("moving.c_tiers_title", lang))
    texts = [bar["text"] for bar in boxes["data"]]
    assert [col[1] for col in texts[:3]] == ["A2", "A1", "A*2"]  # CPU memory, least recently used at the bottom
    assert [col[0] for col in texts[:2]] == ["A1", t("moving.c_computed_cell", lang, n=2 * 16 + 7 - 16)]
    requests = _table(at, 0)
    assert list(requests[t("moving.col_memory", lang)]) == [0, 32, 16]
    # changed at 24, inside the chunk 16..31: computed from 16 (as the memory column's 16 says)
    assert list(requests[t("moving.col_why", lang)])[2] == t("moving.reason_prompt_changed", lang, token=16,
                                                             changed_at=24, tier="", request="?")
    assert all(v.startswith(t("moving.equal", lang, diff="", tol="").split("(")[0])
               for v in requests[t("moving.col_logits", lang)])
    at.button(key="moving_all").click().run()
    assert at.session_state["moving_demo"].done and not at.exception
    why = list(_table(at, 0)[t("moving.col_why", lang)])
    assert why[6] == t("moving.reason_evicted", lang, token=16, tier=t("moving.tier_disk", lang), request=6)
    assert why[8] == t("moving.reason_corrupt", lang, token=0, tier=t("moving.tier_disk", lang), request="?")
    ttft = chart(at, t("moving.c_ttft_title", lang))
    assert len(ttft["data"]) == 4 and len(ttft["data"][0]["x"]) == 9


def test_break_even_table_chart_and_this_machine():
    at = _open("en")
    at.selectbox(key="moving_chunk").set_value(16).run()
    at.selectbox(key="moving_gpu").set_value("H100 SXM").run()
    table = _break_even(at)
    rows = dict(zip(table["link"], table["loading wins from"], strict=True))
    assert rows["local NVMe (PCIe 4.0 x4)"] == "5,136" and rows["100 Gb/s network"] == "from the first token"
    fig = chart(at, "Loading the K/V over a link vs recomputing it")
    diamonds = [d for d in fig["data"] if d.get("marker", {}).get("symbol") == "diamond"]
    assert any("5,136" in d["hovertext"] for d in diamonds)
    at.button(key="moving_measure").click().run()
    fig = chart(at, "Loading the K/V over a link vs recomputing it")
    names = [d.get("name") for d in fig["data"]]
    assert "this machine: CPU memory tier" in names and "this machine: disk tier" in names
    here = next(d for d in fig["data"] if d.get("name") == "this machine: CPU memory tier")
    tiers = at.session_state["moving_tiers"]
    assert here["y"] == [tiers[0].load_s.median / tiers[0].recompute_s.median] and here["x"] == [tiers[0].tokens]
    # Llama-2-7B (MHA) over 100 Gb/s: recomputing still wins at its 4,096-token context.
    at.selectbox(key="moving_model").set_value("Llama-2-7B").run()
    table = _break_even(at)
    assert dict(zip(table["link"], table["loading wins from"], strict=True))["100 Gb/s network"] == (
        "never within 4,096 tokens")


def test_per_rank_calculator_line():
    at = _open("en")
    at.selectbox(key="moving_model").set_value("Llama-3.1-70B").run()
    at.number_input(key="moving_tp").set_value(16).run()
    line = next(m.value for m in at.markdown if m.value.startswith("**Llama-3.1-70B**"))
    # 64 tokens · 80 layers · 2 · 1 KV head · 128 · 2 bytes per rank; 16 ranks, each a copy of one of 8 heads.
    assert "2.50 MiB per rank (1 KV head each), 40.00 MiB in all" in line and "own copy" in line


def test_hosted_mode_bounds_the_store_and_runs_no_handoff(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_OFFLOAD_STORE_BYTES", str(2 * 2**20))
    at = _open("en")  # 256-token chunks of the shipped model: 384 KiB each, 3 + 7 of them > 2 MiB
    assert any("each session may hold at most 2.00 MiB" in e.value for e in at.error)
    assert "moving_demo" not in at.session_state
    at.selectbox(key="moving_chunk").set_value(16).run()
    assert not at.error and at.session_state["moving_demo"] is not None
    assert any("runs only on your own machine" in i.value for i in at.info)
    assert not [b for b in at.button if b.key in ("moving_run_kvviz", "moving_run_llamacpp")]
