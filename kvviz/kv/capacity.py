"""Capacity planning as vLLM does it at start-up (how many KV tokens and requests fit in what the weights and
the profiled activations leave of each GPU), and what a contiguous max-length reservation wastes next to paged
blocks (PagedAttention). Checked against real vLLM start-up logs in tests/fixtures/vllm_logs.json.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint, weight_bytes

# vLLM's defaults where a log or the user does not say otherwise: 16-token blocks, utilization 0.9, and the
# profiling run's batch (max_num_batched_tokens 8192, max_num_seqs 256).
BLOCK_SIZE = 16
GPU_MEMORY_UTILIZATION = 0.9
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 256
NON_TORCH_BYTES = 256 * 2**20  # CUDA context, cuBLAS workspaces: 0.04–0.35 GiB on one GPU in the logs we keep


def estimate_reserve_bytes(spec: KVSpec, *, max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                           max_num_seqs: int = MAX_NUM_SEQS, act_bytes: int = 2) -> int | None:
    """A rough stand-in for what vLLM measures by profiling before it sizes the cache: the peak activations of
    one batch of max_num_batched_tokens (≈ 16·d_model values per token in 16-bit, MLP intermediate included),
    the sampler's float32 logits and probabilities for max_num_seqs rows, and non-torch memory. None when the
    shape lacks d_model or vocab_size. The logs we keep measured 0.5–9.5 GiB: replace it with your own log's
    "activation peak + non_torch" whenever you have one."""
    if spec.d_model is None or spec.vocab_size is None:
        return None
    activations = max_num_batched_tokens * 16 * spec.d_model * act_bytes
    sampler = max_num_seqs * spec.vocab_size * 4 * 2
    return activations + sampler + NON_TORCH_BYTES


def shard_for_tp(spec: KVSpec, tp: int) -> KVSpec:
    """One GPU's part of the model under tensor parallelism, as vLLM splits it: query heads ÷ tp, KV heads ÷ tp
    (replicated when there are fewer KV heads than GPUs), an MLA latent whole on every GPU."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError("positive_int", name="tp", value=tp)
    if tp == 1:
        return spec
    if spec.n_heads % tp:
        raise InputError("capacity.tp_heads", heads=spec.n_heads, tp=tp)
    heads = spec.n_heads // tp
    # MLA caches one latent per token whatever the heads: its "KV heads" follow the query heads on each GPU.
    kv = heads if spec.is_mla else max(1, spec.n_kv_heads // tp)
    if heads % kv:
        raise InputError("capacity.tp_heads", heads=spec.n_heads, tp=tp)
    return replace(spec, n_heads=heads, n_kv_heads=kv)


@dataclass(frozen=True)
class CapacityPlan:
    """vLLM's start-up arithmetic, per GPU: total × utilization − weights − reserve = KV budget → blocks →
    tokens, and "maximum concurrency for max_model_len tokens per request"."""

    device_total_bytes: int  # one GPU, as torch.cuda.mem_get_info() reports it (vLLM's total_gpu_memory)
    gpu_memory_utilization: float
    requested_bytes: int  # total · utilization
    tp: int
    weights_bytes: int  # one GPU's share: parameters · bytes ÷ tp
    reserve_bytes: int  # activation peak + non-torch memory
    reserve_estimated: bool
    kv_budget_bytes: int  # requested − weights − reserve (0 when nothing is left)
    kv_dtype: str
    block_size: int
    kv_bytes_per_token: int  # one GPU, all layers
    kv_bytes_per_block: int
    num_blocks: int
    kv_cache_tokens: int  # num_blocks · block_size (vLLM's "GPU KV cache size: N tokens")
    max_model_len: int
    blocks_per_request: int  # blocks one max_model_len request needs (sliding layers need fewer)
    max_concurrency: float  # num_blocks / blocks_per_request
    max_requests: int  # whole requests of max_model_len tokens
    weights_fit: bool

    def to_dict(self) -> dict:
        return asdict(self)


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
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
) -> CapacityPlan:
    """The KV capacity of one model on tp GPUs of device_total_bytes each, computed as vLLM computes it."""
    if isinstance(gpu_memory_utilization, bool) or not 0 < gpu_memory_utilization <= 1:
        raise InputError("memory.bad_fraction", value=gpu_memory_utilization)
    for name, value in (("device_total_bytes", device_total_bytes), ("max_model_len", max_model_len),
                        ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError("positive_int", name=name, value=value)
    if spec.n_params is None:
        raise InputError("capacity.params_unknown", name=spec.name or "?")
    shard = shard_for_tp(spec, tp)
    weights = math.ceil(weight_bytes(spec.n_params, weight_dtype) / tp)
    estimated = reserve_bytes is None
    if estimated:
        reserve_bytes = estimate_reserve_bytes(shard, max_num_batched_tokens=max_num_batched_tokens)
        if reserve_bytes is None:
            raise InputError("capacity.reserve_unknown")
    elif reserve_bytes < 0:
        raise InputError("positive_int", name="reserve_bytes", value=reserve_bytes)
    requested = int(device_total_bytes * gpu_memory_utilization)
    budget = max(requested - weights - reserve_bytes, 0)
    fp = kv_footprint(shard, max_model_len, 1, kv_dtype_name)
    per_block = fp.per_token * block_size
    num_blocks = budget // per_block
    # a request's blocks: full layers hold max_model_len tokens, sliding layers only their window
    blocks_per_request = max(1, math.ceil(fp.per_request / per_block))
    return CapacityPlan(
        device_total_bytes=device_total_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        requested_bytes=requested,
        tp=tp,
        weights_bytes=weights,
        reserve_bytes=reserve_bytes,
        reserve_estimated=estimated,
        kv_budget_bytes=budget,
        kv_dtype=fp.kv_dtype,
        block_size=block_size,
        kv_bytes_per_token=fp.per_token,
        kv_bytes_per_block=per_block,
        num_blocks=num_blocks,
        kv_cache_tokens=num_blocks * block_size,
        max_model_len=max_model_len,
        blocks_per_request=blocks_per_request,
        max_concurrency=num_blocks / blocks_per_request,
        max_requests=num_blocks // blocks_per_request,
        weights_fit=requested >= weights + reserve_bytes,
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
    lengths: list[int], max_len: int, kv_bytes_per_token: int, block_size: int = 16
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
