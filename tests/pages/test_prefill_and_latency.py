"""Prefill & Decode and Latency & Capacity headless (AppTest): they run, stream, sweep, cancel and chart."""
import dataclasses
import json
import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.engine import sweep_stats as stats
from kvviz.engine.config import DecoderConfig

APP = str(Path(__file__).resolve().parents[2] / "app.py")
SMALL = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=128)


def _open(page: str, lang: str = "en", shape: DecoderConfig = SMALL) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["lang"] = lang
    at.session_state["kv_model"] = "random"  # a small custom shape keeps the sweeps quick
    at.session_state["kv_shape"] = shape
    at.switch_page(page).run()
    assert not at.exception
    return at


@pytest.mark.parametrize("lang", ["en", "ko"])
@pytest.mark.parametrize("page, title", [
    ("pages/2_Prefill_and_Decode.py", ("Prefill & Decode", "프리필과 디코드")),
    ("pages/4_Latency_and_Capacity.py", ("Latency & Capacity", "지연 시간과 처리 용량")),
])
def test_pages_run_in_both_languages(page, title, lang):
    at = _open(page, lang)
    assert at.title[0].value == title[lang == "ko"]
    assert not at.error


@pytest.mark.parametrize("lang, chart_title", [("en", "Batch size: latency, throughput, cache"),
                                               ("ko", "배치 크기: 지연, 처리량, 캐시")])
def test_batch_sweep_chart_in_both_languages(lang, chart_title):
    at = _open("pages/4_Latency_and_Capacity.py", lang)
    max_len = at.session_state["kv_shape"].max_seq_len
    at.text_input(key="latency_b_batches").set_value("1, 2")
    at.number_input(key=f"latency_b_prompt_{max_len}").set_value(8)
    at.number_input(key="latency_b_new").set_value(3)
    at.button(key="latency_start_batch").click().run()
    _until(at, lambda: at.session_state["latency_run_batch"].finished)
    at.run()
    assert not at.exception
    rows = at.session_state["latency_run_batch"].rows
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if json.loads(c.proto.spec)["layout"]["title"]["text"] == chart_title)
    kv = spec["data"][2]
    assert kv["x"] == [1, 2] and kv["y"] == pytest.approx([r["kv_bytes"] / 2**20 for r in rows])
    assert rows[1]["kv_bytes"] == 2 * rows[0]["kv_bytes"] == 2 * rows[0]["kv_formula_bytes"]


def _until(at: AppTest, done, limit: int = 60, pause_s: float = 0.0) -> None:
    """Rerun until `done()`, at most `limit` times (`pause_s` between: a worker process measuring on its own)."""
    for _ in range(limit):
        if done():
            return
        time.sleep(pause_s)
        at.run()
    raise AssertionError("did not finish")


def _run_request(at: AppTest, n_prompt: int, n_new: int, repeats: int = 2) -> None:
    max_len = at.session_state["kv_shape"].max_seq_len
    at.number_input(key=f"prefill_prompt_{max_len}").set_value(n_prompt)
    at.number_input(key=f"prefill_new_{max_len}_{max_len - 1}").set_value(n_new)
    if repeats is not None:
        at.number_input(key="prefill_repeats").set_value(repeats)
    at.button(key="prefill_run").click().run()
    _until(at, lambda: not at.session_state["prefill_running"])
    at.run()
    assert not at.exception


def test_prefill_decode_measures_whole_runs_and_draws_the_median_one():
    at = _open("pages/2_Prefill_and_Decode.py")
    _run_request(at, 40, 12, repeats=3)
    request = at.session_state["prefill_request"]
    runs = request.finished_runs
    assert len(runs) == 3 and all(len(g.prompt_ids) == 40 and g.n_generated == 12 for g in runs)
    totals = [sum(e.seconds for e in g.events) + g.events[0].queue_s for g in runs]
    gen = runs[sorted(range(3), key=totals.__getitem__)[1]]  # the median run by T
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["layout"]["title"]["text"].startswith("Per-token latency, run ")
    bars = {d["name"]: d for d in spec["data"]}
    names = list(bars)
    prefill, decode, cumulative = bars[names[1]], bars[names[2]], bars[names[3]]
    assert prefill["y"] == [pytest.approx(gen.events[0].seconds * 1e3)]
    assert decode["x"] == list(range(2, 13)) and decode["y"] == pytest.approx([e.seconds * 1e3 for e in gen.events[1:]])
    assert cumulative["y"][-1] == pytest.approx(1e3 * (gen.events[0].queue_s + sum(e.seconds for e in gen.events)))
    assert len(at.metric) == 4
    text = " ".join(m.value for m in at.markdown)
    assert "T = TTFT + (12 − 1)·mean TPOT" in text and "+ -" not in text
    assert "Within tolerance in" in text


def _probe_timed_regions(monkeypatch, owner) -> tuple[list[bool], list[int]]:
    """A probe on Streamlit's element queue recording whether quiet() was open at each call, and a count of the
    quiet() regions `owner` (the module whose `quiet` the page's code calls) entered."""
    from streamlit.delta_generator import DeltaGenerator

    from kvviz.engine import timing

    calls, entered = [], []
    enqueue, quiet = DeltaGenerator._enqueue, owner.quiet

    def probe(self, *args, **kwargs):
        calls.append(timing.in_quiet())
        return enqueue(self, *args, **kwargs)

    def counted_quiet(*args, **kwargs):
        entered.append(1)
        return quiet(*args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "_enqueue", probe)
    monkeypatch.setattr(owner, "quiet", counted_quiet)
    return calls, entered


def test_the_timed_region_draws_nothing(monkeypatch):
    """Every element the page sends while the model is timed would compete with it: a probe on Streamlit's
    element queue records whether quiet() was open at each call (none may be), and that quiet() was used."""
    from kvviz.engine import timing

    calls, entered = _probe_timed_regions(monkeypatch, timing)
    at = _open("pages/2_Prefill_and_Decode.py")
    _run_request(at, 24, 6)
    assert len(at.session_state["prefill_request"].finished_runs) == 2
    assert entered and calls and not any(calls)


def test_a_sweeps_timed_region_draws_nothing(monkeypatch):
    from kvviz.engine import sweeps

    calls, entered = _probe_timed_regions(monkeypatch, sweeps)
    at = _open("pages/4_Latency_and_Capacity.py")
    max_len = at.session_state["kv_shape"].max_seq_len
    at.text_input(key=f"latency_p_lengths_{max_len}").set_value("8, 16").run()
    at.button(key="latency_start_prompt-length").click().run()
    _until(at, lambda: at.session_state["latency_run_prompt-length"].finished)
    assert len(at.session_state["latency_run_prompt-length"].rows) == 2
    assert len(entered) >= 2 and calls and not any(calls)


def test_results_of_another_model_are_not_shown_as_this_ones():
    """Issue 19.6: after a model change the page showed the old model's timings under the new model's caption."""
    at = _open("pages/2_Prefill_and_Decode.py")
    _run_request(at, 16, 4, repeats=None)  # the default
    assert at.get("plotly_chart")
    at.session_state["kv_dtype"] = "bfloat16"  # another model: same shape, other weights
    at.run()
    assert not at.get("plotly_chart") and not at.metric
    assert any("were measured on" in w.value and "Run request" in w.value for w in at.warning)


def test_a_number_out_of_range_is_refused_with_its_range():
    """Issue 19.7: 0, −5 or 100000 typed into a box was silently replaced by the previous value."""
    at = _open("pages/2_Prefill_and_Decode.py")
    max_len = at.session_state["kv_shape"].max_seq_len
    box = f"prefill_prompt_{max_len}"
    at.number_input(key=box).set_value(20).run()
    for bad in (0, -5, 100000):
        at.number_input(key=box).set_value(bad).run()
        assert not at.exception
        assert any(f"{bad:,} is outside the allowed range 1 … {max_len - 1:,}, so it was not used. "
                   "The previous value, 20, stays." in e.value for e in at.error)
    at.button(key="prefill_run").click().run()
    _until(at, lambda: not at.session_state["prefill_running"])
    assert all(len(g.prompt_ids) == 20 for g in at.session_state["prefill_request"].runs)


def test_prompt_length_sweep_fills_its_chart_and_csv():
    at = _open("pages/4_Latency_and_Capacity.py")
    max_len = at.session_state["kv_shape"].max_seq_len
    at.text_input(key=f"latency_p_lengths_{max_len}").set_value("8, 16, 32")
    at.number_input(key="latency_p_new").set_value(3)
    at.button(key="latency_start_prompt-length").click().run()
    _until(at, lambda: at.session_state["latency_run_prompt-length"].finished)
    at.run()
    assert not at.exception
    rows = at.session_state["latency_run_prompt-length"].rows
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "TTFT" in json.loads(c.proto.spec)["layout"]["title"]["text"])
    ttft = spec["data"][0]
    assert ttft["x"] == [8, 16, 32] and ttft["y"] == pytest.approx([r["ttft_s"] * 1e3 for r in rows])
    # each point is a median of 5 whole runs, its bar from the fastest to the slowest
    assert all(r["repeats"] == 5 and len(r["runs"]) == 5 for r in rows)
    assert ttft["error_y"]["array"] == pytest.approx([(r["ttft_max_s"] - r["ttft_s"]) * 1e3 for r in rows])
    assert ttft["error_y"]["arrayminus"] == pytest.approx([(r["ttft_s"] - r["ttft_min_s"]) * 1e3 for r in rows])
    # the dashed curve is the cost model fitted to every run: fixed + per token + per pair of tokens
    fit = stats.model_fits("prompt-length", rows)["ttft_s"]
    curve = spec["data"][1]
    assert curve["name"] == "TTFT fit: fixed + per token + per pair" and len(fit.coef) == 3
    assert curve["y"] == pytest.approx([fit(x) * 1e3 for x in curve["x"]]) and curve["x"][0] == 8
    axis = spec["layout"]["xaxis"]  # labels are the full numbers, rising: never "…9, 10, 2"
    assert [float(t.replace(",", "")) for t in axis["ticktext"]] == axis["tickvals"] == sorted(axis["tickvals"])
    text = " ".join(m.value for m in at.markdown)
    assert "Fitted to all 15 runs" in text and " ± " in text and "+ -" not in text and "+ −" not in text
    assert ("TTFT rises with the prompt" in text or "Too noisy to tell" in text or "TTFT is flat" in text)


def test_cancel_keeps_the_rounds_done():
    at = _open("pages/4_Latency_and_Capacity.py", shape=dataclasses.replace(SMALL, max_seq_len=1024))
    max_len = at.session_state["kv_shape"].max_seq_len
    # 12 contexts in both modes, 10 rounds (the first a warm-up): far more than one tick's second of measuring.
    at.text_input(key=f"latency_c_contexts_{max_len}").set_value(", ".join(map(str, range(10, 1001, 90))))
    at.number_input(key="latency_c_repeats").set_value(9)
    at.button(key="latency_start_cache").click().run()
    run = at.session_state["latency_run_cache"]
    assert run.done == 0 and run.sweep.total == 10 * 24  # the Start rerun draws the page; measuring begins next
    _until(at, lambda: run.rows)  # the first measured round complete
    assert not run.finished and 1 <= run.done < run.sweep.total
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert not any("One decode step" in t for t in titles)  # no chart while measuring
    assert not at.button(key="latency_cancel_cache").disabled and at.button(key="latency_start_cache").disabled
    at.button(key="latency_cancel_cache").click().run()
    assert run.cancelled and run.finished and run.done < run.sweep.total
    rounds = run.rows[0]["repeats"]
    assert len(run.rows) == 24 and all(r["repeats"] == rounds == len(r["runs"]) for r in run.rows)
    assert at.button(key="latency_cancel_cache").disabled and not at.button(key="latency_start_cache").disabled
    at.run()
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("One decode step"))
    assert sum(len(d["x"]) for d in spec["data"] if not d["name"].startswith("fit")) == 24
    assert any(f"Cancelled after {run.done} of 240 runs: the 24 settings below are kept" in p.proto.text
               for p in at.get("progress"))


def test_bad_list_shows_a_message_not_a_traceback():
    at = _open("pages/4_Latency_and_Capacity.py")
    at.text_input(key="latency_b_batches").set_value("1, two").run()
    at.button(key="latency_start_batch").click().run()
    assert not at.exception
    assert any("whole numbers" in e.value for e in at.error)


def test_roofline_tab_shows_the_llama3_8b_bound():
    at = _open("pages/4_Latency_and_Capacity.py")
    assert any("= **4.95 ms**" in m.value for m in at.markdown)  # (16.06 GB + 0.54 GB) / 3.35 TB/s, Llama-3.1-8B
    at.number_input(key="latency_r_batch").set_value(8).run()
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("Decode TPOT"))
    memory = spec["data"][0]
    i = memory["x"].index(8)
    assert memory["y"][i] == pytest.approx((2 * 8_030_261_248 + 8 * 536_870_912) / 3.35e12 * 1e3)  # Llama-3.1-8B preset


def test_hosted_demo_caps_sweep_points(monkeypatch):
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_MAX_SWEEP_POINTS", "3")
    at = _open("pages/4_Latency_and_Capacity.py")
    max_len = at.session_state["kv_shape"].max_seq_len
    at.text_input(key=f"latency_p_lengths_{max_len}").set_value("8, 16, 32, 64")
    at.button(key="latency_start_prompt-length").click().run()
    assert not at.exception
    assert "latency_run_prompt-length" not in at.session_state  # refused before anything ran
    assert any("at most 3 points per sweep, got 4" in e.value for e in at.error)


def test_roofline_inputs_at_their_limits_read_truthfully():
    """Issue 19.21: peak 0.01 TFLOP/s gave 'batch 0' and 'ridge point 0'; 10,000,000 tokens '26668357.15 ms';
    0.1 GB 'Requests that fit 0' without saying the weights do not fit."""
    at = _open("pages/4_Latency_and_Capacity.py")
    hw = at.selectbox(key="latency_r_hw").value
    at.number_input(key=f"latency_r_peak_{hw}").set_value(0.01).run()
    assert not at.exception
    compute = next(m for m in at.metric if m.label == "Compute-bound from batch")
    assert compute.value == "1"
    captions = " ".join(c.value for c in at.caption)
    assert "ridge point: 0 FLOP" not in captions and "compute-bound from the first request" in captions
    at.number_input(key="latency_r_context").set_value(10_000_000).run()
    text = " ".join([m.value for m in at.markdown] + [str(m.value) for m in at.metric])
    assert "26668357.15 ms" not in text and not any(len(w) > 12 and w.replace(".", "").isdigit() for w in text.split())
    assert " h" in text or " min" in text or "days" in text
    # vLLM refuses a max_model_len past the model's context (131,072 for Llama 3.1): no requests-that-fit figure
    assert any("131072 tokens" in c.value for c in at.caption)
    at.number_input(key="latency_r_context").set_value(4096).run()
    at.number_input(key=f"latency_r_mem_{hw}").set_value(0.1).run()
    assert any("do not fit in this memory" in e.value for e in at.error)


def test_roofline_refuses_a_block_format_the_heads_do_not_fit():
    """llama.cpp's q8_0 on a d_head of 16 (the SMALL shape): a message, as llama.cpp refuses it, not a traceback."""
    at = _open("pages/4_Latency_and_Capacity.py")
    names = at.selectbox(key="latency_r_model").options
    at.selectbox(key="latency_r_model").set_value(names[-1]).run()  # the model in use, d_head 64 / 4 = 16
    at.selectbox(key="latency_r_kvdtype").set_value("q8_0").run()
    assert not at.exception
    assert any("not whole blocks" in e.value for e in at.error)
    at.selectbox(key="latency_r_model").set_value("Llama-3.1-8B").run()  # d_head 128 = 4 blocks: sized
    assert not at.error and any("ms**" in m.value for m in at.markdown)


# ---- issue 29 -------------------------------------------------------------------------------------------------
def _number(text: str, unit: str = "ms") -> float:
    return float(re.search(rf"([\d.]+) {unit}", text).group(1))


def test_cards_and_formula_show_the_same_run():
    """Issue 29.4: the TTFT card (a median over runs) and the formula under it (the drawn run) disagreed, and
    'decode alone' came from the mean TPOT beside a p50 card. Every figure is now the drawn run's, named."""
    at = _open("pages/2_Prefill_and_Decode.py")
    _run_request(at, 40, 12, repeats=3)
    runs = at.session_state["prefill_request"].finished_runs
    totals = [sum(e.seconds for e in g.events) + g.events[0].queue_s for g in runs]
    gen = runs[sorted(range(3), key=totals.__getitem__)[1]]  # the median run by T, the one drawn
    cards = {m.label: m.value for m in at.metric}
    ttft = gen.events[0].queue_s + gen.events[0].seconds
    assert cards["TTFT"] == f"{ttft * 1e3:.2f} ms"
    assert cards["T (measured)"] == f"{(ttft + sum(e.seconds for e in gen.events[1:])) * 1e3:.2f} ms"
    formula = next(m.value for m in at.markdown if m.value.startswith("**T = TTFT"))
    assert f"= {cards['TTFT']} + (12 − 1)·" in formula  # the formula's TTFT is the card's
    p50 = next(m.value for m in at.markdown if "TPOT_p50 = TTFT" in m.value)
    assert f"·{cards['TPOT (p50)']} =" in p50
    rate = next(c.value for c in at.caption if c.value.startswith("decode alone"))
    assert f"= 1 / TPOT p50 ({cards['TPOT (p50)']})" in rate
    tpot_ms = _number(cards["TPOT (p50)"])  # shown to 2 decimals: up to 0.005 ms off, a large share below 1 ms
    assert _number(rate, "tokens/s") == pytest.approx(1e3 / tpot_ms, rel=0.01 + 0.005 / tpot_ms)
    captions = " ".join(c.value for c in at.caption)
    assert "the median of the 3 runs by T (the one drawn)" in captions


def test_one_run_says_there_is_no_spread_yet():
    at = _open("pages/2_Prefill_and_Decode.py")
    _run_request(at, 24, 6, repeats=1)
    text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "with one run there is no run-to-run spread yet" in text
    assert "(—)" not in text and "—:" not in text
    assert re.search(r"Within tolerance in [01] of 1 run\.", text)
    assert any(p.proto.text == "6 / 6 tokens generated after a 24-token prompt, 1 run" for p in at.get("progress"))


def test_stop_before_a_whole_run_says_so():
    at = _open("pages/2_Prefill_and_Decode.py")
    max_len = at.session_state["kv_shape"].max_seq_len
    at.number_input(key=f"prefill_prompt_{max_len}").set_value(40)
    at.button(key="prefill_run").click().run()  # the Run rerun: measuring starts on the next tick
    at.button(key="prefill_stop").click().run()
    assert not at.exception and at.session_state["prefill_request"].stopped
    assert any("Stopped before a whole run was measured" in i.value for i in at.info)
    assert not at.button(key="prefill_run").disabled


def test_plurals_on_the_latency_pages():
    at = _open("pages/2_Prefill_and_Decode.py")
    _run_request(at, 127, 1, repeats=1)  # the context (128) leaves room for one new token
    assert any(p.proto.text == "1 / 1 token generated after a 127-token prompt, 1 run" for p in at.get("progress"))
    max_len = at.session_state["kv_shape"].max_seq_len
    at.number_input(key=f"prefill_new_{max_len}_{max_len - 1}").set_value(5).run()
    assert any("only 1 new token fits after this prompt" in w.value for w in at.warning)
    at = _open("pages/4_Latency_and_Capacity.py")
    assert any(json.loads(c.proto.spec)["layout"]["title"]["text"] == "KV cache of 1 request vs the weights"
               for c in at.get("plotly_chart"))


def test_korean_table_headers_are_korean():
    """Issue 29.8: snake_case column headers (prompt_tokens, ttft_min_s) and English modes on Korean pages."""
    at = _open("pages/4_Latency_and_Capacity.py", "ko")
    at.text_input(key="latency_c_contexts_128").set_value("8, 32")
    at.number_input(key="latency_c_repeats").set_value(1)
    at.button(key="latency_start_cache").click().run()
    _until(at, lambda: at.session_state["latency_run_cache"].finished)
    at.run()
    frame = at.dataframe[0].value
    assert list(frame.columns) == ["방식", "컨텍스트 (토큰)", "입력한 토큰", "실행 횟수", "스텝 (ms)",
                                   "스텝 (ms), 가장 빠름", "스텝 (ms), 가장 느림"]
    assert list(frame["방식"]) == ["KV 캐시 사용", "캐시 없음 (접두부 재계산)"] * 2
    rows = at.session_state["latency_run_cache"].rows
    assert list(frame["스텝 (ms)"]) == pytest.approx([round(r["seconds"] * 1e3, 3) for r in rows])


HOSTED_SMALL = {"KVVIZ_HOSTED": "1", "KVVIZ_KV_BUDGET_BYTES": "20000", "KVVIZ_MAX_SWEEP_POINTS": "3"}


def test_hosted_defaults_fit_the_caps(monkeypatch):
    """Issue 29.5: the default batch sweep (1, 2, 4, 8, 16) was refused under the default cap of 4, and defaults
    could ask for more points or KV bytes than the caps allow. Every default now starts without a refusal."""
    monkeypatch.setenv("KVVIZ_HOSTED", "1")  # the default caps: batch 4, 8 points, 64 MiB of KV
    at = _open("pages/4_Latency_and_Capacity.py")
    assert at.text_input(key="latency_b_batches").value == "1, 2, 4"
    at.button(key="latency_start_batch").click().run()
    assert not at.error and at.session_state["latency_run_batch"] is not None, [e.value for e in at.error]
    for name, value in HOSTED_SMALL.items():
        monkeypatch.setenv(name, value)
    at = _open("pages/4_Latency_and_Capacity.py")  # SMALL: 512 bytes of KV per token, so 39 tokens fit
    # 4 requests of a prompt and 16 new tokens would need 4 × 17 × 512 bytes: more than the budget
    assert at.text_input(key="latency_b_batches").value == "1, 2"
    for kind, key in (("prompt-length", "latency_p_lengths_128"), ("cache", "latency_c_contexts_128")):
        points = [int(v) for v in at.text_input(key=key).value.split(",")]
        assert len(points) <= 3 and max(points) <= 39
        at.button(key=f"latency_start_{kind}").click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert at.session_state[f"latency_run_{kind}"] is not None  # started, not refused
        at.button(key=f"latency_cancel_{kind}").click().run()
    at.button(key="latency_start_batch").click().run()
    assert not at.error, [e.value for e in at.error]
    at = _open("pages/2_Prefill_and_Decode.py")
    at.button(key="prefill_run").click().run()
    assert not at.error and at.session_state["prefill_running"], [e.value for e in at.error]


FIRST_SCREEN = """
import sys, threading
from streamlit.testing.v1 import AppTest
held = []
start = threading.Thread.start
threading.Thread.start = lambda self: held.append(self.name) if self.name == "kvviz-preload" else start(self)
at = AppTest.from_file("app.py", default_timeout=60)
at.switch_page(sys.argv[1]).run()
assert not at.exception, at.exception
assert held == ["kvviz-preload"], held
print("torch" in sys.modules, at.title[0].value, len(at.button), len(at.number_input))
"""


@pytest.mark.parametrize("page, title", [("pages/2_Prefill_and_Decode.py", "Prefill & Decode"),
                                         ("pages/3_Memory_Footprint.py", "Memory Footprint"),
                                         ("pages/4_Latency_and_Capacity.py", "Latency & Capacity")])
def test_opened_directly_the_first_screen_needs_no_torch(page, title):
    """Issue 29.10: a page opened directly (a link shared in a lecture chat) took 5.6 s on a fresh server against
    2.7 s for Home, importing torch and loading the model before its first screen. Now its title, settings and
    buttons are drawn from the model's description; the engine loads in the background afterwards."""
    import subprocess
    import sys

    root = Path(APP).parent
    out = subprocess.run([sys.executable, "-c", FIRST_SCREEN, page], cwd=root, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_loaded, rest = out.stdout.strip().split(" ", 1)
    assert torch_loaded == "False" and rest.startswith(title)
    n_buttons, n_numbers = map(int, rest.removeprefix(title).split())
    assert n_buttons >= 1 and n_numbers >= 3  # Run/Start (Run here); the request's or the scenario's numbers


@pytest.mark.parametrize("page, key", [("pages/2_Prefill_and_Decode.py", "prefill"),
                                       ("pages/4_Latency_and_Capacity.py", "latency")])
def test_check_noise_loads_the_model_it_times(page, key):
    """The first screen draws without the model; Check noise loads it, then times 30 identical passes."""
    at = _open(page)
    at.button(key=f"_noise_{key}_button").click().run()
    assert not at.exception
    assert any(re.match(r"Machine now: \*\*(quiet|busy|noisy)\*\* — 30 identical passes", c.value) for c in at.caption)


def test_a_budget_that_holds_almost_nothing_still_opens(monkeypatch):
    """A hosted KV budget of 1,000 bytes (one token of SMALL): the defaults shrink to settings that exist, and
    Start says why they are refused instead of the page failing (a geometric range cannot start at zero)."""
    monkeypatch.setenv("KVVIZ_HOSTED", "1")
    monkeypatch.setenv("KVVIZ_KV_BUDGET_BYTES", "1000")
    at = _open("pages/4_Latency_and_Capacity.py")
    assert not at.exception and at.text_input(key="latency_c_contexts_128").value == "2"
    at.button(key="latency_start_cache").click().run()
    assert not at.exception and any("KV cache needs" in e.value for e in at.error)
