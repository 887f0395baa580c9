"""The Speculative Decoding page under AppTest: a real speculative generation on the shipped model; the grid draws
the rolled-back positions, the charts carry the engine's own numbers, bad settings are said in the user's language."""
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.i18n import t
from tests.pages.pagetest import grid_html

ROOT = Path(__file__).resolve().parents[2]
PAGE = "pages/10_Speculative_Decoding.py"
HOME = str(ROOT / "app.py")
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


def _page(lang: str = "en", lecture: bool = False, **state) -> AppTest:
    at = AppTest.from_file(HOME, default_timeout=120)
    at.query_params["lang"] = lang
    if lecture:
        at.query_params["lecture"] = "1"
    at.run()
    for key, value in state.items():
        at.session_state[key] = value
    at.switch_page(PAGE).run()
    assert not at.exception
    return at


def _step(at: AppTest, clicks: int = 1) -> AppTest:
    served = at.session_state["spec_served"]
    at.session_state["spec_stepper"] = {"events": [[served + i + 1, "step"] for i in range(clicks)]}
    return at.run()


def _grid(at: AppTest, index: int = 0) -> dict[str, list[tuple[str, int, int]]]:
    html = grid_html(at)[index]
    rows = {}
    for name, body in re.findall(r'data-row="([^"]+)" data-cached="\d+"(.*?)(?=class="kv-row"|$)', html, flags=re.S):
        rows[name] = [(k, int(a), int(b)) for k, a, b in
                      re.findall(r'data-kind="(\w+)" data-from="(\d+)" data-to="(\d+)"', body)]
    return rows


def _chart(at: AppTest, key: str) -> dict:
    charts = [c for c in at.get("plotly_chart") if c.proto.id.endswith("-" + key) or c.proto.id == key]
    assert charts, f"no chart {key}"
    return json.loads(charts[0].proto.spec)


def _run(at: AppTest, method: str, steps: int, **settings) -> AppTest:
    at.session_state["spec_method"] = method
    for key, value in settings.items():
        at.session_state[key] = value
    at.run()
    at.text_area(key="_w_spec_prompt").set_value(PROMPT)
    at.button(key="spec_btn_prefill").click().run()
    for _ in range(steps):
        _step(at)
    assert not at.exception
    return at


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_early_exit_steps_draw_the_rollback(lang):
    at = _run(_page(lang), "early-exit", 3)
    gen = at.session_state["spec_gen"]
    last = gen.events[-1]
    assert at.title[0].value == t("spec.title", lang)
    rows = _grid(at)
    m = gen.draft.shared_layers
    assert len(rows) == 2 * gen.backend.spec.n_layers
    kept, end = last.cache_lengths[0], last.cache_lengths[0] + last.rolled_back
    for name, segs in rows.items():
        layer = int(name.split()[0][1:])
        newest = "draft" if layer < m else "newest"
        assert segs[-1 if not last.rolled_back else -2][0] == newest
        if last.rolled_back:  # the verify wrote them, the rollback took them: striped, after the kept ones
            assert segs[-1] == ("rejected", kept, end - 1)
        else:
            assert segs[-1][2] == kept - 1
    line = next(c.value for c in at.caption if t("spec.c_peak", lang)[:3] in c.value or "B" in c.value
                and f"{last.live_bytes:,}" in c.value)
    assert f"{last.formula_bytes:,}" in line and f"{last.peak_live_bytes:,}" in line


def test_acceptance_charts_carry_the_engine_numbers():
    at = _run(_page(), "ngram", 6)
    gen = at.session_state["spec_gen"]
    spec = _chart(at, "spec_acceptance")
    by_name = {d["name"]: d for d in spec["data"]}
    steps = gen.events[1:]
    assert by_name[t("spec.c_accepted", "en")]["y"] == [e.accepted for e in steps]
    assert by_name[t("spec.c_rejected", "en")]["y"] == [len(e.drafted) - e.accepted for e in steps]
    assert by_name[t("spec.c_emitted", "en")]["y"] == [len(e.emitted) for e in steps]
    per_pos = _chart(at, "spec_per_position")["data"][0]["y"]
    assert per_pos == [r or 0 for r in gen.stats.acceptance_rate_per_pos]
    bytes_spec = {d["name"]: d["y"] for d in _chart(at, "spec_bytes")["data"]}
    assert bytes_spec[t("spec.c_live", "en")] == bytes_spec[t("spec.c_formula", "en")]


def test_draft_model_shows_its_own_cache():
    at = _run(_page(), "draft", 2, spec_draft_model="layers")
    gen = at.session_state["spec_gen"]
    own = _grid(at, 1)
    m = gen.draft.backend.spec.n_layers
    assert sorted(own) == sorted(f"D{i} {kv}" for i in range(m) for kv in ("K", "V"))
    assert all(segs[-1][2] == gen.events[-1].draft_lengths[0] - 1 for segs in own.values())


def test_measure_compares_plain_and_speculative():
    at = _run(_page(), "early-exit", 1, spec_max_new=8)
    at.button(key="spec_btn_measure").click().run()
    assert not at.exception
    measured = at.session_state["spec_measured"]
    assert measured.tokens_equal_plain is True and measured.tpot_s.n == 3
    table = at.dataframe[-1].value
    assert len(table) == 2  # measured here, and the roofline on the chosen GPU
    assert at.caption and any(t("spec.same_tokens", "en") == c.value for c in at.caption)


def test_lecture_mode_one_idea_per_screen():
    at = _run(_page("ko", lecture=True), "ngram", 2)
    assert not at.get("plotly_chart")  # idea 1: the step and its cache grid
    assert _grid(at)
    at.session_state["kv_idea_spec"] = 2
    at.run()
    assert _chart(at, "spec_acceptance") and not grid_html(at)


def test_bad_lookup_bounds_are_said_and_nothing_is_lost():
    at = _run(_page("ko"), "ngram", 1)
    before = at.session_state["spec_gen"]
    at.session_state["spec_lookup_min"] = 5
    at.session_state["spec_lookup_max"] = 2
    at.run()
    at.button(key="spec_btn_prefill").click().run()
    assert not at.exception
    assert at.session_state["spec_gen"] is before
    assert any(t("spec.lookup_order", "ko", low=5, high=2) in e.value for e in at.error)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_lecture_grid_of_a_deep_model_keeps_the_early_exit_boundary(lang):
    """Issue 38.5: one rule with Reusing Past K/V (charts.decode.grid_layers). On a projector a 30-layer model's grid
    draws 4 layers at full height (it thinned 60 rows to 2 px each): the first, the last, and the early exit's last
    shared layer (the draft's writes, purple) beside the target's first own one; the title says which."""
    from kvviz.engine.config import DecoderConfig

    deep = DecoderConfig(n_layers=30, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=256, max_seq_len=256)
    at = _run(_page(lang, lecture=True, kv_model="random", kv_shape=deep), "early-exit", 2)
    gen = at.session_state["spec_gen"]
    m = gen.draft.shared_layers
    assert m == 22  # drafts.default_exit_layer(30)
    rows = _grid(at)
    assert list(rows) == [f"L{i} {kv}" for i in (0, m - 1, m, 29) for kv in ("K", "V")]
    newest = -2 if gen.events[-1].rolled_back else -1
    assert rows[f"L{m - 1} K"][newest][0] == "draft" and rows[f"L{m} K"][newest][0] == "newest"
    html = grid_html(at)[0]
    assert t("common.grid_layers", lang, title="", shown=f"0, {m - 1}, {m}, 29", n=30) in html
    assert not re.findall(r'class="kv-row"[^>]*height:(?!22px)', html)  # every row at full height


def test_download_this_run_waits_for_a_run_then_offers_it():
    from kvviz.i18n import t

    at = _page("ko")
    button = next(b.proto for b in at.get("download_button") if b.proto.id.endswith("-spec_download"))
    assert button.disabled and button.help == t("run_html.download_none", "ko")
    at = _run(at, "ngram", 2)
    button = next(b.proto for b in at.get("download_button") if b.proto.id.endswith("-spec_download"))
    assert not button.disabled and button.label == t("run_html.download", "ko")


def test_korean_on_smollm2_steps_past_an_unfinished_character(smollm2_dir):
    """SmolLM2 on the Korean preset ends a step inside a character (a lone <0xEA> byte): the grid has a position the
    token strip has no text for yet, which raised an IndexError in the grid's newest-position tick."""
    at = AppTest.from_file(HOME, default_timeout=300)
    at.query_params["lang"] = "ko"
    at.query_params["lecture"] = "1"
    at.query_params["model"] = "smollm2"
    at.run()
    at.switch_page(PAGE).run()
    at.button(key="spec_btn_prefill").click().run()
    for _ in range(8):
        _step(at)
        assert not at.exception, at.exception[0].message
    assert len(at.session_state["spec_gen"].events) > 2
