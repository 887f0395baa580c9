"""Compressing the cache: exact where nothing is compressed, errors within their bounds, bytes equal to the
shared formula, the same eviction on the native and the Hugging Face decode loop, and the CLI contract."""
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from kvviz.cli import main
from kvviz.compression import quant
from kvviz.compression.caches import QuantizedCache, kivi_dtype
from kvviz.compression.runner import Method, _native_rotator, run_method
from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import load_backend, random_backend
from kvviz.engine.model import apply_rotary, rotary_tables
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint
from tests.test_hf_backend import byte_bpe

EVICT = ["window", "streaming", "h2o", "snapkv"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # hundreds of one-token passes through a 4-layer model: one thread is fastest and spares a shared machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    return load_backend("tiny", device="cpu")


@pytest.fixture(scope="module")
def ids(tiny):
    text = "def keys(self):\n    Return a view of the cached keys and values of every past position." * 3
    return tiny.tokenizer.encode(text)[:60]


@pytest.fixture(scope="module")
def full(tiny, ids):
    return run_method(tiny, ids, 30, Method("full"))


# ---- exact where there is nothing to compress ---------------------------------------------------------
@pytest.mark.parametrize("method", EVICT)
def test_budget_at_least_the_sequence_gives_bit_identical_logits(tiny, ids, full, method):
    trace = run_method(tiny, ids, 30, Method(method, budget=len(ids)))
    assert torch.equal(trace.logits, full.logits)
    assert trace.kv_bytes == full.kv_bytes == kv_footprint(tiny.spec, len(ids) - 1, 1, "float32").total


def test_group_size_one_pooling_gives_bit_identical_logits(tiny, ids, full):
    assert torch.equal(run_method(tiny, ids, 30, Method("gqa", kv_heads=2)).logits, full.logits)  # 8/2 → 8/2
    mha = random_backend(DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=4, d_ff=128, vocab_size=4096,
                                       max_seq_len=64), seed=3)
    mha_ids = [i % 4096 for i in ids[:40]]  # the random model's own vocabulary
    ref = run_method(mha, mha_ids, 20, Method("full"))
    assert torch.equal(run_method(mha, mha_ids, 20, Method("gqa", kv_heads=4)).logits, ref.logits)
    pooled = run_method(mha, mha_ids, 20, Method("gqa", kv_heads=2))
    assert not torch.equal(pooled.logits, ref.logits)
    assert pooled.kv_bytes * 2 == ref.kv_bytes == pooled.formula_bytes * 2


def test_compression_changes_the_logits(tiny, ids, full):
    for m in [Method("window", budget=8), Method("int4", residual=0), Method("fp8"), Method("mqa")]:
        assert not torch.equal(run_method(tiny, ids, 30, m).logits, full.logits)


# ---- quantization error within the analytic bound -----------------------------------------------------
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("axis", [-2, -1])
def test_int_error_within_half_a_step(fmt, axis):
    x = torch.randn(2, 3, 64, 32) * torch.linspace(0.01, 20, 32)  # a few outlier channels, as in real keys
    q = quant.quantize_int(x, fmt, 32, axis)
    err = (x - quant.dequantize_int(q)).abs()
    bound = quant.int_error_bound(q)
    assert bool((err <= bound * (1 + 1e-6) + 1e-7).all())
    assert err.max() > bound.max() / 4  # the bound is tight, not vacuous
    levels = {"int8": 127, "int4": 15}[fmt]  # symmetric int8: amax/127; asymmetric int4: (max−min)/15
    # keys: one scale per channel per 32 tokens [2, 3, 2, 32]; values: one per token per 32 channels [2, 3, 64, 1]
    groups = x.view(2, 3, 2, 32, 32) if axis == -2 else x.view(2, 3, 64, 1, 32).transpose(-1, -2)
    spread = groups.abs().amax(3) if fmt == "int8" else groups.amax(3) - groups.amin(3)
    assert q.scale.dtype == torch.float16 and q.scale.shape == spread.shape
    assert torch.allclose(q.scale.float(), spread / levels, rtol=2e-3)


def test_fp8_error_within_three_mantissa_bits():
    x = torch.randn(2, 4, 50, 32) * 3
    scale = quant.fp8_scale(x)
    q = quant.quantize_fp8(x, scale)
    assert q.dtype == torch.float8_e4m3fn and q.element_size() == 1
    err = (x - quant.dequantize_fp8(q, scale)).abs()
    assert bool((err <= quant.fp8_error_bound(x, scale) * (1 + 1e-6)).all())
    assert (err / x.abs().clamp_min(1e-3)).max() > 2**-5  # e4m3 really is that coarse


# ---- measured bytes equal the formula -----------------------------------------------------------------
@pytest.mark.parametrize("method", [Method("window", 12), Method("streaming", 12), Method("h2o", 12),
                                    Method("snapkv", 20), Method("int8"), Method("int4"), Method("fp8"),
                                    Method("int4", group=8, residual=0), Method("mqa"), Method("gqa", kv_heads=1)])
def test_measured_bytes_equal_the_formula(tiny, ids, method):
    trace = run_method(tiny, ids, 30, method)
    assert trace.kv_bytes == trace.formula_bytes > 0


def test_bytes_by_hand(tiny, ids):
    shape = tiny.spec
    assert (shape.n_layers, shape.n_kv_heads, shape.d_head) == (4, 2, 24)  # the shipped model these figures use
    # window: 4 layers · 12 positions · K and V · 2 heads · 24 values · 4 bytes
    assert run_method(tiny, ids, 30, Method("window", 12)).kv_bytes == 4 * 12 * 2 * 2 * 24 * 4
    # SnapKV keeps 20 prompt positions, then every decoded token: 20 + 29 after 29 steps
    assert run_method(tiny, ids, 30, Method("snapkv", 20)).n_cached == 49
    # int4, G=8, R=16, 59 cached tokens: whole groups of 8 are quantized while ≥ R stay, so 40 quantized and
    # 19 in fp32. Per token, layer, KV head, K or V: 12 data bytes + 3 groups · 4 bytes (fp16 scale + zero)
    trace = run_method(tiny, ids, 30, Method("int4", group=8, residual=16))
    assert trace.kv_bytes == 4 * 2 * 2 * (40 * (12 + 3 * 4) + 19 * 24 * 4)
    assert trace.kv_bytes == (kv_footprint(shape, 40, 1, kivi_dtype("int4", 8)).total
                              + kv_footprint(shape, 19, 1, "float32").total)
    # fp8: one byte per value; its two per-layer float32 scales are outside the per-token formula
    fp8 = run_method(tiny, ids, 30, Method("fp8"))
    assert fp8.kv_bytes == kv_footprint(shape, 59, 1, "fp8").total == 59 * 4 * 2 * 2 * 24
    assert fp8.scale_bytes_outside_cache == 4 * 2 * 4


def test_kivi_group_must_divide_d_head():
    with pytest.raises(InputError, match="divide d_head"):
        QuantizedCache(KVSpec(1, 2, 2, 32), 1, torch.float32, torch.device("cpu"), "int4", group=24)


# ---- StreamingLLM re-positions by rotating keys --------------------------------------------------------
def test_rotating_a_key_by_delta_equals_rope_at_the_new_position(tiny):
    cos, sin = rotary_tables(tiny.model.cfg)
    k0 = torch.randn(1, 2, 5, tiny.spec.d_head)
    p = torch.tensor([40, 41, 42, 43, 44])
    rotated = apply_rotary(k0, cos[p], sin[p])
    moved = _native_rotator(tiny.model)(rotated, torch.full((1, 2, 5), -36))
    assert torch.allclose(moved, apply_rotary(k0, cos[p - 36], sin[p - 36]), atol=1e-5)


def test_streaming_keeps_sinks_and_recent(tiny, ids):
    trace = run_method(tiny, ids, 30, Method("streaming", 12, sinks=4), view_step=20)
    kept = trace.view.kept[0][0].tolist()  # layer 0, KV head 0, before this step's eviction
    position = trace.view.position
    assert kept == [0, 1, 2, 3, *range(position - 8, position + 1)]
    h2o = run_method(tiny, ids, 30, Method("h2o", 12), view_step=20).view.kept[0]
    assert h2o.shape == (2, 13) and h2o[0, -6:].tolist() == list(range(position - 5, position + 1))


# ---- the same eviction in the Hugging Face decode loop -------------------------------------------------
@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    cfg = DecoderConfig(n_layers=2, d_model=64, n_heads=8, n_kv_heads=2, d_ff=128, vocab_size=320, max_seq_len=64)
    native = random_backend(cfg, seed=7)
    path = tmp_path_factory.mktemp("hf_twin")
    save_file({k: v.contiguous() for k, v in native.model.state_dict().items()}, path / "model.safetensors",
              metadata={"format": "pt"})
    LlamaConfig(**cfg.to_hf_dict()).save_pretrained(path)
    byte_bpe().save_pretrained(path)
    return native, load_backend(str(path), device="cpu", engine="hf")  # the same weights on transformers


@pytest.mark.parametrize("method", [Method("full"), Method("window", 10), Method("streaming", 10),
                                    Method("h2o", 10), Method("snapkv", 20)])
def test_eviction_runs_the_same_on_the_hf_model(twins, method):
    native, hf = twins
    ids = [5, 17, 200, 3, 99, 42, 7, 8, 250, 31, 64, 12, 77, 19, 3, 4, 100, 101, 150, 9] * 2
    a, b = run_method(native, ids, 24, method), run_method(hf, ids, 24, method)
    assert torch.allclose(a.logits, b.logits, atol=1e-4)
    assert a.kv_bytes == b.kv_bytes == b.formula_bytes


def test_quantization_on_hf_is_a_clear_error(twins):
    with pytest.raises(InputError, match="kvviz's own decoder"):
        run_method(twins[1], list(range(5, 20)), 8, Method("int4"))


# ---- the CLI -------------------------------------------------------------------------------------------
def test_cli_json_fields(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The cache keeps the keys and values of every past token, so a step reads them back. " * 8)
    assert main(["compress", "--method", "h2o", "--budget", "16", "--text", str(text), "--seq-len", "48",
                 "--tokens", "96", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("perplexity", "kl_divergence", "top1_agreement", "kv_bytes", "full_perplexity", "full_kv_bytes"):
        assert isinstance(out[key], (int, float)), key
    assert out["kv_bytes"] == out["formula_bytes"] == 4 * 16 * 2 * 2 * 24 * 4
    assert out["full_kv_bytes"] == 4 * 47 * 2 * 2 * 24 * 4 and out["n_predicted"] == 2 * 24
    assert 0 <= out["top1_agreement"] <= 1 and out["kl_divergence"] >= 0 and out["perplexity"] > 1
    assert main(["compress", "--method", "int8,mqa", "--text", str(text), "--seq-len", "48", "--tokens", "48",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["method"] for r in rows] == ["int8", "mqa"] and rows[1]["kv_bytes"] * 2 == rows[1]["full_kv_bytes"]


@pytest.mark.parametrize("argv, words", [
    (["compress", "--method", "window"], "--budget"),
    (["compress", "--method", "zip", "--budget", "4"], "unknown method"),
    (["compress", "--method", "int4", "--group", "16", "--text", "README.md", "--tokens", "64"], "divide d_head"),
    (["compress", "--method", "window", "--budget", "4", "--text", "/nonexistent.txt"], "no text file"),
])
def test_cli_bad_arguments_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and err.startswith("kvviz: error:")


def test_streaming_on_gpt2_keeps_original_positions(tmp_path):
    """Learned absolute positions live in the hidden state: nothing to re-rotate, so StreamingLLM keeps them."""
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=320, bos_token_id=0,
                        eos_token_id=0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    byte_bpe().save_pretrained(tmp_path)
    hf = load_backend(str(tmp_path), device="cpu")
    ids = list(range(5, 45))
    trace = run_method(hf, ids, 20, Method("streaming", 12), view_step=10)
    assert any("original positions" in n for n in trace.notes)
    assert trace.kv_bytes == trace.formula_bytes == 2 * 12 * 2 * 4 * 16 * 4  # MHA: 4 KV heads of 16
    assert trace.view.kept[0][0].tolist()[:4] == [0, 1, 2, 3]
