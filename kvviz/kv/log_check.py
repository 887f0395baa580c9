"""The planner against real start-up logs (kvviz/kv/startup_logs.json): for each log, what it measured and what
kvviz predicts before launch from the same model, GPU and flags, term by term (weights, activation, non-torch,
KV tokens), with the difference. The Memory page, the CLI (`capacity --check-logs`) and the tests read it here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from kvviz.kv.capacity import plan_capacity
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import get_preset
from kvviz.kv.reader import parse_hf_config
from kvviz.kv.sglang_pool import plan_sglang
from kvviz.kv.vllm_profile import ServingFlags

LOGS_FILE = Path(__file__).with_name("startup_logs.json")
GIB = 2**30
TOLERANCE = 0.10  # the goal: KV tokens within 10% of the log on every log that names its flags


@cache
def load_logs() -> tuple[dict, ...]:
    return tuple(json.loads(LOGS_FILE.read_text(encoding="utf-8")))


def log_spec(entry: dict) -> KVSpec:
    """The model of a log: a preset, or the config.json fields the entry copies (its own parameter count where
    the config cannot give one)."""
    spec = get_preset(entry["preset"]) if entry.get("preset") else parse_hf_config(entry["config"], entry["model"])
    if entry.get("n_params"):
        spec = spec.with_params(entry["n_params"], "published")
    return spec


def log_gpu(entry: dict) -> tuple[int, str | None, int | None, str]:
    """(total bytes, the device name vLLM reads, nvidia-smi MiB, where the total came from): kvviz's GPU table as
    a new user would pick it, else the total the log itself gives."""
    hw = HARDWARE.get(entry.get("gpu") or "")
    if hw is not None and hw.memory_bytes is not None:
        return hw.memory_bytes, hw.name, hw.nvidia_smi_total_mib, f"table: {hw.name}"
    total = entry["logged"].get("total_gpu_memory_gib")
    return round(total * GIB), entry.get("device_name"), None, "the log's total_gpu_memory"


@dataclass(frozen=True)
class Term:
    name: str  # weights, activation, non_torch, kv_tokens, max_concurrency
    logged: float | None
    predicted: float
    unit: str  # "GiB" or "tokens" or "x"
    derived: bool = False  # the logged side is computed from other logged figures, not printed by the engine
    kv_effect: float | None = None  # what this term's error does to the KV tokens: −(predicted − logged) / KV

    @property
    def difference(self) -> float | None:
        return None if self.logged in (None, 0) else (self.predicted - self.logged) / self.logged


@dataclass(frozen=True)
class LogCheck:
    id: str
    engine: str
    model: str
    gpu: str
    tp: int
    source_url: str
    flags_named: bool
    flags_note: str
    version: str
    terms: tuple[Term, ...]
    kv_tokens_range: tuple[int, int]
    launch: dict = field(default_factory=dict)
    weight_format: str = ""  # the weights' format as the planner sized them, and where it came from
    weight_source: str = ""

    def term(self, name: str) -> Term | None:
        return next((t for t in self.terms if t.name == name), None)

    @property
    def kv_within(self) -> bool:
        kv = self.term("kv_tokens")
        if kv is not None and kv.logged == 0:
            return kv.predicted == 0  # the engine refused to start, and the planner says nothing fits
        return kv is not None and kv.difference is not None and abs(kv.difference) <= TOLERANCE

    @property
    def kv_in_range(self) -> bool:
        kv = self.term("kv_tokens")
        return kv is not None and kv.logged is not None and self.kv_tokens_range[0] <= kv.logged <= \
            self.kv_tokens_range[1]

    def to_dict(self) -> dict:
        return asdict(self) | {"kv_within": self.kv_within, "kv_in_range": self.kv_in_range,
                               "differences": {t.name: t.difference for t in self.terms}}


def _vllm(entry: dict) -> LogCheck:
    spec, f, logged = log_spec(entry), entry["flags"], entry["logged"]
    total, name, _, _ = log_gpu(entry)
    flags = ServingFlags(vllm_version=f.get("vllm_version"), engine=f.get("engine"), entry=f.get("entry"),
                         max_num_batched_tokens=f.get("max_num_batched_tokens"),
                         max_num_seqs=f.get("max_num_seqs"), enforce_eager=bool(f.get("enforce_eager")))
    plan = plan_capacity(spec, total, max_model_len=f["max_model_len"],
                         gpu_memory_utilization=f["gpu_memory_utilization"], tp=f["tp"],
                         block_size=f.get("block_size") or 16, flags=flags, gpu_name=name,
                         weight_dtype=f.get("weight_dtype"), preset=bool(entry.get("preset")))
    block = plan.block_size
    terms = [Term("weights", logged.get("weights_gib"), plan.weights_bytes / GIB, "GiB")]
    activation, derived = logged.get("activation_peak_gib"), False
    if activation is None and logged.get("peak_torch_gib") is not None and logged.get("weights_gib") is not None:
        activation, derived = logged["peak_torch_gib"] - logged["weights_gib"], True  # 0.6.4 logs the sum
    terms.append(Term("activation", activation, plan.reserve_terms["activation_peak"] / GIB, "GiB", derived))
    terms.append(Term("non_torch", logged.get("non_torch_gib"), plan.reserve_terms["non_torch"] / GIB, "GiB"))
    kv_tokens, derived = logged.get("kv_cache_tokens"), False
    if kv_tokens is None and logged.get("gpu_blocks") is not None:
        kv_tokens, derived = logged["gpu_blocks"] * block, True
    if kv_tokens is None and logged.get("kv_cache_gib") is not None:
        # the blocks that memory holds, counted as the planner's release counts them (per KV-cache group)
        # (none when the memory left is negative: the engine refused to start)
        blocks = max(int(logged["kv_cache_gib"] * GIB // plan.kv_bytes_per_block), 0)
        kv_tokens, derived = blocks // len(plan.kv_cache_groups) * block, True
    terms.append(Term("kv_tokens", kv_tokens, plan.kv_cache_tokens, "tokens", derived))
    terms = list(_with_kv_effect(terms, None if not kv_tokens else kv_tokens * plan.kv_bytes_per_token))
    if logged.get("kv_cache_gib") is not None:
        # "Available KV cache memory": requested − weights − reserve, negative where nothing is left
        left = plan.requested_bytes - plan.weights_bytes - plan.reserve_bytes
        terms.append(Term("kv_memory", logged["kv_cache_gib"], left / GIB, "GiB"))
        if logged.get("weights_gib") is not None and logged.get("activation_peak_gib") is None:
            # the reserve the log implies: what was requested, less its weights and KV memory
            requested = (logged.get("total_gpu_memory_gib") or total / GIB) * f["gpu_memory_utilization"]
            terms.append(Term("reserve", requested - logged["weights_gib"] - logged["kv_cache_gib"],
                              plan.reserve_bytes / GIB, "GiB", True))
    if logged.get("max_concurrency") is not None:
        # vLLM's concurrency is for max_model_len tokens per request, the length the log states
        n = logged.get("max_concurrency_tokens") or f["max_model_len"]
        terms.append(Term("max_concurrency", logged["max_concurrency"],
                          plan.max_concurrency * f["max_model_len"] / n, "x"))
    return LogCheck(id=entry["id"], engine="vllm", model=entry["model"], gpu=entry.get("gpu") or name or "",
                    tp=f["tp"], source_url=entry["source_url"], flags_named=entry["flags_named"],
                    flags_note=entry["flags_note"], version=f.get("vllm_version") or "?", terms=tuple(terms),
                    kv_tokens_range=plan.kv_cache_tokens_range, launch=plan.launch or {},
                    weight_format=plan.weights["format"]["label"], weight_source=plan.weights["source"])


def _sglang(entry: dict) -> LogCheck:
    spec, f, logged = log_spec(entry), entry["flags"], entry["logged"]
    total, _, smi, _ = log_gpu(entry)
    plan = plan_sglang(spec, total, context_len=f["context_len"], tp=f["tp"], smi_mib=smi,
                       sglang_version=None, kv_dtype_name="bfloat16")
    weights_logged = logged.get("weights_gib")
    if weights_logged is None and logged.get("avail_before_load_gib") is not None:
        weights_logged = logged["avail_before_load_gib"] - logged["avail_after_load_gib"]
    predicted_load = (plan.weights_bytes + plan.reserve_terms["load_overhead"]) / GIB
    terms = _with_kv_effect([
        Term("weights", weights_logged, predicted_load, "GiB", logged.get("weights_gib") is None),
        Term("free_at_start", logged.get("avail_before_load_gib"), plan.free_at_start_bytes / GIB, "GiB"),
        Term("mem_fraction_static", f.get("mem_fraction_static"), plan.mem_fraction_static, ""),
        Term("kv_tokens", logged.get("kv_cache_tokens"), plan.kv_cache_tokens, "tokens"),
    ], logged["kv_cache_tokens"] * plan.kv_bytes_per_token, plan.mem_fraction_static)
    return LogCheck(id=entry["id"], engine="sglang", model=entry["model"], gpu=entry.get("gpu") or "",
                    tp=f["tp"], source_url=entry["source_url"], flags_named=entry["flags_named"],
                    flags_note=entry["flags_note"], version=f.get("sglang_version") or "?", terms=terms,
                    kv_tokens_range=plan.kv_cache_tokens_range,
                    launch={"mem_fraction_source": plan.mem_fraction_source})


def _with_kv_effect(terms: list[Term], kv_bytes: int | None, free_share: float = 1.0) -> tuple[Term, ...]:
    """Each memory term's error as the share of the logged KV cache it moves (a reserve predicted 0.1 GiB too
    high costs 0.1 GiB of KV; SGLang's free memory at start counts by its mem_fraction_static), so the terms
    read on one scale with the KV tokens' own difference."""
    out = []
    for t in terms:
        if t.name == "kv_tokens":
            t = Term(**{**asdict(t), "kv_effect": t.difference})
        elif t.unit == "GiB" and t.logged is not None and kv_bytes:
            effect = (t.predicted - t.logged) * GIB / kv_bytes * (free_share if t.name == "free_at_start" else -1)
            t = Term(**{**asdict(t), "kv_effect": effect})
        out.append(t)
    return tuple(out)


def check_log(entry: dict) -> LogCheck:
    return _sglang(entry) if entry["engine"] == "sglang" else _vllm(entry)


@cache
def check_all() -> tuple[LogCheck, ...]:
    return tuple(check_log(e) for e in load_logs())


def kv_bytes_per_token(entry: dict) -> int:
    """One GPU's KV bytes per token for a log's model (its 'GPU KV cache size' × this = its KV GiB)."""
    from kvviz.kv.formula import shard_for_tp

    return kv_footprint(shard_for_tp(log_spec(entry), entry["flags"]["tp"]), 1).per_token
