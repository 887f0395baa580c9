"""The one description of a model's KV cache (KVSpec) and the one formula over it (kv_footprint).

What one token leaves in one layer's cache — a K and a V vector per KV head (MHA/GQA/MQA), or one MLA latent
plus one shared RoPE key — how many tokens each layer keeps (sliding-window layers keep only the last W − 1
past tokens), and the storage format with its quantization scales (kvviz.kv.formats: the one table of KV
formats). Every byte count the app, the CLI, the
engine's formula column, the capacity planner, the roofline and the hosted budget show comes from
kv_footprint(); a second formula anywhere is a bug. No torch needed.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from kvviz.errors import InputError
from kvviz.kv.formats import KVDtype, kv_dtype

# Where a parameter count came from; "unknown" is never replaced by a default.
PARAM_SOURCES = ("counted", "published", "estimated", "given", "unknown")


def _check_positive(**sizes: float) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InputError("positive_int", name=name, value=value)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError("n_tokens_negative" if name == "n_tokens" else "positive_int", name=name, value=value)
    return value


# ---- the description --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVSpec:
    """A model as every KV number sees it: per-layer cache shape, plus the facts around it (or unknown).

    Built by one reader (kvviz.kv.reader) from the native config, any Hugging Face config.json and the presets.
    """

    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int
    d_head: int
    kv_lora_rank: int = 0  # MLA: the compressed latent c_KV cached instead of K and V
    qk_rope_head_dim: int = 0  # MLA: the decoupled RoPE key, shared by all heads, cached beside it
    sliding_window: int = 0  # W: a sliding layer's query attends to itself and the W − 1 tokens before it
    n_sliding_layers: int = 0
    name: str = ""
    d_model: int | None = None
    vocab_size: int | None = None
    max_context: int | None = None
    n_params: int | None = None  # None = unknown, never a default
    params_source: str = "unknown"
    is_moe: bool = False  # experts: a token reads only some weights (the roofline's weight bytes are unknown)
    model_type: str = ""
    d_ff: int | None = None  # the MLP's inner width (intermediate_size); None = unknown
    mlp_gated: bool | None = None  # gate·up then down (Llama) or fc1 then fc2 (GPT-2, OPT); None = unknown
    # Mixture of experts (what vLLM's profile run allocates for a routed MLP): 0 / None = not an MoE or not said
    n_experts: int = 0  # routed experts (num_local_experts, n_routed_experts, num_experts)
    n_experts_per_token: int = 0  # num_experts_per_tok: the experts each token is routed to
    moe_d_ff: int | None = None  # one expert's inner width (moe_intermediate_size, else intermediate_size)
    n_shared_experts: int = 0  # DeepSeek's always-on experts of moe_d_ff each
    n_dense_layers: int = 0  # DeepSeek's first_k_dense_replace: leading layers with a dense MLP of d_ff
    q_lora_rank: int = 0  # MLA: the query's low-rank width (0: queries projected directly)
    v_head_dim: int = 0  # MLA: one head's value width

    def __post_init__(self) -> None:
        _check_positive(n_layers=self.n_layers, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, d_head=self.d_head)
        for name in ("kv_lora_rank", "qk_rope_head_dim", "sliding_window", "n_sliding_layers"):
            _check_count(name, getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise InputError("not_divisible", n_heads=self.n_heads, n_kv_heads=self.n_kv_heads)
        if self.n_sliding_layers > self.n_layers or (self.n_sliding_layers and self.sliding_window < 2):
            raise InputError("memory.bad_window", window=self.sliding_window, layers=self.n_sliding_layers,
                             n_layers=self.n_layers)
        if self.params_source not in PARAM_SOURCES:
            raise ValueError(f"params_source {self.params_source!r} not in {PARAM_SOURCES}")
        if (self.n_params is None) != (self.params_source == "unknown"):
            raise ValueError("n_params is None exactly when params_source is 'unknown'")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_kind(self) -> str:
        if self.is_mla:
            return "MLA"
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 for MHA, all of them for MQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def vectors_per_token_layer(self) -> tuple[int, int]:
        """(how many vectors, values in each) one token caches in one layer."""
        if self.is_mla:
            return 1, self.kv_lora_rank + self.qk_rope_head_dim  # one latent + one shared RoPE key
        return 2 * self.n_kv_heads, self.d_head  # a K and a V vector per KV head

    @property
    def values_per_token_layer(self) -> int:
        count, length = self.vectors_per_token_layer
        return count * length

    @property
    def window_kept(self) -> int:
        """Past tokens a sliding layer keeps between passes: the next query sees itself and W − 1 before it
        (transformers' DynamicSlidingWindowLayer keeps exactly these)."""
        return self.sliding_window - 1 if self.n_sliding_layers else 0

    def layer_lengths(self, n_tokens: int) -> list[int]:
        """Tokens each layer keeps after n tokens: full layers first, then the sliding ones (the sum is what
        counts; which layers slide is the config's business)."""
        full = self.n_layers - self.n_sliding_layers
        return [n_tokens] * full + [min(n_tokens, self.window_kept)] * self.n_sliding_layers

    def keys_attended(self, n_past: int, n_new: int) -> int:
        """Σ over layers and new queries of the keys each query scores (a window caps it at W)."""
        # Closed forms of Σ_i (n_past + i + 1) and Σ_i min(n_past + i + 1, W): a 128k-token prefill is one step.
        full = self.n_layers - self.n_sliding_layers
        total = full * (n_new * n_past + n_new * (n_new + 1) // 2)
        if self.n_sliding_layers:
            first, w = n_past + 1, self.sliding_window
            below = min(max(w - first, 0), n_new)  # queries that see fewer than W keys
            total += self.n_sliding_layers * (below * first + below * (below - 1) // 2 + (n_new - below) * w)
        return total

    def with_params(self, n_params: int | None, source: str) -> KVSpec:
        return replace(self, n_params=n_params, params_source=source if n_params is not None else "unknown")

    def to_dict(self) -> dict:
        return asdict(self) | {"attention_kind": self.attention_kind}


# ---- the formula ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVFootprint:
    """Every intermediate of the formula, in bytes: token·layer → token → request → all requests."""

    kind: str
    kv_dtype: str
    batch: int
    n_tokens: int
    n_layers: int
    n_kv_heads: int
    d_head: int
    values_per_token_per_layer: int  # 2·H_kv·d_head, or kv_lora_rank + qk_rope_head_dim for MLA
    bytes_per_elem: float  # data bytes per value, scales not included
    scale_bytes_per_token_per_layer: int  # quantization scales (0 for float formats)
    per_token_per_layer: int  # values · bytes + scales
    per_token: int  # · L (every layer, before any window cap)
    cached_token_layers: int  # Σ_layers tokens kept = L·n without a window
    per_request: int  # per_token_per_layer · cached_token_layers
    total: int  # · B
    sliding_window: int = 0
    n_sliding_layers: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def kv_bytes(spec: KVSpec, layer_lengths: Sequence[int], batch: int = 1,
             kv_dtype_name: str | KVDtype = "bfloat16") -> int:
    """B · Σ_layers (tokens the layer keeps) · (bytes one token leaves in one layer, scales included)."""
    count, length = spec.vectors_per_token_layer
    return batch * sum(layer_lengths) * count * kv_dtype(kv_dtype_name).vector_bytes(length)


def kv_footprint(spec: KVSpec, n_tokens: int, batch: int = 1,
                 kv_dtype_name: str | KVDtype = "bfloat16") -> KVFootprint:
    """The one function behind every KV figure (MHA/GQA/MQA/MLA, windows, quantized dtypes)."""
    _check_positive(batch=batch)
    _check_count("n_tokens", n_tokens)
    fmt = kv_dtype(kv_dtype_name)
    count, length = spec.vectors_per_token_layer
    per_token_per_layer = kv_bytes(spec, [1], 1, fmt)
    token_layers = sum(spec.layer_lengths(n_tokens))
    per_request = kv_bytes(spec, spec.layer_lengths(n_tokens), 1, fmt)
    return KVFootprint(
        kind=spec.attention_kind,
        kv_dtype=fmt.name,
        batch=batch,
        n_tokens=n_tokens,
        n_layers=spec.n_layers,
        n_kv_heads=spec.n_kv_heads,
        d_head=spec.d_head,
        values_per_token_per_layer=count * length,
        bytes_per_elem=fmt.data_bytes,
        scale_bytes_per_token_per_layer=per_token_per_layer - count * math.ceil(length * fmt.data_bytes),
        per_token_per_layer=per_token_per_layer,
        per_token=per_token_per_layer * spec.n_layers,
        cached_token_layers=token_layers,
        per_request=per_request,
        total=per_request * batch,
        sliding_window=spec.sliding_window,
        n_sliding_layers=spec.n_sliding_layers,
    )


def attention_variants(spec: KVSpec) -> dict[str, KVSpec]:
    """MHA, GQA, MQA and MLA at the same L, query heads and d_head: only what each token caches differs.

    GQA keeps the model's own groups, else the largest group count ≤ 8 dividing the heads (Llama's 8), and is
    left out when no such count exists (then it would equal MHA or MQA); MLA keeps the model's own ranks, else
    DeepSeek's ratios: latent 4·d_head, RoPE key d_head/2.
    """
    h, d, L = spec.n_heads, spec.d_head, spec.n_layers
    groups = spec.n_kv_heads if spec.attention_kind == "GQA" else max(
        (g for g in range(2, 9) if h % g == 0 and g < h), default=0)
    rank, rope = (spec.kv_lora_rank, spec.qk_rope_head_dim) if spec.is_mla else (4 * d, d // 2)
    out = {"MHA": KVSpec(L, h, h, d)}
    if groups:
        out["GQA"] = KVSpec(L, h, groups, d)
    if h > 1:
        out["MQA"] = KVSpec(L, h, 1, d)
    out["MLA"] = KVSpec(L, h, h, d, kv_lora_rank=rank, qk_rope_head_dim=rope)
    return out


def tokens_to_reach(
    spec: KVSpec, target_bytes: int, batch: int, kv_dtype_name: str, limit: int = 1 << 24
) -> int | None:
    """Smallest context n whose cache (B requests) reaches target_bytes, or None when it never does
    (a model whose every layer slides stops growing) or not within `limit` tokens."""
    if kv_footprint(spec, limit, batch, kv_dtype_name).total < target_bytes:
        return None
    lo, hi = 0, limit  # the footprint never shrinks as n grows, so bisect
    while lo < hi:
        mid = (lo + hi) // 2
        if kv_footprint(spec, mid, batch, kv_dtype_name).total >= target_bytes:
            hi = mid
        else:
            lo = mid + 1
    return lo


def cache_stops_growing(spec: KVSpec) -> bool:
    """True when every layer keeps only a window: the cache is capped, whatever the context."""
    return spec.n_sliding_layers == spec.n_layers


def weight_bytes(n_params: int | None, weight_dtype: str) -> int | None:
    """Weight memory: parameters · bytes per weight; None when the count is unknown.
    (Quantized weights' small scale overhead is not counted.)"""
    if n_params is None:
        return None
    _check_positive(n_params=n_params)
    return math.ceil(n_params * kv_dtype(weight_dtype).data_bytes)


def attention_scores_per_pass(spec: KVSpec, n_new: int, n_past: int) -> int:
    """Dot products q·k for n_new queries after n_past cached keys under a causal mask (a sliding layer's
    query sees at most its window), all layers and query heads."""
    return spec.n_heads * spec.keys_attended(n_past, n_new)


def footprint_report(spec: KVSpec, *, n_tokens: int, batch: int = 1, kv_dtype_name: str = "bfloat16",
                     weight_dtype: str = "bfloat16") -> dict:
    """A named model's KV footprint with every intermediate, its MLA factors where it has them, and its weights'
    bytes (None where the parameter count is unknown): what `kvviz memory --preset/--config --json` prints."""
    out = {"model": spec.name, **kv_footprint(spec, n_tokens, batch, kv_dtype_name).to_dict()}
    if spec.is_mla:
        out |= {"kv_lora_rank": spec.kv_lora_rank, "qk_rope_head_dim": spec.qk_rope_head_dim}
    return out | {"n_params": spec.n_params, "params_source": spec.params_source, "weight_dtype": weight_dtype,
                  "weight_bytes": weight_bytes(spec.n_params, weight_dtype)}


def shape_footprint(n_layers: int, n_kv_heads: int, d_head: int, *, n_tokens: int, batch: int = 1,
                    kv_dtype_name: str = "bfloat16") -> dict:
    """The footprint of a bare shape (L, H_kv, d_head). Query heads do not change the bytes, so the attention kind
    (which needs them) is left out rather than guessed."""
    fp = kv_footprint(KVSpec(n_layers, n_kv_heads, n_kv_heads, d_head), n_tokens, batch, kv_dtype_name)
    return {k: v for k, v in fp.to_dict().items() if k != "kind"}


def shard_for_tp(spec: KVSpec, tp: int) -> KVSpec:
    """One GPU's part of the model under tensor parallelism, as vLLM splits it: query heads ÷ tp, KV heads ÷ tp
    (replicated when there are fewer KV heads than GPUs), an MLA latent whole on every GPU (vLLM's MLA attention
    splits the query heads and replicates the latent cache on every rank)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError("positive_int", name="tp", value=tp)
    if tp == 1:
        return spec
    if spec.n_heads % tp:
        raise InputError("capacity.tp_heads", heads=spec.n_heads, tp=tp)
    heads = spec.n_heads // tp
    if spec.is_mla:  # the latent is not split by heads: the KV bytes per token stay whole
        return replace(spec, n_heads=heads, n_kv_heads=heads)
    kv = max(1, spec.n_kv_heads // tp)
    if heads % kv:
        raise InputError("capacity.tp_heads", heads=spec.n_heads, tp=tp)
    return replace(spec, n_heads=heads, n_kv_heads=kv)
