"""A serving engine's Prometheus /metrics, read with prometheus_client's text parser, as one snapshot.

Recognized names (each engine's own, as its source or docs spell them):
- vLLM (docs.vllm.ai, "Production Metrics"): vllm:kv_cache_usage_perc (older vllm:gpu_cache_usage_perc),
  vllm:num_requests_running / _waiting, vllm:num_preemptions_total, vllm:prefix_cache_queries_total /
  _hits_total (older vllm:gpu_prefix_cache_*), vllm:cache_config_info{block_size=...}.
- SGLang (docs.sglang.ai, "Production Metrics"): sglang:token_usage, sglang:cache_hit_rate,
  sglang:num_running_reqs, sglang:num_queue_reqs.
- llama.cpp (tools/server/server-task.cpp, to_metrics()): llamacpp:requests_processing / _deferred,
  llamacpp:prompt_tokens_cached_total, llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total,
  and llamacpp:kv_cache_usage_ratio where an older build still exports it.
A value the server does not export stays None (unknown), never 0.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvviz.errors import InputError
from kvviz.serving.client import Server

# Our field -> the engine's sample names, first found wins (a newer name before the older one).
NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
                           "vllm:gpu_prefix_cache_queries"),
        "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total",
                        "vllm:gpu_prefix_cache_hits"),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
    },
    "sglang": {
        "kv_usage": ("sglang:token_usage",),
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "hit_rate": ("sglang:cache_hit_rate",),
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
    },
    "llama.cpp": {
        "kv_usage": ("llamacpp:kv_cache_usage_ratio",),
        "running": ("llamacpp:requests_processing",),
        "waiting": ("llamacpp:requests_deferred",),
        "cached_prompt_tokens": ("llamacpp:prompt_tokens_cached_total",),
        "prompt_tokens": ("llamacpp:prompt_tokens_total",),  # processed, cached ones excluded
        "generation_tokens": ("llamacpp:tokens_predicted_total",),
    },
}
PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llama.cpp"}


@dataclass
class MetricsSnapshot:
    """One scrape, in common terms. None = the server does not export it."""

    engine: str | None
    t_s: float = 0.0  # when it was read, on the run's clock
    kv_usage: float | None = None  # fraction 0..1 of the KV cache in use
    running: float | None = None
    waiting: float | None = None
    preemptions: float | None = None  # cumulative
    prefix_queries: float | None = None  # cumulative prompt tokens looked up in the prefix cache (vLLM)
    prefix_hits: float | None = None  # cumulative tokens found there (vLLM)
    hit_rate: float | None = None  # SGLang's own ratio
    cached_prompt_tokens: float | None = None  # cumulative prompt tokens reused (llama.cpp)
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    block_size: int | None = None  # vLLM's KV block size, from vllm:cache_config_info
    recognized: list[str] = field(default_factory=list)  # the sample names that were read

    @property
    def prefix_hit_rate(self) -> float | None:
        """Share of prompt tokens served from the prefix cache, by whichever counters the engine has."""
        if self.hit_rate is not None:
            return self.hit_rate
        if self.prefix_queries:
            return (self.prefix_hits or 0) / self.prefix_queries
        if self.cached_prompt_tokens is not None and self.prompt_tokens is not None:
            seen = self.cached_prompt_tokens + self.prompt_tokens
            return self.cached_prompt_tokens / seen if seen else None
        return None

    def to_dict(self) -> dict:
        return {**asdict(self), "prefix_hit_rate": self.prefix_hit_rate}


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def parse_metrics(text: str, t_s: float = 0.0) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a snapshot; values with several label sets are summed."""
    try:
        samples = list(_samples(text))
    except ValueError as exc:
        raise InputError("serving.bad_metrics", detail=str(exc)[:120]) from None
    totals: dict[str, float] = {}
    block_size = None
    for name, labels, value in samples:
        totals[name] = totals.get(name, 0.0) + value
        if name == "vllm:cache_config_info" and labels.get("block_size", "").isdigit():
            block_size = int(labels["block_size"])
    engine = next((e for p, e in PREFIXES.items() if any(n.startswith(p) for n in totals)), None)
    snap = MetricsSnapshot(engine=engine, t_s=t_s, block_size=block_size)
    if engine is None:
        return snap
    for key, names in NAMES[engine].items():
        found = next((n for n in names if n in totals), None)
        if found is not None:
            setattr(snap, key, totals[found])
            snap.recognized.append(found)
    return snap


def scrape(server: Server, client: httpx.Client | None = None, t_s: float = 0.0) -> MetricsSnapshot:
    """GET /metrics and parse it; InputError("serving.no_metrics") when the server has none to give."""
    own = client is None
    client = client or server.client()
    try:
        response = client.get(server.url("/metrics"))
    except httpx.HTTPError:
        raise InputError("serving.no_metrics", url=server.base_url, detail="no answer") from None
    finally:
        if own:
            client.close()
    if response.status_code != 200:
        # llama-server answers 501 unless started with --metrics; others 404.
        raise InputError("serving.no_metrics", url=server.base_url, detail=f"HTTP {response.status_code}")
    snap = parse_metrics(response.text, t_s)
    if snap.engine is None:
        raise InputError("serving.no_metrics", url=server.base_url, detail="no vllm:, sglang: or llamacpp: metric")
    return snap
