"""Pages run headless (AppTest) with no exception, in both languages."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_home_runs(lang):
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["lang"] = lang
    at.run()
    assert not at.exception
    assert at.title[0].value.startswith("kvviz")
    assert ("캐시" in at.title[0].value) == (lang == "ko")


def test_invalid_shape_keeps_previous_model():
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "random"
    at.run()
    before = at.session_state["kv_shape"]
    at.number_input(key="_w_kv_heads").set_value(3).run()
    assert not at.exception
    assert any("divisible" in e.value for e in at.error)
    assert at.session_state["kv_shape"] == before
