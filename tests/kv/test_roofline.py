"""Roofline bounds reproduce hand-computed numbers from the stated figures."""
import pytest

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec
from kvviz.kv.hardware import HARDWARE, Hardware
from kvviz.kv.presets import get_preset
from kvviz.kv.roofline import Roofline

# The stated figures: 32 layers, 32 query / 8 KV heads, d_head 128, 8.03e9 parameters.
LLAMA3_8B = KVSpec(32, 32, 8, 128, name="Llama-3-8B", n_params=8_030_000_000, params_source="given")
GPU = Hardware("3.35 TB/s GPU", 3.35e12, 989e12, 80 * 10**9)
R = Roofline(LLAMA3_8B, GPU)


def test_llama3_8b_decode_bound_by_hand():
    weights = 8.03e9 * 2  # bf16: 16.06 GB
    kv = 2 * 32 * 8 * 128 * 2 * 4096  # K and V · layers · KV heads · d_head · bytes · tokens = 0.537 GB
    assert R.weight_bytes == weights == 16.06e9 and kv == 536_870_912
    b = R.decode_bound(batch=1, n_context=4096)
    assert b.bytes_moved == weights + kv
    assert b.memory_s == (16.06e9 + 536_870_912) / 3.35e12
    assert b.seconds == b.memory_s and b.limited_by == "memory"
    assert b.seconds * 1e3 == pytest.approx(4.954, abs=1e-3)  # ≈ (16.06 + 0.54) GB / 3.35 TB/s
    flops = 2 * 8.03e9 + 4 * 32 * 32 * 128 * 4096
    assert b.compute_s == flops / 989e12


def test_batch_multiplies_cache_not_weights():
    b8 = R.decode_bound(batch=8, n_context=4096)
    assert b8.bytes_moved == 16.06e9 + 8 * 536_870_912


def test_prefill_is_compute_bound():
    p = R.prefill_bound(n_prompt=4096)
    # causal: query i scores i keys, Σ = n(n+1)/2 per layer, 4·H·d_head FLOPs per score (QKᵀ and PV)
    flops = 2 * 8.03e9 * 4096 + 4 * 32 * 128 * 32 * 4096 * 4097 // 2
    assert p.flops == flops and p.compute_s == flops / 989e12
    assert p.limited_by == "compute"


def test_compute_bound_batch_is_where_the_two_times_meet():
    b_star = R.compute_bound_batch(n_context=1)
    per_req = (2 * 8.03e9 + 4 * 32 * 32 * 128) / 989e12 - 2 * 32 * 8 * 128 * 2 / 3.35e12
    assert b_star == pytest.approx(16.06e9 / 3.35e12 / per_req, rel=1e-12)
    at = R.decode_bound(batch=b_star, n_context=1)
    assert at.memory_s == pytest.approx(at.compute_s, rel=1e-12)
    assert 250 < b_star < 300  # ≈ ridge point (295 FLOP/B) / (bytes per param / 2 FLOPs)
    # At 128k tokens each request's cache reads outgrow its FLOPs: decode never turns compute-bound.
    assert R.compute_bound_batch(n_context=131072) is None


def test_kv_weight_crossing():
    assert R.kv_equals_weights_tokens(batch=1) == -(-16_060_000_000 // 131072)  # first n with n·128 KiB ≥ W
    assert R.kv_equals_weights_tokens(batch=32) == -(-16_060_000_000 // (32 * 131072))


def test_window_caps_reads_and_scales_count():
    mistral = Roofline(get_preset("Mistral-7B"), HARDWARE["H100 SXM"])
    assert mistral.kv_bytes(100_000) == mistral.kv_bytes(4095) == 4095 * 131072  # W − 1 = 4095 tokens kept
    assert mistral.kv_equals_weights_tokens(batch=1) is None  # every layer slides: the cache stops growing
    int4 = Roofline(get_preset("Llama-3.1-8B"), HARDWARE["H100 SXM"], kv_dtype="int4")
    assert int4.kv_bytes(1) == 36_864  # 32768 B of 4-bit values + 4 B of scale and zero point per 64 values


def test_curve_rows_and_presets():
    r = Roofline(LLAMA3_8B, HARDWARE["H100 SXM"])
    rows = r.decode_curve(batches=[1, 2, 4], n_context=4096)
    assert [row["batch"] for row in rows] == [1, 2, 4]
    assert rows[2]["tokens_per_s"] == 4 / rows[2]["seconds"]
    assert rows[1]["kv_bytes"] == 2 * 536_870_912
    assert HARDWARE["H100 SXM"].bandwidth_bytes_per_s == 3.35e12


def test_unknown_or_moe_weights_are_refused():
    with pytest.raises(InputError, match="parameter count"):
        Roofline(KVSpec(2, 4, 2, 16), GPU)
    with pytest.raises(InputError, match="mixture of experts"):
        Roofline(get_preset("DeepSeek-V3"), GPU)
