"""Roofline bounds reproduce hand-computed numbers from the stated figures."""
import math

import pytest

from kvviz.kv import roofline
from kvviz.kv.hardware import HARDWARE, Hardware

# The stated figures: 32 layers, 32 query / 8 KV heads, d_head 128, 8.03e9 parameters.
LLAMA3_8B = roofline.ModelShape("Llama-3-8B", 8.03e9, 32, 32, 8, 128)
GPU = Hardware("3.35 TB/s GPU", 80 * 10**9, 3.35e12, 989e12)


def test_llama3_8b_decode_bound_by_hand():
    weights = 8.03e9 * 2  # bf16: 16.06 GB
    kv = 2 * 32 * 8 * 128 * 2 * 4096  # K and V · layers · KV heads · d_head · bytes · tokens = 0.537 GB
    assert weights == 16.06e9 and kv == 536_870_912
    b = roofline.decode_bound(LLAMA3_8B, GPU, batch=1, n_context=4096)
    assert b.bytes_moved == weights + kv
    assert b.memory_s == (16.06e9 + 536_870_912) / 3.35e12
    assert b.seconds == b.memory_s and b.limited_by == "memory"
    assert b.seconds * 1e3 == pytest.approx(4.954, abs=1e-3)  # ≈ (16.06 + 0.54) GB / 3.35 TB/s
    flops = 2 * 8.03e9 + 4 * 32 * 32 * 128 * 4096
    assert b.compute_s == flops / 989e12


def test_batch_multiplies_cache_not_weights():
    b8 = roofline.decode_bound(LLAMA3_8B, GPU, batch=8, n_context=4096)
    assert b8.bytes_moved == 16.06e9 + 8 * 536_870_912


def test_prefill_is_compute_bound():
    p = roofline.prefill_bound(LLAMA3_8B, GPU, n_prompt=4096)
    flops = 2 * 8.03e9 * 4096 + 2 * 32 * 32 * 128 * 4096**2
    assert p.flops == flops and p.compute_s == flops / 989e12
    assert p.limited_by == "compute"


def test_compute_bound_batch_is_where_the_two_times_meet():
    b_star = roofline.compute_bound_batch(LLAMA3_8B, GPU, n_context=1)
    per_req = (2 * 8.03e9 + 4 * 32 * 32 * 128) / 989e12 - 2 * 32 * 8 * 128 * 2 / 3.35e12
    assert b_star == pytest.approx(16.06e9 / 3.35e12 / per_req, rel=1e-12)
    at = roofline.decode_bound(LLAMA3_8B, GPU, batch=b_star, n_context=1)
    assert at.memory_s == pytest.approx(at.compute_s, rel=1e-12)
    assert 250 < b_star < 300  # ≈ ridge point (295 FLOP/B) / (bytes per param / 2 FLOPs)
    # At 128k tokens each request's cache reads outgrow its FLOPs: decode never turns compute-bound.
    assert roofline.compute_bound_batch(LLAMA3_8B, GPU, n_context=131072) is None


def test_capacity_and_kv_weight_crossing():
    assert roofline.max_batch_that_fits(LLAMA3_8B, GPU, n_context=4096) == math.floor(
        (80e9 - 16.06e9) / 536_870_912) == 119
    assert roofline.kv_equals_weights_tokens(LLAMA3_8B, batch=1) == 16.06e9 / 131072
    assert roofline.kv_equals_weights_tokens(LLAMA3_8B, batch=32) == 16.06e9 / (32 * 131072)
    tiny_gpu = Hardware("small", 10**9, 1e11, 1e12)
    assert roofline.max_batch_that_fits(LLAMA3_8B, tiny_gpu, n_context=4096) == 0


def test_curve_rows_and_presets():
    rows = roofline.decode_curve(LLAMA3_8B, HARDWARE["H100 SXM"], batches=[1, 2, 4], n_context=4096)
    assert [r["batch"] for r in rows] == [1, 2, 4]
    assert rows[2]["tokens_per_s"] == 4 / rows[2]["seconds"]
    assert rows[1]["kv_bytes"] == 2 * 536_870_912
    assert HARDWARE["H100 SXM"].bandwidth_bytes_per_s == 3.35e12


def test_presets_come_from_the_memory_page():
    shapes = roofline.preset_shapes()
    assert shapes["Llama-3.1-8B"] == roofline.ModelShape("Llama-3.1-8B", 8_030_261_248.0, 32, 32, 8, 128)
    assert "DeepSeek-V3" not in shapes and "Mistral-7B" not in shapes  # MLA; sliding window


def test_from_arch_reads_backend_shape():
    class Arch:
        name, n_params, n_layers, n_heads, n_kv_heads, d_head = "m", 1000, 2, 4, 2, 16

    m = roofline.ModelShape.from_arch(Arch())
    assert m.kv_bytes_per_token(2) == 2 * 2 * 2 * 16 * 2 and m.weight_bytes(4) == 4000
