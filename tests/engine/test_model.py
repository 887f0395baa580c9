"""The decoder's claims, in numbers: cached decode == recomputation, step K/V == parallel K/V, HF parity."""
import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from kvviz.engine.config import DecoderConfig
from kvviz.engine.kernels import f32 as f32_kernel
from kvviz.engine.model import Decoder, PackedWeight, linear, prepack
from kvviz.engine.timing import torch_threads
from kvviz.engine.tolerance import agreement, magnitude
from kvviz.errors import InputError

SHAPES = {
    "MHA": dict(n_heads=4, n_kv_heads=4),
    "GQA": dict(n_heads=8, n_kv_heads=2),
    "MQA": dict(n_heads=4, n_kv_heads=1),
}


def make(kind: str, n_layers: int, **extra) -> Decoder:
    cfg = DecoderConfig(n_layers=n_layers, d_model=64, d_ff=128, vocab_size=300, max_seq_len=64, **SHAPES[kind],
                        **extra)
    return Decoder(cfg).init_weights(seed=n_layers).eval()


@pytest.mark.parametrize("kind", SHAPES)
@pytest.mark.parametrize("n_layers", [1, 2, 4])
@pytest.mark.parametrize("fused", [False, True])
def test_cached_decode_equals_recomputation(kind, n_layers, fused):
    model = make(kind, n_layers)
    if fused:
        model.fuse()
    seq = torch.randint(0, 300, (1, 6))
    cache = model.new_cache(1, 64)
    with torch.no_grad():
        logits = model(seq, cache).logits[:, -1]
        for _ in range(12):
            full = model(seq).logits[:, -1]  # no cache: the whole prefix again
            assert (logits - full).abs().max().item() <= 1e-4
            nxt = logits.argmax(-1, keepdim=True)
            assert torch.equal(nxt, full.argmax(-1, keepdim=True))
            seq = torch.cat([seq, nxt], dim=1)
            logits = model(nxt, cache).logits[:, -1]
    assert cache.length == seq.shape[1]


def test_bfloat16_cached_decode_close_to_recomputation():
    model = make("GQA", 2).to(torch.bfloat16).fuse()
    seq = torch.randint(0, 300, (1, 8))
    cache = model.new_cache(1, 64)
    with torch.no_grad():
        logits = model(seq, cache).logits[:, -1].float()
        for _ in range(8):
            full = model(seq).logits[:, -1].float()
            # bf16 has an 8-bit mantissa: the two orders of summation differ by a few ulps of ~1.
            assert (logits - full).abs().max().item() <= 5e-2
            nxt = full.argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
            logits = model(nxt, cache).logits[:, -1].float()


@pytest.mark.parametrize("kind", SHAPES)
def test_step_kv_equals_parallel_prefill_kv(kind):
    model = make(kind, 3)
    seq = torch.randint(0, 300, (2, 10))
    parallel, stepped = model.new_cache(2, 16), model.new_cache(2, 16)
    with torch.no_grad():
        model(seq, parallel)
        model(seq[:, :4], stepped)
        for i in range(4, 10):
            model(seq[:, i : i + 1], stepped)
    for layer in range(3):
        assert torch.allclose(parallel.keys(layer), stepped.keys(layer), atol=1e-5)
        assert torch.allclose(parallel.values(layer), stepped.values(layer), atol=1e-5)
        assert parallel.keys(layer).shape == (2, model.cfg.n_kv_heads, 10, model.cfg.d_head)


def test_attention_capture_matches_fast_path_and_rows_sum_to_one():
    model = make("GQA", 2).fuse()
    seq = torch.randint(0, 300, (1, 9))
    with torch.no_grad():
        fast = model(seq).logits
        captured = model(seq, capture_attention=True)
    assert (fast - captured.logits).abs().max().item() <= 1e-5
    for probs in captured.attentions:
        assert probs.shape == (1, 8, 9, 9)
        assert torch.allclose(probs.sum(-1), torch.ones(1, 8, 9), atol=1e-5)
        assert probs.triu(diagonal=1).abs().max().item() == 0.0  # causal: no weight on the future


def test_parity_with_transformers_llama_gqa():
    cfg = DecoderConfig(n_layers=3, d_model=64, n_heads=8, n_kv_heads=2, d_ff=160, vocab_size=300, max_seq_len=64)
    ours = Decoder(cfg).init_weights(seed=7).eval()
    hf_cfg = LlamaConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k != "architectures"})
    hf = LlamaForCausalLM(hf_cfg).eval()
    result = hf.load_state_dict(ours.state_dict(), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    seq = torch.randint(0, 300, (1, 12))
    cache = ours.new_cache(1, 64)
    with torch.no_grad():
        hf_out = hf(seq, use_cache=True)
        our_logits = ours(seq, cache).logits
        assert (our_logits - hf_out.logits).abs().max().item() <= 1e-4
        pkv = hf_out.cache
        for layer in range(3):
            hf_k, hf_v = pkv.layers[layer].keys, pkv.layers[layer].values
            assert (cache.keys(layer) - hf_k).abs().max().item() <= 1e-5
            assert (cache.values(layer) - hf_v).abs().max().item() <= 1e-5
        nxt = our_logits[:, -1:].argmax(-1)
        hf_step = hf(nxt, cache=pkv, use_cache=True).logits
        our_step = ours(nxt, cache).logits
        assert (our_step - hf_step).abs().max().item() <= 1e-4


def test_hf_weights_load_into_ours():
    cfg = DecoderConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=260, max_seq_len=32)
    hf = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k != "architectures"})).eval()
    ours = Decoder(DecoderConfig.from_hf_dict(hf.config.to_dict()))
    ours.load_state_dict(hf.state_dict(), strict=True)
    seq = torch.randint(0, 260, (1, 7))
    with torch.no_grad():
        assert (ours.eval()(seq).logits - hf(seq).logits).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(96, 64), (64, 96)])
@pytest.mark.parametrize("threads", [1, 2])
def test_torchs_prepacked_matrix_gives_f_linear_to_rounding(monkeypatch, dtype, n, k, threads):
    """Where kvviz's float32 kernel is not built (tests/engine/test_f32_kernel.py for where it is) the step's matrices
    are packed once for torch's kernels (prepack, given in two parts as fused Q/K/V is given in three) and multiplied
    there: float32 matrices with more outputs than inputs by MKL's packed sgemm when packed on one thread, the others
    by oneDNN. The products of F.linear on the whole matrix, to the rounding of another summation order, for one row
    (decode, the packed layout) and many (for MKL, the parts' own products)."""
    monkeypatch.setattr(f32_kernel, "_library", lambda: (None, "not built in this test"))
    gen = torch.Generator().manual_seed(0)
    w, bias = torch.randn(n, k, generator=gen).to(dtype), torch.randn(n, generator=gen).to(dtype)
    with torch_threads(threads):
        packed = prepack(w[: n // 3], w[n // 3:])
    # bfloat16 is prepacked only where oneDNN runs it natively (AVX-512 BF16 or AMX; not on an AVX2-only CPU)
    packs = torch.backends.mkldnn.is_available() and (
        dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert isinstance(packed, PackedWeight) == packs
    if packs:
        mkl = dtype == torch.float32 and n > k and threads == 1 and torch.backends.mkl.is_available()
        assert packed.kernel == ("mkl" if mkl else "onednn") and packed.shape == (n, k) and packed.w.is_mkldnn
        assert all(p.data_ptr() == w.data_ptr() + i * (n // 3) * k * w.element_size()  # the parts, not a copy
                   for i, p in enumerate(packed.parts))
    for rows in (1, 7):
        x = torch.randn(1, rows, k, generator=gen).to(dtype)
        ours, ref = linear(x, packed, bias), F.linear(x, w, bias)
        assert ours.shape == ref.shape == (1, rows, n) and ours.dtype == dtype
        verdict = agreement((ours.float() - ref.float()).abs().max(), dtype, magnitude(ours.float(), ref.float()), k)
        assert verdict.within, verdict


def test_deepcopy_of_a_fused_model_is_the_same_model_unfused():
    """oneDNN's packed matrices have no storage to copy: a deep copy carries the parameters, unfused, and gives
    the original's logits bit for bit once fused again."""
    model = make("GQA", 2).fuse()
    twin = copy.deepcopy(model)
    assert twin.model.layers[0].self_attn.qkv_weight is None and twin.head_weight is None
    seq = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(twin.fuse()(seq).logits, model(seq).logits)


def test_fused_weights_dropped_on_dtype_move():
    model = make("GQA", 1).fuse()
    assert model.model.layers[0].self_attn.qkv_weight is not None
    model.to(torch.bfloat16)
    assert model.model.layers[0].self_attn.qkv_weight is None


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(n_heads=8, n_kv_heads=3), "not_divisible"),
        (dict(n_layers=0), "positive_int"),
        (dict(d_model=100, n_heads=8), "d_model_heads"),
        (dict(d_head=7), "d_head_even"),
    ],
)
def test_config_validation(kwargs, key):
    with pytest.raises(InputError) as err:
        DecoderConfig(**kwargs)
    assert err.value.key == key
    assert "\n" not in str(err.value)


def test_sequence_past_context_is_an_error():
    model = make("GQA", 1)
    with pytest.raises(InputError, match="exceeds the model's context"):
        model(torch.zeros(1, 65, dtype=torch.long))
