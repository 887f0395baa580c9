"""Idle sessions' KV caches are freed on a hosted demo; active ones and closed ones are handled apart."""
import pytest

from kvviz.app.sessions import SessionRegistry, free_generation, generations_in
from kvviz.engine.config import DecoderConfig
from kvviz.engine.generation import Generation
from kvviz.engine.loading import random_backend
from kvviz.errors import InputError

SHAPE = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=300)


@pytest.fixture(scope="module")
def backend():
    return random_backend(SHAPE)


def _started(backend, prompt="hello"):
    gen = Generation(backend, max_new_tokens=8)
    gen.prefill(prompt)
    gen.step()
    return gen


def test_idle_session_cache_freed_active_one_kept(backend):
    idle, active = {"gen": _started(backend), "kv_lang": "en"}, {"g": _started(backend, "other")}
    states = {"idle": idle, "active": active}
    reg = SessionRegistry()
    reg.touch("idle", now=0.0)
    reg.touch("active", now=0.0)
    reg.touch("active", now=550.0)
    assert reg.sweep(now=601.0, idle_timeout_s=600, state_of=states.get) == 1
    assert idle["gen"].cache is None
    assert active["g"].cache is not None and active["g"].cache.length == 6  # "other" + 1 step, untouched
    assert reg.pop_freed("idle") and not reg.pop_freed("idle")  # said once
    assert not reg.pop_freed("active")
    # the freed generation keeps its tokens but ends: a step says so instead of decoding without its past
    assert idle["gen"].n_generated == 2 and idle["gen"].done
    with pytest.raises(InputError, match="finished"):
        idle["gen"].step()
    assert active["g"].step().token_id >= 0


def test_freed_bytes_are_released(backend):
    gen = _started(backend)
    # K and V · 2 layers · (5 prompt + 8 new) positions · 2 KV heads · d_head 16 · 4 bytes
    assert gen.cache.allocated_bytes() == 2 * 2 * (5 + 8) * 2 * 16 * 4
    assert free_generation(gen) and gen.cache is None
    assert not free_generation(gen)  # nothing left to free


def test_closed_sessions_are_forgotten(backend):
    reg = SessionRegistry()
    reg.touch("gone", now=0.0)
    assert reg.sweep(now=1000.0, idle_timeout_s=600, state_of=lambda sid: None) == 0
    assert len(reg) == 0 and reg.last_active("gone") is None


def test_only_generations_are_touched(backend):
    gen, unstarted = _started(backend), Generation(backend)
    state = {"gen": gen, "fresh": unstarted, "list": [1, 2], "n": 3}
    assert generations_in(state) == [gen, unstarted]
    reg = SessionRegistry()
    reg.touch("s", now=0.0)
    assert reg.sweep(now=700.0, idle_timeout_s=600, state_of={"s": state}.get) == 1
    assert state["list"] == [1, 2] and state["n"] == 3 and not unstarted.started
