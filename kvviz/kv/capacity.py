"""Capacity planning: how many tokens and requests fit in what the weights leave of a GPU's memory,
and what a contiguous max-length reservation wastes next to paged blocks (as vLLM's PagedAttention).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvviz.errors import InputError


@dataclass(frozen=True)
class CapacityPlan:
    gpu_memory_bytes: int
    memory_fraction: float  # share of the GPU the engine may use (vLLM's gpu_memory_utilization)
    usable_bytes: int  # gpu_memory · fraction
    weight_bytes: int
    kv_budget_bytes: int  # usable − weights (0 when the weights do not fit)
    kv_bytes_per_token: int  # all layers of one token
    max_tokens: int  # tokens the budget holds, summed over all requests
    context_tokens: int
    bytes_per_request: int  # one request's cache at the context length
    max_requests: int  # concurrent requests at that context
    weights_fit: bool

    def to_dict(self) -> dict:
        return asdict(self)


def plan_capacity(
    gpu_memory_bytes: int,
    memory_fraction: float,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context_tokens: int,
    bytes_per_request: int | None = None,
) -> CapacityPlan:
    """Budget → tokens → requests. bytes_per_request defaults to context · per-token (no sliding window)."""
    if not 0 < memory_fraction <= 1:
        raise InputError("memory.bad_fraction", value=memory_fraction)
    for name, value in (
        ("gpu_memory_bytes", gpu_memory_bytes),
        ("kv_bytes_per_token", kv_bytes_per_token),
        ("context_tokens", context_tokens),
    ):
        if value <= 0:
            raise InputError("positive_int", name=name, value=value)
    if weight_bytes < 0:
        raise InputError("positive_int", name="weight_bytes", value=weight_bytes)
    usable = int(gpu_memory_bytes * memory_fraction)
    budget = max(usable - weight_bytes, 0)
    per_request = bytes_per_request if bytes_per_request is not None else context_tokens * kv_bytes_per_token
    return CapacityPlan(
        gpu_memory_bytes=gpu_memory_bytes,
        memory_fraction=memory_fraction,
        usable_bytes=usable,
        weight_bytes=weight_bytes,
        kv_budget_bytes=budget,
        kv_bytes_per_token=kv_bytes_per_token,
        max_tokens=budget // kv_bytes_per_token,
        context_tokens=context_tokens,
        bytes_per_request=per_request,
        max_requests=budget // per_request if per_request else 0,
        weights_fit=usable >= weight_bytes,
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
