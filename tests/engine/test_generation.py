"""The engine's events: what each pass computed, measured bytes, sampling, and bad input."""
import pytest
import torch

from kvviz.engine.config import DecoderConfig
from kvviz.engine.generation import Generation
from kvviz.engine.loading import random_backend
from kvviz.errors import InputError
from kvviz.kv.formula import attention_scores_per_pass

CFG = DecoderConfig(n_layers=2, d_model=64, n_heads=8, n_kv_heads=2, d_ff=128, vocab_size=320, max_seq_len=48)


@pytest.fixture(scope="module")
def backend():
    return random_backend(CFG, seed=3)


def test_prefill_then_steps(backend):
    gen = Generation(backend, max_new_tokens=6, capture_attention=True)
    ev = gen.prefill("hello")
    assert ev.phase == "prefill" and ev.n_input_tokens == 5 and ev.cache_lengths == [5, 5]
    assert ev.attn_scores == 2 * 8 * (5 * 6 // 2)
    for i in range(1, 4):
        ev = gen.step()
        assert ev.phase == "decode" and ev.n_input_tokens == 1
        assert ev.cache_lengths == [5 + i] * 2
        assert ev.attn_scores == 2 * 8 * (5 + i)  # one query over the whole prefix
        assert len(ev.attention) == 2 and ev.attention[0].shape == (8, 5 + i)
        assert abs(ev.attention[1].sum(-1) - 1).max() < 1e-5
        assert ev.live_bytes == ev.formula_bytes == 2 * 2 * (5 + i) * 2 * 8 * 4
        assert ev.allocated_bytes == 2 * 2 * (5 + 6) * 2 * 8 * 4
    assert gen.n_generated == 4 and len(gen.token_ids) == 9
    diff, cached_tok, fresh_tok = gen.cache_vs_recompute()
    assert diff <= 1e-4 and cached_tok == fresh_tok


def test_cache_and_no_cache_generate_the_same_tokens(backend):
    a = Generation(backend, max_new_tokens=10)
    b = Generation(backend, max_new_tokens=10, use_cache=False)
    a.run("the cache")
    b.run("the cache")
    assert a.generated == b.generated
    assert all(e.live_bytes == 0 for e in b.events)
    # no cache: step k recomputes all prompt+k positions
    assert [e.n_input_tokens for e in b.events] == list(range(9, 19))
    assert b.events[3].attn_scores == attention_scores_per_pass(b.backend.spec, 12, 0) == 2 * 8 * 12 * 13 // 2


def test_sampling_repeats_with_seed_and_batch_rows(backend):
    runs = [Generation(backend, max_new_tokens=8, temperature=1.0, top_k=20, seed=5, batch_size=2) for _ in range(2)]
    for g in runs:
        g.run("abc")
    assert runs[0].generated == runs[1].generated
    assert len(runs[0].generated) == 2
    assert runs[0].events[-1].live_bytes == 2 * 2 * (3 + 7) * 2 * 8 * 4 * 2


def test_generation_stops_at_context(backend):
    gen = Generation(backend, max_new_tokens=100)
    gen.run("x" * 40)
    assert gen.n_generated == 8 and gen.done


@pytest.mark.parametrize(
    "action, key",
    [
        (lambda g: g.prefill(""), "empty_prompt"),
        (lambda g: g.prefill(" \n\t "), "empty_prompt"),
        (lambda g: g.prefill("y" * 48), "prompt_too_long"),
        (lambda g: g.step(), "prefill_first"),
    ],
)
def test_bad_input_is_a_one_line_error(backend, action, key):
    gen = Generation(backend, max_new_tokens=4)
    with pytest.raises(InputError) as err:
        action(gen)
    assert err.value.key == key and "\n" not in str(err.value)
    assert err.value.message("ko") != str(err.value)


def test_finished_generation_refuses_step(backend):
    gen = Generation(backend, max_new_tokens=2)
    gen.run("ab")
    with pytest.raises(InputError, match="finished"):
        gen.step()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_dtypes_run(dtype):
    be = random_backend(CFG, seed=3, dtype=dtype)
    gen = Generation(be, max_new_tokens=4)
    gen.run("dtype")
    elem = 2
    assert gen.events[-1].live_bytes == 2 * 2 * (5 + 3) * 2 * 8 * elem
    assert be.model.lm_head.weight.dtype == getattr(torch, dtype)


def test_cuda_without_gpu_is_an_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(InputError, match="no cuda device"):
        random_backend(CFG, device="cuda")
