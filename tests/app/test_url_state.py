"""url_state: a setting read from the link once, mirrored back, bad values explained; lecture pins seeds."""
from streamlit.testing.v1 import AppTest


def _page():
    import streamlit as st

    from kvviz.app.lecture import demo_seed
    from kvviz.app.sidebar import init_state
    from kvviz.app.url_state import int_in, url_state
    from kvviz.app.widgets import persisted

    init_state()  # page_setup's link-reading part (its sidebar needs the whole app around it)
    key = url_state("steps", 8, int_in(1, 32))
    steps = persisted(st.number_input, key, "steps", min_value=1, max_value=32)
    st.write(f"steps={steps} seed={demo_seed(7)}")


def _run(**query: str) -> AppTest:
    at = AppTest.from_function(_page, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def test_link_value_is_read_and_changes_are_mirrored():
    at = _run(steps="12")
    assert not at.exception
    assert at.number_input(key="_w_kv_url_steps").value == 12
    assert "steps=12 seed=7" in at.markdown[-1].value
    at.number_input(key="_w_kv_url_steps").set_value(20).run()
    assert at.query_params["steps"] == "20"
    at.number_input(key="_w_kv_url_steps").set_value(8).run()
    assert "steps" not in at.query_params  # the default stays out of the link


def test_bad_link_values_fall_back_with_a_message():
    at = _run(steps="99", model="gpt-9", lang="ko")
    assert not at.exception
    assert at.number_input(key="_w_kv_url_steps").value == 8
    assert at.session_state["kv_model"] == "tiny"  # the default
    texts = [w.value for w in at.warning]
    assert any("“99”" in t and "steps" in t for t in texts) and any("gpt-9" in t for t in texts)
    assert all("기본값" in t for t in texts)  # in the user's language


def test_lecture_mode_pins_the_seed():
    at = _run(lecture="1")
    assert at.session_state["kv_lecture"] is True
    assert "seed=0" in at.markdown[-1].value
    at = _run(lecture="0")
    assert at.session_state["kv_lecture"] is False
    assert "seed=7" in at.markdown[-1].value
