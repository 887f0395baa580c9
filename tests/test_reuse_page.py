"""Reusing Past K/V and Home under AppTest: real generations, numbers read from the Plotly specs."""
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from kvviz.engine.config import DecoderConfig

ROOT = Path(__file__).resolve().parents[1]
PAGE = "pages/1_Reusing_Past_KV.py"  # reached from the entrypoint, so sidebar links resolve
HOME = str(ROOT / "app.py")
SMALL = DecoderConfig(n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=256, max_seq_len=128)
PROMPT = "Hello KV"  # 8 byte tokens with the custom-shape model's ByteTokenizer


def _page(lang: str = "en") -> AppTest:
    at = AppTest.from_file(HOME, default_timeout=60)
    at.query_params["lang"] = lang
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = SMALL
    at.run()
    at.switch_page(PAGE).run()
    return at


def _chart(at: AppTest, key: str) -> dict:
    charts = [c for c in at.get("plotly_chart") if c.proto.id.endswith("-" + key) or c.proto.id == key]
    assert charts, f"no chart {key}"
    return json.loads(charts[0].proto.spec)


def _prefill_and_step(at: AppTest, steps: int) -> AppTest:
    at.text_area(key="reuse_prompt").set_value(PROMPT)
    at.button(key="reuse_btn_prefill").click().run()
    for _ in range(steps):
        at.button(key="reuse_btn_step").click().run()
    assert not at.exception
    return at


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_home_and_page_run(lang):
    home = AppTest.from_file(HOME, default_timeout=60)
    home.query_params["lang"] = lang
    home.run()
    assert not home.exception
    assert len(home.get("graphviz_chart")) == 1
    at = _page(lang)
    assert not at.exception
    assert at.title[0].value == ("과거 K/V 재사용" if lang == "ko" else "Reusing Past K/V")
    _prefill_and_step(at, 1)


def test_prefill_then_three_steps():
    at = _prefill_and_step(_page(), 3)
    gen = at.session_state["reuse_gen"]
    n_prompt = len(PROMPT.encode())
    # Engine convention: the prefill pass already emits token 1, so prefill + 3 steps = 4 generated
    # tokens, and the cache holds the prompt plus the 3 tokens fed back in (the newest is not fed yet).
    assert gen.n_generated == 4
    assert [len(e.cache_lengths) for e in gen.events] == [SMALL.n_layers] * 4

    growth = _chart(at, "reuse_growth")["data"][0]
    z = growth["z"]
    assert len(z) == 2 * SMALL.n_layers  # a K row and a V row per layer
    for row in z:
        written = [p for p in row if p is not None]
        assert len(written) == n_prompt + 3
        assert written == [0] * n_prompt + [1, 2, 3]  # one new column per step, old ones untouched

    attn = _chart(at, "reuse_attn")["data"][0]
    rows = np.array(attn["z"], dtype=float)
    assert rows.shape == (SMALL.n_heads, n_prompt + 3)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(rows, gen.events[-1].attention[0], atol=1e-6)  # layer 0 is shown first

    # The K heatmap shows the real cached keys of layer 0, KV head 0: one row per cached position.
    kv = np.array(_chart(at, "reuse_kv")["data"][0]["z"], dtype=float)
    k, _ = gen.backend.layer_kv(gen.cache, 0)
    np.testing.assert_allclose(kv, k[0, 0].numpy(), atol=1e-6)

    # Bytes: live bytes measured from the tensors equal the formula after every pass.
    by = _chart(at, "reuse_bytes")["data"]
    live, formula = by[1]["y"], by[2]["y"]
    assert live == formula
    assert live[-1] == 2 * SMALL.n_layers * (n_prompt + 3) * SMALL.n_kv_heads * 16 * 4

    # Cumulative attention scores counted from the passes lie on the analytic curves.
    cum = _chart(at, "reuse_cum_work")["data"]
    lh = SMALL.n_layers * SMALL.n_heads
    assert cum[3]["x"] == [n_prompt, n_prompt + 1, n_prompt + 2, n_prompt + 3]
    assert cum[3]["y"][-1] == lh * (n_prompt + 3) * (n_prompt + 4) // 2
    assert cum[2]["y"][-1] == lh * sum(t * (t + 1) // 2 for t in range(n_prompt, n_prompt + 4))

    # The live equivalence check: cached and recomputed logits agree and pick the same token.
    delta, tok_cached, tok_fresh = next(iter(at.session_state["reuse_checks"].values()))
    assert delta < 1e-4 and tok_cached == tok_fresh
    assert any("within the rounding tolerance" in s.value for s in at.success)  # a verdict states its tolerance


def test_layer_switch_uses_the_captured_rows():
    at = _prefill_and_step(_page(), 2)
    gen = at.session_state["reuse_gen"]
    n_events = len(gen.events)
    at.selectbox(key="reuse_attn_layer").set_value(2).run()
    rows = np.array(_chart(at, "reuse_attn")["data"][0]["z"], dtype=float)
    np.testing.assert_allclose(rows, gen.events[-1].attention[2], atol=1e-6)
    assert len(at.session_state["reuse_gen"].events) == n_events  # switching layers runs no model pass


def test_invalid_head_split_keeps_the_generation():
    at = _prefill_and_step(_page(), 2)
    gen = at.session_state["reuse_gen"]
    tokens = list(gen.token_ids)
    at.number_input(key="_w_kv_heads").set_value(3).run()  # 4 query heads cannot split over 3 KV heads
    assert not at.exception
    assert any("divisible" in e.value for e in at.error)
    assert at.session_state["reuse_gen"] is gen and gen.token_ids == tokens
    assert not at.warning  # the model did not change, so the generation is still current
    at.button(key="reuse_btn_step").click().run()
    assert gen.n_generated == 4


def test_new_model_marks_the_generation_stale():
    at = _prefill_and_step(_page(), 1)
    gen = at.session_state["reuse_gen"]
    tokens = list(gen.token_ids)
    at.number_input(key="_w_layers").set_value(2).run()
    assert not at.exception
    assert any("previous model" in w.value for w in at.warning)
    assert at.button(key="reuse_btn_step").disabled
    assert at.session_state["reuse_gen"].token_ids == tokens
    at.button(key="reuse_btn_reset").click().run()
    assert at.session_state["reuse_gen"] is None and not at.warning


def test_empty_prompt_is_a_clear_message():
    at = _page("ko")
    at.text_area(key="reuse_prompt").set_value("   ")
    at.button(key="reuse_btn_prefill").click().run()
    assert not at.exception
    assert at.error and "프롬프트" in at.error[0].value
    assert at.session_state["reuse_gen"] is None
