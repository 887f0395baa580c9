"""Roofline lower bounds for serving a decoder on an accelerator (no torch needed).

A decode step must read every weight once (shared by the batch) plus each request's KV cache, and
do ~2 FLOPs per parameter per token; prefill does the same FLOPs for every prompt token at once. A
pass can be no faster than its bytes / bandwidth nor its FLOPs / peak: the bound is the larger one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvviz.kv.formula import kv_cache_bytes
from kvviz.kv.hardware import Hardware


@dataclass(frozen=True)
class ModelShape:
    """The few numbers a roofline needs. (The Memory page's presets carry the same fields.)"""

    name: str
    n_params: float
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int

    def weight_bytes(self, bytes_per_param: float) -> float:
        # All parameters: the embedding lookup reads one row only, a small overestimate (~5% for 8B).
        return self.n_params * bytes_per_param

    def kv_bytes_per_token(self, kv_bytes_per_elem: float) -> int:
        return kv_cache_bytes(1, self.n_layers, 1, self.n_kv_heads, self.d_head, kv_bytes_per_elem)

    def decode_flops_per_token(self, n_context: int) -> float:
        """2 FLOPs per weight (multiply-add), plus QKᵀ and PV over the cached context (2·2·L·H_q·d_head·n)."""
        return 2 * self.n_params + 4 * self.n_layers * self.n_heads * self.d_head * n_context

    def prefill_flops(self, n_prompt: int) -> float:
        """Weights for every prompt token, plus causal attention (half of the n² score matrix, for QKᵀ and PV)."""
        return 2 * self.n_params * n_prompt + 2 * self.n_layers * self.n_heads * self.d_head * n_prompt**2

    @classmethod
    def from_arch(cls, arch: object) -> ModelShape:
        """The model a backend runs (anything with ArchInfo's fields, e.g. backend.arch)."""
        a = arch
        return cls(a.name, float(a.n_params), a.n_layers, a.n_heads, a.n_kv_heads, a.d_head)  # type: ignore[attr-defined]


def preset_shapes() -> dict[str, ModelShape]:
    """The Memory page's presets (kvviz/presets.py) whose cache grows by a fixed amount per token.

    MLA and sliding-window models are left out: their per-token cost is not one constant (and
    DeepSeek-V3's parameters are mostly experts a token never reads).
    """
    from kvviz.kv.presets import PRESETS

    return {
        name: ModelShape(name, float(spec.n_params), s.n_layers, s.n_heads, s.n_kv_heads, s.d_head)
        for name, spec in PRESETS.items()
        if spec.n_params and not (s := spec.shape).is_mla and not s.n_sliding_layers
    }


@dataclass(frozen=True)
class PassBound:
    """Lower bound of one forward pass: the slower of moving its bytes and doing its FLOPs."""

    bytes_moved: float
    flops: float
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def limited_by(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": self.seconds, "limited_by": self.limited_by}


def _bound(bytes_moved: float, flops: float, hw: Hardware) -> PassBound:
    return PassBound(bytes_moved, flops, bytes_moved / hw.bandwidth_bytes_per_s, flops / hw.peak_flops)


def decode_bound(
    model: ModelShape, hw: Hardware, *, batch: int, n_context: int, weight_bytes_per_param: float = 2,
    kv_bytes_per_elem: float = 2,
) -> PassBound:
    """TPOT ≥ (weight bytes + B·KV bytes) / bandwidth, and ≥ B·FLOPs per token / peak."""
    kv = batch * model.kv_bytes_per_token(kv_bytes_per_elem) * n_context
    return _bound(model.weight_bytes(weight_bytes_per_param) + kv, batch * model.decode_flops_per_token(n_context), hw)


def prefill_bound(
    model: ModelShape, hw: Hardware, *, n_prompt: int, batch: int = 1, weight_bytes_per_param: float = 2,
    kv_bytes_per_elem: float = 2,
) -> PassBound:
    """Prefill ≥ FLOPs / peak (usually the binding one), and ≥ (weights + the KV it writes) / bandwidth."""
    kv = batch * model.kv_bytes_per_token(kv_bytes_per_elem) * n_prompt
    return _bound(model.weight_bytes(weight_bytes_per_param) + kv, batch * model.prefill_flops(n_prompt), hw)


def compute_bound_batch(
    model: ModelShape, hw: Hardware, *, n_context: int, weight_bytes_per_param: float = 2,
    kv_bytes_per_elem: float = 2,
) -> float | None:
    """Batch B where decode's compute time reaches its memory time; None if it never does.

    B·F/peak = (W + B·KV)/bw  ⇒  B = (W/bw) / (F/peak − KV/bw). Each request adds its own cache reads, so
    with long contexts the denominator can turn ≤ 0: attention stays memory-bound at any batch.
    """
    per_request = model.decode_flops_per_token(n_context) / hw.peak_flops - (
        model.kv_bytes_per_token(kv_bytes_per_elem) * n_context / hw.bandwidth_bytes_per_s
    )
    if per_request <= 0:
        return None
    return model.weight_bytes(weight_bytes_per_param) / hw.bandwidth_bytes_per_s / per_request


def kv_equals_weights_tokens(
    model: ModelShape, *, batch: int, weight_bytes_per_param: float = 2, kv_bytes_per_elem: float = 2
) -> float:
    """Total cached tokens per request at which the batch's KV cache weighs as much as the weights."""
    return model.weight_bytes(weight_bytes_per_param) / (batch * model.kv_bytes_per_token(kv_bytes_per_elem))


def max_batch_that_fits(
    model: ModelShape, hw: Hardware, *, n_context: int, weight_bytes_per_param: float = 2,
    kv_bytes_per_elem: float = 2,
) -> int:
    """Requests of n_context tokens whose caches fit in memory beside the weights (0 if weights alone do not)."""
    free = hw.memory_bytes - model.weight_bytes(weight_bytes_per_param)
    per_request = model.kv_bytes_per_token(kv_bytes_per_elem) * n_context
    return max(0, math.floor(free / per_request)) if per_request else 0


def decode_curve(
    model: ModelShape, hw: Hardware, *, batches: list[int], n_context: int, weight_bytes_per_param: float = 2,
    kv_bytes_per_elem: float = 2,
) -> list[dict]:
    """One row per batch size: the bound's parts, TPOT and tokens/s, for the roofline chart."""
    rows = []
    for b in batches:
        bound = decode_bound(model, hw, batch=b, n_context=n_context, weight_bytes_per_param=weight_bytes_per_param,
                             kv_bytes_per_elem=kv_bytes_per_elem)
        rows.append({"batch": b, **bound.to_dict(), "tokens_per_s": b / bound.seconds,
                     "kv_bytes": b * model.kv_bytes_per_token(kv_bytes_per_elem) * n_context,
                     "weight_bytes": model.weight_bytes(weight_bytes_per_param)})
    return rows
