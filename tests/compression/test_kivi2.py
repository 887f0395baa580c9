"""KIVI-2 end to end (Liu et al. 2024, arXiv:2402.02750 §4.1, the paper's own setting: 2-bit keys per channel and
values per token, groups of G = 32, the newest R = 128 tokens in full precision): its one entry in the table of KV
formats, the memory formula's bytes, quantizing within its bound, the decode loop on the shipped model, the CLI,
and every other name refused by name."""
import json

import pytest
import torch

from kvviz.cli import main
from kvviz.compression import quant
from kvviz.compression.caches import QuantizedCache
from kvviz.compression.quality import all_methods, compare
from kvviz.compression.runner import METHODS, Method, method_family, run_method
from kvviz.errors import InputError
from kvviz.kv.formats import KV_DTYPES, STORED_DTYPES, stored_dtype
from kvviz.kv.formula import KVSpec, kv_footprint

LLAMA_8B = KVSpec(32, 32, 8, 128)  # Llama-3.1-8B: 32 layers, 8 KV heads of 128


def test_one_entry_says_how_it_is_stored():
    fmt = KV_DTYPES["kivi2"]
    s = fmt.stored
    assert (s.bits, s.per_byte, s.group, s.residual, s.grouped, s.family) == (2, 4, 32, 128, True, "quantize")
    assert (fmt.data_bytes, fmt.group_size, fmt.scale_bytes_per_group) == (0.25, 32, 4)  # fp16 scale + fp16 zero
    # from that entry alone: a method, its family, its place among the stored formats
    assert "kivi2" in STORED_DTYPES and "kivi2" in METHODS and method_family("kivi2") == "quantize"
    assert [m.label() for m in all_methods([], native=True, n_kv_heads=1)] == [
        "int8", "int4", "kivi2", "fp8 (scale=1.0)", "fp8 (--calculate-kv-scales)"]


def test_memory_formula_counts_scales_and_zero_points():
    """Per token and layer: 16 vectors of 128 values, each 128 · 2 bits = 32 B of levels and 4 groups · (fp16
    scale + fp16 zero point) = 16 B: 768 B, 3/16 of bfloat16's 4,096 B."""
    fp = kv_footprint(LLAMA_8B, 4096, 1, "kivi2")
    assert (fp.per_token_per_layer, fp.scale_bytes_per_token_per_layer) == (16 * (32 + 16), 16 * 16) == (768, 256)
    assert fp.per_token == 768 * 32 == 24_576
    assert fp.total == 24_576 * 4096 == 100_663_296  # 96 MiB, against 512 MiB in bfloat16
    assert fp.total * 16 == kv_footprint(LLAMA_8B, 4096, 1, "bfloat16").total * 3


def test_memory_cli(capsys):
    assert main(["memory", "--preset", "Llama-3.1-8B", "--tokens", "4096", "--kv-dtype", "kivi2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["kv_dtype"], out["per_token_per_layer"], out["total"]) == ("kivi2", 768, 100_663_296)


@pytest.mark.parametrize("axis", [-2, -1])
def test_two_bits_within_half_a_step(axis):
    """Four levels per group, (max − min)/3 apart: every value within half a step, four values to a byte."""
    x = torch.randn(2, 3, 64, 32, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 20, 32)
    q = quant.quantize_int(x, "kivi2", 32, axis)
    err = (x - quant.dequantize_int(q)).abs()
    assert bool((err <= quant.int_error_bound(q) * (1 + 1e-6) + 1e-7).all())
    assert err.max() > quant.int_error_bound(q).max() / 4  # the bound is tight, not vacuous
    # 2·3·64·32 values at 4 a byte, and one fp16 scale and fp16 zero point per 32 values
    assert q.data.numel() == 2 * 3 * 64 * 32 // 4 and q.nbytes == 2 * 3 * 64 * 32 // 4 + 2 * 3 * 64 * 4


def test_other_names_refused_by_name():
    with pytest.raises(InputError, match="unknown KV dtype int2"):
        stored_dtype("int2")
    with pytest.raises(InputError, match="sizes q8_0 but does not store it"):  # sized, not stored
        stored_dtype("q8_0")
    with pytest.raises(InputError, match="sizes bfloat16 but does not store it"):
        QuantizedCache(KVSpec(1, 2, 2, 32), 1, torch.float32, torch.device("cpu"), "bfloat16")
    with pytest.raises(InputError, match="multiple of 4"):  # four levels to a byte along a head's channels
        QuantizedCache(KVSpec(1, 2, 2, 6), 1, torch.float32, torch.device("cpu"), "kivi2", group=6, residual=6)
    with pytest.raises(InputError, match="unknown compression method 'int2'"):
        method_family("int2")


@pytest.fixture(scope="module")
def ids(tiny):
    text = ("The cache keeps the keys and values of every past token, so each decode step reads them back instead "
            "of computing them again. Quantization stores each in fewer bits. ") * 20
    return tiny.tokenizer.encode(text)[:256]


def test_decode_loop_on_the_shipped_model(tiny, ids):
    """The shipped model (4 layers, 2 KV heads of 24): 32 does not divide 24, so G = 24 and R = 128 rounded up to
    144. A 128-token prompt, then 127 decode steps: 255 cached; keys quantized 144 at a time (144 quantized, 111 in
    full precision), values past the newest 144 (111 quantized, 144 full). Per layer, KV head, K or V: a quantized
    token is 24 · 2 bits = 6 B + one group's 4 B, a float32 token 96 B."""
    assert (tiny.spec.n_layers, tiny.spec.n_kv_heads, tiny.spec.d_head) == (4, 2, 24)
    kivi2 = run_method(tiny, ids, 128, Method("kivi2"))
    assert (kivi2.group, kivi2.residual, kivi2.n_cached) == (24, 144, 255)
    assert kivi2.kv_bytes == kivi2.formula_bytes == 4 * 2 * ((144 + 111) * (6 + 4) + (111 + 144) * 96) == 216_240
    full = run_method(tiny, ids, 128, Method("full"))
    int4 = run_method(tiny, ids, 128, Method("int4", group=24, residual=144))
    target = [torch.tensor(ids[128:])]
    ppl, ppl_full, kl2, top1 = compare([full], [kivi2], target)
    kl4 = compare([full], [int4], target)[2]
    # 2 bits lose more than 4 at the same G and R, and both lose something
    assert kl2 > kl4 > 0 and top1 < 1 and ppl != ppl_full


def test_compress_cli(capsys):
    assert main(["compress", "--method", "kivi2", "--tokens", "256", "--seq-len", "256", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["results"]
    assert (row["method"], row["family"], row["group"], row["residual"], row["kv_scale"]) == (
        "kivi2", "quantize", 24, 144, None)
    assert row["kv_bytes"] == row["formula_bytes"] and row["n_cached"] == 255
    assert main(["compress", "--method", "int2"]) == 2
    assert "unknown method 'int2'" in capsys.readouterr().err
