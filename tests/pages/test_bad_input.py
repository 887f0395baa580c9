"""What a user can type or click, and what kvviz says: a clear message in their language, never a
traceback, and the current generation and settings survive. One table for the engine, one for the sidebar.
"""
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from kvviz.app import hosted
from kvviz.engine.config import DecoderConfig
from kvviz.engine.device import parse_dtype, resolve_device
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend, random_backend
from kvviz.errors import InputError

APP = str(Path(__file__).resolve().parents[2] / "app.py")
SHAPE = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=300, max_seq_len=64)


@pytest.fixture(scope="module")
def backend():
    return random_backend(SHAPE)


def _gen(backend, **kw):
    return Generation(backend, max_new_tokens=kw.pop("max_new_tokens", 4), **kw)


# ---- engine level: (what the user did, the locale key, words of the English message) -------------------
ENGINE_CASES = [
    ("empty prompt", lambda b: _gen(b).prefill(""), "empty_prompt", "prompt is empty"),
    ("whitespace only", lambda b: _gen(b).prefill("  \n\t  "), "empty_prompt", "prompt is empty"),
    ("control characters only", lambda b: _gen(b).prefill("\x00\x07\x1b\x7f"), "empty_prompt", "prompt is empty"),
    ("huge prompt", lambda b: _gen(b).prefill("x" * 10_000), "prompt_too_long", "10000 tokens"),
    ("zero new tokens", lambda b: _gen(b, max_new_tokens=0), "max_new_tokens", "at least 1, got 0"),
    ("negative batch", lambda b: _gen(b, batch_size=-3), "batch_size", "at least 1, got -3"),
    ("negative temperature", lambda b: _gen(b, temperature=-1.0), "temperature", "got -1.0"),
    ("Step before Prefill", lambda b: _gen(b).step(), "prefill_first", "run prefill first"),
    ("zero layers", lambda b: DecoderConfig(n_layers=0), "positive_int", "n_layers"),
    ("negative d_model", lambda b: DecoderConfig(d_model=-256), "positive_int", "d_model"),
    ("heads do not divide", lambda b: DecoderConfig(n_heads=8, n_kv_heads=3), "not_divisible", "divisible"),
    ("d_model not a multiple of heads", lambda b: DecoderConfig(d_model=100, n_heads=8), "d_model_heads", "d_model"),
    ("odd d_head", lambda b: DecoderConfig(d_head=7), "d_head_even", "even"),
    ("a device this machine lacks", lambda b: resolve_device("cuda"), "no_device", "no cuda device"),
    ("a backend on that device", lambda b: load_backend("random", device="cuda", shape=SHAPE), "no_device", "cuda"),
    ("a dtype that does not exist", lambda b: parse_dtype("int3"), "unknown_dtype", "int3"),
    ("huge shape for this machine",
     lambda b: hosted.check_weights_fit(DecoderConfig(n_layers=48, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=11008),
                                        "float32", available=16 * 2**30), "hosted.too_big", "more than half"),
]
if torch.cuda.is_available():  # a GPU host has the device these cases ask for
    ENGINE_CASES = [c for c in ENGINE_CASES if c[2] != "no_device"]


@pytest.mark.parametrize("action, key, words", [c[1:] for c in ENGINE_CASES], ids=[c[0] for c in ENGINE_CASES])
def test_engine_refuses_with_a_translated_message(backend, action, key, words):
    with pytest.raises(InputError) as err:
        action(backend)
    assert err.value.key == key and words in str(err.value)
    ko = err.value.message("ko")
    assert ko != str(err.value) and any("가" <= ch <= "힣" for ch in ko)


@pytest.mark.parametrize("prompt", ["🙂🚀 KV", "캐시를 재사용한다", "mixed 한국어 and emoji 🙂", "tab\tand\nnewline"])
def test_emoji_and_korean_prompts_run(backend, prompt):
    gen = _gen(backend)
    gen.prefill(prompt)
    assert gen.prompt_ids == list(prompt.encode("utf-8"))  # bytes in, so nothing is dropped
    assert gen.step().position == len(gen.prompt_ids)
    assert gen.cache.length == len(gen.prompt_ids) + 1


def test_a_prompt_that_just_fits_gets_fewer_new_tokens(backend):
    gen = _gen(backend, max_new_tokens=10)
    gen.prefill("y" * 62)  # context 64: room for 2 new tokens, not 10
    assert gen.max_new_tokens == 2
    gen.step()
    with pytest.raises(InputError, match="finished"):
        gen.step()


def test_a_running_generation_survives_bad_calls(backend):
    gen = _gen(backend, max_new_tokens=6)
    gen.prefill("survive")
    gen.step()
    before = (list(gen.generated[0]), gen.cache.length, len(gen.events))
    for bad in (lambda: gen.prefill("again"), lambda: gen.prefill(""), lambda: gen.prefill("x" * 5000)):
        with pytest.raises(InputError):
            bad()
    assert (gen.generated[0], gen.cache.length, len(gen.events)) == before
    fresh = _gen(backend, max_new_tokens=6)
    fresh.prefill("survive")
    fresh.step()
    assert gen.step().token_id == fresh.step().token_id  # and it carries on exactly as if nothing happened


# ---- sidebar level (AppTest on Home): a bad widget value or link --------------------------------------
@pytest.fixture
def app_with_generation(backend):
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "random"
    gen = _gen(backend, max_new_tokens=8)
    gen.prefill("keep me")
    gen.step()
    at.session_state["gen"] = gen
    return at.run()


SIDEBAR_CASES = [
    ("heads do not divide", {"_w_kv_heads": 3}, "divisible"),
    ("more KV heads than query heads", {"_w_kv_heads": 16}, "n_heads (8) must be divisible by n_kv_heads (16)"),
    ("odd d_head", {"_w_d_head": 7}, "positive even number"),
]


@pytest.mark.parametrize("widgets, words", [c[1:] for c in SIDEBAR_CASES], ids=[c[0] for c in SIDEBAR_CASES])
def test_sidebar_bad_shape_keeps_settings_and_generation(app_with_generation, widgets, words):
    at = app_with_generation
    shape, gen = at.session_state["kv_shape"], at.session_state["gen"]
    cached = gen.cache.length
    for key, value in widgets.items():
        at.number_input(key=key).set_value(value)
    at.run()
    assert not at.exception
    assert any(words in e.value for e in at.error), [e.value for e in at.error]
    assert at.session_state["kv_shape"] == shape and at.session_state["kv_lang"] == "en"
    assert at.session_state["gen"] is gen and gen.cache.length == cached and not gen.done


def test_sidebar_huge_shape_for_this_machine(monkeypatch):
    monkeypatch.setattr(hosted, "available_memory_bytes", lambda: 8 * 2**30)
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "random"
    at.run()
    shape = at.session_state["kv_shape"]
    at.number_input(key="_w_layers").set_value(48)
    at.number_input(key="_w_d_model").set_value(4096).run()
    assert not at.exception
    assert any("more than half of the 8.00 GiB" in e.value for e in at.error)
    assert at.session_state["kv_shape"] == shape


def test_sidebar_error_in_korean():
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["lang"] = "ko"
    at.session_state["kv_model"] = "random"
    at.run()
    at.number_input(key="_w_kv_heads").set_value(3).run()
    assert any("나누어떨어져야" in e.value and "이전 모델을 그대로 유지" in e.value for e in at.error)
    assert at.session_state["kv_lang"] == "ko"


def test_malformed_query_string():
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["lang"] = "xx"
    at.query_params["lecture"] = "banana"
    at.run()
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    # lang is checked against the languages; lecture= (like every url_state setting) against its parser
    assert "lang = xx" in warnings and "“banana” for “lecture”" in warnings
    assert at.session_state["kv_lang"] == "en" and at.session_state["kv_lecture"] is False
    assert at.title[0].value.startswith("kvviz — the KV cache")


def test_a_device_this_machine_lacks():
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_device"] = "mps" if torch.cuda.is_available() else "cuda"
    at.run()
    assert not at.exception
    assert any("this machine has no" in w.value and "switched to cpu" in w.value for w in at.warning)
    assert at.session_state["kv_device"] == "cpu"


def test_an_unloadable_model_path_is_a_message():
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = "/nonexistent/model/dir"
    at.run()
    assert not at.exception
    assert any("Could not load the model" in e.value for e in at.error)
