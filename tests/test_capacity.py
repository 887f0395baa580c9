"""Capacity planner and paged-vs-contiguous allocation on hand-computed cases."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvviz.cli import main
from kvviz.errors import InputError
from kvviz.kv.capacity import compare_allocation, parse_lengths, plan_capacity, shard_for_tp
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import CONFIGS, get_preset
from kvviz.kv.reader import parse_hf_config

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


def test_sliding_window_requests_need_fewer_blocks():
    mistral = get_preset("Mistral-7B")
    plan = plan_capacity(mistral, HARDWARE["H100 SXM"].memory_bytes, max_model_len=32768, reserve_bytes=GIB)
    assert plan.blocks_per_request == -(-4095 * 131072 // (16 * 131072)) == 256  # W − 1 tokens, not 32768


@pytest.mark.parametrize(
    "kwargs",
    [dict(gpu_memory_utilization=0), dict(gpu_memory_utilization=1.5), dict(max_model_len=0), dict(block_size=0),
     dict(reserve_bytes=-1), dict(tp=0)],
)
def test_plan_rejects_bad_inputs(kwargs):
    with pytest.raises(InputError):
        plan_capacity(LLAMA, 80 * GIB, **({"max_model_len": 4096} | kwargs))


# ---- real vLLM start-up logs (tests/fixtures/vllm_logs.json, each with its source) ----------------------------
OPT_125M = {"model_type": "opt", "num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
            "ffn_dim": 3072, "vocab_size": 50272, "max_position_embeddings": 2048}  # facebook/opt-125m config.json
QWEN25_MATH_15B = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 12, "hidden_size": 1536,
                   "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
                   "max_position_embeddings": 4096, "tie_word_embeddings": True, "use_sliding_window": False,
                   "sliding_window": 4096, "max_window_layers": 21}  # Qwen/Qwen2.5-Math-1.5B config.json
# log index → (model: preset name or config, extra CLI flags); the device total comes from our GPU table where the
# GPU is in it, else from the log (A10G and L40 are not in the table); the reserve is the log's own activation
# peak + non-torch memory (V0 logs give peak_torch_memory − weights for the activation).
CASES = {
    0: ("Llama-3.1-8B", ["--gpu", "A100 40GB", "--reserve-gib", str(9.37 + 0.10)]),  # Llama-3-8B: same shape
    1: ("Llama-3.1-8B", ["--gpu", "RTX 3090", "--reserve-gib", str(17.06 - 14.99 + 0.35)]),
    2: ("Llama-3.1-8B", ["--gpu", "RTX 3090", "--reserve-gib", str(17.98 - 14.99 + 0.35)]),
    4: ("Qwen2.5-7B", ["--gpu-memory-gib", "21.99", "--reserve-gib", str(1.43 + 0.06)]),
    6: ("Llama-3.1-70B", ["--gpu", "H200", "--tp", "8", "--reserve-gib", str(17.67 - 16.46 + 7.71)]),
    8: (OPT_125M, ["--gpu", "H200", "--params", "125239296", "--reserve-gib", str(0.49 + 0.22)]),
    9: (OPT_125M, ["--gpu", "L4", "--params", "125239296", "--reserve-gib", str(0.47 + 0.04)]),
    13: (QWEN25_MATH_15B, ["--gpu-memory-gib", "44.39", "--reserve-gib", str(1.4 + 0.08)]),
}
LOGS = json.loads((Path(__file__).parent / "fixtures" / "vllm_logs.json").read_text())


def capacity_cli(model, flags, log, tmp_path) -> dict:
    if isinstance(model, str):
        source = ["--preset", model]
    else:
        (tmp_path / "config.json").write_text(json.dumps(model))
        source = ["--config", str(tmp_path)]
    argv = ["capacity", *source, *flags, "--gpu-memory-utilization", str(log["gpu_memory_utilization"]),
            "--max-model-len", str(log["max_concurrency_tokens"] or log["max_model_len"]), "--json"]
    return argv


@pytest.mark.parametrize("index", sorted(CASES))
def test_capacity_reproduces_vllm_logs(index, tmp_path, capsys):
    log = LOGS[index]
    model, flags = CASES[index]
    assert main(capacity_cli(model, flags, log, tmp_path)) == 0
    ours = json.loads(capsys.readouterr().out)
    logged_tokens = log["kv_cache_tokens"] or log["gpu_blocks"] * 16
    assert ours["kv_cache_tokens"] == pytest.approx(logged_tokens, rel=0.05), log["source_url"]
    if log["max_concurrency"] is not None:
        assert ours["max_concurrency"] == pytest.approx(log["max_concurrency"], rel=0.05), log["source_url"]
    if log["weights_gib"] is not None:
        assert ours["weights_bytes"] / GIB == pytest.approx(log["weights_gib"], rel=0.05)


def test_capacity_matches_a_v1_log_budget():
    """vLLM V1 on an H100 (llm-d's record): 'KV cache memory: 51.38 GiB' with weights 14.99, activation 4.76 and
    non-torch 0.13 GiB at utilization 0.9."""
    log = LOGS[3]
    plan = plan_capacity(LLAMA, HARDWARE["H100 SXM"].memory_bytes, max_model_len=16000,
                         reserve_bytes=round((4.76 + 0.13) * GIB))
    assert plan.kv_budget_bytes / GIB == pytest.approx(log["kv_cache_gib"], rel=0.05)


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
