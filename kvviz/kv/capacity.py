"""Capacity planning as vLLM does it at start-up (how many KV tokens and requests fit in what the weights and
the profiled activations leave of each GPU), and what a contiguous max-length reservation wastes next to paged
blocks (PagedAttention). The reserve vLLM profiles is predicted from the serving flags (kvviz.kv.vllm_profile);
checked against real start-up logs in kvviz/kv/startup_logs.json.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_bytes, kv_footprint, shard_for_tp, weight_bytes
from kvviz.kv.vllm_profile import (
    Gpu,
    Reserve,
    ServingFlags,
    block_size_allowed,
    launch_batch,
    line_for,
    line_label,
    parse_version,
    predict_reserve,
)

# vLLM's defaults where the user does not say otherwise: 16-token blocks (CacheConfig.block_size) and
# gpu_memory_utilization 0.9 (EngineArgs), the same in every release read (0.4.1 – 0.33.0).
BLOCK_SIZE = 16
GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class KVRule:
    """How one run of vLLM releases lays the KV cache out and counts it, as read in each release's wheel
    (vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py; V0: executor/executor_base.py)."""

    first: tuple[int, ...]
    groups: bool  # hybrid KV-cache groups of one page size, sliding layers sized by their window
    pad_to_larger: bool  # group size = the larger type's count when under 1.5× the smaller one
    tokens: str  # the logged "GPU KV cache size": "blocks" (num_blocks · block_size), "groups" (num_blocks //
    #              groups · block_size) or "concurrency" (int(max_concurrency · max_model_len))
    source: str


KV_RULES: tuple[KVRule, ...] = (
    KVRule((0, 8, 0), False, False, "blocks",
           "0.8.5, 0.9.0 _get_kv_cache_config_uniform_type: num_blocks = memory // page // layers, concurrency = "
           "num_blocks · block_size / max_model_len; unify_hybrid_kv_cache_specs turns sliding layers into full "
           "attention when both kinds are present"),
    KVRule((0, 9, 1), True, False, "groups",
           "0.9.1 _get_kv_cache_config_uniform_page_size: groups of min(layers per type), 'Add %d padding "
           "layers'; get_max_concurrency_for_kv_cache_config: num_blocks / Σ_groups max_memory_usage_bytes ÷ "
           "page; SlidingWindowSpec.max_memory_usage_bytes: cdiv(min(W − 1 + max_num_batched_tokens, "
           "max_model_len), block_size) + 1 blocks; GPU KV cache size = num_blocks // groups · block_size"),
    KVRule((0, 18, 0), True, True, "groups",
           "0.18.0 _get_kv_cache_groups_uniform_page_size: the larger type's count as the group size when it is "
           "under 1.5× the smaller one (0.10.0 and 0.11.1 still take the smaller)"),
    KVRule((0, 21, 0), True, True, "concurrency",
           "0.21.0 _report_kv_cache_config (0.29+: get_kv_cache_capacity): GPU KV cache size = "
           "int(max_concurrency · max_model_len)"),
)


@dataclass(frozen=True)
class KVLayout:
    """vLLM's KV-cache groups for one model, one release and one batch: what a block holds and what one
    max_model_len request takes."""

    rule: str  # "v0", "uniform" or "groups"
    source: str
    page_bytes: int  # one layer's block (vLLM's page_size_bytes)
    group_size: int  # layers per group = KV-cache tensors (each shared by one layer of every group)
    groups: tuple[tuple[str, int], ...]  # per group: ("full" | "sliding", blocks one request takes)
    padding_layers: int
    tokens_rule: str

    @property
    def blocks_per_request(self) -> int:
        return sum(blocks for _, blocks in self.groups)

    def num_blocks(self, budget: int) -> int:
        return max(budget, 0) // self.page_bytes // self.group_size  # get_num_blocks

    def concurrency(self, num_blocks: int, block_size: int, max_model_len: int) -> float:
        if self.rule == "groups":
            return num_blocks / self.blocks_per_request
        return num_blocks * block_size / max_model_len  # V0 executor_base, V1 before 0.9.1

    def tokens(self, num_blocks: int, block_size: int, max_model_len: int) -> int:
        if self.tokens_rule == "concurrency":
            return int(self.concurrency(num_blocks, block_size, max_model_len) * max_model_len)
        if self.tokens_rule == "groups":
            return num_blocks // len(self.groups) * block_size
        return num_blocks * block_size


def kv_layout(shard: KVSpec, *, version: tuple[int, ...] | None, engine: str, max_model_len: int,
              max_num_batched_tokens: int, block_size: int, kv_dtype_name: str) -> KVLayout:
    """The groups vLLM forms for one GPU's share of the model (get_kv_cache_groups) and the blocks one request
    of max_model_len tokens takes in each (get_max_concurrency_for_kv_cache_config). Without a version, the
    newest rule read."""
    page = kv_bytes(shard, [1], 1, kv_dtype_name) * block_size
    layers = shard.n_layers
    full_blocks = -(-max_model_len // block_size)
    if engine == "v0":  # CacheEngine.get_cache_block_size: every layer holds the whole context
        return KVLayout("v0", "V0 worker/cache_engine.py get_cache_block_size; executor_base.py: concurrency = "
                        "num_gpu_blocks · block_size / max_model_len", page, layers, (("full", full_blocks),), 0,
                        "blocks")
    # V1 before 0.8.0 (VLLM_USE_V1=1 on 0.7) is given the first rule read
    rule = ([r for r in KV_RULES if version is None or r.first <= version] or [KV_RULES[0]])[-1]
    n_sliding, n_full = shard.n_sliding_layers, layers - shard.n_sliding_layers
    window_tokens = min(shard.sliding_window - 1 + max_num_batched_tokens, max_model_len)
    sliding_blocks = -(-window_tokens // block_size) + 1
    if not rule.groups:
        kind = "sliding" if n_sliding == layers else "full"
        return KVLayout("uniform", rule.source, page, layers, ((kind, full_blocks),), 0, rule.tokens)
    if n_sliding in (0, layers):  # one spec for every layer: one group
        kind, blocks = ("sliding", sliding_blocks) if n_sliding else ("full", full_blocks)
        return KVLayout("groups", rule.source, page, layers, ((kind, blocks),), 0, rule.tokens)
    size = min(n_full, n_sliding)
    if rule.pad_to_larger and max(n_full, n_sliding) < size * 1.5:
        size = max(n_full, n_sliding)
    groups, padding = [], 0
    for kind, count, blocks in (("full", n_full, full_blocks), ("sliding", n_sliding, sliding_blocks)):
        n_groups = -(-count // size)
        groups += [(kind, blocks)] * n_groups
        padding += n_groups * size - count
    return KVLayout("groups", rule.source, page, size, tuple(groups), padding, rule.tokens)


@dataclass(frozen=True)
class CapacityPlan:
    """vLLM's start-up arithmetic, per GPU: total × utilization − weights − reserve = KV budget → blocks →
    tokens, and "maximum concurrency for max_model_len tokens per request"."""

    device_total_bytes: int  # one GPU, as torch.cuda.mem_get_info() reports it (vLLM's total_gpu_memory)
    gpu_memory_utilization: float
    requested_bytes: int  # total · utilization
    tp: int
    weights_bytes: int  # one GPU's share: parameters · bytes ÷ tp
    reserve_bytes: int  # activation peak + non-torch memory (+ CUDA graphs where the version subtracts them)
    reserve_estimated: bool
    kv_budget_bytes: int  # requested − weights − reserve (0 when nothing is left)
    kv_dtype: str
    block_size: int
    kv_bytes_per_token: int  # one GPU, all layers
    kv_bytes_per_block: int  # one block id across a group's layers (page · group_size)
    num_blocks: int  # memory // page // group_size (get_num_blocks)
    kv_cache_tokens: int  # vLLM's "GPU KV cache size: N tokens", counted as the release counts it (KV_RULES)
    max_model_len: int
    blocks_per_request: int  # blocks one max_model_len request takes, summed over vLLM's KV-cache groups
    max_concurrency: float  # vLLM's "Maximum concurrency for max_model_len tokens per request"
    max_requests: int  # whole requests of max_model_len tokens
    weights_fit: bool
    reserve_terms: dict | None = None  # {activation, sampler, non_torch, cudagraph} of the likely launch
    reserve_range: tuple[int, int] | None = None  # the smallest and largest reserve the unknown flags allow
    kv_cache_tokens_range: tuple[int, int] | None = None  # the KV tokens at those two reserves
    max_concurrency_range: tuple[float, float] | None = None
    narrowing_flag: str | None = None  # the flag that narrows the range most when given
    launch: dict | None = None  # the likely launch: version line, engine, entry, batch and where each came from
    kv_cache_groups: list | None = None  # vLLM's KV-cache groups: [kind, blocks one request takes] each
    padding_layers: int = 0  # layers vLLM adds so that every group has group_size layers ("Add %d padding layers")
    kv_rule: str = ""  # the release whose layout and counting rule the plan follows, with the function read
    sliding_as_full: bool = False  # the release (V0, V1 before 0.9.1) counts sliding-window layers as full attention

    def to_dict(self) -> dict:
        return asdict(self)


def _launch(r: Reserve) -> dict:
    return {"vllm_line": r.line, "engine": r.engine, "entry": r.entry, "sampler": r.sampler_path,
            "max_num_batched_tokens": r.max_num_batched_tokens, "max_num_seqs": r.max_num_seqs}


def plan_capacity(
    spec: KVSpec,
    device_total_bytes: int,
    *,
    max_model_len: int,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    tp: int = 1,
    kv_dtype_name: str = "bfloat16",
    weight_dtype: str = "bfloat16",
    block_size: int = BLOCK_SIZE,
    reserve_bytes: int | None = None,
    flags: ServingFlags | None = None,
    gpu_name: str | None = None,
) -> CapacityPlan:
    """The KV capacity of one model on tp GPUs of device_total_bytes each, computed as vLLM computes it; the
    reserve predicted from the flags (kvviz.kv.vllm_profile) unless given (from a log)."""
    flags = flags or ServingFlags()
    if isinstance(gpu_memory_utilization, bool) or not 0 < gpu_memory_utilization <= 1:
        raise InputError("memory.bad_fraction", value=gpu_memory_utilization)
    for name, value in (("device_total_bytes", device_total_bytes), ("max_model_len", max_model_len),
                        ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError("positive_int", name=name, value=value)
    line = line_for(flags.vllm_version) if flags.vllm_version else None
    if not block_size_allowed(block_size, line):
        raise InputError("capacity.block_size", value=block_size, version=line_label(line) if line else "any",
                         choices=", ".join(map(str, line.block_sizes)) if line and line.block_sizes
                         else "1, 8, 16, 32, 64, 128, 256 (0.18+: a multiple of 16)")
    if spec.max_context is not None and max_model_len > spec.max_context:
        # vLLM's _get_and_verify_max_len refuses a max_model_len past the config's (VLLM_ALLOW_LONG_MAX_MODEL_LEN)
        raise InputError("capacity.past_context", value=max_model_len, name=spec.name or "the model",
                         limit=spec.max_context)
    if spec.n_params is None:
        raise InputError("capacity.params_unknown", name=spec.name or "?")
    shard = shard_for_tp(spec, tp)
    weights = math.ceil(weight_bytes(spec.n_params, weight_dtype) / tp)
    requested = int(device_total_bytes * gpu_memory_utilization)
    fp = kv_footprint(shard, max_model_len, 1, kv_dtype_name)
    given_version = parse_version(flags.vllm_version) if flags.vllm_version else None

    def layout(version: tuple[int, ...], engine: str, batch: int) -> KVLayout:
        return kv_layout(shard, version=given_version or version, engine=engine, max_model_len=max_model_len,
                         max_num_batched_tokens=batch, block_size=block_size, kv_dtype_name=kv_dtype_name)

    def split(kv: KVLayout, reserve: int) -> tuple[int, float]:
        blocks = kv.num_blocks(requested - weights - reserve)
        return kv.tokens(blocks, block_size, max_model_len), kv.concurrency(blocks, block_size, max_model_len)

    estimated = reserve_bytes is None
    terms = reserve_range = tokens_range = concurrency_range = narrows = launch = None
    if estimated:
        prediction = predict_reserve(spec, Gpu(device_total_bytes, gpu_name), flags, max_model_len=max_model_len,
                                     tp=tp, weight_dtype=weight_dtype)
        if prediction is None:
            raise InputError("capacity.reserve_unknown")
        likely: Reserve = prediction.likely
        reserve_bytes = likely.total
        kv = layout(likely.first, likely.engine, likely.max_num_batched_tokens)
        terms = likely.terms() | {"activation_peak": likely.activation_peak}
        reserve_range = (prediction.low.total, prediction.high.total)
        # each end with its own launch's layout: a sliding layer's blocks follow that launch's batch
        ends = [split(layout(r.first, r.engine, r.max_num_batched_tokens), r.total)
                for r in (prediction.low, likely, prediction.high)]
        tokens_range = (min(t for t, _ in ends), max(t for t, _ in ends))
        concurrency_range = (min(c for _, c in ends), max(c for _, c in ends))
        narrows = prediction.narrows
        launch = {"vllm_line": likely.line, "engine": likely.engine, "entry": likely.entry,
                  "sampler": likely.sampler_path, "max_num_batched_tokens": likely.max_num_batched_tokens,
                  "max_num_seqs": likely.max_num_seqs, "batch_source": likely.batch_source(),
                  "batch_why": list(likely.batch_why), "non_torch_source": likely.non_torch_source(),
                  "non_torch_why": list(likely.non_torch_why), "unknown": list(prediction.unknown),
                  "low_reserve_launch": _launch(prediction.low), "high_reserve_launch": _launch(prediction.high),
                  "activation_checked": not (spec.is_moe or spec.is_mla)}
    elif isinstance(reserve_bytes, bool) or not isinstance(reserve_bytes, int) or reserve_bytes < 0:
        raise InputError("positive_int", name="reserve_bytes", value=reserve_bytes)
    else:
        version, engine, batch = launch_batch(Gpu(device_total_bytes, gpu_name), flags, max_model_len=max_model_len)
        kv = layout(version, engine, batch)
    kv_budget = max(requested - weights - reserve_bytes, 0)
    num_blocks = kv.num_blocks(kv_budget)
    concurrency = kv.concurrency(num_blocks, block_size, max_model_len)
    return CapacityPlan(
        device_total_bytes=device_total_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        requested_bytes=requested,
        tp=tp,
        weights_bytes=weights,
        reserve_bytes=reserve_bytes,
        reserve_estimated=estimated,
        kv_budget_bytes=kv_budget,
        kv_dtype=fp.kv_dtype,
        block_size=block_size,
        kv_bytes_per_token=fp.per_token,
        kv_bytes_per_block=kv.page_bytes * kv.group_size,
        num_blocks=num_blocks,
        kv_cache_tokens=kv.tokens(num_blocks, block_size, max_model_len),
        max_model_len=max_model_len,
        blocks_per_request=kv.blocks_per_request,
        max_concurrency=concurrency,
        max_requests=math.floor(concurrency),
        weights_fit=requested >= weights + reserve_bytes,
        reserve_terms=terms,
        reserve_range=reserve_range,
        kv_cache_tokens_range=tokens_range,
        max_concurrency_range=concurrency_range,
        narrowing_flag=narrows,
        launch=launch,
        kv_cache_groups=[list(g) for g in kv.groups],
        padding_layers=kv.padding_layers,
        kv_rule=kv.source,
        sliding_as_full=kv.rule != "groups" and shard.n_sliding_layers > 0,
    )


@dataclass(frozen=True)
class AllocationComparison:
    """One mix of request lengths, cached two ways: each reserves max_len, or takes blocks as it grows."""

    lengths: tuple[int, ...]
    max_len: int
    block_size: int
    kv_bytes_per_token: int
    live_bytes: int  # the tokens actually cached
    contiguous_bytes: int  # every request reserves max_len up front
    paged_blocks: int  # Σ ceil(length / block)
    paged_bytes: int
    contiguous_waste_bytes: int
    paged_waste_bytes: int  # at most block_size − 1 tokens per request, all in its last block

    @property
    def contiguous_waste_fraction(self) -> float:
        return self.contiguous_waste_bytes / self.contiguous_bytes if self.contiguous_bytes else 0.0

    @property
    def paged_waste_fraction(self) -> float:
        return self.paged_waste_bytes / self.paged_bytes if self.paged_bytes else 0.0

    def requests_that_fit(self, kv_budget_bytes: int) -> tuple[int, int]:
        """Concurrent requests of this mix a KV budget holds: (each reserving max_len, in paged blocks)."""
        contiguous = kv_budget_bytes // (self.max_len * self.kv_bytes_per_token)
        paged = kv_budget_bytes * len(self.lengths) // self.paged_bytes  # at the mix's average block count
        return contiguous, paged

    def to_dict(self) -> dict:
        return asdict(self) | {
            "contiguous_waste_fraction": self.contiguous_waste_fraction,
            "paged_waste_fraction": self.paged_waste_fraction,
        }


def compare_allocation(
    lengths: list[int], max_len: int, kv_bytes_per_token: int, block_size: int = BLOCK_SIZE
) -> AllocationComparison:
    if not lengths:
        raise InputError("memory.no_lengths")
    for name, value in (("max_len", max_len), ("block_size", block_size), ("kv_bytes_per_token", kv_bytes_per_token)):
        if value <= 0:
            raise InputError("positive_int", name=name, value=value)
    for n in lengths:
        if n <= 0 or n > max_len:
            raise InputError("memory.bad_length", value=n, max_len=max_len)
    live_tokens = sum(lengths)
    blocks = sum(math.ceil(n / block_size) for n in lengths)
    live = live_tokens * kv_bytes_per_token
    contiguous = len(lengths) * max_len * kv_bytes_per_token
    paged = blocks * block_size * kv_bytes_per_token
    return AllocationComparison(
        lengths=tuple(lengths),
        max_len=max_len,
        block_size=block_size,
        kv_bytes_per_token=kv_bytes_per_token,
        live_bytes=live,
        contiguous_bytes=contiguous,
        paged_blocks=blocks,
        paged_bytes=paged,
        contiguous_waste_bytes=contiguous - live,
        paged_waste_bytes=paged - live,
    )


def parse_lengths(text: str) -> list[int]:
    """'100, 2000 37' → [100, 2000, 37]; anything else is a clear error."""
    parts = text.replace(",", " ").split()
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise InputError("memory.bad_lengths", text=text) from None


def capacity_report(spec: KVSpec, device_total_bytes: int, *, device_total_source: str, max_model_len: int,
                    engine: str = "vllm", tp: int = 1, kv_dtype_name: str = "bfloat16",
                    weight_dtype: str = "bfloat16", gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                    block_size: int = BLOCK_SIZE, reserve_bytes: int | None = None,
                    flags: ServingFlags | None = None, gpu_name: str | None = None, smi_mib: int | None = None,
                    mem_fraction_static: float | None = None, sglang_version: str | None = None) -> dict:
    """The plan of `engine` ("vllm" or "sglang") as one dict, headed by the model, its parameter count with their
    source and where the device total came from: what `kvviz capacity --json` prints."""
    head = {"model": spec.name, "n_params": spec.n_params, "params_source": spec.params_source,
            "device_total_source": device_total_source}
    if engine == "sglang":
        from kvviz.kv.sglang_pool import plan_sglang

        plan = plan_sglang(spec, device_total_bytes, context_len=max_model_len, tp=tp, smi_mib=smi_mib,
                           mem_fraction_static=mem_fraction_static, sglang_version=sglang_version,
                           kv_dtype_name=kv_dtype_name, weight_dtype=weight_dtype)
        return head | plan.to_dict()
    plan = plan_capacity(spec, device_total_bytes, max_model_len=max_model_len,
                         gpu_memory_utilization=gpu_memory_utilization, tp=tp, kv_dtype_name=kv_dtype_name,
                         weight_dtype=weight_dtype, block_size=block_size, reserve_bytes=reserve_bytes, flags=flags,
                         gpu_name=gpu_name)
    return head | {"engine": "vllm"} | plan.to_dict()
