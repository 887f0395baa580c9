"""The Memory Footprint page headless: figures from the URL, the seed example, uploads, charts, live bytes."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.kv.capacity import plan_capacity
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.log_check import check_all
from kvviz.kv.presets import CONFIGS, get_preset
from kvviz.kv.sglang_pool import plan_sglang
from kvviz.kv.vllm_profile import ServingFlags
from tests.kv.test_formula import GEMMA2_CONFIG

ROOT = Path(__file__).resolve().parents[2]
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
    assert at.selectbox(key="memory_preset").value == "Qwen2.5-7B"
    table = next(md.value for md in at.markdown if "57,344 B" in md.value)
    assert "1,879,048,192 B" in table and "1.88 GB" in table  # exact bytes and the labelled decimal figure
    assert at.query_params["preset"] == "Qwen2.5-7B" and at.query_params["tokens"] == "8192"


def test_seed_example_one_click_away():
    at = open_page()
    at.button(key="memory_seed_mha").click().run()
    m = metrics(at)
    assert [m["Per token, per layer"], m["Per token (all layers)"], m["Per request"], m["All requests"]] == [
        "16.00 KiB",
        "512.00 KiB",
        "2.00 GiB",
        "64.00 GiB",
    ]
    assert any("68,719,476,736 B" in md.value for md in at.markdown)
    at.button(key="memory_seed_gqa").click().run()
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
    at.number_input(key="memory_kv_heads").set_value(3).run()  # 32 query heads cannot share 3 KV heads
    assert not at.exception
    assert any("divisible" in e.value for e in at.error)
    assert metrics(at)["All requests"] == "16.00 GiB"  # the last valid result stays on screen


def test_malformed_query_values_fall_back_to_defaults():
    at = open_page({"preset": "GPT-9", "tokens": "-4", "kv_dtype": "int3", "batch": "two"})
    assert any("tokens='-4'" in w.value and "preset='GPT-9'" in w.value for w in at.warning)
    assert metrics(at)["Per token (all layers)"] == "128.00 KiB"  # the default preset, Llama-3.1-8B
    assert at.number_input(key="memory_tokens").value == 4096


def uploader(at):
    """The page's uploader: a fresh one (a new key) after every file it read."""
    n = at.session_state["memory_upload_n"] if "memory_upload_n" in at.session_state else 0
    return at.file_uploader(key=f"memory_upload_{n}")


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
    assert at.session_state["memory_upload_n"] == 3  # each file was read by a fresh uploader: never a replace


def test_charts_carry_the_formula():
    at = open_page({"preset": "Llama-2-7B", "tokens": "4096", "batch": "32"})
    cmp = chart(at, "memory_compare_chart")["data"][0]
    # KiB per token: MHA 32 heads, GQA 8, MQA 1, MLA 512+64 latent (all 32 layers, bf16)
    assert cmp["y"] == [512.0, 128.0, 16.0, 32 * 576 * 2 / 1024]
    growth = chart(at, "memory_growth_chart")["data"]
    weights = next(t for t in growth if t["name"].startswith("weights"))
    assert weights["y"][0] == pytest.approx(6_738_415_616 * 2 / 1024**3)
    crossings = next(t for t in growth if t.get("mode") == "markers+text")
    # cache = weights: n = 13,476,831,232 B / (B · 512 KiB) = 25,705.3 for B=1, 803.3 for B=32:
    # first reached at 25,706 and 804 tokens
    assert 25_706 in crossings["x"] and 804 in crossings["x"]
    alloc_chart = chart(at, "memory_alloc_chart")
    alloc = alloc_chart["data"]
    live = 37 + 120 + 900 + 1500 + 3000 + 4096
    assert alloc_chart["layout"]["yaxis"]["title"]["text"].endswith("(GiB)")  # 6 × 4096 × 512 KiB = 12 GiB
    assert alloc[0]["y"][0] == pytest.approx(live * 512 / 1024**2)  # GiB at 512 KiB per token
    assert alloc[1]["y"][0] == pytest.approx((6 * 4096 - live) * 512 / 1024**2)


def test_capacity_planner_is_vllms_arithmetic():
    """Llama 3.1 8B on an H100 at 8,192 tokens, no flags given: the likely launch is the newest vLLM line, `vllm
    serve` on a GPU of 70 GiB or more (8,192 batched tokens, 1,024 sequences, FlashInfer's sampler)."""
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "8192", "gpu": "H100 SXM", "frac": "0.9"})
    gib = 2**30
    activation = 8192 * (3 * 4096 + 3 * 14336) * 2  # one layer's residual, input, normed input, gate_up, act
    sampler = 1024 * 128256 * 2 + 1024 * 128256 * 12 + 8192 * 4096 * 2  # bf16 logits, FlashInfer, hidden kept
    graphs = 2 * (512 * (3 * 4096 + 3 * 14336) * 2 + 50 * 2**20)  # FULL + PIECEWISE, 51 sizes up to 512
    reserve = max(activation, sampler) + round(0.10 * gib) + graphs
    blocks = (int(HARDWARE["H100 SXM"].memory_bytes * 0.9) - 8_030_261_248 * 2 - reserve) // (16 * 131072)
    plan = plan_capacity(get_preset("Llama-3.1-8B"), HARDWARE["H100 SXM"].memory_bytes, max_model_len=8192,
                         gpu_name="H100 SXM")
    assert plan.reserve_bytes == reserve
    m = metrics(at)
    assert m["Max tokens in cache"] == f"{plan.kv_cache_tokens:,}" == f"{blocks * 16:,}"
    assert m["Max requests at 8,192 tokens"] == f"{plan.max_requests:,}" == f"{blocks * 16 // 8192:,}"
    assert any("79.20 GiB × 0.9" in c.value and "predicted" in c.value for c in at.caption)
    lo, hi = plan.kv_cache_tokens_range
    assert any(f"{lo:,} – {hi:,} tokens" in md.value for md in at.markdown)
    terms = next(md.value for md in at.markdown if "| Activation |" in md.value)
    assert "FlashInfer" in terms and "8,192 tokens in 1,024 sequences" in terms
    fit = next(md.value for md in at.markdown if md.value.startswith("In the"))
    assert f"{plan.max_requests} requests fit if each reserves 8,192" in fit
    at.selectbox(key="memory_gpu").set_value("L4").run()
    assert not any("do not fit" in w.value for w in at.warning)  # 22.03 GiB · 0.9 still holds 14.96 GiB
    at.selectbox(key="memory_w_dtype").set_value("float32").run()  # 29.92 GiB of weights
    assert any("do not fit" in w.value for w in at.warning)
    assert metrics(at)["Max requests at 8,192 tokens"] == "0"


def test_serving_flags_narrow_the_range():
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "32768", "gpu": "RTX 4090"})
    wide = next(md.value for md in at.markdown if "tokens** (likely" in md.value)
    at.selectbox(key="memory_vllm").set_value("0.11.1").run()
    at.selectbox(key="memory_entry").set_value("serve").run()
    at.number_input(key="memory_mbt").set_value(2048).run()
    at.number_input(key="memory_seqs").set_value(256).run()
    assert not at.exception
    plan = plan_capacity(get_preset("Llama-3.1-8B"), HARDWARE["RTX 4090"].memory_bytes, max_model_len=32768,
                         gpu_name="RTX 4090", flags=ServingFlags(vllm_version="0.11.1", entry="serve",
                                                                 max_num_batched_tokens=2048, max_num_seqs=256))
    narrow = next(md.value for md in at.markdown if "tokens** (likely" in md.value)
    lo, hi = plan.kv_cache_tokens_range
    assert narrow != wide and f"{lo:,} – {hi:,}" in narrow
    assert metrics(at)["Max tokens in cache"] == f"{plan.kv_cache_tokens:,}"
    assert any("only non-torch memory" in c.value for c in at.caption)
    assert at.query_params["vllm"] == "0.11.1" and at.query_params["seqs"] == "256"  # the link keeps them


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_per_term_residuals_against_real_logs(lang):
    at = open_page({"preset": "Llama-3.1-8B"}, lang)
    points = chart(at, "memory_residual_chart")["data"]
    checks = check_all()
    shown = sum(len(t["y"]) for t in points if t.get("y") and t["y"][0] is not None)
    assert shown == sum(1 for c in checks for t in c.terms
                        if t.name in ("weights", "activation", "non_torch", "kv_tokens") and t.kv_effect is not None)
    kv = next(c for c in checks if c.id == "vllm-10517-3090-20k").term("kv_tokens")
    table = next(md.value for md in at.markdown if "github.com/vllm-project/vllm/issues/10517" in md.value)
    assert f"{kv.logged:,.0f}* → {kv.predicted:,.0f} ({kv.difference:+.1%})" in table
    assert "didier-durand/llms-in-clouds" in table  # SGLang's logs too


def test_sglang_engine_on_the_page():
    at = open_page({"preset": "Qwen2.5-7B", "tokens": "32768", "gpu": "RTX 3090", "engine": "sglang"})
    plan = plan_sglang(get_preset("Qwen2.5-7B"), HARDWARE["RTX 3090"].memory_bytes, context_len=32768,
                       smi_mib=HARDWARE["RTX 3090"].nvidia_smi_total_mib)
    assert metrics(at)["Max tokens in cache"] == f"{plan.kv_cache_tokens:,}"
    assert any("profile_max_num_token" in c.value for c in at.caption)
    at.number_input(key="memory_sgl_frac").set_value(0.8).run()
    smaller = plan_sglang(get_preset("Qwen2.5-7B"), HARDWARE["RTX 3090"].memory_bytes, context_len=32768,
                          mem_fraction_static=0.8)
    assert metrics(at)["Max tokens in cache"] == f"{smaller.kv_cache_tokens:,}"


@pytest.mark.parametrize("lang, words", [("en", "131072 tokens"), ("ko", "131072 토큰")])
def test_planner_refuses_a_context_past_the_models(lang, words):
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "200000"}, lang)
    assert any(words in e.value for e in at.error)
    assert "Max tokens in cache" not in metrics(at) and "KV 캐시 최대 토큰" not in metrics(at)


def test_unknown_parameter_count_is_asked_for_never_reused():
    """Issue 12 item 1: after a preset, a DeepSeek-V3 upload must not inherit 8.03B parameters."""
    at = open_page({"preset": "Llama-3.1-8B"})
    at.radio(key="memory_src").set_value("upload").run()
    uploader(at).set_value(
        ("config.json", json.dumps(CONFIGS["DeepSeek-V3"]).encode(), "application/json")).run()
    assert not at.exception
    assert at.number_input(key="memory_upload_params_b").value is None
    assert any("parameter count is unknown" in w.value for w in at.warning)
    assert "Max requests at 4,096 tokens" not in metrics(at)  # no capacity until it is given
    assert not any("8.03B" in md.value for md in at.markdown)
    at.number_input(key="memory_upload_params_b").set_value(671.0).run()
    # a mixture of experts with MLA: its profile run is modelled from the config (issue 34), no reserve asked for
    assert not any("cannot be predicted" in e.value for e in at.error)
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
    at.button(key="memory_run_here").click().run()
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


def test_kivi2_states_its_scales_zero_points_and_residual():
    """KIVI-2 (arXiv:2402.02750 §4.1): 16 vectors of 128 values, 32 B of 2-bit levels + 4 groups · 4 B each."""
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "4096", "kv_dtype": "kivi2"})
    assert metrics(at)["Per token, per layer"] == "768 B"
    assert any("2 · 8 · 128 · 0.25 B + 256 B (scales) | 768 B" in md.value for md in at.markdown)
    assert any("KIVI-2" in c.value and "12 B in all" in c.value and "newest 128 tokens" in c.value
               for c in at.caption)


def test_llamacpp_block_formats_size_a_llamacpp_deployment():
    """q8_0 and q4_0 as llama.cpp stores them (tests/engine/test_llamacpp_kv.py checks the bytes against its log)."""
    at = open_page({"preset": "Llama-3.1-8B", "tokens": "4096", "kv_dtype": "q8_0"})
    # 16 vectors of 128 values = 4 blocks of 34 B each: 16 · 136 B = 2,176 B
    assert metrics(at)["Per token, per layer"] == "2.13 KiB"
    assert any("2 · 8 · 128 · 1 B + 128 B (scales) | 2,176 B" in md.value for md in at.markdown)
    assert any("block of 32 int8 values" in c.value and "34 B in all" in c.value for c in at.caption)
    assert "Max requests at 4,096 tokens" in metrics(at)  # the planner sizes it too
    at.selectbox(key="memory_kv_dtype").set_value("q4_0").run()
    assert metrics(at)["Per token, per layer"] == "1.13 KiB"  # 16 · 4 · 18 B = 1,152 B


@pytest.mark.parametrize("lang, words", [("en", "not whole blocks"), ("ko", "블록으로 나누어떨어지지")])
def test_block_format_refused_for_a_head_it_does_not_divide(lang, words):
    at = open_page({"src": "custom", "layers": "4", "heads": "4", "kv_heads": "2", "d_head": "24",
                    "kv_dtype": "q8_0"}, lang)
    assert not at.exception
    assert any(words in e.value for e in at.error)
    if lang == "ko":
        return  # AppTest formats the translated source radio's value in English on a re-run: change it in English
    at.selectbox(key="memory_kv_dtype").set_value("float16").run()
    assert not any(words in e.value for e in at.error)
    assert metrics(at)["Per token, per layer"] == "192 B"  # nothing lost: the same shape, now sized (2·2·24·2 B)
    assert at.number_input(key="memory_d_head").value == 24


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
