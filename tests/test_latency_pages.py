"""Prefill & Decode and Latency & Capacity headless (AppTest): they run, stream, sweep, cancel and chart."""
import dataclasses
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.engine.config import DecoderConfig

APP = str(Path(__file__).resolve().parents[1] / "app.py")
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
    at.text_input(key="lc_b_batches").set_value("1, 2")
    at.number_input(key=f"lc_b_prompt_{max_len}").set_value(8)
    at.number_input(key="lc_b_new").set_value(3)
    at.button(key="lc_start_batch").click().run()
    _until(at, lambda: at.session_state["lc_run_batch"].finished)
    at.run()
    assert not at.exception
    rows = at.session_state["lc_run_batch"].rows
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if json.loads(c.proto.spec)["layout"]["title"]["text"] == chart_title)
    kv = spec["data"][2]
    assert kv["x"] == [1, 2] and kv["y"] == pytest.approx([r["kv_bytes"] / 2**20 for r in rows])
    assert rows[1]["kv_bytes"] == 2 * rows[0]["kv_bytes"] == 2 * rows[0]["kv_formula_bytes"]


def _until(at: AppTest, done, limit: int = 60) -> None:
    for _ in range(limit):
        if done():
            return
        at.run()
    raise AssertionError("did not finish")


def _run_request(at: AppTest, n_prompt: int, n_new: int, repeats: int = 2) -> None:
    max_len = at.session_state["kv_shape"].max_seq_len
    at.number_input(key=f"pd_prompt_{max_len}").set_value(n_prompt)
    at.number_input(key=f"pd_new_{max_len}_{max_len - 1}").set_value(n_new)
    if repeats is not None:
        at.number_input(key="pd_repeats").set_value(repeats)
    at.button(key="pd_run").click().run()
    _until(at, lambda: not at.session_state["pd_running"])
    at.run()
    assert not at.exception


def test_prefill_decode_measures_whole_runs_and_draws_the_median_one():
    at = _open("pages/2_Prefill_and_Decode.py")
    _run_request(at, 40, 12, repeats=3)
    request = at.session_state["pd_request"]
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
    assert len(at.session_state["pd_request"].finished_runs) == 2
    assert entered and calls and not any(calls)


def test_a_sweeps_timed_region_draws_nothing(monkeypatch):
    from kvviz.engine import sweeps

    calls, entered = _probe_timed_regions(monkeypatch, sweeps)
    at = _open("pages/4_Latency_and_Capacity.py")
    max_len = at.session_state["kv_shape"].max_seq_len
    at.text_input(key=f"lc_p_lengths_{max_len}").set_value("8, 16").run()
    at.button(key="lc_start_prompt-length").click().run()
    _until(at, lambda: at.session_state["lc_run_prompt-length"].finished)
    assert len(at.session_state["lc_run_prompt-length"].rows) == 2
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
    box = f"pd_prompt_{max_len}"
    at.number_input(key=box).set_value(20).run()
    for bad in (0, -5, 100000):
        at.number_input(key=box).set_value(bad).run()
        assert not at.exception
        assert any(f"{bad:,} is outside the allowed range 1 … {max_len - 1:,}, so it was not used. "
                   "The previous value, 20, stays." in e.value for e in at.error)
    at.button(key="pd_run").click().run()
    _until(at, lambda: not at.session_state["pd_running"])
    assert all(len(g.prompt_ids) == 20 for g in at.session_state["pd_request"].runs)


def test_prompt_length_sweep_fills_its_chart_and_csv():
    at = _open("pages/4_Latency_and_Capacity.py")
    max_len = at.session_state["kv_shape"].max_seq_len
    at.text_input(key=f"lc_p_lengths_{max_len}").set_value("8, 16, 32")
    at.number_input(key="lc_p_new").set_value(3)
    at.button(key="lc_start_prompt-length").click().run()
    _until(at, lambda: at.session_state["lc_run_prompt-length"].finished)
    at.run()
    assert not at.exception
    rows = at.session_state["lc_run_prompt-length"].rows
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "TTFT" in json.loads(c.proto.spec)["layout"]["title"]["text"])
    ttft = spec["data"][0]
    assert ttft["x"] == [8, 16, 32] and ttft["y"] == pytest.approx([r["ttft_s"] * 1e3 for r in rows])
    # each point is a median of 5 whole runs, its bar from the fastest to the slowest
    assert all(r["repeats"] == 5 and len(r["runs"]) == 5 for r in rows)
    assert ttft["error_y"]["array"] == pytest.approx([(r["ttft_max_s"] - r["ttft_s"]) * 1e3 for r in rows])
    assert ttft["error_y"]["arrayminus"] == pytest.approx([(r["ttft_s"] - r["ttft_min_s"]) * 1e3 for r in rows])
    assert spec["data"][1]["name"].startswith("TTFT fit, slope")
    axis = spec["layout"]["xaxis"]  # labels are the full numbers, rising: never "…9, 10, 2"
    assert [float(t.replace(",", "")) for t in axis["ticktext"]] == axis["tickvals"] == sorted(axis["tickvals"])
    text = " ".join(m.value for m in at.markdown)
    assert "over all 15 runs" in text and " ± " in text and "+ -" not in text
    assert ("per prompt token: its 95% interval lies above zero" in text or "Too noisy to tell" in text
            or "TTFT is flat" in text)


def test_cancel_keeps_the_rows_done():
    at = _open("pages/4_Latency_and_Capacity.py", shape=dataclasses.replace(SMALL, max_seq_len=1024))
    max_len = at.session_state["kv_shape"].max_seq_len
    # Long enough (68 settings, ~600 steps up to 1000 tokens) that one tick's 0.25 s cannot finish it.
    at.text_input(key=f"lc_c_contexts_{max_len}").set_value(", ".join(map(str, range(10, 1001, 30))))
    at.number_input(key="lc_c_repeats").set_value(9)
    at.button(key="lc_start_cache").click().run()
    run = at.session_state["lc_run_cache"]
    assert run.rows == []  # the Start rerun draws the page; measuring begins on the next tick
    at.run()
    assert 1 <= len(run.rows) < 68 and not run.finished
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert not any("One decode step" in t for t in titles)  # no chart while measuring
    at.button(key="lc_cancel_cache").click().run()
    assert run.cancelled and 1 <= len(run.rows) < 68
    kept = len(run.rows)
    at.run()
    assert len(at.session_state["lc_run_cache"].rows) == kept
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("One decode step"))
    assert sum(len(d["x"]) for d in spec["data"] if "slope" not in d["name"]) == kept


def test_bad_list_shows_a_message_not_a_traceback():
    at = _open("pages/4_Latency_and_Capacity.py")
    at.text_input(key="lc_b_batches").set_value("1, two").run()
    at.button(key="lc_start_batch").click().run()
    assert not at.exception
    assert any("whole numbers" in e.value for e in at.error)


def test_roofline_tab_shows_the_llama3_8b_bound():
    at = _open("pages/4_Latency_and_Capacity.py")
    assert any("= **4.95 ms**" in m.value for m in at.markdown)  # (16.06 GB + 0.54 GB) / 3.35 TB/s, Llama-3.1-8B
    at.number_input(key="lc_r_batch").set_value(8).run()
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
    at.text_input(key=f"lc_p_lengths_{max_len}").set_value("8, 16, 32, 64")
    at.button(key="lc_start_prompt-length").click().run()
    assert not at.exception
    assert "lc_run_prompt-length" not in at.session_state  # refused before anything ran
    assert any("at most 3 points per sweep, got 4" in e.value for e in at.error)


def test_roofline_inputs_at_their_limits_read_truthfully():
    """Issue 19.21: peak 0.01 TFLOP/s gave 'batch 0' and 'ridge point 0'; 10,000,000 tokens '26668357.15 ms';
    0.1 GB 'Requests that fit 0' without saying the weights do not fit."""
    at = _open("pages/4_Latency_and_Capacity.py")
    hw = at.selectbox(key="lc_r_hw").value
    at.number_input(key=f"lc_r_peak_{hw}").set_value(0.01).run()
    assert not at.exception
    compute = next(m for m in at.metric if m.label == "Compute-bound from batch")
    assert compute.value == "1"
    captions = " ".join(c.value for c in at.caption)
    assert "ridge point: 0 FLOP" not in captions and "compute-bound from the first request" in captions
    at.number_input(key="lc_r_context").set_value(10_000_000).run()
    text = " ".join([m.value for m in at.markdown] + [str(m.value) for m in at.metric])
    assert "26668357.15 ms" not in text and not any(len(w) > 12 and w.replace(".", "").isdigit() for w in text.split())
    assert " h" in text or " min" in text or "days" in text
    # vLLM refuses a max_model_len past the model's context (131,072 for Llama 3.1): no requests-that-fit figure
    assert any("131072 tokens" in c.value for c in at.caption)
    at.number_input(key="lc_r_context").set_value(4096).run()
    at.number_input(key=f"lc_r_mem_{hw}").set_value(0.1).run()
    assert any("do not fit in this memory" in e.value for e in at.error)


def test_roofline_refuses_a_block_format_the_heads_do_not_fit():
    """llama.cpp's q8_0 on a d_head of 16 (the SMALL shape): a message, as llama.cpp refuses it, not a traceback."""
    at = _open("pages/4_Latency_and_Capacity.py")
    names = at.selectbox(key="lc_r_model").options
    at.selectbox(key="lc_r_model").set_value(names[-1]).run()  # the model in use, d_head 64 / 4 = 16
    at.selectbox(key="lc_r_kvdtype").set_value("q8_0").run()
    assert not at.exception
    assert any("not whole blocks" in e.value for e in at.error)
    at.selectbox(key="lc_r_model").set_value("Llama-3.1-8B").run()  # d_head 128 = 4 blocks: sized
    assert not at.error and any("ms**" in m.value for m in at.markdown)
