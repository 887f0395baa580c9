"""kvviz.serving without a server: TPOT/percentile summary, metrics parsing, cache predictions, URL policy,
and the GGUF Q/K permutation checked against the two RoPE layouts it converts between."""
import math

import pytest
import torch

from kvviz.engine.export import permute_rotary
from kvviz.errors import InputError
from kvviz.serving import policy
from kvviz.serving.bench import Limits, check_plan, summarize
from kvviz.serving.client import RequestResult, normalize_base_url
from kvviz.serving.prefix import common_prefix, predicted_cached_tokens
from kvviz.serving.prom import parse_metrics

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
    assert (s.engine, s.running, s.waiting, s.kv_usage, s.preemptions) == ("vllm", 3, 5, 0.4375, 2)
    assert (s.prefix_queries, s.prefix_hits, s.prefix_hit_rate, s.block_size) == (800, 600, 0.75, 16)
    assert parse_metrics(VLLM_OLD).kv_usage == 0.25  # the pre-V1 name


def test_sglang_metrics_and_unknowns_stay_none():
    s = parse_metrics(SGLANG)
    assert (s.engine, s.kv_usage, s.prefix_hit_rate, s.running, s.waiting) == ("sglang", 0.125, 0.5, 4, 1)
    assert s.preemptions is None and s.block_size is None  # not exported: unknown, not 0


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


def _result(start, times, completion_tokens=None):
    r = RequestResult(start_s=start, completion_tokens=completion_tokens)
    r.chunk_times_s, r.n_chunks, r.finish_reason = list(times), len(times), "length"
    return r


def test_tpot_uses_usage_count_and_falls_back_to_chunks():
    # 4 chunks carrying 7 tokens: TPOT = (E2E − TTFT)/(N − 1) = (0.4 − 0.1)/6
    r = _result(0.0, [0.1, 0.2, 0.3, 0.4], completion_tokens=7)
    assert r.ttft_s == 0.1 and r.e2e_s == 0.4
    assert math.isclose(r.tpot_s, 0.3 / 6)
    assert r.itl_s == pytest.approx([0.1, 0.1, 0.1])
    counted = _result(0.0, [0.1, 0.2, 0.3, 0.4])
    assert not counted.tokens_from_usage and math.isclose(counted.tpot_s, 0.3 / 3)


def test_summary_percentiles_and_throughput():
    rs = [_result(0.0, [0.1, 0.5], 2), _result(0.2, [0.5, 0.9], 2), _result(0.3, [0.2, 1.7], 2)]
    failed = RequestResult(start_s=0.4, error=InputError("serving.no_models"))
    row = summarize(2, [*rs, failed])
    assert (row["requests"], row["ok"], row["failed"]) == (4, 3, 1)
    assert row["ttft_p50_s"] == pytest.approx(0.2)
    assert row["tpot_p50_s"] == pytest.approx(0.4)
    assert row["duration_s"] == pytest.approx(2.0)  # first send 0.0, last chunk 0.3 + 1.7
    assert row["output_tokens_per_s"] == pytest.approx(6 / 2.0)
    assert row["tokens_from_usage"] is True


def test_plan_caps():
    check_plan([1, 2, 4], 8, 64, 128, Limits())
    with pytest.raises(InputError) as e:
        check_plan([1, 2, 4], 8, 64, 128, Limits(max_points=2))
    assert e.value.key == "serving.too_many_points"
    with pytest.raises(InputError) as e:
        check_plan([1, 128], 8, 64, 128, Limits())
    assert e.value.key == "serving.over_cap"


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_base_url_forms(url):
    assert normalize_base_url(url) == "http://h:8000"


@pytest.mark.parametrize("url", ["", "h:8000", "file:///etc/passwd", "ftp://h/", "http://"])
def test_bad_urls(url):
    with pytest.raises(InputError) as e:
        normalize_base_url(url)
    assert e.value.key == "serving.bad_url"


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
