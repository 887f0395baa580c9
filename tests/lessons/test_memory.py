"""What the Memory Footprint page computes, without streamlit: the seed example's bytes, the formula's LaTeX and
steps, the attention variants, where the cache reaches the weights, the planner for either engine, the planner's
residuals on real start-up logs, the request mix and the live cache's verdict. Every figure is worked out here
by hand (tests/kv/kvref.py's textbook formula) or by the kv function the page must agree with."""
import math

import pytest

from kvviz.errors import InputError
from kvviz.kv.capacity import plan_capacity
from kvviz.kv.formula import KVSpec, kv_footprint, weight_bytes
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.log_check import check_all
from kvviz.kv.presets import PRESETS
from kvviz.kv.sglang_pool import plan_sglang
from kvviz.kv.vllm_profile import ServingFlags
from kvviz.lessons.memory import (
    CROSSING_LIMIT,
    LOG_TERMS,
    attention_bars,
    capped_lengths,
    crossing_kind,
    custom_spec,
    device_total,
    flag_name,
    footprint_steps,
    formula_latex,
    growth_curves,
    lecture_screens,
    live_verdict,
    log_cell,
    log_name,
    params_b_of,
    plan_for,
    residuals,
    seed_scenario,
    serving_flags,
    with_given_params,
)
from tests.kv.kvref import textbook_bytes

GIB, KIB = 2**30, 1024


def seed_spec(kv_heads: int) -> tuple[KVSpec, dict]:
    s = seed_scenario(kv_heads)
    return custom_spec(s["layers"], s["heads"], s["kv_heads"], s["d_head"], s["params_b"], "seed"), s


@pytest.mark.parametrize("kv_heads, total_gib", [(32, 64), (8, 16)])
def test_the_seed_example_is_the_study_notes_llama2_7b(kv_heads, total_gib):
    spec, s = seed_spec(kv_heads)
    fp = kv_footprint(spec, s["tokens"], s["batch"], s["kv_dtype"])
    assert fp.total == textbook_bytes(32, 32, 4096, kv_heads, 128, 2) == total_gib * GIB
    assert (spec.d_model, spec.n_params, spec.params_source) == (4096, 6_740_000_000, "given")


def test_a_shape_that_cannot_share_its_heads_is_refused():
    with pytest.raises(InputError, match="divisible by n_kv_heads"):
        custom_spec(32, 32, 3, 128, 7.0, "bad")


def test_an_uploads_count_is_the_users_only_when_it_differs():
    spec = PRESETS["Llama-3.1-8B"]  # 8,030,261,248 parameters, counted
    assert params_b_of(spec) == 8.03 and params_b_of(spec.with_params(None, "unknown")) is None
    assert with_given_params(spec, 8.03) == spec  # the box's 3 decimals: 261,248 off, still the config's own
    given = with_given_params(spec, 8.031)  # 738,752 off: the user's
    assert (given.n_params, given.params_source) == (8_031_000_000, "given")
    unknown = with_given_params(spec, None)
    assert (unknown.n_params, unknown.params_source) == (None, "unknown")
    assert with_given_params(spec.with_params(None, "unknown"), 671.0).n_params == 671_000_000_000


def test_formula_latex_writes_every_factor_and_the_exact_total():
    spec, _ = seed_spec(32)
    latex = formula_latex(spec, kv_footprint(spec, 4096, 32, "bfloat16"))
    assert r"2 \cdot 32 \cdot 32 \cdot 4096 \cdot 32 \cdot 128 \cdot 2\,\text{B}" in latex
    assert r"68{,}719{,}476{,}736\,\text{B}" in latex and "scales" not in latex
    gemma = formula_latex(PRESETS["Gemma-2-9B"], kv_footprint(PRESETS["Gemma-2-9B"], 8192, 1))
    assert r"(21 \cdot 8192 + 21 \cdot 4095) \cdot 8 \cdot 256" in gemma  # a window keeps W − 1 past tokens
    ds = PRESETS["DeepSeek-V3"]
    mla = formula_latex(ds, kv_footprint(ds, 100, 2))
    assert r"2 \cdot 61 \cdot 100 \cdot (512 + 64) \cdot 2\,\text{B}" in mla  # latent + RoPE key, no factor 2·H_kv
    assert f"{2 * 61 * 100 * 576 * 2:,}".replace(",", "{,}") in mla
    assert r"+ \text{scales}" in formula_latex(spec, kv_footprint(spec, 16, 1, "int4"))


def test_footprint_steps_multiply_out_in_both_languages():
    spec = PRESETS["Llama-3.1-8B"]
    fp = kv_footprint(spec, 8192, 4, "bfloat16")
    steps = footprint_steps(spec, fp, "en")
    assert [(k, v) for k, _, v in steps] == [("per_token_per_layer", 2 * 8 * 128 * 2), ("per_token", 131_072),
                                             ("per_request", 131_072 * 8192), ("total", 4 * 131_072 * 8192)]
    assert [f for _, f, _ in steps] == ["2 · 8 · 128 · 2 B", "· 32 layers", "· 8,192 tokens", "· 4 requests"]
    assert [f for _, f, _ in footprint_steps(spec, kv_footprint(spec, 1, 1), "en")][1:] == [
        "· 32 layers", "· 1 token", "· 1 request"]
    ko = footprint_steps(spec, fp, "ko")
    assert [v for *_, v in ko] == [v for *_, v in steps] and ko[1][1] != steps[1][1]
    # int4: 16 vectors of 128 values, 64 B of data and 2 groups · 4 B of scale each
    int4 = footprint_steps(spec, kv_footprint(spec, 4096, 1, "int4"), "en")[0]
    assert int4 == ("per_token_per_layer", "2 · 8 · 128 · 0.5 B + 128 B (scales)", 1152)
    gemma = PRESETS["Gemma-2-9B"]
    window = footprint_steps(gemma, kv_footprint(gemma, 8192, 1), "en")[2]
    assert window == ("per_request", f"· Σ {21 * 8192 + 21 * 4095:,} token·layers (window-capped)",
                      2 * 8 * 256 * 2 * 21 * (8192 + 4095))


def test_attention_bars_keep_everything_but_the_kv_heads():
    bars = attention_bars(PRESETS["Llama-2-7B"], "bfloat16")
    assert bars.labels == ["MHA (H_kv=32)", "GQA (H_kv=8)", "MQA (H_kv=1)", "MLA (512+64)"]
    assert bars.kinds == ["MHA", "GQA", "MQA", "MLA"] and bars.refused == []
    assert bars.per_token == [2 * 32 * h * 128 * 2 for h in (32, 8, 1)] + [32 * 576 * 2]
    # d_head 32: K/V heads are whole q8_0 blocks of 32, DeepSeek's MLA ratios (128 + 16 = 144 values) are not
    small = attention_bars(KVSpec(n_layers=2, n_heads=4, n_kv_heads=4, d_head=32), "q8_0")
    assert small.refused == ["MLA"] and small.kinds == ["MHA", "GQA", "MQA"] and len(small.labels) == 3
    assert small.per_token[0] == 2 * 2 * 4 * 34  # 2 layers · 4 heads · K and V · one 34-byte block


def test_growth_curves_cross_the_weights_where_the_bytes_say():
    spec = PRESETS["Llama-2-7B"]
    weights = weight_bytes(spec.n_params, "bfloat16")
    curves = growth_curves(spec, weights, 32, 4096, "bfloat16")
    assert [c.batch for c in curves] == [1, 8, 32]
    per_token = 512 * KIB
    for c in curves:  # the first context whose cache reaches the weights
        assert c.crossing_tokens == math.ceil(weights / (c.batch * per_token))
        assert c.cache_bytes == [c.batch * n * per_token for n in c.tokens]
        assert crossing_kind(c, spec) == "at"
    assert [c.crossing_tokens for c in curves] == [25_706, 3_214, 804]
    assert curves[0].tokens == sorted({2**k for k in range(8, 18)} | {4096})  # 256 … 128k (25,706 < 2^15)
    odd = growth_curves(spec, weights, 5, 3000, "bfloat16")
    assert [c.batch for c in odd] == [1, 5, 8, 32] and 3000 in odd[0].tokens
    mistral = PRESETS["Mistral-7B"]  # every layer slides: the cache stops growing at 4,095 tokens a request
    mistral_weights = weight_bytes(mistral.n_params, "bfloat16")
    capped = growth_curves(mistral, mistral_weights, 1, 4096, "bfloat16")
    assert [crossing_kind(c, mistral) for c in capped] == ["never", "never", "at"]
    # 1 or 8 requests' windows stay under the 14.5 GB of weights; 32 of them (16 GiB) pass them
    assert 8 * 4095 * 128 * KIB < mistral_weights < 32 * 4095 * 128 * KIB
    assert capped[2].crossing_tokens == math.ceil(mistral_weights / (32 * 128 * KIB))
    ds = PRESETS["DeepSeek-V3"]
    beyond = growth_curves(ds, weight_bytes(ds.n_params, "bfloat16"), 1, 4096, "bfloat16")[0]
    assert beyond.crossing_tokens is None and crossing_kind(beyond, ds) == "beyond"
    assert kv_footprint(ds, CROSSING_LIMIT, 1).total < weight_bytes(ds.n_params, "bfloat16")


def test_the_device_total_is_exact_until_edited():
    h100 = HARDWARE["H100 SXM"]
    assert device_total(h100, round(h100.memory_bytes / GIB, 2)) == h100.memory_bytes
    assert device_total(h100, 80.0) == 80 * GIB


def test_serving_flags_leave_unsaid_what_the_boxes_leave_at_any_or_zero():
    assert serving_flags("any", "any", False, 0, 0) == ServingFlags()
    assert serving_flags("0.11.1", "serve", True, 2048, 256) == ServingFlags(
        vllm_version="0.11.1", entry="serve", enforce_eager=True, max_num_batched_tokens=2048, max_num_seqs=256)
    assert flag_name("max_num_batched_tokens") == "--max-num-batched-tokens"


def test_plan_for_is_the_engines_own_planner():
    spec, gpu = PRESETS["Llama-3.1-8B"], HARDWARE["RTX 3090"]
    common = dict(tokens=32768, n_gpus=1, kv_dtype_name="bfloat16", weight_dtype="bfloat16", gpu=gpu,
                  gpu_name="RTX 3090")
    flags = serving_flags("0.11.1", "serve", False, 2048, 256)
    vllm = plan_for("vllm", spec, gpu.memory_bytes, fraction=0.85, flags=flags, reserve_gib=1.5, **common)
    assert vllm == plan_capacity(spec, gpu.memory_bytes, max_model_len=32768, gpu_memory_utilization=0.85,
                                 weight_dtype="bfloat16", flags=flags, gpu_name="RTX 3090",
                                 reserve_bytes=round(1.5 * GIB))
    assert vllm.reserve_bytes == round(1.5 * GIB) and not vllm.reserve_estimated
    sglang = plan_for("sglang", spec, gpu.memory_bytes, **common)  # a fraction of 0: SGLang's default rule
    assert sglang == plan_sglang(spec, gpu.memory_bytes, context_len=32768, smi_mib=gpu.nvidia_smi_total_mib)
    assert plan_for("sglang", spec, gpu.memory_bytes, sgl_frac=0.8, **common).mem_fraction_static == 0.8


def test_residuals_and_the_log_table_are_the_checks_own_figures():
    checks = check_all()
    names = {t: t.upper() for t in LOG_TERMS}
    points = residuals(checks, names)
    assert len(points) == sum(1 for c in checks for t in c.terms if t.name in LOG_TERMS and t.kv_effect is not None)
    check = next(c for c in checks if c.id == "vllm-10517-3090-20k")
    kv = check.term("kv_tokens")
    mine = [p for p in points if p.log.startswith(f"{check.model} · {check.gpu}×{check.tp}")]
    assert any(p.term == "KV_TOKENS" and p.difference == kv.kv_effect for p in mine)
    assert log_cell(check, "kv_tokens") == f"{kv.logged:,.0f}* → {kv.predicted:,.0f} ({kv.difference:+.1%})"
    assert log_cell(check, "no_such_term") == "—"
    assert log_name(check).startswith(f"[{check.model}](https://github.com/vllm-project/vllm/issues/10517")
    unnamed = next(c for c in checks if not c.flags_named)
    assert log_name(unnamed).endswith(" †")


def test_the_request_mix_is_capped_at_the_context():
    assert capped_lengths([37, 5000, 4096, 9000], 4096) == ([37, 4096, 4096, 4096], 2)
    assert capped_lengths([1, 2], 4096) == ([1, 2], 0)


def test_the_live_verdict():
    gqa = KVSpec(n_layers=2, n_heads=8, n_kv_heads=2, d_head=16)
    assert live_verdict(1000, 1000, gqa, 2) == "equal"
    assert live_verdict(4000, 1000, gqa, 8) == "expanded"  # K/V repeated for all 8 query heads: 4× the bytes
    assert live_verdict(3000, 1000, gqa, 8) == "differ"
    mla = PRESETS["DeepSeek-V3"]
    assert live_verdict(2000, 1000, mla, 256) == "differ"  # an MLA latent is never per head


@pytest.mark.parametrize("lecture, n_sections", [(False, 5), (True, 6)])
def test_lecture_screens_give_the_planner_and_the_logs_a_screen_each(lecture, n_sections):
    sections, screens, cap_screens = lecture_screens(lecture)
    assert len(sections) == n_sections and sections[0] == "idea_formula" and sections[-1] == "tab_live"
    assert len(screens) == n_sections + 1 and cap_screens == [3, 4]
    assert [screens[i] for i in cap_screens] == [(3, "tab_capacity"), (3, "logs_title")]
    assert ("paged_title" in sections) == lecture
