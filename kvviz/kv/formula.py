"""The KV-cache memory formula, M_KV = 2 · B · L · n · H_kv · d_head · bytes, with its intermediates.

Everything the app and CLI show about KV memory comes from here (no torch needed).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

from kvviz.errors import InputError

# Bytes per cached element for each KV dtype; int4 packs two values in a byte.
KV_DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


def dtype_bytes(name: str) -> float:
    try:
        return KV_DTYPE_BYTES[name]
    except KeyError:
        raise InputError("unknown_kv_dtype", name=name, choices=", ".join(KV_DTYPE_BYTES)) from None


def _check_positive(**sizes: float) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InputError("positive_int", name=name, value=value)


def _times_bytes(elements: int, bytes_per_elem: float) -> int:
    """elements · bytes, exact at any size (a float product drops whole bytes past 2**53)."""
    return int(elements * Fraction(bytes_per_elem))


def kv_cache_bytes(
    batch: int, n_layers: int, n_tokens: int, n_kv_heads: int, d_head: int, bytes_per_elem: float
) -> int:
    """2 (K and V) · B · L · n · H_kv · d_head · bytes. n_tokens may be 0 (an empty cache)."""
    _check_positive(batch=batch, n_layers=n_layers, n_kv_heads=n_kv_heads, d_head=d_head, bytes_per_elem=bytes_per_elem)
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
        raise InputError("n_tokens_negative", value=n_tokens)
    return _times_bytes(2 * batch * n_layers * n_tokens * n_kv_heads * d_head, bytes_per_elem)


def live_kv_bytes(batch: int, layer_lengths: list[int], elems_per_token_per_layer: int, bytes_per_elem: float) -> int:
    """The formula over a live cache whose layers may hold different lengths (sliding windows):
    B · Σ_layers n_layer · (2·H_kv·d_head, or the MLA latent + RoPE key) · bytes."""
    return int(batch * sum(layer_lengths) * elems_per_token_per_layer * bytes_per_elem)


@dataclass(frozen=True)
class KVMemory:
    """Each step of the formula, as the study note walks it: token·layer → token → request → all requests."""

    batch: int
    n_layers: int
    n_tokens: int
    n_kv_heads: int
    d_head: int
    bytes_per_elem: float
    per_token_per_layer: int  # 2 · H_kv · d_head · bytes
    per_token: int  # · L
    per_request: int  # · n
    total: int  # · B

    def to_dict(self) -> dict:
        return asdict(self)


def kv_memory(
    batch: int, n_layers: int, n_tokens: int, n_kv_heads: int, d_head: int, bytes_per_elem: float
) -> KVMemory:
    total = kv_cache_bytes(batch, n_layers, n_tokens, n_kv_heads, d_head, bytes_per_elem)
    per_token_per_layer = _times_bytes(2 * n_kv_heads * d_head, bytes_per_elem)
    return KVMemory(
        batch=batch,
        n_layers=n_layers,
        n_tokens=n_tokens,
        n_kv_heads=n_kv_heads,
        d_head=d_head,
        bytes_per_elem=bytes_per_elem,
        per_token_per_layer=per_token_per_layer,
        per_token=per_token_per_layer * n_layers,
        per_request=per_token_per_layer * n_layers * n_tokens,
        total=total,
    )


def _format_units(n_bytes: float, step: int, units: tuple[str, ...]) -> str:
    value = float(n_bytes)
    for unit in units[:-1]:
        if abs(value) < step:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= step
    return f"{value:.2f} {units[-1]}"


def format_binary(n_bytes: float) -> str:
    """Binary units, labelled as such (KiB = 1024 B): the usual calculator mistake is GiB printed as GB."""
    return _format_units(n_bytes, 1024, ("B", "KiB", "MiB", "GiB", "TiB"))


def format_decimal(n_bytes: float) -> str:
    """Decimal units (kB = 1000 B, GB = 10⁹ B), only for comparison with marketed sizes; shown beside binary."""
    return _format_units(n_bytes, 1000, ("B", "kB", "MB", "GB", "TB"))


# ---- quantized KV dtypes: data bytes plus the scales each group of values carries ------------------------


@dataclass(frozen=True)
class KVDtype:
    """A KV storage format: bytes per value and the scale overhead of its quantization groups."""

    name: str
    data_bytes: float  # per cached value
    group_size: int = 0  # values sharing one scale (0 = no per-group scale)
    scale_bytes_per_group: int = 0  # fp16 scale (+ fp16 zero point for asymmetric int4)

    def vector_bytes(self, n_values: int) -> int:
        """Bytes of one cached vector of n_values (a K or V head, or an MLA latent), scales included."""
        data = math.ceil(n_values * self.data_bytes)  # int4 packs two values per byte
        groups = math.ceil(n_values / self.group_size) if self.group_size else 0
        return data + groups * self.scale_bytes_per_group


# int8/int4: one fp16 scale per 64 values (int4 adds an fp16 zero point), the layout of Hugging Face's
# QuantizedCache (q_group_size=64) and KIVI; fp8 (e4m3) uses one scale per tensor, which is negligible.
KV_DTYPES: dict[str, KVDtype] = {
    "float32": KVDtype("float32", 4),
    "bfloat16": KVDtype("bfloat16", 2),
    "float16": KVDtype("float16", 2),
    "fp8": KVDtype("fp8", 1),
    "int8": KVDtype("int8", 1, group_size=64, scale_bytes_per_group=2),
    "int4": KVDtype("int4", 0.5, group_size=64, scale_bytes_per_group=4),
}


def kv_dtype(name: str) -> KVDtype:
    try:
        return KV_DTYPES[name]
    except KeyError:
        raise InputError("unknown_kv_dtype", name=name, choices=", ".join(KV_DTYPES)) from None


# ---- the general shape: MHA / GQA / MQA / MLA, with or without a sliding window -------------------------


@dataclass(frozen=True)
class KVShape:
    """What one token leaves in the cache of one layer, and how many layers keep how many tokens."""

    n_layers: int
    n_heads: int  # query heads (for the MHA/GQA/MQA label)
    n_kv_heads: int
    d_head: int
    kv_lora_rank: int = 0  # MLA: the compressed latent c_KV cached instead of K and V
    qk_rope_head_dim: int = 0  # MLA: the decoupled RoPE key, shared by all heads, cached beside it
    sliding_window: int = 0  # 0 = every layer attends (and caches) the whole context
    n_sliding_layers: int = 0  # layers that keep only the last `sliding_window` tokens

    def __post_init__(self) -> None:
        _check_positive(n_layers=self.n_layers, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, d_head=self.d_head)
        for name in ("kv_lora_rank", "qk_rope_head_dim", "sliding_window", "n_sliding_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError("positive_int", name=name, value=value)
        if self.n_heads % self.n_kv_heads:
            raise InputError("not_divisible", n_heads=self.n_heads, n_kv_heads=self.n_kv_heads)
        if self.n_sliding_layers > self.n_layers or (self.n_sliding_layers and not self.sliding_window):
            raise InputError("memory.bad_window", window=self.sliding_window, layers=self.n_sliding_layers,
                             n_layers=self.n_layers)

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
    def vectors_per_token_layer(self) -> tuple[int, int]:
        """(how many vectors, values in each) one token caches in one layer."""
        if self.is_mla:
            return 1, self.kv_lora_rank + self.qk_rope_head_dim  # one latent + one shared RoPE key
        return 2 * self.n_kv_heads, self.d_head  # a K and a V vector per KV head

    @property
    def values_per_token_layer(self) -> int:
        count, length = self.vectors_per_token_layer
        return count * length

    def cached_token_layers(self, n_tokens: int) -> int:
        """Σ over layers of tokens kept: sliding layers cap n at the window."""
        full = self.n_layers - self.n_sliding_layers
        return full * n_tokens + self.n_sliding_layers * min(n_tokens, self.sliding_window)


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


def kv_footprint(
    shape: KVShape, n_tokens: int, batch: int = 1, kv_dtype_name: str | KVDtype = "bfloat16"
) -> KVFootprint:
    """The one function behind every KV figure the app shows (MHA/GQA/MQA/MLA, windows, quantized dtypes).

    kv_dtype_name may also be a KVDtype (e.g. int4 with KIVI's group size: dataclasses.replace(KV_DTYPES["int4"],
    group_size=32)); kvviz.compression stores such caches and holds their bytes equal to this."""
    _check_positive(batch=batch)
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
        raise InputError("n_tokens_negative", value=n_tokens)
    fmt = kv_dtype_name if isinstance(kv_dtype_name, KVDtype) else kv_dtype(kv_dtype_name)
    count, length = shape.vectors_per_token_layer
    per_token_per_layer = count * fmt.vector_bytes(length)
    data_bytes = count * math.ceil(length * fmt.data_bytes)
    token_layers = shape.cached_token_layers(n_tokens)
    per_request = per_token_per_layer * token_layers
    return KVFootprint(
        kind=shape.attention_kind,
        kv_dtype=fmt.name,
        batch=batch,
        n_tokens=n_tokens,
        n_layers=shape.n_layers,
        n_kv_heads=shape.n_kv_heads,
        d_head=shape.d_head,
        values_per_token_per_layer=count * length,
        bytes_per_elem=fmt.data_bytes,
        scale_bytes_per_token_per_layer=per_token_per_layer - data_bytes,
        per_token_per_layer=per_token_per_layer,
        per_token=per_token_per_layer * shape.n_layers,
        cached_token_layers=token_layers,
        per_request=per_request,
        total=per_request * batch,
        sliding_window=shape.sliding_window,
        n_sliding_layers=shape.n_sliding_layers,
    )


def attention_variants(shape: KVShape) -> dict[str, KVShape]:
    """MHA, GQA, MQA and MLA at the same L, query heads and d_head: only what each token caches differs.

    GQA keeps the model's own groups, else the largest group count ≤ 8 dividing the heads (Llama's 8);
    MLA keeps the model's own ranks, else DeepSeek's ratios: latent 4·d_head, RoPE key d_head/2.
    """
    h, d = shape.n_heads, shape.d_head
    groups = shape.n_kv_heads if shape.attention_kind == "GQA" else max(
        (g for g in range(2, 9) if h % g == 0 and g < h), default=1)
    rank, rope = (shape.kv_lora_rank, shape.qk_rope_head_dim) if shape.is_mla else (4 * d, d // 2)
    return {
        "MHA": KVShape(shape.n_layers, h, h, d),
        "GQA": KVShape(shape.n_layers, h, groups, d),
        "MQA": KVShape(shape.n_layers, h, 1, d),
        "MLA": KVShape(shape.n_layers, h, h, d, kv_lora_rank=rank, qk_rope_head_dim=rope),
    }


def tokens_to_reach(
    shape: KVShape, target_bytes: int, batch: int, kv_dtype_name: str, limit: int = 1 << 24
) -> int | None:
    """Smallest context n whose cache (B requests) reaches target_bytes, or None (a window caps it first)."""
    if kv_footprint(shape, limit, batch, kv_dtype_name).total < target_bytes:
        return None
    lo, hi = 0, limit  # the footprint never shrinks as n grows, so bisect
    while lo < hi:
        mid = (lo + hi) // 2
        if kv_footprint(shape, mid, batch, kv_dtype_name).total >= target_bytes:
            hi = mid
        else:
            lo = mid + 1
    return lo


def weight_bytes(n_params: int, weight_dtype: str) -> int:
    """Weight memory: parameters · bytes per weight (quantized weights ignore their small scale overhead)."""
    _check_positive(n_params=n_params)
    return math.ceil(n_params * kv_dtype(weight_dtype).data_bytes)
