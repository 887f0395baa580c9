"""The Attention Patterns page, headless: the user's own text (also opened from a shared link) and the sentence
that compares the two copies' losses, in English and Korean."""
import pytest

from kvviz.i18n import t
from tests.pages.pagetest import open_page

PAGE = "pages/12_Attention_Patterns.py"


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_own_text_opens_without_a_traceback(lang):
    at = open_page(PAGE, lang)
    at.radio(key="_w_kv_url_text").set_value("custom").run()
    assert not at.exception
    # an empty box, nothing typed yet: a hint (what to type and how much), not an error
    assert not at.error and [i.value for i in at.info] == [t("heads.custom_hint", lang, min_len=16)]
    at.text_area(key="_w_heads_custom_text").input("Too short.").run()  # typed, too short: said as an error
    assert any("16" in e.value for e in at.error)
    at.text_area(key="_w_heads_custom_text").input("The cache keeps the keys and values of every token. " * 6).run()
    assert not at.exception and not at.error
    assert at.session_state["heads_custom_text"].startswith("The cache keeps")


def test_a_shared_link_to_the_own_text_opens():
    at = open_page(PAGE, "en", text="custom")
    assert at.radio(key="_w_kv_url_text").value == "custom"


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_the_second_copy_costs_more_or_less_as_measured(lang):
    at = open_page(PAGE, lang)
    delta = float(at.metric[-3].proto.delta)  # the second copy's loss minus the first's
    tail = t("heads.induction_reading", lang, named=0, threshold=0.3)[-15:]
    caption = next(c.value for c in at.caption if c.value.endswith(tail))
    key = "heads.induction_cheaper" if delta <= 0 else "heads.induction_dearer"
    assert caption.startswith(t(key, lang, drop=f"{abs(delta):.2f}")), caption
    assert "-" not in caption.split(".")[0]
