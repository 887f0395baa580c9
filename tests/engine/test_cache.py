"""Exact bytes: the live cache equals the formula; the allocation equals the preallocated size."""
import pytest
import torch

from kvviz.engine.cache import KVCache
from kvviz.engine.config import DecoderConfig
from kvviz.engine.model import Decoder
from kvviz.engine.shape import native_spec
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.units import format_binary
from tests.kv.kvref import textbook_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layers, heads, kv_heads, batch", [(1, 4, 4, 1), (3, 8, 2, 2), (2, 4, 1, 3)])
def test_live_bytes_equal_formula(dtype, layers, heads, kv_heads, batch):
    cfg = DecoderConfig(n_layers=layers, d_model=64, n_heads=heads, n_kv_heads=kv_heads, d_ff=96, vocab_size=300,
                        max_seq_len=40)
    model = Decoder(cfg).init_weights(1).to(dtype).eval()
    cache = model.new_cache(batch, 40)
    elem = torch.empty((), dtype=dtype).element_size()
    with torch.no_grad():
        model(torch.randint(0, 300, (batch, 5)), cache)
        for n in range(6, 12):
            model(torch.randint(0, 300, (batch, 1)), cache)
            formula = kv_footprint(native_spec(cfg), n, batch, str(dtype)).total
            assert cache.live_bytes() == formula == textbook_bytes(batch, layers, n, kv_heads, cfg.d_head, elem)
    assert cache.allocated_bytes() == textbook_bytes(batch, layers, 40, kv_heads, cfg.d_head, elem)
    assert cache.allocated_bytes() == sum(t.numel() * elem for t in cache.k + cache.v)


def test_cache_append_and_reset():
    cache = KVCache(2, 1, 2, 4, 8)
    k = torch.randn(1, 2, 3, 8)
    keys, values = cache.append(0, k, -k)
    assert torch.equal(keys, k) and torch.equal(values, -k)
    assert cache.lengths == [3, 0]
    with pytest.raises(InputError, match="full"):
        cache.append(0, k, k)
    cache.reset()
    assert cache.lengths == [0, 0] and cache.live_bytes() == 0


def test_seed_example_figures():
    m = kv_footprint(KVSpec(n_layers=32, n_heads=32, n_kv_heads=32, d_head=128), 4096, 32, "bfloat16")
    assert m.per_token_per_layer == 16 * 1024
    assert m.per_token == 512 * 1024
    assert m.per_request == 2 * 1024**3
    assert m.total == 64 * 1024**3
    assert textbook_bytes(32, 32, 4096, 8, 128, 2) == 16 * 1024**3
    assert format_binary(m.total) == "64.00 GiB"


@pytest.mark.parametrize("bad", [dict(batch=0), dict(n_layers=-1), dict(n_tokens=-5), dict(d_head=0)])
def test_formula_rejects_bad_sizes(bad):
    args = dict(batch=1, n_layers=2, n_tokens=3, n_kv_heads=2, d_head=8) | bad
    with pytest.raises(InputError):
        spec = KVSpec(n_layers=args["n_layers"], n_heads=2, n_kv_heads=args["n_kv_heads"], d_head=args["d_head"])
        kv_footprint(spec, args["n_tokens"], args["batch"], "bfloat16")
