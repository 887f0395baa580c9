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


def test_demo_ids_are_the_texts_tokens_cut_to_the_demo(backend):
    assert causal.demo_ids(backend.tokenizer, TEXT) == backend.tokenizer.encode(TEXT)
    long = " ".join([TEXT] * 20)
    assert causal.demo_ids(backend.tokenizer, long) == backend.tokenizer.encode(long)[: causal.MAX_DEMO_TOKENS]
    with pytest.raises(InputError, match="at least 2") as err:
        causal.demo_ids(backend.tokenizer, "a")
    assert err.value.params["n_tokens"] == len(backend.tokenizer.encode("a"))


def test_the_verdicts_the_training_page_states(backend, ids):
    n_prompt = 5
    par = causal.run_parallel(backend.model, ids)
    same = causal.compare_passes(par, causal.run_sequential(backend.model, ids, n_prompt), n_prompt)
    assert same.same_argmax == len(ids)
    tol = same.agreements(torch.float32, SHAPE.d_model)["logits"].tolerance
    note = same.logits_note(tol)
    assert note["note"] == "within" and note["n_prefill"] == n_prompt
    assert note["n_exact"] == sum(d == 0 for d in same.logits_max_diff[:n_prompt])
    assert note["prefill_max"] == max(same.logits_max_diff[:n_prompt])
    assert note["decode_max"] == max(same.logits_max_diff[n_prompt:])
    # Against another model's sequential pass the logits differ far beyond rounding, and the note says so.
    other = causal.run_sequential(random_backend(SHAPE, seed=2).model, ids, n_prompt)
    apart = causal.compare_passes(par, other, n_prompt)
    assert apart.logits_note(tol)["note"] == "beyond" and apart.same_argmax < len(ids)


def test_drift_verdicts_with_and_without_the_mask(backend, ids):
    kept, moved = (causal.past_kv_drift(backend.model, ids, causal=c) for c in (True, False))
    for d in (kept, moved):
        assert d.max_change(0, 1) == max(d.k_max_diff[0], d.v_max_diff[0]) == 0.0  # layer 0: its own embedding
        assert d.max_change(1) == max(d.k_max_diff[1:] + d.v_max_diff[1:])
    assert kept.max_change(SHAPE.n_layers) == 0.0  # no layers: nothing changed
    agreements = kept.kv_agreements(torch.float32, SHAPE.d_model)
    changed, largest = causal.drift_verdict(agreements)
    assert not changed and largest.diff == kept.max_change()
    changed, largest = causal.drift_verdict(moved.kv_agreements(torch.float32, SHAPE.d_model))
    assert len(changed) == SHAPE.n_layers - 1 and largest.diff == moved.max_change(1)
    layer0 = [d.kv_agreements(torch.float32, SHAPE.d_model)[0] for d in (kept, moved)]
    assert causal.overall(layer0) == "exact"
    assert causal.overall(agreements) in ("exact", "within")
    assert causal.overall(moved.kv_agreements(torch.float32, SHAPE.d_model)) == "beyond"
