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


def test_the_memory_scenario_goes_back_into_the_link_as_its_widgets_hold_it():
    """scenario_in() reads a number box's last valid value (never one it refused); query_changes() sets only what
    differs and drops what the scenario no longer has, keeping the app's own lang and lecture."""
    from kvviz.app.url_state import query_changes, read_query, scenario_in, scenario_query

    state = {"memory_src": "custom", "memory_layers": 40.0, "_valid_memory_layers": 40, "memory_kv_heads": 3000.0,
             "_valid_memory_kv_heads": 8, "memory_tokens": 8192, "memory_upload_n": 2, "kv_lang": "ko"}
    scenario = scenario_in(state)
    assert scenario == {"src": "custom", "layers": 40, "kv_heads": 8, "tokens": 8192}
    wanted = scenario_query(scenario)
    assert wanted == {"src": "custom", "layers": "40", "kv_heads": "8", "tokens": "8192"}
    query = {"lang": "ko", "lecture": "1", "src": "custom", "layers": "32", "preset": "GPT-2"}
    changed, dropped = query_changes(query, wanted)
    assert changed == {"layers": "40", "kv_heads": "8", "tokens": "8192"} and dropped == {"preset"}
    link = {k: v for k, v in {**query, **changed}.items() if k not in dropped}
    values, bad = read_query(link)
    assert not bad and {k: values[k] for k in scenario} == scenario  # the link reproduces the scenario
    assert query_changes(link, wanted) == ({}, set())
