"""Issue 19 #7: a number typed out of range is refused with a message naming the range, in English and Korean;
the last valid value stays in use."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.engine.config import DecoderConfig
from tests.pages.pagetest import open_page as _open

APP = str(Path(__file__).resolve().parents[2] / "app.py")
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


# ---- issue 29 #3: no box clamps silently ---------------------------------------------------------------------
OUT = "is outside the allowed range"


def _numbers_shown(at: AppTest) -> list[str]:
    """Every number the page draws outside its number boxes: metrics, formulas, tables, captions."""
    return [*(m.value for m in at.metric), *(x.value for x in at.latex), *(x.value for x in at.markdown),
            *(c.value for c in at.caption)]


@pytest.mark.parametrize("page, query", [
    ("app.py", {"model": "random"}), ("pages/1_Reusing_Past_KV.py", {}), ("pages/2_Prefill_and_Decode.py", {}),
    ("pages/3_Memory_Footprint.py", {"src": "custom"}), ("pages/4_Latency_and_Capacity.py", {}),
    ("pages/6_Check.py", {"model": "random"}), ("pages/7_Serving_Engine.py", {}), ("pages/9_Paged_Blocks.py", {}),
    ("pages/10_Speculative_Decoding.py", {}), ("pages/11_Moving_the_Cache.py", {}),
])
def test_no_number_box_has_a_range_the_browser_clamps_silently(page, query):
    """A box with Streamlit's own min/max keeps a refused entry red in the browser while the app goes on with
    another value: every box checks its range itself (number_in_range) and says so."""
    at = _open(page, **query)
    assert at.number_input, f"{page} has no number box to check"
    clamped = [(b.key, b.min, b.max) for b in at.number_input if b.min is not None or b.max is not None]
    assert clamped == []


@pytest.mark.parametrize("typed", [0, -1, 99999999999])
def test_decode_page_refuses_max_new_tokens_and_prefills_with_the_previous_value(typed):
    at = _open("pages/1_Reusing_Past_KV.py")
    box = at.number_input(key="_w_reuse_max_new")
    box.set_value(typed).run()
    assert [e.value for e in at.error] == [f"Max new tokens: {typed:,} {OUT} 1 … 512, so it was not used. "
                                           "The previous value, 24, stays."]
    assert at.number_input(key="_w_reuse_max_new").value == typed  # what was typed stays beside the message
    at.button(key="reuse_btn_prefill").click().run()
    gen = at.session_state["reuse_gen"]
    assert gen.max_new_tokens == 24 and not gen.done  # not 1, not "Generation finished"


def test_decode_page_value_typed_with_the_prefill_click_is_checked_too():
    at = _open("pages/1_Reusing_Past_KV.py")
    at.number_input(key="_w_reuse_max_new").set_value(7)  # typed, then Prefill clicked: one rerun
    at.button(key="reuse_btn_prefill").click().run()
    assert at.session_state["reuse_gen"].max_new_tokens == 7
    at.number_input(key="_w_reuse_max_new").set_value(0)
    at.button(key="reuse_btn_prefill").click().run()
    assert at.session_state["reuse_gen"].max_new_tokens == 7 and OUT in at.error[0].value


MEMORY_BOXES = [  # key, the label's start, the range as the message names it
    ("memory_layers", "Layers", "1 … 1,000"), ("memory_heads", "Query heads", "1 … 1,024"),
    ("memory_kv_heads", "KV heads", "1 … 1,024"), ("memory_d_head", "d_head", "1 … 4,096"),
    ("memory_params_b", "Parameters", "0.001 … 10,000"), ("memory_tokens", "Context length", "1 … 10,000,000"),
    ("memory_batch", "Concurrent requests", "1 … 100,000"), ("memory_n_gpus", "GPUs", "1 … 64"),
    ("memory_total_H100 SXM", "Memory per GPU", "0.1 … 100,000"), ("memory_block", "Block size", "1 … 4,096"),
]


@pytest.mark.parametrize("lang", ["en", "ko"])
@pytest.mark.parametrize("key, label, bounds", MEMORY_BOXES, ids=[b[0] for b in MEMORY_BOXES])
def test_memory_page_refuses_every_box_and_keeps_its_results(key, label, bounds, lang):
    at = _open("pages/3_Memory_Footprint.py", src="custom", lang=lang)
    before, previous = _numbers_shown(at), at.number_input(key=key).value
    standing = [e.value for e in at.error]  # a custom shape's reserve cannot be estimated: said before any typing
    for typed in (0, -1, 99999999999):
        at.number_input(key=key).set_value(typed).run()
        assert not at.exception
        errors = [e.value for e in at.error if e.value not in standing]
        assert len(errors) == 1 and bounds in errors[0], errors  # this box's message, no other
        if lang == "en":
            assert errors[0].startswith(label) and OUT in errors[0]
        assert _numbers_shown(at) == before  # nothing computed from the refused value
        assert at.query_params[key.removeprefix("memory_")] == str(previous) if key.removeprefix("memory_") in (
            "layers", "tokens", "batch", "n_gpus", "block") else True  # the link keeps the valid value
    at.number_input(key=key).set_value(previous).run()
    assert [e.value for e in at.error] == standing  # a valid value clears the message


def test_memory_page_refuses_a_negative_reserve():
    at = _open("pages/3_Memory_Footprint.py")
    reserve = next(b for b in at.number_input if b.key.startswith("memory_reserve_"))
    reserve.set_value(-1.0).run()
    assert OUT in at.error[0].value and "0 … 1,000" in at.error[0].value


def test_paged_page_refuses_a_pool_size_and_keeps_its_requests():
    at = _open("pages/9_Paged_Blocks.py")
    at.button(key="paged_add4").click().run()
    engine = at.session_state["paged_engine"]
    at.number_input(key="paged_blocks").set_value(1).run()
    assert f"{OUT} 2 … 1,024" in at.error[0].value
    assert at.session_state["paged_engine"] is engine and len(engine.requests) == 4  # nothing lost


def test_serving_page_refuses_a_timeout():
    at = _open("pages/7_Serving_Engine.py")
    at.number_input(key="serving_timeout").set_value(0.0).run()
    assert f"{OUT} 1 … 600" in at.error[0].value and "30" in at.error[0].value


def test_a_whole_number_box_with_an_int_step_logs_no_type_warning():
    """Memory Footprint's token box has step=1024: Streamlit warned, with a stack, on every run that an int value
    is 'displayed as int despite format string %.0f'. number_in_range passes its step as a float."""
    import logging

    def page() -> None:
        import streamlit as st

        from kvviz.app.widgets import number_in_range

        st.session_state["tokens"] = number_in_range(st, "Tokens", 1, 10_000_000, 4096, "tokens_box", step=1024)

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    logger, records = logging.getLogger("streamlit.elements.widgets.number_input"), Records()
    logger.addHandler(records)  # Streamlit's loggers do not propagate to the root's (pytest's caplog)
    try:
        at = AppTest.from_function(page).run()
    finally:
        logger.removeHandler(records)
    assert not at.exception and at.session_state["tokens"] == 4096
    assert records.messages == []
