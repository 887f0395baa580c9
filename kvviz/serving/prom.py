"""A serving engine's Prometheus /metrics, read with prometheus_client's text parser: snapshots, and what
changed between two of them (a run's window).

Recognized names (each engine's own, as its source spells them):
- vLLM (vllm/v1/metrics/loggers.py, PrometheusStatLogger): vllm:kv_cache_usage_perc (older
  vllm:gpu_cache_usage_perc), vllm:num_requests_running / _waiting, vllm:num_preemptions_total,
  vllm:prefix_cache_queries_total / _hits_total (older vllm:gpu_prefix_cache_*), vllm:prompt_tokens_total,
  vllm:generation_tokens_total, the histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds
  (older vllm:time_per_output_token_seconds), vllm:request_prefill_time_seconds, and
  vllm:cache_config_info{block_size=..., cache_dtype=...}.
- SGLang (python/sglang/srt/metrics/collector.py): sglang:token_usage, sglang:num_running_reqs,
  sglang:num_queue_reqs, sglang:prompt_tokens_total, sglang:cached_tokens_total, sglang:generation_tokens_total,
  sglang:time_to_first_token_seconds, sglang:inter_token_latency_seconds. (sglang:cache_hit_rate is the last
  prefill batch's ratio and reads 0 while decoding: a window's hit rate comes from the two token counters.)
- llama.cpp (tools/server/server-task.cpp, to_metrics()): llamacpp:requests_processing / _deferred,
  llamacpp:prompt_tokens_total (processed, cached ones excluded), llamacpp:prompt_tokens_cached_total,
  llamacpp:prompt_seconds_total, llamacpp:tokens_predicted_total, llamacpp:tokens_predicted_seconds_total, and
  llamacpp:kv_cache_usage_ratio where an older build still exports it.

Counters are cumulative since the server started, so a run reads them as the difference between a scrape
before and after it (`window`). A gauge reported under several label sets (data-parallel engines, several
models) is kept per label set, never summed. A value the server does not export stays None (unknown), never 0.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvviz.errors import InputError
from kvviz.serving.client import Server, get

# Our field -> the engine's sample names, first found wins (a newer name before the older one).
COUNTERS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
                           "vllm:gpu_prefix_cache_queries"),
        "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total",
                        "vllm:gpu_prefix_cache_hits"),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        "ttft_sum": ("vllm:time_to_first_token_seconds_sum",),
        "ttft_count": ("vllm:time_to_first_token_seconds_count",),
        "itl_sum": ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum"),
        "itl_count": ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count"),
        "prefill_seconds": ("vllm:request_prefill_time_seconds_sum",),
    },
    "sglang": {
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "cached_tokens": ("sglang:cached_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
        "ttft_sum": ("sglang:time_to_first_token_seconds_sum",),
        "ttft_count": ("sglang:time_to_first_token_seconds_count",),
        "itl_sum": ("sglang:inter_token_latency_seconds_sum", "sglang:time_per_output_token_seconds_sum"),
        "itl_count": ("sglang:inter_token_latency_seconds_count", "sglang:time_per_output_token_seconds_count"),
    },
    "llama.cpp": {
        "cached_tokens": ("llamacpp:prompt_tokens_cached_total",),
        "processed_prompt_tokens": ("llamacpp:prompt_tokens_total",),  # cached ones excluded
        "prefill_seconds": ("llamacpp:prompt_seconds_total",),
        "generation_tokens": ("llamacpp:tokens_predicted_total",),
        "generation_seconds": ("llamacpp:tokens_predicted_seconds_total",),
    },
}
GAUGES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
             "running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",)},
    "sglang": {"kv_usage": ("sglang:token_usage",), "running": ("sglang:num_running_reqs",),
               "waiting": ("sglang:num_queue_reqs",)},
    "llama.cpp": {"kv_usage": ("llamacpp:kv_cache_usage_ratio",), "running": ("llamacpp:requests_processing",),
                  "waiting": ("llamacpp:requests_deferred",)},
}
GAUGE_FIELDS = ("kv_usage", "running", "waiting")
PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llama.cpp"}


def label_text(labels: dict[str, str]) -> str:
    """One label set as text, e.g. 'engine=0,model_name=m' ('' for none)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@dataclass
class MetricsSnapshot:
    """One scrape, in common terms."""

    engine: str | None
    t_s: float = 0.0  # when it was read, on the run's clock
    counters: dict[str, float] = field(default_factory=dict)  # cumulative; summed over label sets
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)  # field -> {label set: value}
    block_size: int | None = None  # vLLM's KV block size, from vllm:cache_config_info
    cache_dtype: str | None = None  # vLLM's KV dtype label ("auto": the model's dtype), from the same
    recognized: list[str] = field(default_factory=list)  # the sample names that were read

    def gauge(self, name: str) -> float | None:
        """The gauge's value when the server reports it under one label set; None when absent or several."""
        values = self.gauges.get(name) or {}
        return next(iter(values.values())) if len(values) == 1 else None

    @property
    def kv_usage(self) -> float | None:
        return self.gauge("kv_usage")

    @property
    def running(self) -> float | None:
        return self.gauge("running")

    @property
    def waiting(self) -> float | None:
        return self.gauge("waiting")

    def to_dict(self) -> dict:
        return {"engine": self.engine, "t_s": self.t_s, "counters": dict(self.counters),
                "gauges": {k: dict(v) for k, v in self.gauges.items()}, "block_size": self.block_size,
                "cache_dtype": self.cache_dtype, "recognized": list(self.recognized)}

    @classmethod
    def from_dict(cls, d: dict) -> MetricsSnapshot:
        return cls(d["engine"], d["t_s"], dict(d["counters"]), {k: dict(v) for k, v in d["gauges"].items()},
                   d.get("block_size"), d.get("cache_dtype"), list(d.get("recognized", [])))


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def parse_metrics(text: str, t_s: float = 0.0) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a snapshot: counters summed over label sets, gauges per label set."""
    try:
        samples = list(_samples(text))
    except ValueError as exc:
        raise InputError("serving.bad_metrics", detail=str(exc)[:120]) from None
    by_name: dict[str, dict[str, float]] = {}
    block_size, cache_dtype = None, None
    for name, labels, value in samples:
        by_name.setdefault(name, {})[label_text(labels)] = value
        if name == "vllm:cache_config_info":
            if labels.get("block_size", "").isdigit():
                block_size = int(labels["block_size"])
            cache_dtype = labels.get("cache_dtype") or cache_dtype
    engine = next((e for p, e in PREFIXES.items() if any(n.startswith(p) for n in by_name)), None)
    snap = MetricsSnapshot(engine=engine, t_s=t_s, block_size=block_size, cache_dtype=cache_dtype)
    if engine is None:
        return snap
    for key, names in COUNTERS[engine].items():
        found = next((n for n in names if n in by_name), None)
        if found is not None:
            snap.counters[key] = sum(by_name[found].values())  # a counter's total over engines is a total
            snap.recognized.append(found)
    for key, names in GAUGES[engine].items():
        found = next((n for n in names if n in by_name), None)
        if found is not None:
            snap.gauges[key] = dict(by_name[found])
            snap.recognized.append(found)
    return snap


def scrape(server: Server, client: httpx.Client | None = None, t_s: float = 0.0) -> MetricsSnapshot:
    """GET /metrics and parse it. The error says which of the causes it is: the server cannot be reached
    (serving.unreachable), or it answers but exports no metrics (serving.no_metrics: llama.cpp without
    --metrics answers 501, other servers 404)."""
    response = get(server, "/metrics", client)
    if response.status_code == 501:
        raise InputError("serving.no_metrics_flag", url=server.base_url)
    if response.status_code != 200:
        raise InputError("serving.no_metrics", url=server.base_url, detail=f"HTTP {response.status_code}")
    snap = parse_metrics(response.text, t_s)
    if snap.engine is None:
        raise InputError("serving.no_metrics", url=server.base_url, detail="no vllm:, sglang: or llamacpp: metric")
    return snap


def _delta(before: MetricsSnapshot, after: MetricsSnapshot, key: str) -> float | None:
    if key not in before.counters or key not in after.counters:
        return None
    return after.counters[key] - before.counters[key]


def window(before: MetricsSnapshot, after: MetricsSnapshot, duration_s: float | None) -> dict:
    """What the server counted between two scrapes: each counter's difference, and per second over `duration_s`.

    prompt_tokens counts every prompt token (cached ones included) and cached_tokens those served from the
    prefix cache, whatever each engine calls them; prefix_cache_hit_rate = cached_tokens / prompt_tokens (vLLM:
    prefix-cache hits / queries, which count tokens). server_mean_ttft_ms and server_mean_itl_ms are the means of
    the engine's own histograms over the window (Δsum / Δcount); server_prefill_s is its summed prompt time.
    Unknown stays None.
    """
    d = {k: _delta(before, after, k) for k in set(before.counters) | set(after.counters)}
    engine = after.engine
    if engine == "vllm":
        prompt, cached, queries = d.get("prompt_tokens"), d.get("prefix_hits"), d.get("prefix_queries")
        hit_rate = cached / queries if cached is not None and queries else None
    elif engine == "llama.cpp":
        cached, processed = d.get("cached_tokens"), d.get("processed_prompt_tokens")
        prompt = cached + processed if cached is not None and processed is not None else None
        hit_rate = cached / prompt if cached is not None and prompt else None
    else:
        prompt, cached = d.get("prompt_tokens"), d.get("cached_tokens")
        hit_rate = cached / prompt if cached is not None and prompt else None

    def mean_ms(s: str, c: str) -> float | None:
        total, count = d.get(s), d.get(c)
        return total / count * 1e3 if total is not None and count else None

    out = {"engine": engine, "duration_s": duration_s, "prompt_tokens": prompt, "cached_tokens": cached,
           "prefix_cache_hit_rate": hit_rate, "generation_tokens": d.get("generation_tokens"),
           "preemptions": d.get("preemptions"), "server_prefill_s": d.get("prefill_seconds"),
           "server_mean_ttft_ms": mean_ms("ttft_sum", "ttft_count"),
           "server_mean_itl_ms": mean_ms("itl_sum", "itl_count")}
    if engine == "llama.cpp":  # its own seconds per generated token, over the window
        gen, secs = d.get("generation_tokens"), d.get("generation_seconds")
        out["server_mean_itl_ms"] = secs / gen * 1e3 if gen and secs is not None else None
    for key in ("prompt_tokens", "cached_tokens", "generation_tokens", "preemptions"):
        value = out[key]
        out[f"{key}_per_s"] = value / duration_s if value is not None and duration_s else None
    return out
