"""Hosted-demo mode: how it is switched on, and each cap refusing with a clear, translated message."""
import dataclasses
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.app import hosted
from kvviz.app.hosted import HostedCaps, load_caps
from kvviz.app.sidebar import DEFAULTS
from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import random_backend
from kvviz.engine.shape import parameter_count
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec

APP = str(Path(__file__).resolve().parents[2] / "app.py")
CAPS = HostedCaps()


# ---- switching it on -------------------------------------------------------------------------------
def test_off_unless_asked():
    assert load_caps({}) is None
    assert load_caps({"KVVIZ_HOSTED": "0"}, {"hosted": True}) is None  # the environment wins
    assert load_caps({"KVVIZ_HOSTED": "1"}) == HostedCaps()
    assert load_caps({}, {"hosted": True}) == HostedCaps()
    assert load_caps({}, {"hosted": "false"}) is None


def test_env_and_secrets_override_caps():
    caps = load_caps({"KVVIZ_HOSTED": "yes", "KVVIZ_MAX_LAYERS": "3", "KVVIZ_HF_ALLOW": "a/b, c/d"},
                     {"hosted": {"max_layers": 6, "max_batch": 2}})
    assert (caps.max_layers, caps.max_batch, caps.hf_allow) == (3, 2, ("a/b", "c/d"))
    assert caps.max_d_model == HostedCaps().max_d_model


@pytest.mark.parametrize("env", [{"KVVIZ_HOSTED": "banana"}, {"KVVIZ_HOSTED": "1", "KVVIZ_MAX_LAYERS": "0"},
                                 {"KVVIZ_HOSTED": "1", "KVVIZ_KV_BUDGET_BYTES": "1e6"}])
def test_bad_setting_is_named(env):
    with pytest.raises(InputError) as err:
        load_caps(env)
    assert err.value.key == "hosted.bad_setting" and list(env)[-1] in str(err.value)


# ---- each cap, as a pure check ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "check, words",
    [
        (lambda: hosted.check_shape(DecoderConfig(n_layers=9), CAPS), "at most 8 layers, got 9"),
        (lambda: hosted.check_shape(DecoderConfig(d_model=768, n_heads=12, n_kv_heads=4, d_ff=2048), CAPS),
         "d_model at most 512, got 768"),
        # 8 layers of d_model 512, but a huge FFN: within layer/width caps, past the parameter cap
        (lambda: hosted.check_shape(DecoderConfig(n_layers=8, d_model=512, d_ff=20000, vocab_size=50000), CAPS),
         "at most 150,000,000 model parameters"),
        (lambda: hosted.check_params(7_000_000_000, CAPS), "this model has 7,000,000,000"),
        (lambda: hosted.check_new_tokens(65, CAPS), "at most 64 new tokens per request, got 65"),
        (lambda: hosted.check_batch(5, CAPS), "a batch of at most 4 requests, got 5"),
        (lambda: hosted.check_sweep(9, CAPS), "at most 8 points per sweep, got 9"),
        (lambda: hosted.check_hf_model("/etc/passwd", CAPS), "file-system paths are not accepted"),
        (lambda: hosted.check_hf_model("../models/big", CAPS), "file-system paths are not accepted"),
        (lambda: hosted.check_hf_model("~/weights", CAPS), "file-system paths are not accepted"),
        (lambda: hosted.check_hf_model("meta-llama/Llama-3.1-70B", CAPS), "not on this demo's list"),
    ],
)
def test_each_cap_refuses_with_a_clear_message(check, words):
    with pytest.raises(InputError) as err:
        check()
    assert words in str(err.value)
    assert err.value.key.startswith("hosted.")
    assert "공개 데모" in err.value.message("ko")


def test_within_caps_passes():
    hosted.check_shape(DecoderConfig(n_layers=8, d_model=512), CAPS)
    hosted.check_hf_model("HuggingFaceTB/SmolLM2-135M", CAPS)
    hosted.check_new_tokens(64, CAPS), hosted.check_batch(4, CAPS), hosted.check_sweep(8, CAPS)


def test_param_count_matches_the_built_model():
    cfg = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab_size=300)
    assert parameter_count(cfg) == random_backend(cfg).model.num_parameters() == random_backend(cfg).spec.n_params


def test_kv_budget_uses_the_formula():
    # 2 · batch 4 · 8 layers · 1024 tokens · 8 KV heads · d_head 64 · 4 bytes = 128 MiB > 64 MiB
    spec = KVSpec(n_layers=8, n_heads=8, n_kv_heads=8, d_head=64)
    with pytest.raises(InputError) as err:
        hosted.check_request(CAPS, spec, batch=4, prompt_tokens=960, max_new_tokens=64, dtype="float32")
    assert "needs 128.00 MiB" in str(err.value) and "at most 64.00 MiB" in str(err.value)
    # the same request in bfloat16 at batch 1 needs 16 MiB: allowed, and the bytes are returned
    assert hosted.check_request(CAPS, spec, batch=1, prompt_tokens=960, max_new_tokens=64,
                                dtype="bfloat16") == 2 * 8 * 1024 * 8 * 64 * 2


# ---- the sidebar and backend under KVVIZ_HOSTED=1 ----------------------------------------------------
@pytest.fixture
def hosted_app(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_MAX_LAYERS", "3")
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=160)
    return at.run()


def test_sidebar_shows_the_limits_and_refuses_past_them(hosted_app):
    at = hosted_app
    assert not at.exception and not at.error
    assert any("Hosted demo limits: 3 layers" in c.value for c in at.sidebar.caption)
    before = at.session_state["kv_shape"]
    at.number_input(key="_w_layers").set_value(4).run()
    assert not at.exception
    assert any("hosted demo: at most 3 layers, got 4" in e.value for e in at.error)
    assert at.session_state["kv_shape"] == before  # the last valid shape (and its model) stays
    at.number_input(key="_w_layers").set_value(3)
    at.number_input(key="_w_d_model").set_value(1024).run()
    assert any("d_model at most 512, got 1024" in e.value for e in at.error)


def test_sidebar_refusal_in_korean(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_MAX_LAYERS", "3")
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["lang"] = "ko"
    at.session_state["kv_model"] = "random"
    at.run()
    at.number_input(key="_w_layers").set_value(4).run()
    assert any("공개 데모: 레이어는 최대 3개입니다 (입력: 4)" in e.value for e in at.error)


def test_hf_choice_is_the_allow_list_not_a_text_box(hosted_app):
    at = hosted_app
    at.selectbox(key="_w_kv_model").set_value("hf").run()
    assert not at.exception
    assert not at.sidebar.text_input  # nowhere to type a path
    assert at.selectbox(key="_w_kv_hf_model").options == list(hosted.hub_ids(HostedCaps()))


def test_a_path_in_session_state_never_loads(monkeypatch):
    """Even a path that reached the state some other way is refused before any loading."""
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_HF_ALLOW", "")
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = "/etc"
    at.run()
    assert not at.exception
    assert at.session_state["kv_model"] == DEFAULTS["kv_model"] == "tiny"  # no allow-list: no hf choice
    assert "hf" not in at.selectbox(key="_w_kv_model").options


def test_not_hosted_keeps_the_free_text_box(monkeypatch):
    monkeypatch.delenv("KVVIZ_HOSTED", raising=False)
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "hf"
    at.run()
    assert at.sidebar.text_input and not any("Hosted demo" in c.value for c in at.sidebar.caption)


def test_misconfigured_host_says_so_and_keeps_default_caps(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_MAX_BATCH", "lots")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert any("KVVIZ_MAX_BATCH = ‘lots’ is not valid" in e.value for e in at.error)
    assert any("batch 4" in c.value for c in at.sidebar.caption)


def test_secrets_table_turns_it_on(monkeypatch):
    monkeypatch.delenv("KVVIZ_HOSTED", raising=False)
    at = AppTest.from_file(APP, default_timeout=60)
    at.secrets["hosted"] = {"max_layers": 5, "hf_allow": ["org/small"]}
    at.run()
    assert not at.exception
    assert any("Hosted demo limits: 5 layers" in c.value for c in at.sidebar.caption)


def test_the_page_helpers_apply_the_caps():
    """What pages call before a prefill or a sweep, and to bound their widgets."""
    from kvviz.app.models import check_request, check_sweep, limit
    from kvviz.app.sidebar import Settings

    shape = DecoderConfig(n_layers=8, d_model=512, n_heads=8, n_kv_heads=8, d_ff=1376)
    be = random_backend(DecoderConfig(n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=32, vocab_size=256))
    on = Settings("en", "random", "float32", "cpu", shape, hosted=CAPS)
    off = Settings("en", "random", "float32", "cpu", shape)
    assert (limit(on, "max_new_tokens", 256), limit(off, "max_new_tokens", 256)) == (64, 256)
    with pytest.raises(InputError, match="at most 8 points per sweep"):
        check_sweep(on, 12)
    check_sweep(off, 12)
    with pytest.raises(InputError, match="a batch of at most 4"):
        check_request(on, be, batch=8, prompt_tokens=10, max_new_tokens=10)
    check_request(on, be, batch=4, prompt_tokens=10, max_new_tokens=10)
    check_request(off, be, batch=64, prompt_tokens=10, max_new_tokens=1000)


def test_the_sidebar_lists_every_cap_that_can_refuse(monkeypatch):
    """Issue 29.5: points per sweep and the parameter count refused requests but were not in the sidebar's list.
    Every cap a check refuses with is listed, with its value (the idle timeout frees, it never refuses; the Hugging
    Face allow-list is the model box's own choices)."""
    values = {"max_params": "123456789", "max_layers": "7", "max_d_model": "384", "max_new_tokens": "33",
              "max_batch": "3", "max_sweep_points": "5", "kv_budget_bytes": str(3 * 2**20),
              "offload_store_bytes": str(5 * 2**20), "max_rooms": "2", "max_room_followers": "45"}
    assert set(values) == {f.name for f in dataclasses.fields(HostedCaps)} - {"idle_timeout_s", "hf_allow"}
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    for name, value in values.items():
        monkeypatch.setenv("KVVIZ_" + name.upper(), value)
    at = AppTest.from_file(APP, default_timeout=60).run()
    caption = next(c.value for c in at.sidebar.caption if c.value.startswith("Hosted demo limits"))
    for shown in ("7 layers", "d_model 384", "123,456,789 model parameters", "33 new tokens per request",
                  "batch 3", "5 points per sweep", "3.00 MiB of KV cache",
                  "5.00 MiB of offloaded KV", "2 lecture rooms at once", "45 followers per room"):
        assert shown in caption
    monkeypatch.setenv("KVVIZ_MAX_SWEEP_POINTS", "1")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert "1 point per sweep" in next(c.value for c in at.sidebar.caption if c.value.startswith("Hosted demo"))
