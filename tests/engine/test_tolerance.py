"""One rounding tolerance, from the dtype's eps and the values' magnitude, behind every verdict the app shows."""
import math

import pytest
import torch

from kvviz.engine.config import DecoderConfig
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend
from kvviz.engine.tolerance import ROUNDING_ULPS, agreement, eps, magnitude, rounding_tolerance
from kvviz.lessons import causal

SMALL = DecoderConfig(n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=300, max_seq_len=128)


def test_tolerance_is_eps_times_magnitude():
    assert eps(torch.float32) == 2.0**-23 and eps(torch.bfloat16) == 2.0**-7 and eps(torch.float16) == 2.0**-10
    assert rounding_tolerance(torch.float32, 10.0, 256) == pytest.approx(10 * (ROUNDING_ULPS + 16) * 2.0**-23)
    # bfloat16 accumulates in float32: its sums add float32's eps, its results round to bfloat16's
    assert rounding_tolerance(torch.bfloat16, 8.0, 64) == pytest.approx(8 * (ROUNDING_ULPS * 2.0**-7 + 8 * 2.0**-23))
    assert rounding_tolerance(torch.float32, 20.0) == 2 * rounding_tolerance(torch.float32, 10.0)  # scales with |x|
    assert magnitude(torch.tensor([1.0, -3.0]), torch.tensor([2.0])) == 3.0
    a = agreement(0.0625, torch.bfloat16, 10.0, 256)  # the "6.25e-02 exceeds 5e-02": one bf16 ulp at 8..16
    assert a.within and not a.exact and a.tolerance > 0.0625


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("model", ["tiny", "random"])
def test_rounding_stays_within_and_bidirectional_drift_goes_beyond(model, dtype):
    be = load_backend(model, dtype=dtype, device="cpu", shape=SMALL if model == "random" else None)
    n_terms = be.spec.d_model
    for text in causal.PRESETS.values():
        ids = be.tokenizer.encode(text)[: causal.MAX_DEMO_TOKENS]
        result = causal.parallel_vs_sequential(be.model, ids, len(ids) - 4)
        for name, a in result.agreements(be.dtype, n_terms).items():
            # Measured rounding keeps a margin under the tolerance: at most 0.54 of it (the shipped model's float32
            # cached logits against a recomputation, MKL's packed products; 0.35 in bfloat16).
            assert a.diff <= 0.8 * a.tolerance, (name, a)
        drift = causal.past_kv_drift(be.model, ids, causal=True)
        assert all(a.within for a in drift.kv_agreements(be.dtype, n_terms))
        gen = Generation(be, max_new_tokens=4)
        gen.run(text)
        delta, _, _ = gen.cache_vs_recompute()
        assert agreement(delta, be.dtype, magnitude(gen.last_logits), n_terms).within
    if dtype == "float32":  # without the mask, every layer above the first moves far beyond rounding
        bidir = causal.past_kv_drift(be.model, ids, causal=False).kv_agreements(be.dtype, n_terms)
        assert bidir[0].within and all(a.diff > 100 * a.tolerance for a in bidir[1:])
    assert not math.isnan(result.k_magnitude) and result.logits_magnitude > 0
