"""The Training · Prefill · Decode and Check pages, headless (AppTest): numbers read off the page and figures."""
import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from kvviz.charts.base import LECTURE_MAX_HEIGHT
from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import tokenizer_for
from kvviz.lessons import causal, quiz
from kvviz.units import format_binary

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TRAINING = "pages/5_Training_Prefill_Decode.py"
CHECK = "pages/6_Check.py"
SMALL = DecoderConfig(n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=300, max_seq_len=128)


def open_page(page: str, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = SMALL  # a small random model keeps the test quick
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page(page)
    return at.run()


def _decode(obj):  # noqa: ANN001, ANN202 - JSON
    """Plotly writes numpy arrays as {dtype, bdata (base64), shape}: turn them back into lists."""
    if isinstance(obj, dict) and "bdata" in obj and "dtype" in obj:
        array = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"])
        shape = obj.get("shape")
        return array.reshape([int(n) for n in str(shape).split(",")] if shape else -1).tolist()
    if isinstance(obj, dict):
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def figure(at: AppTest, key: str) -> dict:
    charts = [c for c in at.get("plotly_chart") if c.proto.id.endswith("-" + key)]
    assert len(charts) == 1, key
    return _decode(json.loads(charts[0].proto.spec))


def metric(at: AppTest, label: str) -> float:
    return float(next(m.value for m in at.metric if m.label == label).split()[0])


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_training_page_parallel_equals_sequential(lang):
    at = open_page(TRAINING, lang=lang)
    assert not at.exception
    assert at.title[0].value == ("학습 · 프리필 · 디코드" if lang == "ko" else "Training · Prefill · Decode")
    dk = metric(at, "최대 |ΔK|" if lang == "ko" else "max |ΔK|")
    dlogits = metric(at, "최대 |Δ로짓|" if lang == "ko" else "max |Δlogits|")
    assert 0 <= dk < 1e-5 and 0 <= dlogits < 1e-4
    assert at.success  # the "identical up to rounding" verdict
    logits = figure(at, "training_logits_diff")
    prefill, decode, tolerance = logits["data"]
    assert max(prefill["customdata"] + decode["customdata"]) < 1e-4  # the true differences (y is floored for log)
    n_tokens = len(tokenizer_for(at.session_state["kv_shape"]).encode(causal.PRESETS["cat"]))
    assert len(prefill["customdata"]) + len(decode["customdata"]) == n_tokens  # every position of the preset
    tol = tolerance["y"][0]
    assert tolerance["y"] == [tol, tol] and max(decode["customdata"]) < tol < 1e-3
    assert f"{tol:.2e}" in at.success[0].value  # the line is the tolerance the verdict states
    assert logits["layout"]["yaxis"]["type"] == "log"
    mask = figure(at, "training_mask")["data"][0]["z"]
    assert mask[0][1] == 0 and mask[1][0] == 1 and mask[-1][-1] == 1  # lower triangle
    # Every chart has Plotly's toolbar with a PNG download, every table a CSV download.
    for chart in at.get("plotly_chart"):
        config = json.loads(chart.proto.config)
        assert config["displayModeBar"] is True and config["toImageButtonOptions"]["format"] == "png"
    csv_buttons = {b.key for b in at.get("download_button")}
    assert csv_buttons >= {"training_prefill_decode_csv", "training_kv_diff_by_layer_csv"}


def test_bidirectional_switch_moves_past_kv_above_layer_one():
    at = open_page(TRAINING)
    causal_bars = figure(at, "training_drift")["data"][:2]
    assert max(max(t["customdata"]) for t in causal_bars) < 1e-6
    at.radio(key="_w_kv_url_attn").set_value("bidirectional").run()
    assert not at.exception
    k_bars, v_bars, tol = figure(at, "training_drift")["data"]
    assert k_bars["customdata"][0] < tol["y"][0] and v_bars["customdata"][0] < tol["y"][0]  # layer 1: own embedding
    assert all(y > 1e-3 for y in k_bars["customdata"][1:]) and all(y > 1e-4 for y in v_bars["customdata"][1:])
    assert at.error and "changed the K/V" in at.error[0].value
    mask = figure(at, "training_mode_mask")["data"][0]["z"]
    assert all(v == 1 for row in mask for v in row)  # no mask: every query sees every key
    assert at.query_params["attn"] == "bidirectional"  # the switch is in the link


def test_link_reproduces_the_view_and_bad_values_are_explained():
    at = open_page(TRAINING, preset="code", steps="5", attn="bidirectional")
    assert not at.exception
    assert at.selectbox(key="_w_kv_url_preset").value == "code"
    assert at.slider(key="_w_kv_url_steps").value == 5
    assert at.radio(key="_w_kv_url_attn").value == "bidirectional"
    n_tokens = len(tokenizer_for(at.session_state["kv_shape"]).encode(causal.PRESETS["code"]))
    assert f"prefills {n_tokens - 5} and then runs 5 decode steps" in " ".join(c.value for c in at.caption)
    bad = open_page(TRAINING, steps="many", preset="nope")
    assert not bad.exception
    assert len(bad.warning) == 2 and any("“many”" in w.value for w in bad.warning)
    assert bad.slider(key="_w_kv_url_steps").value == 8


def test_lecture_mode_from_the_link():
    at = open_page(TRAINING, lecture="1", idea="3")
    assert not at.exception
    assert at.session_state["kv_lecture"] is True
    assert at.toggle(key="_w_kv_lecture").value is True
    # one idea per screen, its title beside the stepper (no section header repeats it)
    assert [h.value for h in at.subheader] == ["The condition for reuse: the causal mask"] and not at.header
    drift = figure(at, "training_drift")
    assert drift["layout"]["font"]["size"] == 18 and drift["layout"]["height"] <= LECTURE_MAX_HEIGHT
    at.toggle(key="_w_kv_lecture").set_value(False).run()
    assert len(at.header) == 5 and "lecture" not in at.query_params


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_check_page_runs_and_locks_reveal_until_a_prediction(lang):
    at = open_page(CHECK, lang=lang)
    assert not at.exception
    assert len(at.radio) == 1 + 9  # language + nine choice / true-false predictions
    assert all(b.disabled for b in at.button if b.key.startswith("reveal_"))
    at.radio(key="predict_m_training").set_value("true").run()
    assert not at.button(key="reveal_m_training").disabled
    at.button(key="reveal_m_training").click().run()
    assert not at.exception
    assert at.radio(key="predict_m_training").disabled  # the prediction is locked once revealed
    assert at.error and ("거짓" if lang == "ko" else "False") in at.error[0].value


def test_check_cache_size_answer_is_the_calculators_64_gib():
    total = format_binary(quiz.cache_size_memory().total)
    assert total == "64.00 GiB"
    at = open_page(CHECK)
    at.number_input(key="predict_cache_size").set_value(64.0).run()
    at.button(key="reveal_cache_size").click().run()
    assert not at.exception
    assert at.success[0].value == f"Correct: 64 GiB. The calculator gives {total}."
    main_links = [link.proto.label for link in at.main.get("page_link")]
    if (Path(APP).parent / "pages/3_Memory_Footprint.py").exists():  # link only pages that exist
        assert main_links == ["Memory Footprint"]
    at.button(key="again_cache_size").click().run()
    at.number_input(key="predict_cache_size").set_value(68.7).run()
    at.button(key="reveal_cache_size").click().run()
    assert "decimal gigabytes" in at.error[0].value and total in at.error[0].value


def test_bfloat16_verdicts_follow_the_stated_tolerance():
    """Issue 19 #16: in bf16, 6.25e-02 was called a disagreement while every greedy token matched."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["kv_dtype"] = "bfloat16"  # the shipped model, as the issue saw it
    at.switch_page(TRAINING)
    at.run()
    assert not at.exception and not at.warning
    assert "Identical up to floating-point rounding" in at.success[0].value
    same = next(m.value for m in at.metric if m.label == "Same greedy token").split(" / ")
    assert same[0] == same[1]
    stated = [float(x) for x in at.success[0].value.split("(")[1].split(")")[0].split(", ")]
    diffs = [metric(at, label) for label in ("max |ΔK|", "max |ΔV|", "max |Δlogits|")]
    assert all(d <= t for d, t in zip(diffs, stated, strict=True))  # every verdict against the number it states
    assert "within the rounding tolerance" in at.success[1].value  # the causal section agrees with its own numbers


def test_captions_say_the_numbers_beside_them():
    """Issue 19 #17: 'zero in both modes' beside 5.96e-07, 'agree exactly' beside ~1e-6."""
    at = open_page(TRAINING)
    captions = " ".join(c.value for c in at.caption)
    layer1 = metric(at, "Change in layer 0")
    if layer1 != 0:
        assert "exactly zero" not in captions and f"{layer1:.2e}" in captions
    prefill = figure(at, "training_logits_diff")["data"][0]["customdata"]
    assert f"{sum(d == 0 for d in prefill)} of {len(prefill)} prefill positions agree exactly" in captions
    assert f"{max(prefill):.2e}" in captions


def test_a_too_short_text_keeps_the_rest_of_the_page():
    """Issue 19 #22: the comparison heading vanished (st.stop) after a text too short to run."""
    at = open_page(TRAINING, preset="custom", text="a")
    assert not at.exception
    assert at.error and "at least 2" in at.error[0].value
    assert [h.value for h in at.header] == ["Training, prefill and decode compared"]


def test_training_enforces_the_hosted_kv_budget(monkeypatch):
    """Every page that runs the model enforces the hosted caps (issue 19 #2, on this page)."""
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_KV_BUDGET_BYTES", "2000")
    at = open_page(TRAINING)
    assert not at.exception and not at.get("plotly_chart")  # nothing ran
    assert "2,000 B" in at.error[0].value or "1.95 KiB" in at.error[0].value
    assert [h.value for h in at.header] == ["Training, prefill and decode compared"]


def test_layers_are_counted_from_zero_as_on_the_decode_page():
    """Issue 12 item 11: one numbering of layers on every page (0-based, as model.layers.0 is named)."""
    at = open_page(TRAINING)
    assert any(m.label == "Change in layer 0" for m in at.metric)
    assert not any(m.label == "Change in layer 1" for m in at.metric)
