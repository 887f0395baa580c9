"""The live cache of a real generation measures exactly the formula's bytes for its shape."""

import pytest
import torch

from kvviz.engine.config import DecoderConfig
from kvviz.engine.generation import Generation
from kvviz.engine.loading import random_backend
from kvviz.kv.formula import KVSpec, kv_footprint


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("heads, kv_heads, batch", [(4, 4, 1), (4, 2, 2), (4, 1, 1)])
def test_live_cache_bytes_equal_formula(dtype, heads, kv_heads, batch):
    cfg = DecoderConfig(
        n_layers=2, d_model=64, n_heads=heads, n_kv_heads=kv_heads, d_ff=96, vocab_size=300, max_seq_len=64
    )
    gen = Generation(random_backend(cfg, dtype=dtype), max_new_tokens=5, batch_size=batch)
    shape = KVSpec(cfg.n_layers, heads, kv_heads, cfg.d_head)
    event = gen.prefill("memory")
    for _ in range(3):
        n = event.cache_lengths[0]
        formula = kv_footprint(shape, n, batch, dtype)
        assert event.live_bytes == formula.total == event.formula_bytes
        # the tensors themselves, not only the backend's report
        assert sum(gen.cache.keys(i).nbytes + gen.cache.values(i).nbytes for i in range(2)) == formula.total
        event = gen.step()
    assert event.cache_lengths[0] == len("memory") + 3
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    assert event.allocated_bytes == 2 * batch * 2 * (len("memory") + 5) * kv_heads * cfg.d_head * elem
