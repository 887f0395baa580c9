"""The Compressing the Cache page, headless: every method measured on the user's text, bytes equal to the formula,
one chart with all methods, the kept-positions strip and the attention rows, in English and Korean."""
import dataclasses
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.engine.config import DecoderConfig
from kvviz.engine.timing import torch_threads
from kvviz.i18n import t

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGE = "pages/8_Compressing_the_Cache.py"
# d_head 32 (128 / 4 heads): KIVI's group of 32 must divide it
SMALL = DecoderConfig(n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=4096, max_seq_len=128)
TEXT = "The cache keeps the keys and values of every past token, so each decode step reads them back. " * 20


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


def measured(lang: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = SMALL
    at.query_params["text"] = "own"
    at.query_params["lang"] = lang
    at.query_params["tokens"] = "256"
    at.switch_page(PAGE)
    at.run()
    at.text_area(key="compression_own_text").input(TEXT)
    at.run()
    at.button(key="compression_run").click()
    return finished(at.run())


def finished(at: AppTest) -> AppTest:
    """Rerun until the methods are measured (the page runs them a second per tick, drawing progress between)."""
    for _ in range(600):
        if "compression_sweep" not in at.session_state:
            return at
        at.run()
    raise AssertionError("still measuring")


def named(method: str, settings: str, lang: str) -> str:
    """A method as the page names it: in the user's language, with its settings ("FP8 (scale=1.0)")."""
    return t(f"compression.method_{method}", lang) + settings


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_page_measures_every_method(lang):
    at = measured(lang)
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    # full, 4 evictions × 2 budgets, int8/int4/KIVI-2, fp8 with each of vLLM's scale settings, mqa (2 KV heads)
    assert len(table) == 1 + 2 * 4 + 3 + 2 + 1
    measured_bytes = table[t("compression.table_bytes", lang)]
    assert (measured_bytes == table[t("compression.table_formula", lang)]).all()
    # full cache: 2 layers · 127 positions · K and V · 2 KV heads · d_head 32 · 4 bytes
    assert measured_bytes.iloc[0] == 2 * 127 * 2 * 2 * 32 * 4
    saved = dict(zip(table.iloc[:, 0], table[t("compression.table_saved", lang, dtype="bfloat16")], strict=True))
    fp8_default, fp8_calculated = named("fp8", " (scale=1.0)", lang), named("fp8", " (--calculate-kv-scales)", lang)
    assert saved[fp8_default] == saved[fp8_calculated] == "50.0%"  # against bfloat16, not 75%
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    tradeoff, strip, attention = charts
    assert sum(len(t_["x"]) for t_ in tradeoff["data"]) == len(table) - 1  # every method on one chart
    assert len(strip["data"][0]["y"]) == len(table)  # a strip row per method
    assert len(attention["data"]) == 2  # full beside compressed
    title = tradeoff["layout"]["title"]["text"]
    assert ("캐시" in title or "방법" in title) if lang == "ko" else "Memory saved" in title
    # SnapKV at 50% of a 128-token chunk: the 64-token prompt is within its budget, so nothing was dropped
    assert any(named("snapkv", " (64)", lang) in i.value for i in at.info)
    # The sinks' value: StreamingLLM against the window at each budget, the same perplexities as the table's
    ppl = dict(zip(table.iloc[:, 0], table[t("compression.table_ppl", lang)], strict=True))
    lines = [m.value for m in at.markdown if m.value.startswith(t("compression.sink_value", lang).split("{")[0])]
    assert len(lines) == 2, lines  # both budgets
    for line in lines:
        budget = int(re.search(r"\d+", line).group())
        streaming, window = (float(x) for x in re.findall(r"\*\*([\d.]+)\*\*", line))
        assert streaming == pytest.approx(ppl[named("streaming", f" ({budget})", lang)], abs=0.006)
        assert window == pytest.approx(ppl[named("window", f" ({budget})", lang)], abs=0.006)
    hollow = [d for d in tradeoff["data"] if d["name"] == named("snapkv", " (64)", lang)]
    assert hollow[0]["marker"]["symbol"].endswith("-open") and hollow[0]["x"] == [0.0]


def test_savings_follow_the_chosen_kv_dtype_and_survive_a_language_switch():
    """The quality axis (and every choice made after a run) stays when the language changes; savings are
    redrawn for another KV dtype without measuring again."""
    at = measured("en")
    at.radio(key="_w_kv_url_metric").set_value("top1").run()
    at.selectbox(key="_w_kv_url_kvdtype").set_value("float32").run()
    assert "Top-1" in json.loads(at.get("plotly_chart")[0].proto.spec)["layout"]["yaxis"]["title"]["text"]
    at.radio(key="_w_kv_lang").set_value("ko").run()
    assert not at.exception
    assert at.radio(key="_w_kv_url_metric").value == "top1"
    assert at.selectbox(key="_w_kv_url_kvdtype").value == "float32"
    table = at.dataframe[0].value
    saved = dict(zip(table.iloc[:, 0], table[t("compression.table_saved", "ko", dtype="float32")], strict=True))
    assert saved[named("fp8", " (scale=1.0)", "ko")] == "75.0%"
    assert json.loads(at.get("plotly_chart")[0].proto.spec)["layout"]["yaxis"]["title"]["text"] == t(
        "compression.chart_top1", "ko")


def opened(lang: str, shape: DecoderConfig = SMALL, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = shape
    at.query_params["lang"] = lang
    for k, v in query.items():
        at.query_params[k] = v
    at.switch_page(PAGE)
    return at.run()


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_a_text_shorter_than_a_chunk_is_refused_in_words(lang):
    at = opened(lang, text="own", tokens="256")
    at.text_area(key="compression_own_text").input("Just a few words.").run()
    finished(at.button(key="compression_run").click().run())
    assert not at.exception
    (error,) = at.error
    # the count of tokens the text has, and the 128 one chunk needs
    assert any(t("compression.text_too_short", lang, n_tokens=n, seq_len=128) in error.value for n in range(1, 20))
    assert not at.get("plotly_chart") and not at.dataframe  # no figure describes tokens that were not there


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_changed_settings_keep_the_last_results_labelled(lang):
    at = measured(lang)
    before = at.dataframe[0].value
    at.multiselect(key="_w_compression_budgets").set_value([0.5]).run()
    assert not at.exception
    (note,) = [i.value for i in at.info if t("compression.run", lang) in i.value]
    assert "budgets 33, 64" in note or "예산 33, 64" in note  # the budgets the shown run was measured with
    assert at.dataframe[0].value.equals(before) and len(at.get("plotly_chart")) == 3


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_settings_raised_are_said_next_to_their_control(lang):
    at = opened(lang)
    # 25% of 128 is 32 positions: SnapKV's window of 32 needs 33
    assert t("compression.budget_raised", lang, shares="25%", seq_len=128, asked="32", kept=33, window=32) in [
        c.value for c in at.caption]
    at = opened(lang, dataclasses.replace(SMALL, max_seq_len=512), seq="512", tokens="256")
    assert t("compression.tokens_raised", lang, n_tokens=256, seq_len=512) in [c.value for c in at.caption]


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_time_left_beside_the_progress_and_cancel_keeps_what_was_measured(lang):
    at = opened(lang, text="own", tokens="2048")  # 16 chunks of 128: far more than one tick's second of work
    at.text_area(key="compression_own_text").input(TEXT * 6).run()
    at.button(key="compression_run").click().run()
    run = at.session_state["compression_sweep"][1]
    assert not run.finished and 0 < run.done < run.sweep.total
    (bar,) = at.get("progress")  # drawn before the tick's work: nothing measured yet, no time left to tell
    assert bar.proto.text == t("compression.progress", lang, done=0, total=run.sweep.total,
                               left=t("compression.time_left_unknown", lang))
    done, seconds = run.done, run.seconds
    at.run()  # the next tick draws where the last one left the run, then measures on
    assert not run.finished and done < run.done < run.sweep.total
    (bar,) = at.get("progress")
    left = round(seconds / done * (run.sweep.total - done))  # the measured time per pass, times passes
    assert bar.proto.text == t("compression.progress", lang, done=done, total=run.sweep.total,
                               left=t("compression.time_left", lang, seconds=left))
    assert at.button(key="compression_run").disabled and not at.button(key="compression_cancel").disabled
    while not run.rows:  # until the first chunk's batch is done
        at.run()
    at.button(key="compression_cancel").click().run()
    assert not at.exception and run.cancelled and "compression_sweep" not in at.session_state
    request, rows, partial = at.session_state["compression_result"]
    assert partial == (run.done, run.sweep.total, 14) and rows == run.rows  # 8 evictions, 3 KIVI, 2 fp8, mqa
    (warning,) = [w.value for w in at.warning]
    chunks = sorted({r.n_predicted // 64 for r in rows})
    assert warning == t("compression.partial", lang, done=run.done, total=run.sweep.total, measured=len(rows) - 1,
                        methods=14, chunks="–".join(map(str, dict.fromkeys([chunks[0], chunks[-1]]))))
    table = at.dataframe[0].value  # what was measured is drawn: the table, the chart, the strips
    assert len(table) == len(rows) and len(at.get("plotly_chart")) == 3
    assert list(table[t("compression.table_ppl", lang)])[1:] == [round(r.perplexity, 3) for r in rows[1:]]
    assert not at.button(key="compression_run").disabled and at.button(key="compression_cancel").disabled


def test_the_default_tokens_follow_the_models_size():
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = SMALL  # 0.6M parameters: the small model's default
    at.switch_page(PAGE)
    at.run()
    assert at.selectbox[[s.label for s in at.selectbox].index(t("compression.n_tokens", "en"))].value == 512
