"""The one table of KV formats (KV_DTYPES): each format's bytes per value and the scales its groups carry (what
kvviz.kv.formula sizes), and, for a format kvviz also stores in the decode loop, how it is stored (bits, packing,
KIVI's G and R, the family and marker it is charted with). Code asks the entry, never compares a format's name;
an unknown name is refused by name. No torch needed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvviz.errors import InputError

# How kvviz.compression stores a format in the real decode loop (kvviz.compression.quant, caches):
# "kivi": KIVI's asymmetric integer groups (Liu et al. 2024, arXiv:2402.02750 §3.1; jy-yuan/KIVI quant/new_pack.py):
#   keys per channel over G tokens, values per token over G channels, an fp16 scale and an fp16 zero point (the
#   group's minimum) per group, `bits`-bit levels packed 8/bits to a byte, the newest R tokens in full precision;
# "fp8_tensor": float8 e4m3 with one float32 scale per layer tensor (vLLM's --kv-cache-dtype fp8).
STORAGE_SCHEMES = ("kivi", "fp8_tensor")
KIVI_GROUP_BYTES = 4  # an fp16 scale and an fp16 zero point per group: KIVI is asymmetric at every bit width


@dataclass(frozen=True)
class Stored:
    """What kvviz.compression needs to store a format: its scheme, bits per value, KIVI's default G and R, and the
    family and marker its compression method is charted with (kvviz.charts.compression)."""

    scheme: str  # one of STORAGE_SCHEMES
    bits: int  # per stored value: levels 0..2^bits − 1 (kivi), or float8's 8
    group: int = 0  # kivi: G, the values one scale and zero point cover (group_for: where it fits a head)
    residual: int = 0  # kivi: R, the newest tokens kept in full precision (residual_for: a multiple of G)
    family: str = "quantize"
    marker: str = "x"  # Plotly's marker symbol on the memory-vs-quality chart

    def __post_init__(self) -> None:
        if self.scheme not in STORAGE_SCHEMES or 8 % self.bits:
            raise ValueError(f"storage {self.scheme!r} with {self.bits} bits is not one kvviz stores")

    @property
    def grouped(self) -> bool:
        """KIVI's integer groups (scales and zero points per group, a full-precision residual)."""
        return self.scheme == "kivi"

    @property
    def per_byte(self) -> int:
        """Values packed into one stored byte (two int4 values, four 2-bit values)."""
        return 8 // self.bits

    def group_for(self, d_head: int) -> int:
        """G where it divides d_head (values carry d_head/G scales per token, as the shared formula counts per
        vector); else the largest divisor of d_head below it (the shipped model's d_head 24 takes 24)."""
        return max(g for g in range(1, self.group + 1) if d_head % g == 0)

    def residual_for(self, group: int) -> int:
        """R rounded up to a multiple of G (KIVI asserts R % G == 0): int4's 32 is 48 at G = 24, KIVI-2's 128 is
        144."""
        return -(-self.residual // group) * group


@dataclass(frozen=True)
class KVDtype:
    """A KV storage format: bytes per value and the scale overhead of its quantization groups; `stored` says how
    kvviz.compression stores it in the decode loop (None: a format kvviz sizes but does not store)."""

    name: str
    data_bytes: float  # per cached value; int4 packs two values per byte, a 2-bit format four
    group_size: int = 0  # values sharing one scale (0 = no per-group scale)
    scale_bytes_per_group: int = 0  # fp16 scale, plus an fp16 zero point for asymmetric formats
    whole_blocks: bool = False  # llama.cpp's blocks: a head must be whole blocks, a partial one is refused
    stored: Stored | None = None

    def vector_bytes(self, n_values: int) -> int:
        """Bytes of one cached vector of n_values (a K or V head, or an MLA latent), scales included."""
        if self.whole_blocks and n_values % self.group_size:
            raise InputError("kv_dtype_blocks", dtype=self.name, block=self.group_size, d_head=n_values)
        data = math.ceil(n_values * self.data_bytes)
        groups = math.ceil(n_values / self.group_size) if self.group_size else 0
        return data + groups * self.scale_bytes_per_group

    def stored_at(self, group: int) -> KVDtype:
        """The format as kvviz.compression stores it with group size G: KIVI's groups of G values with an fp16 scale
        and zero point each (the sized int8 entry counts a symmetric scale alone); float8 is itself."""
        if self.stored is None:
            raise InputError("not_stored_kv_dtype", name=self.name, choices=", ".join(STORED_DTYPES))
        if not self.stored.grouped:
            return self
        return replace(self, name=f"{self.name}-g{group}", group_size=group, scale_bytes_per_group=KIVI_GROUP_BYTES)


# int8: one fp16 scale per 64 values; int4: an fp16 scale and an fp16 zero point per 64 values — the layout of
# Hugging Face's QuantizedCache (q_group_size=64) and KIVI. fp8 (e4m3, vLLM's --kv-cache-dtype fp8) keeps one
# scale per layer tensor, which is not per token and so not counted here.
# q8_0 and q4_0 are llama.cpp's cache types (-ctk/-ctv): blocks of 32 values with one fp16 scale, block_q8_0 = 34 B
# and block_q4_0 = 18 B (ggml/src/ggml-common.h). llama_init_from_model (src/llama-context.cpp) refuses a head size
# that is not whole blocks ("K cache type %s with block size %u does not divide n_embd_head_k").
# int8/int4 stored by kvviz.compression take G = R = 32, KIVI's example.py (group_size = 32, residual_length = 32).
# kivi2 is KIVI-2, the paper's own setting (Liu et al. 2024, arXiv:2402.02750 §4.1): 2-bit keys per channel and
# values per token, G = 32, the newest R = 128 tokens in full precision; each group of 32 values carries an fp16
# scale and an fp16 zero point (8 B of data + 4 B = 12 B per 32 values, 0.375 B a value). The residual is a
# constant R tokens, not a per-token cost: the formula sizes the quantized tokens, the Memory page says so.
KV_DTYPES: dict[str, KVDtype] = {
    "float32": KVDtype("float32", 4),
    "bfloat16": KVDtype("bfloat16", 2),
    "float16": KVDtype("float16", 2),
    "fp8": KVDtype("fp8", 1, stored=Stored("fp8_tensor", 8, marker="star")),
    "int8": KVDtype("int8", 1, group_size=64, scale_bytes_per_group=2,
                    stored=Stored("kivi", 8, group=32, residual=32, marker="x")),
    "int4": KVDtype("int4", 0.5, group_size=64, scale_bytes_per_group=4,
                    stored=Stored("kivi", 4, group=32, residual=32, marker="cross")),
    "q8_0": KVDtype("q8_0", 1, group_size=32, scale_bytes_per_group=2, whole_blocks=True),
    "q4_0": KVDtype("q4_0", 0.5, group_size=32, scale_bytes_per_group=2, whole_blocks=True),
    "kivi2": KVDtype("kivi2", 0.25, group_size=32, scale_bytes_per_group=KIVI_GROUP_BYTES,
                     stored=Stored("kivi", 2, group=32, residual=128, marker="star-diamond")),
}
# The formats kvviz.compression stores, grouped (KIVI) ones first: the compression methods' order.
STORED_DTYPES = tuple(sorted((n for n, d in KV_DTYPES.items() if d.stored),
                             key=lambda n: not KV_DTYPES[n].stored.grouped))


def kv_dtype(name: str | KVDtype) -> KVDtype:
    """A storage format by name; a torch dtype's name ("torch.bfloat16") works too, and a KVDtype is itself
    (e.g. int4 as KIVI stores it with group size 32, KV_DTYPES["int4"].stored_at(32), which kvviz.compression
    stores and holds its bytes equal to)."""
    if isinstance(name, KVDtype):
        return name
    key = str(name).removeprefix("torch.")
    try:
        return KV_DTYPES[key]
    except KeyError:
        raise InputError("unknown_kv_dtype", name=name, choices=", ".join(KV_DTYPES)) from None


def stored_dtype(name: str | KVDtype) -> KVDtype:
    """A format kvviz.compression stores, by name: an unknown name, or one kvviz only sizes, is refused by name."""
    fmt = kv_dtype(name)
    if fmt.stored is None:
        raise InputError("not_stored_kv_dtype", name=fmt.name, choices=", ".join(STORED_DTYPES))
    return fmt
