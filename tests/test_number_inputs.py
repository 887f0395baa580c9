"""Issue 19 #7: a number typed out of range is refused with a message naming the range, in English and Korean;
the last valid value stays in use."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.engine.config import DecoderConfig

APP = str(Path(__file__).resolve().parents[1] / "app.py")
SMALL = DecoderConfig(n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, d_ff=160, vocab_size=300, max_seq_len=128)


def custom_shape_app(lang: str = "en") -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["lang"] = lang
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = SMALL
    at.switch_page("pages/6_Check.py")  # a page without a model run keeps the test quick
    return at.run()


@pytest.mark.parametrize("typed", [0, -5, 49, 100000])
def test_sidebar_refuses_an_out_of_range_layer_count(typed):
    at = custom_shape_app()
    at.number_input(key="_w_layers").set_value(typed).run()
    assert not at.exception
    assert at.session_state["kv_shape"] == SMALL  # the previous shape stays in use
    message = at.sidebar.error[0].value
    assert message == (f"Layers: {typed:,} is outside the allowed range 1 … 48, so it was not used. "
                       "The previous value, 3, stays.")
    assert at.number_input(key="_w_layers").value == typed  # what was typed stays visible beside the message
    at.number_input(key="_w_layers").set_value(4).run()  # a valid value is taken and the message goes
    assert at.session_state["kv_shape"].n_layers == 4 and not at.sidebar.error


def test_the_message_is_korean_in_korean():
    at = custom_shape_app("ko")
    at.number_input(key="_w_d_model").set_value(5000).run()
    assert "5,000은(는) 허용 범위 16 … 4,096를 벗어나므로" in at.sidebar.error[0].value
    assert at.session_state["kv_shape"].d_model == 64


def test_check_refuses_a_negative_estimate_and_keeps_reveal_locked():
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/6_Check.py").run()
    at.number_input(key="predict_cache_size").set_value(-5.0).run()
    assert not at.exception
    assert "−5" in at.error[0].value.replace("-", "−") and "0 … 1,000,000" in at.error[0].value
    assert at.button(key="reveal_cache_size").disabled  # no valid prediction yet
    at.number_input(key="predict_cache_size").set_value(64.0).run()
    assert not at.error and not at.button(key="reveal_cache_size").disabled
