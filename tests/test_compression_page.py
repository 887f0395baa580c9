"""The Compressing the Cache page, headless: every method measured on the user's text, bytes equal to the formula,
one chart with all methods, the kept-positions strip and the attention rows, in English and Korean."""
import json
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from kvviz.engine.config import DecoderConfig

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "pages/8_Compressing_the_Cache.py"
# d_head 32 (128 / 4 heads): KIVI's group of 32 must divide it
SMALL = DecoderConfig(n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=4096, max_seq_len=128)
TEXT = "The cache keeps the keys and values of every past token, so each decode step reads them back. " * 20


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def measured(lang: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = SMALL
    at.query_params["text"] = "own"
    at.query_params["lang"] = lang
    at.query_params["tokens"] = "256"
    at.switch_page(PAGE)
    at.run()
    at.text_area(key="cc_own_text").input(TEXT)
    at.run()
    at.button(key="cc_run").click()
    return at.run()


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_page_measures_every_method(lang):
    at = measured(lang)
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert len(table) == 1 + 2 * 4 + 3 + 1  # full, 4 evictions × 2 budgets, int8/int4/fp8, mqa (2 KV heads)
    measured_bytes, formula_bytes = table.iloc[:, 4], table.iloc[:, 5]
    assert (measured_bytes == formula_bytes).all()
    # full cache: 2 layers · 127 positions · K and V · 2 KV heads · d_head 32 · 4 bytes
    assert measured_bytes.iloc[0] == 2 * 127 * 2 * 2 * 32 * 4
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    tradeoff, strip, attention = charts
    assert sum(len(t["x"]) for t in tradeoff["data"]) == len(table) - 1  # every method on one chart
    assert len(strip["data"][0]["y"]) == len(table)  # a strip row per method
    assert len(attention["data"]) == 2  # full beside compressed
    title = tradeoff["layout"]["title"]["text"]
    assert ("캐시" in title or "방법" in title) if lang == "ko" else "Memory saved" in title
