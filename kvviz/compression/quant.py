"""Quantize and dequantize K/V: integer groups in the KIVI layout, and FP8 e4m3 with a per-tensor scale.

KIVI (Liu et al. 2024, arXiv:2402.02750): keys are quantized per channel (one scale for a channel over a
group of G tokens, because outliers live in a few channels), values per token (one scale for G channels
of one token). Both widths are asymmetric as in KIVI, which quantizes every bit width the same way (paper
§3.1: z = min X, s = (max X − min X)/(2^B − 1), Q(X) = ⌊(X − z)/s⌉; jy-yuan/KIVI quant/new_pack.py
quant_and_pack_kcache / quant_and_pack_vcache): an fp16 scale and an fp16 minimum per group, levels 0..2^B − 1
packed 8/B to a byte (one int8 level, two int4 levels, four 2-bit levels). The bit width comes from the format's
entry in the one table of KV formats (kvviz.kv.formats.KV_DTYPES, `stored`), never from its name. Scales are
rounded *outwards* to fp16 (scale up, minimum down) so every value of a group stays inside the grid and the error
bound below holds exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvviz.kv.formats import KVDtype, stored_dtype

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn (torch.finfo(torch.float8_e4m3fn).max)
FP8_REL_ERR = 2.0**-4  # 3 mantissa bits: round-to-nearest is within half a step, 2^-4 of |x| (normals)
FP8_SUBNORMAL_ERR = 2.0**-10  # half of the subnormal step 2^-9 (in scaled units)


def _up(x: torch.Tensor) -> torch.Tensor:
    """x rounded to an fp16 that is ≥ x (and > 0)."""
    h = x.to(torch.float16)
    h = torch.where(h.float() < x, torch.nextafter(h, torch.full_like(h, math.inf)), h)
    tiny = torch.tensor(torch.finfo(torch.float16).tiny, dtype=torch.float16)
    return torch.maximum(h, tiny)


def _down(x: torch.Tensor) -> torch.Tensor:
    """x rounded to an fp16 that is ≤ x."""
    h = x.to(torch.float16)
    return torch.where(h.float() > x, torch.nextafter(h, torch.full_like(h, -math.inf)), h)


@dataclass
class IntGroups:
    """Quantized values with their per-group fp16 scale and minimum (KIVI's zero point); grouped along `axis`."""

    data: torch.Tensor  # uint8: 8/bits levels per byte along the last axis
    scale: torch.Tensor  # fp16, one per group
    zero: torch.Tensor  # fp16, one per group: the group's minimum, rounded down
    bits: int
    shape: tuple[int, ...]  # the float tensor's shape
    axis: int  # the grouped axis of the float tensor (-2 tokens for keys, -1 channels for values)
    group: int

    def tensors(self) -> list[torch.Tensor]:
        return [self.data, self.scale, self.zero]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors())


def _grouped(x: torch.Tensor, axis: int, group: int) -> torch.Tensor:
    """[..., n, d] → groups along `axis` as a trailing dimension of size `group`."""
    if axis == -1:
        return x.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    # tokens axis: [..., n/G, G, d] → [..., n/G, d, G]
    return x.reshape(*x.shape[:-2], x.shape[-2] // group, group, x.shape[-1]).transpose(-1, -2)


def _ungrouped(g: torch.Tensor, axis: int, shape: tuple[int, ...]) -> torch.Tensor:
    if axis == -1:
        return g.reshape(shape)
    return g.transpose(-1, -2).reshape(shape)


def int_format(fmt: str | KVDtype) -> KVDtype:
    """The entry of a format stored as KIVI's integer groups; any other name is refused by name."""
    entry = stored_dtype(fmt)
    if not entry.stored.grouped:
        raise ValueError(f"{entry.name} is not stored as integer groups")
    return entry


def quantize_int(x: torch.Tensor, fmt: str | KVDtype, group: int, axis: int) -> IntGroups:
    """Groups of `group` along `axis` (-2: per channel over tokens, KIVI's keys; -1: per token, its values)."""
    if x.shape[axis] % group:
        raise ValueError(f"{x.shape[axis]} not a multiple of the group size {group}")
    stored = int_format(fmt).stored
    bits, per_byte = stored.bits, stored.per_byte
    if x.shape[-1] % per_byte:
        raise ValueError(f"{x.shape[-1]} values do not pack {per_byte} to a byte")
    g = _grouped(x.float(), axis, group)
    levels = 2**bits - 1  # 0..255 for int8, 0..15 for int4, 0..3 for 2 bits, counted from the group's minimum
    zero = _down(g.amin(-1, keepdim=True))
    scale = _up((g.amax(-1, keepdim=True) - zero.float()) / levels)
    q = torch.round((g - zero.float()) / scale.float()).clamp(0, levels).to(torch.uint8)
    data = _ungrouped(q, axis, tuple(x.shape))
    packed = data[..., 0::per_byte].clone()  # value i of each run of per_byte goes to bits [i·B, (i + 1)·B)
    for i in range(1, per_byte):
        packed |= data[..., i::per_byte] << (bits * i)
    return IntGroups(packed, scale.squeeze(-1), zero.squeeze(-1), bits, tuple(x.shape), axis, group)


def dequantize_int(q: IntGroups, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    per_byte, mask = 8 // q.bits, 2**q.bits - 1
    values = torch.stack([(q.data >> (q.bits * i)) & mask for i in range(per_byte)], dim=-1).reshape(q.shape).float()
    g = _grouped(values, q.axis, q.group)
    g = g * q.scale.float().unsqueeze(-1) + q.zero.float().unsqueeze(-1)
    return _ungrouped(g, q.axis, q.shape).to(dtype)


def int_error_bound(q: IntGroups) -> torch.Tensor:
    """|x − x̂| ≤ scale/2 for every value (round to nearest inside the group's grid), as a [shape] tensor."""
    half = _grouped(torch.zeros(q.shape), q.axis, q.group) + q.scale.float().unsqueeze(-1) / 2
    return _ungrouped(half, q.axis, q.shape)


# vLLM's two ways to set k_scale / v_scale without scales in the checkpoint:
# "default": 1.0 (set_default_quant_scales, vllm/attention/layer.py);
# "calculate": --calculate-kv-scales, |K|max / K_SCALE_CONSTANT and |V|max / V_SCALE_CONSTANT from the first
# forward pass (Attention.calc_kv_scales), leaving headroom for later tokens larger than the first ones.
FP8_SCALES = ("default", "calculate")
K_SCALE_CONSTANT = 200.0  # vllm/envs.py: "Divisor for dynamic key scale factor calculation for FP8 KV Cache"
V_SCALE_CONSTANT = 100.0  # vllm/envs.py: the same for values


def fp8_scales(k: torch.Tensor, v: torch.Tensor, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_scale, v_scale), float32, as vLLM sets them (`how` in FP8_SCALES)."""
    if how == "default":
        one = torch.ones((), dtype=torch.float32, device=k.device)
        return one, one.clone()
    return (k.detach().abs().amax().float() / K_SCALE_CONSTANT, v.detach().abs().amax().float() / V_SCALE_CONSTANT)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale in float8_e4m3fn; values past the calibrated range saturate at ±448·scale."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def fp8_error_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """|x − x̂| ≤ max(2⁻⁴·|x|, 2⁻¹⁰·scale) for |x| ≤ 448·scale (3 mantissa bits; subnormal step 2⁻⁹)."""
    return torch.maximum(FP8_REL_ERR * x.float().abs(), FP8_SUBNORMAL_ERR * scale)
