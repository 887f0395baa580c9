"""kvviz.serving.results without a server or Streamlit: the plan the page's boxes describe, each point's label,
the statistics columns in vLLM's order, and one run's tables as the page lays them out."""
import math

import pytest

from kvviz.errors import InputError
from kvviz.serving.bench import Limits, result_filename
from kvviz.serving.results import (
    Sweep,
    load_defaults,
    load_plan,
    parse_list,
    prefix_rule,
    stat_keys,
    x_label,
)

FORM = {"url": "http://127.0.0.1:8080", "model": "m", "endpoint": "completions", "timeout_s": 30.0,
        "concurrency": "1, 2,4", "rates": "0.5, 2", "max_concurrency": 0, "burstiness": 3.0, "requests": 6,
        "prompt_tokens": 32, "max_tokens": 12, "range_ratio": 0.0, "prefix_len": 0, "warmups": 1,
        "slo_ttft_ms": 0.0, "slo_tpot_ms": 50.0}


def test_closed_loop_plan_from_the_boxes():
    plan = load_plan(mode="closed", **FORM)
    assert [(p.request_rate, p.max_concurrency) for p in plan.points] == [(math.inf, 1), (math.inf, 2), (math.inf, 4)]
    assert plan.burstiness == 1.0  # burstiness shapes arrivals: a closed loop has none
    assert plan.goodput == (("tpot", 50.0),)  # an SLO of 0 is no SLO
    assert (plan.num_prompts, plan.workload.input_len, plan.workload.output_len) == (6, 32, 12)


def test_open_loop_plan_caps_only_when_asked():
    plan = load_plan(mode="open", **FORM)
    assert [(p.request_rate, p.max_concurrency) for p in plan.points] == [(0.5, None), (2.0, None)]
    assert plan.burstiness == 3.0
    capped = load_plan(mode="open", **{**FORM, "max_concurrency": 3})
    assert {p.max_concurrency for p in capped.points} == {3}


@pytest.mark.parametrize("text", ["1, x", "2.5"])
def test_a_list_that_names_no_point_is_refused(text):
    with pytest.raises(InputError) as e:
        load_plan(mode="closed", **{**FORM, "concurrency": text})
    assert e.value.key == "serving.no_points"
    assert parse_list("2, 4", int) == [2, 4]


def test_x_labels():
    assert x_label({"request_rate": "inf", "max_concurrency": 4}) == "4"
    assert x_label({"request_rate": "inf", "max_concurrency": None}) == "∞"
    assert x_label({"request_rate": 2.0, "max_concurrency": None}) == "2/s"
    assert x_label({"request_rate": 0.5, "max_concurrency": 3}) == "0.5/s ≤3"


def test_statistic_columns_in_vllm_order():
    keys = stat_keys([{"p90_ttft_ms": 1.0, "p99_ttft_ms": 2.0, "mean_ttft_ms": 0.5}])
    assert keys[:4] == [("mean_ttft_ms", "ttft", "mean"), ("median_ttft_ms", "ttft", "median"),
                        ("p90_ttft_ms", "ttft", "p90"), ("p99_ttft_ms", "ttft", "p99")]
    assert [k for k, _, _ in keys][-1] == "p99_e2el_ms" and len(keys) == 4 * 4


def test_defaults_stay_within_a_hosted_demos_limits():
    first = load_defaults(Limits(max_requests=4, max_tokens=16, max_prompt_tokens=100))
    assert (first["requests"], first["max_tokens"], first["prompt"], first["prefix_words"]) == (4, 16, 100, 100)
    assert load_defaults(Limits())["requests"] == 8


def _point(c, tps, ttft, sent=True, server=None, agree=None, gauges=()):
    timings = {"client_mean_ttft_ms": ttft, "server_mean_ttft_ms": None,
               "server_mean_prefill_ms": None if agree is None else 1.5, "client_mean_tpot_ms": 4.0,
               "server_mean_tpot_ms": 4.1, "server_mean_itl_ms": None, "tpot_agree": agree}
    return {"request_rate": "inf", "max_concurrency": c, "burstiness": 1.0, "num_prompts": 2, "sent": sent,
            "output_throughput": tps, "median_ttft_ms": ttft, "median_tpot_ms": 4.0, "server": server,
            "server_timings": timings, "gauges": list(gauges), "completed": 2,
            "requests": [{"prompt_tokens": 32, "n_tokens": 12, "ok": True, "ttft_s": ttft / 1e3, "itl_s": [0.004],
                          "e2e_s": 0.05, "start_s": 0.0, "queue_s": 0.0, "error": None}] * 2}


RUN = {"plan": {"endpoint": "completions", "workload": {"input_len": 32}}, "model": "org/m", "url": "u",
       "engine": "llama.cpp", "error": {"key": "serving.stream_cut", "params": {}},
       "notes": [{"key": "serving.stream_cut", "params": {}}, {"key": "serving.no_metrics", "params": {"detail": "x"}}],
       "points": [_point(1, 50.0, 10.0, server={"prefix_cache_hit_rate": 0.4375, "prompt_tokens": 64},
                         agree=True, gauges=[{"t_s": 0.1}]),
                  _point(2, 0.0, 30.0, server={"prefix_cache_hit_rate": None, "prompt_tokens": 64}, agree=False),
                  _point(4, 90.0, 40.0, sent=False)],
       "current": {"request_rate": "inf", "max_concurrency": 8, "gauges": [{"t_s": 0.9}], "requests": []}}


def test_a_run_as_the_page_lays_it_out():
    sweep = Sweep(RUN)
    assert sweep.xs == ["1", "2"]  # the point that sent nothing (cancelled before it) is not drawn
    assert sweep.notes == [{"key": "serving.no_metrics", "params": {"detail": "x"}}]  # the error is shown once
    assert [w["prefix_cache_hit_rate"] for w in sweep.window_rows()] == [43.75, None]
    assert sweep.has_server_clock() and sweep.clocks_agree() is False
    assert [g["t_s"] for g in sweep.gauge_samples()] == [0.1, 0.9]  # the point being measured last
    assert sweep.timeline_point() is RUN["current"]
    assert [r["point"] for r in sweep.request_rows()] == ["1", "1", "2", "2"]
    assert sweep.progress(18) == (0, 18)  # before the run's first snapshot says
    ends = sweep.first_last()
    assert (ends["c0"], ends["c"], ends["first_ttft"], ends["ttft"]) == ("1", "2", 10.0, 30.0)
    assert ends["ratio"] is None  # a throughput of 0 gives no ratio, never a division by it
    files = sweep.result_files("20260101-000000")
    assert list(files) == ["point1", "point2"] and files["point1"]["model_id"] == "org/m"
    assert files["point1"]["ttfts"] == [0.01, 0.01]
    assert result_filename(RUN, RUN["points"][0], "d") == "openai-infqps-concurrency1-m-d.json"


def test_ratio_and_no_server_clock():
    run = {**RUN, "points": [_point(1, 50.0, 10.0), _point(4, 125.0, 12.0)], "current": None}
    sweep = Sweep(run)
    assert sweep.first_last()["ratio"] == 2.5
    assert not sweep.has_server_clock() and sweep.clocks_agree() is None
    assert sweep.timeline_point() is run["points"][-1]
    assert Sweep({**run, "points": run["points"][:1]}).first_last() is None


def test_prefix_rules():
    assert prefix_rule("vllm") == "block"
    assert prefix_rule("llama.cpp") == prefix_rule("sglang") == "token"
    assert prefix_rule(None) == prefix_rule("tgi") == "unknown"
