"""SGLang's KV pool size, predicted before launch: a second engine for the capacity planner.

SGLang does not profile a batch. Its ModelRunner measures the free memory once the process group is up (the
`total_gpu_memory` it passes on), loads the weights, and gives the KV pool what is left beyond a fixed share of
that first figure (model_runner.py `profile_max_num_token`, read in the 0.4.6, 0.4.9 and 0.5.2 sdists):

    rest = free after loading − free at start · (1 − mem_fraction_static)
    max_total_num_tokens = rest // cell_size,   cell_size = KV bytes of one token on one GPU, all layers

--mem-fraction-static defaults by the GPU's memory as nvidia-smi reports it and the tensor-parallel size
(server_args.py `__post_init__`). Checked against real start-up logs in kvviz/kv/startup_logs.json.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.kv.formula import KVSpec, kv_footprint, shard_for_tp, weight_bytes
from kvviz.kv.vllm_profile import parse_version  # the same release numbering (0.4.6, 0.5.2.post1)

GIB = 2**30

# Memory already in use when SGLang first measures (CUDA context, NCCL) and the weights' load overhead beyond the
# parameters (rotary caches, workspaces): (low, likely, high) GiB from the logs in kvviz/kv/startup_logs.json —
# RTX 3090 (Docker on WSL2) 23.58 − 22.76 = 0.82, 4×L4 22.03 − 21.63 = 0.40 (NCCL's 0.13 included); overheads:
# QwQ-32B 15.54 − 15.25 = 0.29, DeepSeek-R1-Distill-Qwen-7B 14.39 − 14.18 = 0.21.
IN_USE_AT_START_GIB = (0.30, 0.50, 0.90)
LOAD_OVERHEAD_GIB = (0.10, 0.25, 0.40)


def default_mem_fraction(smi_mib: int | None, tp: int, version: str | None) -> list[tuple[float, str]]:
    """--mem-fraction-static when not given, for each rule the version allows: (value, the rule's locale key)."""
    if smi_mib is None:
        return []
    out = []
    v = parse_version(version) if version else None
    if v is None or v < (0, 4, 9):  # 0.4.6 server_args.py: by tp on GPUs ≤ 81,920 MiB, else (mem − 13 GiB) / mem
        if smi_mib <= 81920:
            frac = 0.79 if tp >= 16 else 0.81 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88
        else:
            frac = (smi_mib - 13 * 1024) / smi_mib
        out.append((frac, "capacity.sgl_rule_046"))
    if v is None or v >= (0, 4, 9):  # 0.4.9, 0.5.2 server_args.py: reserved_mem by GPU memory
        if smi_mib < 35 * 1024:
            reserved = (2.8 + tp / 10) * 1024
        elif smi_mib < 90 * 1024:
            reserved = (9.5 + tp / 2) * 1024
        elif smi_mib < 160 * 1024:
            reserved = (12 + tp / 2) * 1024
        else:
            reserved = 32 * 1024
        out.append((round((smi_mib - reserved) / smi_mib, 3), "capacity.sgl_rule_049"))
    return out


@dataclass(frozen=True)
class SglangPlan:
    engine: str
    device_total_bytes: int
    tp: int
    mem_fraction_static: float
    mem_fraction_rule: str  # a locale key: which rule gave the fraction
    mem_fraction_source: str  # the same, in English (CLI, JSON)
    weights_bytes: int
    free_at_start_bytes: int  # predicted: total − memory in use before the first measurement
    free_after_load_bytes: int
    kv_budget_bytes: int  # free after load − free at start · (1 − fraction)
    kv_bytes_per_token: int
    kv_cache_tokens: int  # max_total_num_tokens ("KV Cache is allocated. #tokens: N")
    kv_cache_tokens_range: tuple[int, int]
    context_len: int
    max_concurrency: float  # tokens / context_len
    max_concurrency_range: tuple[float, float]
    reserve_terms: dict  # {in_use_at_start, load_overhead, outside_fraction} bytes
    weights_fit: bool

    def to_dict(self) -> dict:
        return asdict(self)


def plan_sglang(spec: KVSpec, device_total_bytes: int, *, context_len: int, tp: int = 1,
                smi_mib: int | None = None, mem_fraction_static: float | None = None,
                sglang_version: str | None = None, kv_dtype_name: str = "bfloat16",
                weight_dtype: str = "bfloat16", weights_per_gpu: int | None = None) -> SglangPlan:
    """The pool SGLang sizes for this model on tp GPUs, the likely value and the range over what is unknown
    before launch (memory in use at start, load overhead, the default fraction's rule when no version)."""

    if spec.n_params is None:
        raise InputError("capacity.params_unknown", name=spec.name or "?")
    if mem_fraction_static is not None and not 0 < mem_fraction_static <= 1:
        raise InputError("memory.bad_fraction", value=mem_fraction_static)
    if mem_fraction_static is None:
        rules = default_mem_fraction(smi_mib, tp, sglang_version)
        if not rules:
            raise InputError("capacity.sglang_unknown_fraction")
    else:
        rules = [(mem_fraction_static, "capacity.sgl_given")]
    shard = shard_for_tp(spec, tp)
    cell = kv_footprint(shard, 1, 1, kv_dtype_name).per_token
    # one GPU's weights: as sized from the checkpoint's format (kvviz.kv.weights), else every parameter in one dtype
    weights = weights_per_gpu if weights_per_gpu is not None else math.ceil(weight_bytes(spec.n_params, weight_dtype)
                                                                             / tp)

    def pool(frac: float, in_use: float, overhead: float) -> tuple[int, int, int]:
        free_start = device_total_bytes - round(in_use * GIB)
        after = free_start - weights - round(overhead * GIB)
        rest = after - free_start * (1 - frac)
        return max(int(rest // cell), 0), free_start, after

    likely_frac, source = rules[-1]  # the newest rule the version allows
    tokens, free_start, after = pool(likely_frac, IN_USE_AT_START_GIB[1], LOAD_OVERHEAD_GIB[1])
    corners = [pool(f, u, o)[0] for f, _ in rules for u in IN_USE_AT_START_GIB[::2] for o in LOAD_OVERHEAD_GIB[::2]]
    outside = round(free_start * (1 - likely_frac))
    return SglangPlan(
        engine="sglang", device_total_bytes=device_total_bytes, tp=tp, mem_fraction_static=likely_frac,
        mem_fraction_rule=source, mem_fraction_source=t(source, "en"), weights_bytes=weights,
        free_at_start_bytes=free_start,
        free_after_load_bytes=after, kv_budget_bytes=max(int(after - free_start * (1 - likely_frac)), 0),
        kv_bytes_per_token=cell, kv_cache_tokens=tokens, kv_cache_tokens_range=(min(corners), max(corners)),
        context_len=context_len, max_concurrency=tokens / context_len,
        max_concurrency_range=(min(corners) / context_len, max(corners) / context_len),
        reserve_terms={"in_use_at_start": device_total_bytes - free_start,
                       "load_overhead": free_start - after - weights, "outside_fraction": outside},
        weights_fit=tokens > 0,
    )
