"""The KV-cache memory formula, M_KV = 2 · B · L · n · H_kv · d_head · bytes, with its intermediates.

Everything the app and CLI show about KV memory comes from here (no torch needed).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

from .errors import InputError

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


def format_binary(n_bytes: float) -> str:
    """Binary units, labelled as such (KiB = 1024 B): the usual calculator mistake is GiB printed as GB."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
