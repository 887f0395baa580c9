"""Compressing the cache: exact where nothing is compressed, errors within their bounds, bytes equal to the
shared formula, the same eviction on the native and the Hugging Face decode loop, and the CLI contract."""
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from kvviz.cli import main
from kvviz.compression import quant
from kvviz.compression.caches import EvictingCache, QuantizedCache, kivi_dtype
from kvviz.compression.runner import Method, _native_rotator, run_method
from kvviz.engine.cache import DecodeCache
from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import load_backend, random_backend
from kvviz.engine.model import apply_rotary, rotary_tables
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint
from tests.engine.test_hf_backend import byte_bpe

EVICT = ["window", "streaming", "h2o", "snapkv"]


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


def test_every_decode_cache_keeps_one_contract(tiny):
    """The engine's KVCache and both compressed caches are what Decoder.forward runs with (DecodeCache); the paged
    pool is not one (it is addressed by slots)."""
    from kvviz.engine.paged.kv import PagedKV

    shape, cpu = KVSpec(4, 8, 2, 24), torch.device("cpu")
    caches = [tiny.model.new_cache(1, 16), EvictingCache(shape, 1, torch.float32, cpu),
              QuantizedCache(shape, 1, torch.float32, cpu, "kivi2", group=24, residual=24)]
    x = torch.tensor([[5, 6, 7]])
    for cache in caches:
        assert isinstance(cache, DecodeCache)
        with torch.inference_mode():
            tiny.model(x, cache)
        assert (cache.lengths, cache.length) == ([3] * 4, 3)
    assert not isinstance(PagedKV(4, 2, 16, 2, 24), DecodeCache)


def test_compression_changes_the_logits(tiny, ids, full):
    for m in [Method("window", budget=8), Method("int4", group=8, residual=8), Method("fp8"), Method("mqa")]:
        assert not torch.equal(run_method(tiny, ids, 30, m).logits, full.logits)


# ---- quantization error within the analytic bound -----------------------------------------------------
@pytest.mark.parametrize("fmt", ["int8", "int4", "kivi2"])
@pytest.mark.parametrize("axis", [-2, -1])
def test_int_error_within_half_a_step(fmt, axis):
    x = torch.randn(2, 3, 64, 32) * torch.linspace(0.01, 20, 32)  # a few outlier channels, as in real keys
    q = quant.quantize_int(x, fmt, 32, axis)
    err = (x - quant.dequantize_int(q)).abs()
    bound = quant.int_error_bound(q)
    assert bool((err <= bound * (1 + 1e-6) + 1e-7).all())
    assert err.max() > bound.max() / 4  # the bound is tight, not vacuous
    levels = {"int8": 255, "int4": 15, "kivi2": 3}[fmt]  # KIVI, asymmetric at every width: (max − min)/(2^B − 1)
    # keys: one scale per channel per 32 tokens [2, 3, 2, 32]; values: one per token per 32 channels [2, 3, 64, 1]
    groups = x.view(2, 3, 2, 32, 32) if axis == -2 else x.view(2, 3, 64, 1, 32).transpose(-1, -2)
    spread = groups.amax(3) - groups.amin(3)
    assert q.scale.dtype == torch.float16 and q.scale.shape == spread.shape
    assert torch.allclose(q.scale.float(), spread / levels, rtol=2e-3)
    assert q.zero.dtype == torch.float16 and bool((q.zero.float() <= groups.amin(3)).all())


@pytest.mark.parametrize("fmt,bits", [("int8", 8), ("int4", 4), ("kivi2", 2)])
def test_int_levels_as_kivi_quant_and_pack(fmt, bits):
    """KIVI (arXiv:2402.02750 §3.1; jy-yuan/KIVI quant/new_pack.py quant_and_pack_vcache): per group
    mn = min, scale = (max − mn)/(2^B − 1), levels round((x − mn)/scale) in 0..2^B − 1, at every bit width. The
    group's range is chosen so that scale is a power of two (exact in fp16, where kvviz rounds it outwards)."""
    scale = {8: 2.0**-5, 4: 0.5, 2: 2.0}[bits]
    g = torch.tensor([[-3.0, -1.0, 0.53, 2.0, -3.0 + scale * (2**bits - 1), 1.27, -2.49, 0.9]])  # one group of 8
    q = quant.quantize_int(g, fmt, 8, -1)
    mn, mx = g.min(-1, keepdim=True).values, g.max(-1, keepdim=True).values
    kivi = torch.round((g - mn) / ((mx - mn) / (2**bits - 1))).clamp(0, 2**bits - 1)
    assert q.zero.float().item() == -3.0 and q.scale.float().item() == scale
    # value i of each run of 8/B sits in bits [i·B, (i + 1)·B) of its byte (int4: low nibble first)
    ours = torch.stack([(q.data >> (bits * i)) & (2**bits - 1) for i in range(8 // bits)], -1).reshape(g.shape)
    assert torch.equal(ours.float(), kivi)
    assert ours.min() == 0 and ours.max() == 2**bits - 1  # the whole unsigned range, from the minimum up
    assert q.data.dtype == torch.uint8 and q.nbytes == {"int8": 8, "int4": 4, "kivi2": 2}[fmt] + 2 + 2  # + scale, min


def test_fp8_error_within_three_mantissa_bits():
    x = torch.randn(2, 4, 50, 32) * 3
    scale, _ = quant.fp8_scales(x, x, "calculate")
    q = quant.quantize_fp8(x, scale)
    assert q.dtype == torch.float8_e4m3fn and q.element_size() == 1
    err = (x - quant.dequantize_fp8(q, scale)).abs()
    assert bool((err <= quant.fp8_error_bound(x, scale) * (1 + 1e-6)).all())
    assert (err / x.abs().clamp_min(1e-3)).max() > 2**-5  # e4m3 really is that coarse


# ---- measured bytes equal the formula -----------------------------------------------------------------
@pytest.mark.parametrize("method", [Method("window", 12), Method("streaming", 12), Method("h2o", 12),
                                    Method("snapkv", 40), Method("int8"), Method("int4"), Method("fp8"),
                                    Method("kivi2"), Method("kivi2", group=8, residual=16),
                                    Method("int4", group=8, residual=8), Method("fp8", kv_scale="calculate"),
                                    Method("mqa"), Method("gqa", kv_heads=1)])
def test_measured_bytes_equal_the_formula(tiny, ids, method):
    trace = run_method(tiny, ids, 30, method)
    assert trace.kv_bytes == trace.formula_bytes > 0


def test_bytes_by_hand(tiny, ids):
    shape = tiny.spec
    assert (shape.n_layers, shape.n_kv_heads, shape.d_head) == (4, 2, 24)  # the shipped model these figures use
    # window: 4 layers · 12 positions · K and V · 2 heads · 24 values · 4 bytes
    assert run_method(tiny, ids, 30, Method("window", 12)).kv_bytes == 4 * 12 * 2 * 2 * 24 * 4
    # SnapKV keeps 40 of a 50-token prompt, then every decoded token: 40 + 9 after 9 steps
    assert run_method(tiny, ids, 50, Method("snapkv", 40)).n_cached == 49
    # int4, G=8, R=16, 59 cached tokens, KIVI's rule: keys quantized 16 at a time (48 quantized, 59 mod 16 = 11 in
    # fp32), values one at a time past the last 16 (43 quantized, 16 in fp32). Per token, layer, KV head, K or V:
    # 12 data bytes + 3 groups · 4 bytes (fp16 scale + zero), or 24 · 4 bytes in fp32
    trace = run_method(tiny, ids, 30, Method("int4", group=8, residual=16))
    assert trace.kv_bytes == 4 * 2 * ((48 + 43) * (12 + 3 * 4) + (11 + 16) * 24 * 4)
    assert 2 * trace.kv_bytes == (kv_footprint(shape, 48 + 43, 1, kivi_dtype("int4", 8)).total
                                  + kv_footprint(shape, 11 + 16, 1, "float32").total)
    # fp8: one byte per value; its two per-layer float32 scales are outside the per-token formula
    fp8 = run_method(tiny, ids, 30, Method("fp8"))
    assert fp8.kv_bytes == kv_footprint(shape, 59, 1, "fp8").total == 59 * 4 * 2 * 2 * 24
    assert fp8.scale_bytes_outside_cache == 4 * 2 * 4


def test_kivi_group_must_divide_d_head():
    with pytest.raises(InputError, match="divide d_head"):
        QuantizedCache(KVSpec(1, 2, 2, 32), 1, torch.float32, torch.device("cpu"), "int4", group=24)
    with pytest.raises(InputError, match="multiple of the group size"):  # KIVI: assert R % G == 0
        QuantizedCache(KVSpec(1, 2, 2, 32), 1, torch.float32, torch.device("cpu"), "int4", group=16, residual=24)


# ---- KIVI's residual, as jy-yuan/KIVI models/llama_kivi.py keeps it ----------------------------------------
@pytest.mark.parametrize("fmt", ["int8", "int4", "kivi2"])
def test_kivi_keeps_n_mod_r_keys_and_the_last_r_values(fmt):
    """KIVI quantizes keys R tokens at a time (the prefill's first n − n mod R at once) and values one token per
    step past the last R; main kept one shared residual of R..R+G−1 tokens for both."""
    g, r = 8, 24
    cache = QuantizedCache(KVSpec(1, 2, 2, 16), 1, torch.float32, torch.device("cpu"), fmt, group=g, residual=r)
    gen = torch.Generator().manual_seed(0)

    def kv(t: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(1, 2, t, 16, generator=gen), torch.randn(1, 2, t, 16, generator=gen)

    cache.append(0, *kv(53))  # prefill: 48 keys quantized, 5 kept; 29 values quantized, 24 kept
    for n in range(53, 130):
        assert cache.k_res[0].shape[2] == n % r and cache.n_k_quantized[0] == n - n % r
        assert cache.v_res[0].shape[2] == r and cache.n_v_quantized[0] == n - r
        cache.append(0, *kv(1))
    assert cache.formula_bytes() == cache.kv_bytes()


def test_kivi_bytes_on_the_shipped_model():
    """The issue's numbers: 255 cached tokens at int4, R = 48, G = 24 on the shipped model take 105,600 bytes under
    KIVI's rule (main kept 145,920: more full-precision tokens than KIVI keeps, so less error than KIVI has)."""
    shape = KVSpec(4, 8, 2, 24)
    cache = QuantizedCache(shape, 1, torch.float32, torch.device("cpu"), "int4", group=24, residual=48)
    gen = torch.Generator().manual_seed(1)
    for t in [128] + [1] * 127:  # a 128-token prompt, then 127 decode steps: 255 cached
        for layer in range(4):
            cache.append(layer, torch.randn(1, 2, t, 24, generator=gen), torch.randn(1, 2, t, 24, generator=gen))
    assert cache.length == 255 and cache.n_k_quantized == [240] * 4 and cache.n_v_quantized == [207] * 4
    assert cache.kv_bytes() == cache.formula_bytes() == 105_600
    # keys 240 quantized + 15 fp32, values 207 + 48: (240 + 207)·(12 + 4) + (15 + 48)·96 bytes per head and layer
    assert 105_600 == 4 * 2 * ((240 + 207) * 16 + (15 + 48) * 96)


# ---- FP8 scales as vLLM sets them ----------------------------------------------------------------------
def test_fp8_scales_are_vllms():
    """vLLM: k_scale = v_scale = 1.0 without checkpoint scales (set_default_quant_scales); with
    --calculate-kv-scales, |K|max/200 and |V|max/100 from the first forward (Attention.calc_kv_scales, envs
    K_SCALE_CONSTANT / V_SCALE_CONSTANT). Main divided by amax/448 and clipped any later value above the prefill's."""
    shape = KVSpec(1, 2, 2, 16)
    k, v = torch.randn(1, 2, 20, 16) * 3, torch.randn(1, 2, 20, 16)
    default = QuantizedCache(shape, 1, torch.float32, torch.device("cpu"), "fp8")
    calc = QuantizedCache(shape, 1, torch.float32, torch.device("cpu"), "fp8", kv_scale="calculate")
    for cache in (default, calc):
        cache.append(0, k, v)
    assert default.k_scale[0].item() == default.v_scale[0].item() == 1.0
    assert calc.k_scale[0].item() == pytest.approx(k.abs().max().item() / 200, rel=1e-6)
    assert calc.v_scale[0].item() == pytest.approx(v.abs().max().item() / 100, rel=1e-6)
    # headroom: a later key twice the first pass's largest still fits (2·200 < 448); five times does not
    later = torch.zeros(1, 2, 1, 16)
    later[..., 0] = 2 * k.abs().max()
    calc.append(0, later, torch.zeros_like(later))
    assert calc.clipped == 0
    calc.append(0, later * 2.5, torch.zeros_like(later))
    assert calc.clipped == 2  # one value per KV head
    with pytest.raises(InputError, match="fp8 scale"):
        QuantizedCache(shape, 1, torch.float32, torch.device("cpu"), "fp8", kv_scale="amax")


def test_savings_count_against_the_deployment_dtype(tiny):
    """fp8 halves a bfloat16 cache; main divided by the float32 run and showed 75%."""
    from kvviz.compression.quality import evaluate

    text = "def keys(self):\n    Return a view of the cached keys and values of every past position.\n" * 12
    rows = evaluate(tiny, [Method("full"), Method("fp8"), Method("int4"), Method("window", 16)], text, seq_len=64,
                    n_tokens=64)
    full, fp8, int4, window = rows
    assert fp8.memory_saved == fp8.saved("bfloat16") == 0.5 and fp8.saved("float32") == 0.75
    assert window.saved("bfloat16") == window.saved("float32") == 1 - 16 / 63  # eviction: dtype-free
    # int4 (KIVI, G = 24, R = 48) after 63 tokens: keys 48 quantized + 15 full, values 15 + 48; the full-precision
    # ones stored as bfloat16 in a bfloat16 deployment
    spec = tiny.spec
    quantized = kv_footprint(spec, 48 + 15, 1, kivi_dtype("int4", 24)).total // 2
    bf16 = kv_footprint(spec, 15 + 48, 1, "bfloat16").total // 2
    assert int4.bytes_at["bfloat16"] == quantized + bf16
    assert int4.saved("bfloat16") == 1 - (quantized + bf16) / kv_footprint(spec, 63, 1, "bfloat16").total
    assert full.bytes_at["float32"] == full.kv_bytes == kv_footprint(spec, 63, 1, "float32").total


# ---- SnapKV as its reference code selects ----------------------------------------------------------------
def snapkv_reference(probs: torch.Tensor, n_kv_heads: int, budget: int, window: int, kernel: int) -> torch.Tensor:
    """FasterDecoding/SnapKV snapkv_utils.py SnapKVCluster.update_kv, on the prefill's attention [1, H, n, n]:
    the last `window` queries' attention summed, avg_pool1d with torch's defaults (count_include_pad=True),
    top budget − window positions, then the window; GQA votes summed per KV head (kvpress averages: same order)."""
    n = probs.shape[-1]
    vote = probs[:, :, -window:, : n - window].sum(2)
    vote = vote.view(1, n_kv_heads, -1, n - window).sum(2)
    pooled = torch.nn.functional.avg_pool1d(vote, kernel_size=kernel, padding=kernel // 2, stride=1)
    top = pooled.topk(budget - window, dim=-1).indices.sort(-1).values
    return torch.cat([top, torch.arange(n - window, n).expand(1, n_kv_heads, window)], dim=2)


def test_snapkv_selects_as_its_reference_code(tiny, ids):
    """Window 32 (init_snapkv's default; main cited 16) and pooling that counts the zero padding (torch's default,
    which SnapKV and kvpress use; main excluded it)."""
    from kvviz.compression.eviction import SNAPKV_KERNEL, SNAPKV_WINDOW

    assert (SNAPKV_WINDOW, SNAPKV_KERNEL) == (32, 5)
    long_ids = (ids * 3)[:100]
    n_prompt, budget = 80, 40
    model = tiny.model
    with torch.inference_mode():
        out = model(torch.tensor([long_ids[:n_prompt]]), model.new_cache(1, n_prompt), capture_attention=True)
    trace = run_method(tiny, long_ids, n_prompt, Method("snapkv", budget), view_steps=(1,))
    for layer in range(tiny.spec.n_layers):
        want = snapkv_reference(out.attentions[layer].float(), tiny.spec.n_kv_heads, budget, SNAPKV_WINDOW,
                                SNAPKV_KERNEL)[0]
        kept = torch.from_numpy(trace.views[1].kept[layer])[:, :-1]  # the decode step's own token is last
        assert torch.equal(kept, want), layer


def test_snapkv_leaves_a_prompt_within_its_budget_whole(tiny):
    """SnapKV compresses only a prompt longer than its budget (update_kv returns early): the page said "snapkv
    (128)" beside window (128) without saying it kept every position."""
    from kvviz.compression.quality import evaluate

    text = "The cache keeps the keys and values of every past token, so each step reads them back. " * 20
    rows = evaluate(tiny, [Method("full"), Method("snapkv", 64), Method("window", 64), Method("snapkv", 40)], text,
                    seq_len=128, n_tokens=128)
    _, snap, window, snap40 = rows
    assert snap.left_whole and snap.evicted == 0 and snap.n_cached == 127 and snap.memory_saved == 0
    assert not window.left_whole and window.n_cached == 64
    assert not snap40.left_whole and snap40.n_cached == 40 + 63  # 40 prompt positions, then every decoded token


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
                                    Method("h2o", 10), Method("snapkv", 40)])
def test_eviction_runs_the_same_on_the_hf_model(twins, method):
    native, hf = twins
    ids = [5, 17, 200, 3, 99, 42, 7, 8, 250, 31, 64, 12, 77, 19, 3, 4, 100, 101, 150, 9] * 3
    a, b = run_method(native, ids, 48, method), run_method(hf, ids, 48, method)  # SnapKV: 48 prompt → 40
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
    (out,) = json.loads(capsys.readouterr().out)["results"]  # one shape, one method or several
    for key in ("perplexity", "kl_divergence", "top1_agreement", "kv_bytes", "full_perplexity", "full_kv_bytes"):
        assert isinstance(out[key], (int, float)), key
    assert out["kv_bytes"] == out["formula_bytes"] == 4 * 16 * 2 * 2 * 24 * 4
    assert out["full_kv_bytes"] == 4 * 47 * 2 * 2 * 24 * 4 and out["n_predicted"] == 2 * 24
    assert 0 <= out["top1_agreement"] <= 1 and out["kl_divergence"] >= 0 and out["perplexity"] > 1
    assert main(["compress", "--method", "int8,mqa", "--text", str(text), "--seq-len", "48", "--tokens", "48",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["method"] for r in rows] == ["int8", "mqa"] and rows[1]["kv_bytes"] * 2 == rows[1]["full_kv_bytes"]


def test_cli_reports_the_lengths_that_ran(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The cache keeps the keys and values of every past token, so a step reads them back. " * 30)
    assert main(["compress", "--method", "window", "--budget", "16", "--text", str(text), "--seq-len", "64",
                 "--tokens", "150", "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)["results"]
    # whole chunks within --tokens: 2 of 64 (main ran 3, 192 tokens, past the 150 asked for)
    assert (out["seq_len"], out["n_prompt"], out["n_chunks"], out["n_predicted"]) == (64, 32, 2, 64)
    assert out["full_n_cached"] == 63 and out["kv_dtype"] == "bfloat16"


@pytest.mark.parametrize("argv, words", [
    (["compress", "--method", "window", "--budget", "8", "--seq-len", "5000"], "context of 2048 tokens"),
    (["compress", "--method", "window", "--budget", "8", "--seq-len", "256", "--tokens", "100"],
     "less than one chunk"),
    (["compress", "--method", "window", "--budget", "8", "--seq-len", "1"], "at least 2 tokens"),
    (["compress", "--method", "int4", "--group", "24", "--residual", "32", "--tokens", "64", "--seq-len", "64"],
     "multiple of the group size"),
    (["compress", "--method", "window"], "--budget"),
    (["compress", "--method", "zip", "--budget", "4"], "unknown method"),
    (["compress", "--method", "int4", "--group", "16", "--text", "README.md", "--tokens", "64", "--seq-len", "64"],
     "divide d_head"),
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
    hf = load_backend(str(tmp_path), device="cpu", engine="hf")
    ids = list(range(5, 45))
    trace = run_method(hf, ids, 20, Method("streaming", 12), view_step=10)
    assert any("original positions" in n for n in trace.notes)
    assert trace.kv_bytes == trace.formula_bytes == 2 * 12 * 2 * 4 * 16 * 4  # MHA: 4 KV heads of 16
    assert trace.view.kept[0][0].tolist()[:4] == [0, 1, 2, 3]


def test_export_gguf_paths_are_checked(tmp_path, capsys):
    """A directory is not "a file", and a missing directory is not created silently."""
    assert main(["export-gguf", "--out", str(tmp_path)]) == 2
    assert "is a directory: give the .gguf file" in capsys.readouterr().err
    missing = tmp_path / "no" / "such" / "x.gguf"
    assert main(["export-gguf", "--out", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "\n" not in err.strip()
    assert not (tmp_path / "no").exists()


def test_sink_values_pair_window_and_streaming_at_each_budget():
    from kvviz.compression.quality import SINK_TOLERANCE, Quality, sink_values

    def row(method: str, budget: int | None, ppl: float) -> Quality:
        return Quality(method, method, ppl, 0.0, 1.0, 0, 0, 0, 10.0, 0, 0, 1, budget=budget)

    rows = [row("window", 64, 30.0), row("streaming", 64, 10.0), row("window", 32, 10.0),
            row("streaming", 32, 10.0 * (1 + SINK_TOLERANCE / 2)), row("streaming", 16, 5.0), row("int8", None, 9.0)]
    values = sink_values(rows)
    assert [(v.budget, v.ratio, v.verdict) for v in values] == [
        (32, pytest.approx(1 / (1 + SINK_TOLERANCE / 2)), "same"), (64, 3.0, "helps")]
    assert sink_values([row("window", 8, 10.0), row("streaming", 8, 20.0)])[0].verdict == "hurts"
