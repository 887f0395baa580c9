"""kvviz.serving without a server: TPOT/percentile summary, metrics parsing, cache predictions, URL policy,
and the GGUF Q/K permutation checked against the two RoPE layouts it converts between."""
import math

import numpy as np
import pytest
import torch

from kvviz.engine.export import permute_rotary
from kvviz.errors import InputError
from kvviz.serving import policy
from kvviz.serving.bench import (
    BenchPlan,
    Limits,
    Point,
    calculate_metrics,
    check_plan,
    closed_loop,
    open_loop,
    parse_goodput,
    result_filename,
    vllm_result,
)
from kvviz.serving.client import RequestResult, Server, normalize_base_url
from kvviz.serving.prefix import common_prefix, predicted_cached_tokens, saving_verdict
from kvviz.serving.prom import parse_metrics, window
from kvviz.serving.workload import Workload, arrival_times, length_bounds, read_dataset, sample_lengths

# Names as vLLM's V1 engine exports them (docs.vllm.ai "Production Metrics"; counters carry _total).
VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4375
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 800.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2048"} 1.0
"""
VLLM_OLD = """# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
"""
SGLANG = """# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.125
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.5
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 1.0
"""


def test_vllm_metrics():
    s = parse_metrics(VLLM)
    assert (s.engine, s.running, s.waiting, s.kv_usage, s.counters["preemptions"]) == ("vllm", 3, 5, 0.4375, 2)
    assert (s.counters["prefix_queries"], s.counters["prefix_hits"], s.block_size) == (800, 600, 16)
    assert s.cache_dtype == "auto"
    assert parse_metrics(VLLM_OLD).kv_usage == 0.25  # the pre-V1 name


def test_sglang_metrics_and_unknowns_stay_none():
    s = parse_metrics(SGLANG)
    assert (s.engine, s.kv_usage, s.running, s.waiting) == ("sglang", 0.125, 4, 1)
    assert "preemptions" not in s.counters and s.block_size is None  # not exported: unknown, not 0


# Two data-parallel engines (vLLM labels each engine's series with engine="0", engine="1").
VLLM_DP = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 50.0
"""


def test_gauges_of_several_engines_are_never_summed():
    s = parse_metrics(VLLM_DP)
    assert s.gauges["kv_usage"] == {"engine=0,model_name=m": 0.25, "engine=1,model_name=m": 0.75}
    assert s.kv_usage is None  # no single value: two engines at 25% and 75% are not one at 100%
    assert s.counters["prompt_tokens"] == 150  # a counter's total over engines is the server's total


def test_gauge_chart_one_line_per_label_set_and_unknown_said_where_it_is():
    from kvviz.charts.serving import metrics_chart

    s = parse_metrics(VLLM_DP)
    labels = {k: k for k in ("cache", "requests", "not_exported", "x", "y_pct", "y_count", "title", "kv_usage",
                             "running", "waiting")}
    fig = metrics_chart([{"t_s": 0.0, "gauges": s.gauges}], labels)
    kv = [t for t in fig.data if t.name.startswith("kv_usage")]
    assert sorted(t.y[0] for t in kv) == [25.0, 75.0]  # two lines, not one at 100%
    # llama.cpp without a KV-use gauge: "not exported" in the middle of the left subplot, in paper coordinates
    fig = metrics_chart([{"t_s": 0.0, "gauges": {"running": {"": 1.0}, "waiting": {"": 0.0}}}], labels)
    (note,) = [a for a in fig.layout.annotations if a.text == "not_exported"]
    assert (note.xref, note.yref, note.xanchor) == ("paper", "paper", "center")  # 'auto' anchors left below 1/3
    assert note.x == sum(fig.layout.xaxis.domain) / 2 and note.y == sum(fig.layout.yaxis.domain) / 2


def _snap(engine_text: str, **values: float) -> str:
    """Prometheus text for counters (name_total) and histograms (name_sum with name_count), as engines write it."""
    out = []
    for k, v in values.items():
        if k.endswith("_count"):
            continue
        if k.endswith("_sum"):
            base = k.removesuffix("_sum")
            n = values[base + "_count"]
            out.append(f'# TYPE {base} histogram\n{base}_bucket{{le="+Inf"}} {n}\n{base}_count {n}\n{k} {v}\n')
        else:
            out.append(f"# TYPE {k.removesuffix('_total')} counter\n{k} {v}\n")
    return "".join(out)


def test_window_is_the_difference_of_two_scrapes():
    """Counters count since the server started: a run's numbers are after − before, whatever came earlier
    (the lifetime ratio 1425 / (20495 + 1425) = 6.5% the issue saw is not this run's)."""
    before = parse_metrics(_snap("", **{"llamacpp:prompt_tokens_total": 20495, "llamacpp:prompt_tokens_cached_total":
                                        1425, "llamacpp:tokens_predicted_total": 900,
                                        "llamacpp:prompt_seconds_total": 3.0}))
    after = parse_metrics(_snap("", **{"llamacpp:prompt_tokens_total": 20495 + 512,
                                       "llamacpp:prompt_tokens_cached_total": 1425,
                                       "llamacpp:tokens_predicted_total": 900 + 256,
                                       "llamacpp:prompt_seconds_total": 3.5}))
    w = window(before, after, 2.0)
    assert (w["prompt_tokens"], w["cached_tokens"], w["prefix_cache_hit_rate"]) == (512, 0, 0.0)
    assert (w["generation_tokens"], w["generation_tokens_per_s"], w["server_prefill_s"]) == (256, 128.0, 0.5)
    assert w["preemptions"] is None  # llama.cpp exports none: unknown


def test_sglang_window_hit_rate_from_token_counters():
    """sglang:cache_hit_rate is the last prefill batch's ratio (0 while decoding); the window's rate comes from
    sglang:cached_tokens_total / sglang:prompt_tokens_total."""
    before = parse_metrics(_snap("", **{"sglang:prompt_tokens_total": 1000, "sglang:cached_tokens_total": 100}))
    after = parse_metrics(_snap("", **{"sglang:prompt_tokens_total": 1400, "sglang:cached_tokens_total": 400}))
    assert window(before, after, 1.0)["prefix_cache_hit_rate"] == pytest.approx(300 / 400)


def test_vllm_window_hit_rate_and_server_histograms():
    before = parse_metrics(_snap("", **{"vllm:prefix_cache_queries_total": 800, "vllm:prefix_cache_hits_total": 600,
                                        "vllm:time_to_first_token_seconds_sum": 1.0,
                                        "vllm:time_to_first_token_seconds_count": 10}))
    after = parse_metrics(_snap("", **{"vllm:prefix_cache_queries_total": 1000, "vllm:prefix_cache_hits_total": 650,
                                       "vllm:time_to_first_token_seconds_sum": 1.6,
                                       "vllm:time_to_first_token_seconds_count": 14}))
    w = window(before, after, 1.0)
    assert w["prefix_cache_hit_rate"] == pytest.approx(50 / 200)
    assert w["server_mean_ttft_ms"] == pytest.approx(600 / 4)  # (1.6 − 1.0) s over 4 requests


def test_bad_metrics_text():
    with pytest.raises(InputError) as e:
        parse_metrics("this is { not prometheus\n")
    assert e.value.key == "serving.bad_metrics"


@pytest.mark.parametrize("engine,n,p,block,expected", [
    ("vllm", 100, 100, 16, 96),  # ⌊(n−1)/B⌋·B: the last token is always recomputed
    ("vllm", 100, 40, 16, 32),   # only whole blocks of the shared part
    ("vllm", 17, 17, 16, 16),
    ("vllm", 16, 16, 16, 0),     # n−1 = 15 < one block
    ("llama.cpp", 100, 100, None, 99),
    ("sglang", 100, 40, None, 40),
    (None, 100, 40, None, None),
    ("vllm", 100, 40, None, None),  # block size unknown: no prediction
])
def test_predicted_cached_tokens(engine, n, p, block, expected):
    assert predicted_cached_tokens(engine, n, p, block) == expected


def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 5]) == 2
    assert common_prefix([], [1]) == 0


def _result(start, times, completion_tokens=None, prompt_tokens=None):
    r = RequestResult(start_s=start, completion_tokens=completion_tokens, prompt_tokens=prompt_tokens)
    r.chunk_times_s, r.n_chunks, r.finish_reason = list(times), len(times), "length"
    return r


def test_tpot_uses_usage_count_and_falls_back_to_chunks():
    # 4 messages carrying 7 tokens: TPOT = (E2E − TTFT)/(N − 1) = (0.4 − 0.1)/6
    r = _result(0.0, [0.1, 0.2, 0.3, 0.4], completion_tokens=7)
    assert r.ttft_s == 0.1 and r.e2e_s == 0.4
    assert math.isclose(r.tpot_s, 0.3 / 6)
    assert r.itl_s == pytest.approx([0.1, 0.1, 0.1])
    counted = _result(0.0, [0.1, 0.2, 0.3, 0.4])
    assert not counted.tokens_from_usage and math.isclose(counted.tpot_s, 0.3 / 3)


def test_metrics_as_vllm_calculate_metrics():
    """vllm/benchmarks/serve.py calculate_metrics, by hand: three finished requests, one failed, duration 2 s."""
    rs = [_result(0.0, [0.1, 0.5], 2, 10), _result(0.2, [0.5, 0.9], 2, 10), _result(0.3, [0.2, 0.6, 1.7], 3, 20)]
    failed = RequestResult(start_s=0.4, error=InputError("serving.no_models"))
    m = calculate_metrics([*rs, failed], 2.0, (50, 90, 99), (("ttft", 300.0), ("tpot", 500.0)))
    assert (m["completed"], m["failed"], m["total_input_tokens"], m["total_output_tokens"]) == (3, 1, 40, 7)
    assert m["request_throughput"] == 1.5 and m["output_throughput"] == 3.5 and m["total_token_throughput"] == 23.5
    assert m["mean_ttft_ms"] == pytest.approx(800 / 3) and m["median_ttft_ms"] == pytest.approx(200)
    assert m["std_ttft_ms"] == pytest.approx(np.std([100, 500, 200]))  # population std, as numpy's default
    assert m["p90_ttft_ms"] == pytest.approx(np.percentile([100, 500, 200], 90))
    tpots = [400, 400, 750]  # (E2E − TTFT)/(N − 1)
    assert m["mean_tpot_ms"] == pytest.approx(np.mean(tpots)) and m["median_tpot_ms"] == pytest.approx(400)
    assert m["median_itl_ms"] == pytest.approx(np.median([400, 400, 400, 1100]))  # every gap, pooled
    assert m["mean_e2el_ms"] == pytest.approx(np.mean([500, 900, 1700]))
    # goodput: TTFT ≤ 300 ms and TPOT ≤ 500 ms: the first only (the second's TTFT is 500, the third's TPOT 750)
    assert m["request_goodput"] == pytest.approx(1 / 2.0)
    assert m["max_concurrent_requests"] == 3  # all three overlap in [0.3, 0.5)


def test_no_samples_is_unknown_not_zero():
    m = calculate_metrics([RequestResult(start_s=0.0, error=InputError("serving.no_models"))], 1.0)
    assert m["completed"] == 0 and m["mean_ttft_ms"] is None and m["p99_itl_ms"] is None
    assert m["request_goodput"] is None  # no SLO given


def test_plan_caps():
    check_plan(BenchPlan("http://h", points=closed_loop((1, 2, 4))), Limits())
    with pytest.raises(InputError) as e:
        check_plan(BenchPlan("http://h", points=closed_loop((1, 2, 4))), Limits(max_points=2))
    assert e.value.key == "serving.too_many_points"
    with pytest.raises(InputError) as e:
        check_plan(BenchPlan("http://h", points=closed_loop((1, 128))), Limits())
    assert e.value.key == "serving.over_cap"
    with pytest.raises(InputError) as e:  # an open loop without a cap has every request in flight
        check_plan(BenchPlan("http://h", points=open_loop((2.0,)), num_prompts=16), Limits(max_concurrency=8))
    assert e.value.key == "serving.over_cap"
    with pytest.raises(InputError) as e:
        check_plan(BenchPlan("http://h", workload=Workload(range_ratio=1.0)), Limits())
    assert e.value.key == "serving.bad_range_ratio"


def test_plan_survives_json():
    plan = BenchPlan("http://h", "m", open_loop((1.0, math.inf), 4), 12, Workload(96, 24, 0.5, 32, seed=3),
                     burstiness=0.5, num_warmups=2, goodput=(("ttft", 500.0),), percentiles=(50.0, 99.9))
    import json

    assert BenchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


@pytest.mark.parametrize("pairs,expected", [(["ttft:500", "tpot:50"], (("ttft", 500.0), ("tpot", 50.0))),
                                            (["e2el:0"], (("e2el", 0.0),))])
def test_goodput_pairs(pairs, expected):
    assert parse_goodput(pairs) == expected


@pytest.mark.parametrize("pair", ["ttft", "itl:5", "ttft:-1", "ttft:x"])
def test_bad_goodput_pairs(pair):
    with pytest.raises(InputError) as e:
        parse_goodput([pair])
    assert e.value.key == "serving.bad_goodput"


def test_arrivals_as_vllm_get_request():
    """Gamma gaps with shape = burstiness and mean 1/rate, rescaled so the last arrival is n / rate."""
    rng = np.random.default_rng(0)
    t = np.asarray(arrival_times(4000, 8.0, 1.0, rng))
    assert t[-1] == pytest.approx(4000 / 8.0) and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.06)  # exponential: CV 1 (Poisson arrivals)
    bursty = np.diff(arrival_times(4000, 8.0, 0.25, np.random.default_rng(0)))
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, abs=0.2)  # gamma: CV 1/√k
    even = arrival_times(4, 2.0, math.inf, rng)
    assert even == pytest.approx([0.5, 1.0, 1.5, 2.0])  # burstiness ∞: evenly spaced
    assert arrival_times(3, math.inf, 1.0, rng) == [0.0, 0.0, 0.0]  # rate ∞: all at once


def test_lengths_as_vllm_random_dataset():
    assert length_bounds(100, 0.25) == (75, 125)
    assert length_bounds(3, 0.5, at_least=1) == (1, 5)  # ⌊1.5⌋, ⌈4.5⌉
    ins, outs = sample_lengths(2000, Workload(input_len=100, output_len=10, range_ratio=0.5), np.random.default_rng(1))
    assert min(ins) == 50 and max(ins) == 150 and min(outs) == 5 and max(outs) == 15  # both ends drawn
    fixed = sample_lengths(5, Workload(input_len=100, output_len=10), np.random.default_rng(1))
    assert fixed == ([100] * 5, [10] * 5)


def test_read_dataset_sharegpt_and_jsonl(tmp_path):
    import json

    share = [{"id": "a", "conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
             {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]}]
    (tmp_path / "s.json").write_text(json.dumps(share))
    assert read_dataset(tmp_path / "s.json") == [("Hi?", "Hello.")]  # a one-turn entry is dropped, as vLLM's
    (tmp_path / "c.jsonl").write_text('{"prompt": "What is a KV cache?"}\n' + json.dumps(share[0]) + "\n")
    assert read_dataset(tmp_path / "c.jsonl") == [("What is a KV cache?", None), ("Hi?", "Hello.")]
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(InputError) as e:
        read_dataset(tmp_path / "bad.jsonl")
    assert e.value.key == "serving.bad_dataset"


def test_saving_verdict_against_its_spread():
    assert saving_verdict([0.03, 0.05, 0.04])["verdict"] == "saved"
    noisy = saving_verdict([0.405, -0.5, 0.2])  # one control took 1444 ms, the one before 552 ms
    assert noisy["verdict"] == "within_noise" and noisy["median_s"] == pytest.approx(0.2)
    assert (noisy["low_s"], noisy["high_s"]) == (-0.5, 0.405)
    assert saving_verdict([-0.01, -0.02])["verdict"] == "slower"
    assert saving_verdict([0.1])["verdict"] == "one_trial"
    assert saving_verdict([None])["verdict"] is None


def test_vllm_result_file():
    """A point written as vllm bench serve --save-result writes its JSON: setup keys, then metric keys."""
    rs = [_result(0.0, [0.1, 0.5], 2, 10)]
    point = {**Point(2.0, 4).to_dict(), "burstiness": 1.0, "num_prompts": 1, "sent": 1,
             **calculate_metrics(rs, 1.0), "server": None, "server_timings": {}, "tokens_from_usage": True,
             "cancelled": False, "gauges": [],
             "requests": [{**r.to_dict(), "queue_s": 0.0} for r in rs]}
    run = {"plan": BenchPlan("http://h").to_dict(), "model": "org/My-Model", "url": "http://h", "engine": None}
    out = vllm_result(run, point, "20250101-000000")
    for key in ("date", "endpoint_type", "backend", "model_id", "num_prompts", "request_rate", "burstiness",
                "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms",
                "mean_e2el_ms", "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors",
                "max_output_tokens_per_s", "max_concurrent_requests"):
        assert key in out, key
    assert out["itls"] == [pytest.approx([0.4])] and out["request_rate"] == 2.0 and out["max_concurrency"] == 4
    assert result_filename(run, point, "D") == "openai-2.0qps-concurrency4-My-Model-D.json"


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_base_url_forms(url):
    assert normalize_base_url(url) == "http://h:8000"


@pytest.mark.parametrize("url", ["", "h:8000", "file:///etc/passwd", "ftp://h/", "http://"])
def test_bad_urls(url):
    with pytest.raises(InputError) as e:
        normalize_base_url(url)
    assert e.value.key == "serving.bad_url"


def test_credentials_in_a_url_are_never_shown():
    srv = Server("http://alice:s3cret@h:8000/v1")
    assert srv.base_url == "http://h:8000" and srv.basic_auth == ("alice", "s3cret")
    assert "s3cret" not in repr(srv)
    with pytest.raises(InputError) as e:
        normalize_base_url("ftp://alice:s3cret@h/")
    assert "s3cret" not in str(e.value) and "alice" not in str(e.value)


def test_hosted_allowlist():
    allowed = policy.allowlist({"KVVIZ_SERVE_ALLOW": "http://a:8000/v1, http://b:9000"}, {})
    assert allowed == ("http://a:8000", "http://b:9000")
    assert policy.check_url("http://a:8000/", allowed) == "http://a:8000"
    with pytest.raises(InputError) as e:
        policy.check_url("http://169.254.169.254", allowed)
    assert e.value.key == "serving.not_allowed"
    assert policy.allowlist({}, {"serve_allow": ["http://c:1"]}) == ("http://c:1",)
    assert policy.api_key({}, {"serve_api_key": "s"}) == "s" and policy.api_key({}, {}) is None


def _rope_halves(x, pos, theta=10000.0):
    """HF's layout: dimension i pairs with i + d/2."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos * inv
    cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return x * cos + rot * sin


def _rope_interleaved(x, pos, theta=10000.0):
    """llama.cpp's LLAMA (NORM) layout: dimension 2i pairs with 2i + 1."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos * inv
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * ang.cos() - b * ang.sin()
    out[..., 1::2] = a * ang.sin() + b * ang.cos()
    return out


@pytest.mark.parametrize("n_heads,d_head", [(8, 32), (2, 32), (4, 64)])
def test_permutation_turns_rotate_half_into_interleaved(n_heads, d_head):
    """q·k after RoPE must be the same in both engines: permuting the projection rows converts the layouts."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n_heads * d_head, 64, generator=g)
    x = torch.randn(64, generator=g)
    hf = _rope_halves((w @ x).view(n_heads, d_head), 5.0)
    cpp = _rope_interleaved((permute_rotary(w, n_heads) @ x).view(n_heads, d_head), 5.0)
    # The same vectors up to the fixed reordering of each head's dimensions, so dot products agree.
    assert torch.allclose(permute_rotary(hf.reshape(-1, 1), n_heads).view(n_heads, d_head), cpp, atol=1e-5)


@pytest.mark.parametrize("model_id,name,per_token", [
    ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B", 2 * 8 * 128 * 32 * 2),  # 128 KiB per token in bf16
    ("Qwen/Qwen3-8B", "Qwen3-8B", 2 * 8 * 128 * 36 * 2),
    ("kvviz-tiny", "kvviz-tiny", 2 * 2 * 24 * 4 * 2),  # K and V · 2 KV heads · d_head 24 · 4 layers · bf16
    ("some/unknown-model", None, None),
])
def test_kv_bytes_per_token_for_served_models(model_id, name, per_token):
    from kvviz.serving.report import kv_per_token

    out = kv_per_token(model_id, "bfloat16")
    assert (out["shape_name"], out["kv_bytes_per_token"]) == (name, per_token)
    assert kv_per_token(model_id, None)["kv_bytes_per_token"] is None  # the KV dtype unknown: so are the bytes


@pytest.mark.parametrize("label,expected", [("auto", None), ("fp8_e4m3", "fp8"), ("bfloat16", "bfloat16"),
                                            ("half", "float16")])
def test_kv_dtype_as_vllm_reports_it(label, expected):
    from kvviz.serving.report import server_kv_dtype

    text = f'# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size="16",cache_dtype="{label}"}} 1.0\n'
    assert server_kv_dtype(parse_metrics(text)) == expected


def test_kv_bytes_of_a_fetched_model_served_by_its_name():
    """SmolLM2 served by llama-server (its GGUF from `fetch-model smollm2`) is known by its name: 2 (K, V) · 30 layers
    · 3 KV heads · d_head 64 · 2 bytes (f16) per token."""
    from kvviz.engine.fetch import is_fetched
    from kvviz.serving.report import kv_per_token

    if not is_fetched("smollm2"):
        pytest.skip("SmolLM2 is not fetched here: python -m kvviz fetch-model smollm2")
    for model_id in ("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"):
        out = kv_per_token(model_id, "float16")
        assert (out["shape_name"], out["kv_bytes_per_token"]) == ("SmolLM2-135M-Instruct", 2 * 30 * 3 * 64 * 2)
