"""Capacity planner and paged-vs-contiguous allocation on hand-computed cases."""

import json
from dataclasses import replace

import pytest

from kvviz.cli import main
from kvviz.errors import InputError
from kvviz.kv.capacity import compare_allocation, parse_lengths, plan_capacity
from kvviz.kv.formula import kv_footprint, shard_for_tp
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.log_check import load_logs, log_gpu
from kvviz.kv.presets import CONFIGS, get_preset
from kvviz.kv.reader import parse_hf_config
from kvviz.kv.vllm_profile import ServingFlags

GIB = 2**30
LLAMA = get_preset("Llama-3.1-8B")


def test_plan_by_hand():
    # 80 GiB · 0.5 = 40 GiB; 16e9 B of weights (8e9 params, bf16) and a 1 GiB reserve leave the KV budget;
    # 128 KiB per token, blocks of 16 tokens (2 MiB), 4096-token requests need 256 blocks
    spec = replace(LLAMA, n_params=8 * 10**9, params_source="given")
    plan = plan_capacity(spec, 80 * GIB, max_model_len=4096, gpu_memory_utilization=0.5, reserve_bytes=GIB)
    assert plan.requested_bytes == 40 * GIB
    assert plan.kv_budget_bytes == 40 * GIB - 16 * 10**9 - GIB
    assert plan.kv_bytes_per_block == 16 * 131072
    assert plan.num_blocks == (40 * GIB - 16 * 10**9 - GIB) // (16 * 131072) == 12_338
    assert plan.kv_cache_tokens == 12_338 * 16
    assert plan.blocks_per_request == 256 and plan.max_requests == 48
    assert plan.max_concurrency == 12_338 / 256
    assert plan.weights_fit and not plan.reserve_estimated



def test_kv_cache_tokens_is_max_concurrency_times_max_model_len():
    """vLLM 0.33/0.34's get_kv_cache_capacity logs int(max_concurrency · max_model_len): with 1000-token requests
    (63 blocks of 16, the last one partial) the 12,338 blocks of test_plan_by_hand hold int(12338 / 63 · 1000)
    tokens of requests, not 12,338 · 16 (the formula before, still equal when max_model_len fills whole blocks)."""
    spec = replace(LLAMA, n_params=8 * 10**9, params_source="given")
    plan = plan_capacity(spec, 80 * GIB, max_model_len=1000, gpu_memory_utilization=0.5, reserve_bytes=GIB)
    assert plan.num_blocks == 12_338 and plan.blocks_per_request == 63
    assert plan.kv_cache_tokens == int(12_338 / 63 * 1000) == 195_841 != 12_338 * 16

def test_weights_that_do_not_fit():
    plan = plan_capacity(get_preset("Llama-3.1-70B"), HARDWARE["L4"].memory_bytes, max_model_len=100)
    assert not plan.weights_fit and plan.kv_budget_bytes == 0 and plan.num_blocks == 0 and plan.max_requests == 0


def test_unknown_parameters_give_no_capacity():
    """An MoE/MLA config whose count the reader cannot determine: never a default, no capacity until given."""
    unknown = parse_hf_config(CONFIGS["DeepSeek-V3"], "upload")
    assert unknown.n_params is None and unknown.params_source == "unknown"
    with pytest.raises(InputError, match="parameter count is unknown"):
        plan_capacity(unknown, HARDWARE["H100 SXM"].memory_bytes, max_model_len=4096)


def test_tensor_parallel_splits_weights_and_kv_heads():
    spec = get_preset("Llama-3.1-70B")
    one = shard_for_tp(spec, 8)
    assert (one.n_heads, one.n_kv_heads) == (8, 1)
    assert shard_for_tp(spec, 16).n_kv_heads == 1  # fewer KV heads than GPUs: replicated
    plan = plan_capacity(spec, HARDWARE["H200"].memory_bytes, max_model_len=131072, tp=8)
    assert plan.weights_bytes == -(-spec.n_params * 2 // 8)
    assert plan.kv_bytes_per_token == 2 * 80 * 1 * 128 * 2
    with pytest.raises(InputError, match="split evenly"):
        shard_for_tp(spec, 3)


def test_mla_latent_is_whole_on_every_gpu():
    """Issue 28 item 8: vLLM's MLA attention splits the 128 query heads over 8 GPUs and keeps the whole latent
    cache on each rank (no KV heads to split): 61 layers × (512 + 64) × 2 B per token on every GPU."""
    v3 = get_preset("DeepSeek-V3")
    shard = shard_for_tp(v3, 8)
    assert shard.n_heads == 16
    assert kv_footprint(shard, 1).per_token == kv_footprint(v3, 1).per_token == 61 * (512 + 64) * 2
    plan = plan_capacity(v3, HARDWARE["H200"].memory_bytes, max_model_len=32768, tp=8, weight_dtype="fp8",
                         reserve_bytes=5 * GIB)
    assert plan.kv_bytes_per_token == 70_272 and plan.weights_bytes == -(-v3.n_params // 8)
    assert plan.num_blocks == (int(HARDWARE["H200"].memory_bytes * 0.9) - plan.weights_bytes - 5 * GIB) // (
        16 * 70_272)
    with pytest.raises(InputError, match="split evenly"):
        shard_for_tp(v3, 3)  # 128 query heads do not split over 3 GPUs, in vLLM either


@pytest.mark.parametrize("block, version, ok", [
    (16, None, True), (7, None, False), (256, "0.12", True), (256, "0.11", False), (1, "0.8.3", False),
    (1, "0.10.2", True), (48, "0.20", True), (48, "0.11", False), (64, "0.4.1", False), (32, "0.4.1", True),
])
def test_vllm_block_sizes(block, version, ok):
    """--block-size as vLLM's parser takes it: arg_utils.py choices (0.4.1: 8/16/32; 0.6–0.9: up to 128),
    config/cache.py BlockSize (0.10: 1 added; 0.12: 256), then any multiple of 16 (FlashAttention, 0.18+)."""
    run = lambda: plan_capacity(LLAMA, 80 * GIB, max_model_len=4096, block_size=block,  # noqa: E731
                                flags=ServingFlags(vllm_version=version), reserve_bytes=GIB)
    if ok:
        assert run().block_size == block
    else:
        with pytest.raises(InputError, match=f"--block-size {block}"):
            run()


def test_max_model_len_past_the_models_context_is_refused():
    """vLLM's _get_and_verify_max_len refuses it; the message names the model's own limit."""
    with pytest.raises(InputError, match="config gives 131072 tokens"):
        plan_capacity(LLAMA, 80 * GIB, max_model_len=10_000_000, reserve_bytes=GIB)
    assert plan_capacity(LLAMA, 80 * GIB, max_model_len=131072, reserve_bytes=GIB).max_model_len == 131072


@pytest.mark.parametrize("argv, words", [
    (["--preset", "Llama-3.1-8B", "--gpu", "H200", "--block-size", "7"], "--block-size 7"),
    (["--preset", "Llama-3.1-8B", "--gpu", "H200", "--max-model-len", "10000000"], "131072 tokens"),
    (["--preset", "Llama-3.1-8B", "--gpu", "H200", "--vllm-version", "eleven"], "vLLM version 'eleven'"),
    (["--preset", "Llama-3.1-8B", "--gpu", "H200", "--vllm-version", "0.3.3"], "older than"),
    (["--preset", "Llama-3.1-8B", "--gpu", "H200", "--vllm-version", "0.11", "--vllm-engine", "v0"], "v0 engine"),
])
def test_capacity_cli_refuses_in_one_line(argv, words, capsys):
    assert main(["capacity", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err


def test_deepseek_v3_on_eight_gpus_plans_with_a_given_reserve(capsys):
    assert main(["capacity", "--preset", "DeepSeek-V3", "--gpu", "H200", "--tp", "8", "--weight-dtype", "fp8",
                 "--max-model-len", "32768", "--reserve-gib", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 70_272 and out["kv_cache_tokens"] > 0


def test_sliding_window_requests_need_fewer_blocks():
    """vLLM admits a sliding layer's window plus the batch being prefilled, not only W − 1 tokens
    (SlidingWindowSpec.max_memory_usage_bytes; tests/kv/test_vllm_kv_layout.py holds the rest)."""
    mistral = get_preset("Mistral-7B")
    plan = plan_capacity(mistral, HARDWARE["H100 SXM"].memory_bytes, max_model_len=32768, reserve_bytes=GIB,
                         flags=ServingFlags(max_num_batched_tokens=2048))
    assert plan.blocks_per_request == -(-(4095 + 2048) // 16) + 1 == 385 < 32768 // 16


@pytest.mark.parametrize(
    "kwargs",
    [dict(gpu_memory_utilization=0), dict(gpu_memory_utilization=1.5), dict(max_model_len=0), dict(block_size=0),
     dict(reserve_bytes=-1), dict(tp=0)],
)
def test_plan_rejects_bad_inputs(kwargs):
    with pytest.raises(InputError):
        plan_capacity(LLAMA, 80 * GIB, **({"max_model_len": 4096} | kwargs))


# ---- real vLLM start-up logs (kvviz/kv/startup_logs.json, each with its source) -----------------------------
# With a log's own activation + non-torch figures as the reserve, vLLM's arithmetic must give its KV tokens.
GIVEN = [e for e in load_logs() if e["engine"] == "vllm" and e["logged"].get("non_torch_gib") is not None
         and (e["logged"].get("activation_peak_gib") is not None or e["logged"].get("peak_torch_gib") is not None)]


@pytest.mark.parametrize("entry", GIVEN, ids=[e["id"] for e in GIVEN])
def test_capacity_reproduces_vllm_logs_from_their_own_reserve(entry, tmp_path, capsys):
    logged, f = entry["logged"], entry["flags"]
    activation = logged.get("activation_peak_gib")
    if activation is None:  # 0.6.4 logs the torch peak, weights included
        activation = logged["peak_torch_gib"] - logged["weights_gib"]
    if entry.get("preset"):
        source = ["--preset", entry["preset"]]
    else:
        (tmp_path / "config.json").write_text(json.dumps(entry["config"]))
        source = ["--config", str(tmp_path)] + (["--params", str(entry["n_params"])] if entry["n_params"] else [])
    total, _, _, _ = log_gpu(entry)
    argv = ["capacity", *source, "--gpu-memory-gib", str(total / GIB), "--tp", str(f["tp"]),
            "--reserve-gib", str(activation + logged["non_torch_gib"]),
            "--gpu-memory-utilization", str(f["gpu_memory_utilization"]),
            "--max-model-len", str(f["max_model_len"]), "--json"]
    assert main(argv) == 0
    ours = json.loads(capsys.readouterr().out)
    logged_tokens = logged["kv_cache_tokens"] or (logged["gpu_blocks"] or 0) * 16 or \
        logged["kv_cache_gib"] * GIB // ours["kv_bytes_per_token"]
    assert ours["kv_cache_tokens"] == pytest.approx(logged_tokens, rel=0.05), entry["source_url"]
    if logged["max_concurrency"] is not None:
        assert ours["max_concurrency"] == pytest.approx(logged["max_concurrency"], rel=0.05), entry["source_url"]
    if logged["weights_gib"] is not None:
        assert ours["weights_bytes"] / GIB == pytest.approx(logged["weights_gib"], rel=0.05)


def test_paged_fragmentation_by_hand():
    # max length 128, blocks of 16, 10 B per token
    alloc = compare_allocation([1, 16, 17, 100], max_len=128, kv_bytes_per_token=10, block_size=16)
    assert alloc.live_bytes == 134 * 10
    assert alloc.contiguous_bytes == 4 * 128 * 10 and alloc.contiguous_waste_bytes == 5120 - 1340
    assert alloc.paged_blocks == 1 + 1 + 2 + 7  # ceil(n / 16)
    assert alloc.paged_bytes == 11 * 16 * 10 and alloc.paged_waste_bytes == 1760 - 1340
    assert alloc.contiguous_waste_fraction == pytest.approx(3780 / 5120)
    assert alloc.paged_waste_fraction == pytest.approx(420 / 1760)
    assert alloc.to_dict()["paged_waste_fraction"] == pytest.approx(420 / 1760)
    # a 12,800 B budget: 12800 / (128 · 10) = 10 max-length reservations; 12800 / (1760 / 4) = 29.09 → 29 paged
    assert alloc.requests_that_fit(12_800) == (10, 29)


def test_paged_waste_is_under_one_block_per_request():
    lengths = list(range(1, 300, 7))
    alloc = compare_allocation(lengths, 512, 3, 16)
    assert 0 <= alloc.paged_waste_bytes <= len(lengths) * 15 * 3
    assert alloc.paged_bytes <= alloc.contiguous_bytes


@pytest.mark.parametrize("lengths, words", [([], "at least one"), ([0], "outside"), ([129], "outside")])
def test_allocation_rejects_bad_lengths(lengths, words):
    with pytest.raises(InputError, match=words):
        compare_allocation(lengths, 128, 10)


def test_parse_lengths():
    assert parse_lengths("100, 2000 37") == [100, 2000, 37]
    with pytest.raises(InputError, match="whole numbers"):
        parse_lengths("10, ten")
