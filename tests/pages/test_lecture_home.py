"""Issue 19 #23 and #22: lecture mode shows Home one idea per screen with a stepper; Korean text breaks between
words; the decode-loop diagram is two rows of three, large enough to read."""
from pathlib import Path

from streamlit.testing.v1 import AppTest

from kvviz.charts.decode import decode_loop_dot

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_home_in_lecture_mode_is_one_idea_per_screen_with_a_stepper():
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["lecture"] = "1"
    at.run()
    assert not at.exception
    assert [h.value for h in at.subheader] == ["The decode loop"]
    assert at.button(key="kv_idea_back_home").disabled
    at.button(key="kv_idea_next_home").click().run()
    assert [h.value for h in at.subheader] == ["The model in use"] and at.query_params["idea"] == "2"
    at.button(key="kv_idea_next_home").click().run()
    assert [h.value for h in at.subheader] == ["Pages"] and at.button(key="kv_idea_next_home").disabled
    at.toggle(key="_w_kv_lecture").set_value(False).run()
    assert len(at.subheader) == 3  # off the projector, the whole page


def test_korean_keeps_words_whole():
    def css(lang: str) -> str:
        at = AppTest.from_file(APP, default_timeout=60)
        at.query_params["lang"] = lang
        at.run()
        return " ".join(h.proto.body for h in at.get("html"))

    assert "word-break: keep-all" in css("ko") and "keep-all" not in css("en")


def test_decode_loop_is_two_rows():
    dot = decode_loop_dot([f"step {i}" for i in range(6)], "repeat")
    assert "{rank=same; s0 s1 s2}" in dot and "{rank=same; s3 s4 s5}" in dot and "fontsize=16" in dot
