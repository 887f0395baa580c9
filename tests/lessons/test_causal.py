"""Causal decoding never changes past K/V: one masked parallel pass equals prefill + decode; no mask breaks it."""
import pytest
import torch

from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import random_backend
from kvviz.errors import InputError
from kvviz.lessons import causal

SHAPE = DecoderConfig(n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=300, max_seq_len=64)
TEXT = "Past keys and values never change."


@pytest.fixture(scope="module")
def backend():
    return random_backend(SHAPE, seed=1)


@pytest.fixture(scope="module")
def ids(backend):
    return backend.tokenizer.encode(TEXT)


def test_parallel_pass_equals_prefill_plus_decode(backend, ids):
    r = causal.parallel_vs_sequential(backend.model, ids, n_prompt=5)
    assert len(r.k_max_diff) == len(r.v_max_diff) == SHAPE.n_layers
    assert len(r.logits_max_diff) == len(ids)
    assert max(r.k_max_diff + r.v_max_diff) < 1e-5
    assert max(r.logits_max_diff) < 1e-4
    assert r.parallel_argmax == r.sequential_argmax


def test_sequential_really_runs_one_token_per_step(backend, ids):
    # Against a different model the comparison must fail: the check can detect a difference.
    other = random_backend(SHAPE, seed=2)
    par = causal.run_parallel(backend.model, ids)
    seq = causal.run_sequential(other.model, ids, n_prompt=3)
    assert float((par.logits - seq.logits).abs().max()) > 1e-3


def test_causal_past_kv_do_not_move(backend, ids):
    d = causal.past_kv_drift(backend.model, ids, causal=True)
    assert d.n_past == len(ids) - 1
    # Only rounding: a pass over n − 1 rows may block its matrix products differently from one over n.
    assert d.k_max_diff[0] == 0.0 and d.v_max_diff[0] == 0.0
    assert max(d.k_max_diff + d.v_max_diff) < 1e-6
    assert d.logits_max_diff < 1e-5


def test_bidirectional_past_kv_change_above_layer_one(backend, ids):
    d = causal.past_kv_drift(backend.model, ids, causal=False)
    # Layer 1 projects each token's own embedding: exactly unchanged; every layer above mixes in the new token.
    assert d.k_max_diff[0] == 0.0 and d.v_max_diff[0] == 0.0
    for layer in range(1, SHAPE.n_layers):
        assert d.k_max_diff[layer] > 1e-3 * d.k_scale[layer], layer
        assert d.v_max_diff[layer] > 1e-4, layer
    assert d.logits_max_diff > 1e-4


def test_decode_computes_the_last_row_of_the_attention_matrix(backend, ids):
    rows = causal.attention_rows(backend.model, ids, layer=SHAPE.n_layers - 1)
    n = len(ids)
    assert rows.full.shape == (SHAPE.n_heads, n, n)
    assert rows.decode_row.shape == (SHAPE.n_heads, n)
    assert rows.row_max_diff < 1e-6
    # Causal: nothing above the diagonal, each row a distribution.
    assert float(rows.full.triu(1).abs().max()) == 0.0
    assert torch.allclose(rows.full.sum(-1), torch.ones(SHAPE.n_heads, n), atol=1e-5)


def test_mask_is_lower_triangular():
    m = causal.causal_mask(4)
    assert m.tolist() == [[True, False, False, False], [True, True, False, False],
                          [True, True, True, False], [True, True, True, True]]


def test_bad_inputs_raise_input_errors(backend, ids):
    with pytest.raises(InputError, match="at least 2"):
        causal.past_kv_drift(backend.model, ids[:1], causal=True)
    with pytest.raises(InputError, match="prefill length"):
        causal.parallel_vs_sequential(backend.model, ids, n_prompt=len(ids))
    with pytest.raises(InputError, match="layer 9"):
        causal.attention_rows(backend.model, ids, layer=9)


def test_presets_fit_the_demo():
    for text in causal.PRESETS.values():
        assert 2 <= len(text.encode("utf-8")) <= causal.MAX_DEMO_TOKENS
