"""Roofline lower bounds for serving a decoder on an accelerator (no torch needed).

A decode step must read every weight once (shared by the batch) plus each request's KV cache, and do ~2 FLOPs
per parameter per token; prefill does the same FLOPs for every prompt token at once. A pass can be no faster
than its bytes / bandwidth nor its FLOPs / peak: the bound is the larger one. KV bytes come from kv_footprint
(windows and quantization scales included); how many requests fit comes from the capacity planner.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint, tokens_to_reach, weight_bytes
from kvviz.kv.hardware import Hardware


@dataclass(frozen=True)
class Roofline:
    """One model, its storage formats and one accelerator: the numbers every bound below needs."""

    spec: KVSpec
    hw: Hardware
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.spec.n_params is None:
            raise InputError("capacity.params_unknown", name=self.spec.name or "?")
        if self.spec.is_moe:
            # A token reads only its experts' weights, which the config alone does not give.
            raise InputError("capacity.moe_weights", name=self.spec.name or "?")
        self.kv_bytes(1)  # a KV format the model's heads do not fit (llama.cpp's blocks) is refused here, not later

    @property
    def weight_bytes(self) -> int:
        # All parameters: the embedding lookup reads one row only, a small overestimate (~5% for 8B).
        return weight_bytes(self.spec.n_params, self.weight_dtype)

    def kv_bytes(self, n_context: int, batch: int = 1) -> int:
        """KV bytes a step reads for `batch` requests of n_context cached tokens (windows cap it)."""
        return kv_footprint(self.spec, n_context, batch, self.kv_dtype).total

    def decode_flops_per_token(self, n_context: int) -> float:
        """2 FLOPs per weight (multiply-add), plus QKᵀ and PV over the keys the new query sees (2·2·H_q·d_head
        per key and layer)."""
        keys = self.spec.keys_attended(max(n_context - 1, 0), 1)
        return 2 * self.spec.n_params + 4 * self.spec.n_heads * self.spec.d_head * keys

    def prefill_flops(self, n_prompt: int) -> float:
        """Weights for every prompt token, plus causal attention over the keys each query sees."""
        keys = self.spec.keys_attended(0, n_prompt)
        return 2 * self.spec.n_params * n_prompt + 4 * self.spec.n_heads * self.spec.d_head * keys

    def _bound(self, bytes_moved: float, flops: float) -> PassBound:
        return PassBound(bytes_moved, flops, bytes_moved / self.hw.bandwidth_bytes_per_s, flops / self.hw.peak_flops)

    def decode_bound(self, *, batch: int, n_context: int) -> PassBound:
        """TPOT ≥ (weight bytes + B·KV bytes) / bandwidth, and ≥ B·FLOPs per token / peak."""
        return self._bound(self.weight_bytes + self.kv_bytes(n_context, batch),
                           batch * self.decode_flops_per_token(n_context))

    def prefill_bound(self, *, n_prompt: int, batch: int = 1) -> PassBound:
        """Prefill ≥ FLOPs / peak (usually the binding one), and ≥ (weights + the KV it writes) / bandwidth."""
        return self._bound(self.weight_bytes + self.kv_bytes(n_prompt, batch), batch * self.prefill_flops(n_prompt))

    def verify_bound(self, *, n_past: int, n_new: int) -> PassBound:
        """One pass over n_new tokens after n_past cached ones (a speculative verify: n_new = k + 1): the weights
        read once and the KV of all n_past + n_new positions, FLOPs for every new token. n_new = 1 is a decode
        step and n_past = 0 a prefill: while it is memory-bound, k + 1 positions cost about one decode step."""
        flops = 2 * self.spec.n_params * n_new + 4 * self.spec.n_heads * self.spec.d_head * self.spec.keys_attended(
            n_past, n_new)
        return self._bound(self.weight_bytes + self.kv_bytes(n_past + n_new), flops)

    def compute_bound_batch(self, *, n_context: int) -> float | None:
        """Batch B where decode's compute time reaches its memory time; None if it never does.

        B·F/peak = (W + B·KV)/bw  ⇒  B = (W/bw) / (F/peak − KV/bw). Each request adds its own cache reads, so
        with long contexts the denominator can turn ≤ 0: attention stays memory-bound at any batch.
        """
        per_request = self.decode_flops_per_token(n_context) / self.hw.peak_flops - (
            self.kv_bytes(n_context) / self.hw.bandwidth_bytes_per_s
        )
        if per_request <= 0:
            return None
        return self.weight_bytes / self.hw.bandwidth_bytes_per_s / per_request

    def kv_equals_weights_tokens(self, *, batch: int) -> int | None:
        """Cached tokens per request at which the batch's KV cache weighs as much as the weights (None: never,
        a cache whose every layer slides stops growing first)."""
        return tokens_to_reach(self.spec, self.weight_bytes, batch, self.kv_dtype)

    def decode_curve(self, *, batches: list[int], n_context: int) -> list[dict]:
        """One row per batch size: the bound's parts, TPOT and tokens/s, for the roofline chart."""
        rows = []
        for b in batches:
            bound = self.decode_bound(batch=b, n_context=n_context)
            rows.append({"batch": b, **bound.to_dict(), "tokens_per_s": b / bound.seconds,
                         "kv_bytes": self.kv_bytes(n_context, b), "weight_bytes": self.weight_bytes})
        return rows


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
