"""The Memory Footprint page headless: figures from the URL, the seed example, uploads, charts, live bytes."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.kv.capacity import plan_capacity
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import CONFIGS, get_preset
from tests.test_memory_formula import GEMMA2_CONFIG

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
PAGE = "pages/3_Memory_Footprint.py"


def open_page(query=None, lang="en"):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["lang"] = lang
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


def metrics(at):
    return {m.label: m.value for m in at.metric}


def chart(at, key):
    return json.loads(
        next(c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or key in c.proto.id).proto.spec
    )


@pytest.mark.parametrize("lang, label", [("en", "Per token (all layers)"), ("ko", "토큰 하나 (모든 레이어)")])
def test_preset_from_query_params(lang, label):
    at = open_page({"preset": "Qwen2.5-7B", "tokens": "8192", "batch": "4"}, lang)
    m = metrics(at)
    assert m[label] == "56.00 KiB"
    total = [v for k, v in m.items() if k in ("All requests", "전체 요청")]
    assert total == ["1.75 GiB"]  # 4 · 8192 · 56 KiB
    assert at.selectbox(key="mem_preset").value == "Qwen2.5-7B"
    table = next(md.value for md in at.markdown if "57,344 B" in md.value)
    assert "1,879,048,192 B" in table and "1.88 GB" in table  # exact bytes and the labelled decimal figure
    assert at.query_params["preset"] == "Qwen2.5-7B" and at.query_params["tokens"] == "8192"


def test_seed_example_one_click_away():
    at = open_page()
    at.button(key="mem_seed_mha").click().run()
    m = metrics(at)
    assert [m["Per token, per layer"], m["Per token (all layers)"], m["Per request"], m["All requests"]] == [
        "16.00 KiB",
        "512.00 KiB",
        "2.00 GiB",
        "64.00 GiB",
    ]
    assert any("68,719,476,736 B" in md.value for md in at.markdown)
    at.button(key="mem_seed_gqa").click().run()
    assert metrics(at)["All requests"] == "16.00 GiB"
    assert at.query_params["src"] == "custom" and at.query_params["kv_heads"] == "8"
    assert "preset" not in at.query_params


def test_custom_shape_from_url_and_bad_value_keeps_last_result():
    at = open_page(
        {
            "src": "custom",
            "layers": "32",
            "heads": "32",
            "kv_heads": "8",
            "d_head": "128",
            "tokens": "4096",
            "batch": "32",
        }
    )
    assert metrics(at)["All requests"] == "16.00 GiB"
    at.number_input(key="mem_kv_heads").set_value(3).run()  # 32 query heads cannot share 3 KV heads
    assert not at.exception
    assert any("divisible" in e.value for e in at.error)
    assert metrics(at)["All requests"] == "16.00 GiB"  # the last valid result stays on screen


def test_malformed_query_values_fall_back_to_defaults():
    at = open_page({"preset": "GPT-9", "tokens": "-4", "kv_dtype": "int3", "batch": "two"})
    assert any("tokens='-4'" in w.value and "preset='GPT-9'" in w.value for w in at.warning)
    assert metrics(at)["Per token (all layers)"] == "128.00 KiB"  # the default preset, Llama-3.1-8B
    assert at.number_input(key="mem_tokens").value == 4096


def uploader(at):
    """The page's uploader: a fresh one (a new key) after every file it read."""
    n = at.session_state["mem_upload_n"] if "mem_upload_n" in at.session_state else 0
    return at.file_uploader(key=f"mem_upload_{n}")


def test_upload_config_bad_upload_keeps_last_valid():
    at = open_page({"src": "upload"})
    uploader(at).set_value(
        ("config.json", json.dumps(GEMMA2_CONFIG).encode(), "application/json")
    ).run()
    assert metrics(at)["Per token (all layers)"] == "336.00 KiB"
    uploader(at).set_value(("config.json", b"{definitely not json", "application/json")).run()
    assert not at.exception
    assert any("not valid JSON" in e.value for e in at.error)
    assert metrics(at)["Per token (all layers)"] == "336.00 KiB"
    missing = {k: v for k, v in GEMMA2_CONFIG.items() if k != "num_hidden_layers"}
    uploader(at).set_value(("c.json", json.dumps(missing).encode(), "application/json")).run()
    assert any("num_hidden_layers" in e.value for e in at.error)
    assert metrics(at)["Per token (all layers)"] == "336.00 KiB"
    assert at.session_state["mem_upload_n"] == 3  # each file was read by a fresh uploader: never a replace


def test_charts_carry_the_formula():
    at = open_page({"preset": "Llama-2-7B", "tokens": "4096", "batch": "32"})
    cmp = chart(at, "mem_compare_chart")["data"][0]
    # KiB per token: MHA 32 heads, GQA 8, MQA 1, MLA 512+64 latent (all 32 layers, bf16)
    assert cmp["y"] == [512.0, 128.0, 16.0, 32 * 576 * 2 / 1024]
    growth = chart(at, "mem_growth_chart")["data"]
    weights = next(t for t in growth if t["name"].startswith("weights"))
    assert weights["y"][0] == pytest.approx(6_738_415_616 * 2 / 1024**3)
    crossings = next(t for t in growth if t.get("mode") == "markers+text")
    # cache = weights: n = 13,476,831,232 B / (B · 512 KiB) = 25,705.3 for B=1, 803.3 for B=32:
    # first reached at 25,706 and 804 tokens
    assert 25_706 in crossings["x"] and 804 in crossings["x"]
    alloc = chart(at, "mem_alloc_chart")["data"]
    live = 37 + 120 + 900 + 1500 + 3000 + 4096
    assert alloc[0]["y"][0] == pytest.approx(live * 512 / 1024)  # MiB at 512 KiB per token
    assert alloc[1]["y"][0] == pytest.approx((6 * 4096 - live) * 512 / 1024)


def test_capacity_planner_is_vllms_arithmetic():
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "8192", "gpu": "H100 SXM", "frac": "0.9"})
    plan = plan_capacity(get_preset("Llama-3.1-8B"), HARDWARE["H100 SXM"].memory_bytes, max_model_len=8192)
    m = metrics(at)
    assert m["Max tokens in cache"] == f"{plan.kv_cache_tokens:,}" == "449,184"
    assert m["Max requests at 8,192 tokens"] == f"{plan.max_requests:,}" == "54"
    assert any("79.20 GiB × 0.9" in c.value and "estimated" in c.value for c in at.caption)
    fit = next(md.value for md in at.markdown if md.value.startswith("In the"))
    assert "54 requests fit if each reserves 8,192" in fit
    at.selectbox(key="mem_gpu").set_value("L4").run()
    assert not any("do not fit" in w.value for w in at.warning)  # 22.03 GiB · 0.9 still holds 14.96 GiB
    assert metrics(at)["Max requests at 8,192 tokens"] == "3"
    at.selectbox(key="mem_w_dtype").set_value("float32").run()  # 29.92 GiB of weights
    assert any("do not fit" in w.value for w in at.warning)
    assert metrics(at)["Max requests at 8,192 tokens"] == "0"


def test_unknown_parameter_count_is_asked_for_never_reused():
    """Issue 12 item 1: after a preset, a DeepSeek-V3 upload must not inherit 8.03B parameters."""
    at = open_page({"preset": "Llama-3.1-8B"})
    at.radio(key="mem_src").set_value("upload").run()
    uploader(at).set_value(
        ("config.json", json.dumps(CONFIGS["DeepSeek-V3"]).encode(), "application/json")).run()
    assert not at.exception
    assert at.number_input(key="mem_upload_params_b").value is None
    assert any("parameter count is unknown" in w.value for w in at.warning)
    assert "Max requests at 4,096 tokens" not in metrics(at)  # no capacity until it is given
    assert not any("8.03B" in md.value for md in at.markdown)
    at.number_input(key="mem_upload_params_b").set_value(671.0).run()
    assert "Max requests at 4,096 tokens" in metrics(at)
    assert any("671.00B parameters (as you entered it)" in md.value for md in at.markdown)


def test_memory_and_latency_pages_agree_on_requests_that_fit():
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "4096", "gpu": "H100 SXM", "frac": "0.9"})
    memory_page = metrics(at)["Max requests at 4,096 tokens"]
    lat = AppTest.from_file(APP, default_timeout=90)
    lat.session_state["kv_model"] = "random"
    lat.switch_page("pages/4_Latency_and_Capacity.py")
    lat.run()
    assert not lat.exception, lat.exception
    assert {m.label: m.value for m in lat.metric}["Requests that fit in memory"] == memory_page


def test_live_cache_run_here_equals_formula():
    at = open_page()
    at.button(key="mem_run_here").click().run()
    m = metrics(at)
    assert m["Measured (tensor bytes)"] == m["Formula"]
    assert int(m["Measured (tensor bytes)"].replace(",", "").split()[0]) > 0
    assert any("equal the formula" in s.value for s in at.success)


def test_sliding_window_preset_shows_capped_factors():
    at = open_page({"preset": "Gemma-2-9B", "tokens": "8192"})
    assert r"(21 \cdot 8192 + 21 \cdot 4095)" in at.latex[0].value  # a window keeps W − 1 past tokens
    assert metrics(at)["Per request"] == "1.97 GiB"  # 8 KiB · (21·8192 + 21·4095) = 2,113,757,184 B
    assert any("2,113,757,184 B" in md.value for md in at.markdown)


def test_quantized_kv_states_its_scales():
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "4096", "kv_dtype": "int4"})
    # 16 vectors of 128 values: 1024 B of 4-bit data + 2 groups · 4 B (fp16 scale and zero) each = 128 B
    assert metrics(at)["Per token, per layer"] == "1.13 KiB"  # 1,152 B = 1.125 KiB, rounded half up
    assert any("2 · 8 · 128 · 0.5 B + 128 B (scales) | 1,152 B" in md.value for md in at.markdown)


def test_llamacpp_block_formats_size_a_llamacpp_deployment():
    """q8_0 and q4_0 as llama.cpp stores them (tests/test_llamacpp_kv.py checks the bytes against its log)."""
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "4096", "kv_dtype": "q8_0"})
    # 16 vectors of 128 values = 4 blocks of 34 B each: 16 · 136 B = 2,176 B
    assert metrics(at)["Per token, per layer"] == "2.13 KiB"
    assert any("2 · 8 · 128 · 1 B + 128 B (scales) | 2,176 B" in md.value for md in at.markdown)
    assert any("block of 32 int8 values" in c.value and "34 B in all" in c.value for c in at.caption)
    assert "Max requests at 4,096 tokens" in metrics(at)  # the planner sizes it too
    at.selectbox(key="mem_kv_dtype").set_value("q4_0").run()
    assert metrics(at)["Per token, per layer"] == "1.13 KiB"  # 16 · 4 · 18 B = 1,152 B


@pytest.mark.parametrize("lang, words", [("en", "not whole blocks"), ("ko", "블록으로 나누어떨어지지")])
def test_block_format_refused_for_a_head_it_does_not_divide(lang, words):
    at = open_page({"src": "custom", "layers": "4", "heads": "4", "kv_heads": "2", "d_head": "24",
                    "kv_dtype": "q8_0"}, lang)
    assert not at.exception
    assert any(words in e.value for e in at.error)
    if lang == "ko":
        return  # AppTest formats the translated source radio's value in English on a re-run: change it in English
    at.selectbox(key="mem_kv_dtype").set_value("float16").run()
    assert not any(words in e.value for e in at.error)
    assert metrics(at)["Per token, per layer"] == "192 B"  # nothing lost: the same shape, now sized (2·2·24·2 B)
    assert at.number_input(key="mem_d_head").value == 24


def test_no_window_claim_for_a_model_without_one():
    """Issue 12 item 6: DeepSeek-V3's cache passes its weights beyond the search limit; it has no window."""
    at = open_page({"preset": "DeepSeek-V3", "tokens": "4096", "batch": "1"})
    texts = [md.value for md in at.markdown]
    assert not any("sliding window" in t for t in texts)
    assert any("does not reach the weights within 16,777,216 tokens" in t for t in texts)
    at = open_page({"preset": "Mistral-7B", "tokens": "4096", "batch": "1"})
    assert any("every layer keeps only its sliding window" in md.value for md in at.markdown)


def test_context_past_the_models_maximum_is_flagged():
    at = open_page({"preset": "GPT-2", "tokens": "32768"})
    assert any("maximum context of 1,024 tokens" in w.value for w in at.warning)
