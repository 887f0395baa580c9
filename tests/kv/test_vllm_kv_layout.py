"""kvviz's planner against vLLM's own KV-cache sizing (tests/kv/vllm_kv_ref.py, transcribed from its wheels):
sliding-window layers, hybrid models' groups and padding layers, and the counting rule of each release; mixtures
of experts and MLA planned from their config; the environment defaults each release's envs.py sets."""

import json

import pytest

from kvviz.cli import main
from kvviz.kv.capacity import kv_layout, plan_capacity
from kvviz.kv.formula import kv_bytes, shard_for_tp
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.log_check import check_all
from kvviz.kv.presets import get_preset
from kvviz.kv.vllm_profile import ENV_DEFAULTS, LINES, ServingFlags, mla_attention, moe_layer_peak, parse_version
from tests.kv.vllm_kv_ref import vllm_start_up

H100 = HARDWARE["H100 SXM"].memory_bytes


def kinds(name: str) -> list[str]:
    """Which layers slide, as vLLM's model files decide it (gemma2.py: even layers; gemma3.py: all but every
    sixth; Mistral: every layer; gpt-oss: its layer_types)."""
    spec = get_preset(name)
    if name == "Gemma-2-9B":
        return ["sliding" if i % 2 == 0 else "full" for i in range(spec.n_layers)]
    if name == "Gemma-3-27B":
        return ["full" if (i + 1) % 6 == 0 else "sliding" for i in range(spec.n_layers)]
    if name == "gpt-oss-120b":
        return ["sliding", "full"] * 18
    return ["sliding" if spec.n_sliding_layers else "full"] * spec.n_layers


def reference(name: str, plan, *, version: str, batch: int, tp: int = 1) -> dict:
    shard = shard_for_tp(get_preset(name), tp)
    assert kinds(name).count("sliding") == shard.n_sliding_layers
    return vllm_start_up(kinds(name), sliding_window=shard.sliding_window,
                         page_size_bytes=kv_bytes(shard, [1]) * plan.block_size,
                         available_memory=plan.kv_budget_bytes, max_model_len=plan.max_model_len,
                         max_num_batched_tokens=batch, block_size=plan.block_size, version=parse_version(version))


CASES = [  # model, max_model_len, max_num_batched_tokens, version
    ("Gemma-2-9B", 8192, 8192, "0.20.0"), ("Gemma-2-9B", 8192, 8192, "0.21.0"), ("Gemma-2-9B", 8192, 2048, "0.9.1"),
    ("Mistral-7B", 32768, 8192, "0.20.0"), ("Mistral-7B", 32768, 8192, "0.33.0"),
    ("Gemma-3-27B", 32768, 8192, "0.20.0"), ("Gemma-3-27B", 32768, 8192, "0.11.1"),
    ("Gemma-3-27B", 32768, 8192, "0.29"),
    ("gpt-oss-120b", 131072, 8192, "0.20.0"), ("Gemma-2-9B", 8192, 8192, "0.9.0"), ("Mistral-7B", 32768, 2048, "0.8.5"),
    ("Llama-3.1-8B", 10000, 8192, "0.21.0"),
]


@pytest.mark.parametrize("name, mml, batch, version", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_planner_counts_as_vllm_does(name, mml, batch, version):
    """Issue 34 items 1–2: blocks, 'GPU KV cache size' and 'Maximum concurrency' equal vLLM's own rule for the
    release, at the planner's KV budget."""
    plan = plan_capacity(get_preset(name), H100, max_model_len=mml, reserve_bytes=2**30,
                         weight_dtype="int4" if name == "gpt-oss-120b" else "bfloat16",
                         flags=ServingFlags(vllm_version=version, max_num_batched_tokens=batch))
    ref = reference(name, plan, version=version, batch=batch)
    assert plan.num_blocks == ref["num_blocks"]
    assert plan.kv_cache_tokens == ref["tokens"]
    assert plan.max_concurrency == pytest.approx(ref["concurrency"], rel=1e-12)
    assert (len(plan.kv_cache_groups), plan.padding_layers) == (ref["groups"], ref["padding"])


def test_sliding_layers_take_their_window_plus_the_batch():
    """SlidingWindowSpec.max_memory_usage_bytes: Gemma-2 at 8K with 8,192 batched tokens keeps
    cdiv(min(4095 + 8192, 8192), 16) + 1 = 513 blocks per sliding group beside the full group's 512, so vLLM
    admits 1025 blocks per request where W − 1 tokens per sliding layer would say 384 (+33 %); Mistral at 32K
    takes cdiv(4095 + 8192, 16) + 1 = 769 blocks where W − 1 tokens say 256 (3×)."""
    plan = plan_capacity(get_preset("Gemma-2-9B"), H100, max_model_len=8192, reserve_bytes=2**30,
                         flags=ServingFlags(vllm_version="0.20", max_num_batched_tokens=8192))
    assert plan.kv_cache_groups == [["full", 512], ["sliding", 513]] and plan.blocks_per_request == 1025
    mistral = plan_capacity(get_preset("Mistral-7B"), H100, max_model_len=32768, reserve_bytes=2**30,
                            flags=ServingFlags(vllm_version="0.20", max_num_batched_tokens=8192))
    assert mistral.kv_cache_groups == [["sliding", 769]]
    assert mistral.max_concurrency == mistral.num_blocks / 769


def test_uneven_pattern_is_padded():
    """Gemma-3-27B: 10 full + 52 sliding layers → groups of 10, six sliding groups with 8 padding layers; the
    0.9.1–0.20 count num_blocks // 7 · 16 is 62/70 of what the unpadded layers would hold."""
    plan = plan_capacity(get_preset("Gemma-3-27B"), H100, max_model_len=32768, reserve_bytes=2**30,
                         flags=ServingFlags(vllm_version="0.20", max_num_batched_tokens=8192))
    assert plan.padding_layers == 8 and len(plan.kv_cache_groups) == 7
    assert plan.kv_bytes_per_block == 10 * plan.kv_bytes_per_token // 62 * 16
    unpadded = plan.kv_budget_bytes // (plan.kv_bytes_per_token * 16) * 16
    assert plan.kv_cache_tokens / unpadded == pytest.approx(62 / 70, rel=2e-3)


def test_before_0_9_1_sliding_layers_count_as_full():
    """0.8.5 / 0.9.0 and V0: the window does not enter the count; concurrency = tokens / max_model_len."""
    for version, engine in (("0.9.0", None), ("0.6.6", "v0")):
        plan = plan_capacity(get_preset("Gemma-2-9B"), H100, max_model_len=8192, reserve_bytes=2**30,
                             flags=ServingFlags(vllm_version=version, engine=engine))
        assert plan.kv_cache_groups == [["full", 512]] and plan.padding_layers == 0
        assert plan.max_concurrency == plan.kv_cache_tokens / 8192 and plan.sliding_as_full
    assert "unify_hybrid_kv_cache_specs" in kv_layout(
        get_preset("Gemma-2-9B"), version=(0, 9, 0), engine="v1", max_model_len=8192, max_num_batched_tokens=8192,
        block_size=16, kv_dtype_name="bfloat16").source


def test_cli_shows_the_new_concurrency(capsys):
    assert main(["capacity", "--preset", "Gemma-2-9B", "--gpu", "H100 SXM", "--max-model-len", "8192",
                 "--max-num-batched-tokens", "8192", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["blocks_per_request"] == 1025 and out["kv_cache_groups"] == [["full", 512], ["sliding", 513]]
    assert out["max_concurrency"] == pytest.approx(out["num_blocks"] / 1025) and not out["sliding_as_full"]
    assert main(["capacity", "--preset", "Gemma-2-9B", "--gpu", "H100 SXM", "--max-model-len", "8192",
                 "--vllm-version", "0.9.0"]) == 0
    assert "counts the sliding-window layers as full attention" in capsys.readouterr().out


# ---- mixtures of experts and MLA ------------------------------------------------------------------------------
def test_moe_layer_buffers_by_hand():
    """Mixtral-8x7B, 2,048 tokens on one GPU, 0.20's TritonExperts.workspace_shapes: [M, 2, max(14336, 4096)] +
    [M, 2, max(28672, 4096)] + [M, 4096]; 0.9's fused_experts_impl: cache13 [M, 2, 28672] + cache2 [2M, 14336];
    around them the residual, input and normed input, the router's 8 logits and the top-2 weights and ids."""
    spec, t = get_preset("Mixtral-8x7B"), 2048
    held = t * (3 * 4096 + 8) * 2 + t * 2 * 8
    assert moe_layer_peak(spec, t, 1, 2, (0, 20, 0)) == held + (t * 2 * (14336 + 28672) + t * 4096) * 2
    assert moe_layer_peak(spec, t, 1, 2, (0, 9, 0)) == held + (t * 2 * (28672 + 14336) + t * 4096) * 2


def test_mla_prefill_by_hand():
    """DeepSeek-V3 on 8 GPUs: 16 heads of 128 + 64 query/key, 128 values, latents 1536 and 512 + 64."""
    v3 = get_preset("DeepSeek-V3")
    assert mla_attention(v3, 100, 8, 2) == 100 * (3 * 7168 + 1536 + 512 + 64 + 16 * (3 * 192 + 256 + 128)) * 2


def test_deepseek_v3_plans_with_a_range_not_a_refusal(capsys):
    """Issue 34 item 3: the reserve of an MoE + MLA model is modelled from its config, with the range the
    unknown flags leave and the flag that narrows it."""
    assert main(["capacity", "--preset", "DeepSeek-V3", "--gpu", "H200", "--tp", "8", "--weight-dtype", "fp8",
                 "--max-model-len", "32768", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lo, hi = out["kv_cache_tokens_range"]
    assert out["reserve_estimated"] and lo <= out["kv_cache_tokens"] <= hi and lo < hi
    assert out["narrowing_flag"] and out["launch"]["activation_checked"] is False
    assert out["reserve_terms"]["activation"] > 0


@pytest.mark.parametrize("name, tp", [("Mixtral-8x7B", 2), ("Qwen3-30B-A3B", 1), ("gpt-oss-120b", 1)])
def test_moe_presets_plan(name, tp):
    plan = plan_capacity(get_preset(name), HARDWARE["H200"].memory_bytes, max_model_len=32768, tp=tp,
                         weight_dtype="int4" if name == "gpt-oss-120b" else "bfloat16")
    lo, hi = plan.reserve_range
    assert lo <= plan.reserve_bytes <= hi and plan.num_blocks > 0


def test_moe_log_falls_in_the_range():
    """vllm issue 17327: Qwen3-30B-A3B on 4 × A10 with 0.8.5 logged 198,784 tokens and 14.25 GiB of weights."""
    check = next(c for c in check_all() if c.id == "vllm-17327-a10x4-qwen3-30b-a3b")
    assert check.kv_in_range
    assert check.term("weights").difference == pytest.approx(0, abs=0.01)


def test_gpt_oss_log_falls_in_the_range_with_its_mxfp4_weights():
    """vllm issue 27508: 1.71 GiB left for KV on an H100. Sized as int4 (0.5 B per parameter) the planner left
    far more and the log fell outside its range; with the checkpoint's MXFP4 experts, their scales and the bf16
    attention and embeddings (issue 46), the log falls inside it."""
    check = next(c for c in check_all() if c.id == "vllm-27508-h100-gpt-oss-120b")
    assert check.weight_format == "MXFP4 experts" and check.kv_in_range


# ---- environment defaults by release ---------------------------------------------------------------------------
def test_env_defaults_drive_the_lines():
    """Issue 34 item 4: each release's vllm/envs.py (read in its wheel) sets VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
    '0' in 0.18.0 and 0.19.0, '1' from 0.20.0; FlashInfer's sampler on by default from 0.21.0; the lines follow."""
    estimate = ENV_DEFAULTS["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"]
    assert {v: d for v, d, _ in estimate} == {(0, 18, 0): "0", (0, 19, 0): "0", (0, 20, 0): "1", (0, 21, 0): "1",
                                             (0, 29, 0): "1", (0, 33, 0): "1", (0, 34, 0): "1"}
    for first, default, source in estimate:
        line = [ln for ln in LINES if ln.first <= first][-1]
        assert (line.cudagraph == "estimate") == (default == "1"), source
    for first, default, source in ENV_DEFAULTS["VLLM_USE_FLASHINFER_SAMPLER"]:
        line = [ln for ln in LINES if ln.first <= first][-1]
        assert (line.samplers == ("flashinfer",)) == (default == "True"), source
    assert all(d == "32768" for _, d, _ in ENV_DEFAULTS["VLLM_FUSED_MOE_CHUNK_SIZE"])


def test_the_config_file_gives_the_presets_moe_fields():
    """DeepSeek-V3's config.json as published (tests/kv/test_formula.py) gives the preset's MoE and MLA widths."""
    from kvviz.kv.reader import parse_hf_config
    from tests.kv.test_formula import DEEPSEEK_V3_CONFIG

    # (that copy leaves out first_k_dense_replace, the preset's 3 dense layers)
    keys = ("n_experts", "n_experts_per_token", "moe_d_ff", "n_shared_experts", "q_lora_rank", "v_head_dim", "d_ff")
    read, preset = parse_hf_config(DEEPSEEK_V3_CONFIG), get_preset("DeepSeek-V3")
    assert {k: getattr(read, k) for k in keys} == {k: getattr(preset, k) for k in keys} == {
        "n_experts": 256, "n_experts_per_token": 8, "moe_d_ff": 2048, "n_shared_experts": 1, "q_lora_rank": 1536,
        "v_head_dim": 128, "d_ff": 18432}
    assert preset.n_dense_layers == 3
