"""Caches that hold less: kept positions after eviction, or K/V stored quantized. Both plug into the native
Decoder.forward(ids, cache) through the same two members it uses (`lengths`, `append`) plus `length`, the
rotary position of the next token.

Bytes are read off the tensors each cache stores; `formula_bytes()` gives the same through the shared KV
description (kvviz.kv.formula), which the tests hold equal.
"""
from __future__ import annotations

import dataclasses

import torch

from kvviz.compression import quant
from kvviz.errors import InputError
from kvviz.kv.formula import KV_DTYPES, KVSpec, kv_footprint

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES[dtype]


class EvictingCache:
    """Per layer: the kept K/V [B, H_kv, n_kept, d], the original position of each kept key (per KV head,
    since H2O and SnapKV choose per head) and an accumulated-attention score per kept key (H2O).

    `reposition=False`: keys keep the rotary angle of their original position and the next token gets its
    original position (window, H2O, SnapKV). `reposition=True` (StreamingLLM, §3.2 of Xiao et al. 2024):
    positions are counted within the cache, so after an eviction the surviving keys are rotated back to
    their new slots and the next token sits at slot n_kept.
    """

    def __init__(self, shape: KVSpec, batch: int, dtype: torch.dtype, device: torch.device,
                 *, reposition: bool = False, rotate=None) -> None:  # noqa: ANN001 - rotate(k, delta) or None
        self.shape, self.dtype, self.reposition, self.rotate = shape, dtype, reposition, rotate
        empty = torch.zeros(batch, shape.n_kv_heads, 0, shape.d_head, dtype=dtype, device=device)
        n = shape.n_layers
        self.k = [empty] * n
        self.v = [empty] * n
        self.pos = [torch.zeros(batch, shape.n_kv_heads, 0, dtype=torch.long, device=device)] * n
        self.score = [torch.zeros(batch, shape.n_kv_heads, 0, device=device)] * n
        self.slot = [torch.zeros(batch, shape.n_kv_heads, 0, dtype=torch.long, device=device)] * n  # rotary slot
        self.seen = [0] * n  # tokens ever appended, per layer

    # ---- the protocol Decoder.forward uses ----
    @property
    def lengths(self) -> list[int]:
        return [k.shape[2] for k in self.k]

    @property
    def length(self) -> int:
        """Rotary position of the next token: original (seen) or, re-positioned, its slot in the cache."""
        return self.lengths[0] if self.reposition else self.seen[0]

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, t, _ = k_new.shape
        start = self.seen[layer]
        new_pos = torch.arange(start, start + t, device=k_new.device).expand(b, h, t)
        slot0 = self.k[layer].shape[2] if self.reposition else start
        new_slot = torch.arange(slot0, slot0 + t, device=k_new.device).expand(b, h, t)
        self.k[layer] = torch.cat([self.k[layer], k_new], dim=2)
        self.v[layer] = torch.cat([self.v[layer], v_new], dim=2)
        self.pos[layer] = torch.cat([self.pos[layer], new_pos], dim=2)
        self.slot[layer] = torch.cat([self.slot[layer], new_slot], dim=2)
        self.score[layer] = torch.cat([self.score[layer], torch.zeros(b, h, t, device=k_new.device)], dim=2)
        self.seen[layer] = start + t
        return self.k[layer], self.v[layer]

    # ---- eviction ----
    def keep(self, layer: int, index: torch.Tensor) -> None:
        """Keep only the cached entries at `index` [B, H_kv, m] (sorted), in that order."""
        d = self.shape.d_head
        idx4 = index.unsqueeze(-1).expand(*index.shape, d)
        self.k[layer] = self.k[layer].gather(2, idx4)
        self.v[layer] = self.v[layer].gather(2, idx4)
        self.pos[layer] = self.pos[layer].gather(2, index)
        self.score[layer] = self.score[layer].gather(2, index)
        self.slot[layer] = self.slot[layer].gather(2, index)
        if self.reposition:
            want = torch.arange(index.shape[-1], device=index.device).expand_as(index)
            delta = want - self.slot[layer]
            if bool((delta != 0).any()):
                if self.rotate is None:
                    raise InputError("compression.no_reposition")
                self.k[layer] = self.rotate(self.k[layer], delta)
                self.slot[layer] = want

    def add_attention(self, layer: int, probs: torch.Tensor) -> None:
        """Accumulate attention received by each kept key: probs [B, n_heads, T_q, n_kept], summed over the
        queries and over the query heads that share each KV head."""
        b, hq, _, n = probs.shape
        g = hq // self.shape.n_kv_heads
        self.score[layer] = self.score[layer] + probs.float().sum(2).view(b, hq // g, g, n).sum(2)

    # ---- bytes ----
    def kv_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.k, self.v, strict=False))

    def bookkeeping_bytes(self) -> int:
        """Positions, slots and scores: what the policy needs beside K/V (not part of the KV formula)."""
        return sum(p.nbytes + s.nbytes + q.nbytes for p, s, q in zip(self.pos, self.score, self.slot, strict=False))

    def formula_bytes(self) -> int:
        batch = self.k[0].shape[0]
        return sum(kv_footprint(dataclasses.replace(self.shape, n_layers=1), n, batch, dtype_name(self.dtype)).total
                   for n in self.lengths)


def kivi_dtype(fmt: str, group: int):  # noqa: ANN201 - a KVDtype
    """The shared int8/int4 description with KIVI's group size (its scale bytes per group unchanged)."""
    return dataclasses.replace(KV_DTYPES[fmt], name=f"{fmt}-g{group}", group_size=group)


class QuantizedCache:
    """K/V stored quantized. int8/int4: the KIVI layout; the newest tokens (at least `residual`, fewer than
    `residual + group`) stay in full precision until a whole group of `group` tokens can be quantized (keys
    need whole token groups per channel). fp8: every token in float8_e4m3fn, with one float32 scale per layer
    for K and one for V, set from the prefill (vLLM's k_scale/v_scale); later values past it saturate.

    The tokens of the current pass attend to themselves in full precision and to the past through the
    dequantized store, as in KIVI's decode.
    """

    def __init__(self, shape: KVSpec, batch: int, dtype: torch.dtype, device: torch.device, fmt: str,
                 *, group: int = 32, residual: int = 32) -> None:
        if fmt not in ("int8", "int4", "fp8"):
            raise InputError("compression.unknown_method", name=fmt)
        if fmt != "fp8" and (group < 1 or shape.d_head % group):
            # Keys grouped per channel over G tokens carry d_head/G scales per token; the shared formula counts
            # ceil(d_head/G) per vector: the two agree exactly when G divides d_head.
            raise InputError("compression.bad_group", group=group, d_head=shape.d_head)
        if residual < 0:
            raise InputError("positive_int", name="residual", value=residual)
        self.shape, self.dtype, self.fmt, self.group, self.residual = shape, dtype, fmt, group, residual
        n = shape.n_layers
        empty = torch.zeros(batch, shape.n_kv_heads, 0, shape.d_head, dtype=dtype, device=device)
        self.k_res, self.v_res = [empty] * n, [empty] * n  # full-precision newest tokens
        self.kq: list[list] = [[] for _ in range(n)]  # quantized blocks (IntGroups, or fp8 tensors)
        self.vq: list[list] = [[] for _ in range(n)]
        self._k_deq, self._v_deq = [empty] * n, [empty] * n  # dequantized blocks, kept for attention
        self.k_scale: list[torch.Tensor | None] = [None] * n
        self.v_scale: list[torch.Tensor | None] = [None] * n
        self.n_quantized = [0] * n
        self.clipped = 0  # fp8 values that saturated at ±448·scale

    @property
    def lengths(self) -> list[int]:
        return [q + r.shape[2] for q, r in zip(self.n_quantized, self.k_res, strict=False)]

    @property
    def length(self) -> int:
        return self.lengths[0]

    def _quantize(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.fmt == "fp8":
            if self.k_scale[layer] is None:
                self.k_scale[layer], self.v_scale[layer] = quant.fp8_scale(k), quant.fp8_scale(v)
            ks, vs = self.k_scale[layer], self.v_scale[layer]
            for x, s in ((k, ks), (v, vs)):
                self.clipped += int((x.float().abs() > quant.FP8_MAX * s).sum())
            kq, vq = quant.quantize_fp8(k, ks), quant.quantize_fp8(v, vs)
            kd, vd = quant.dequantize_fp8(kq, ks, self.dtype), quant.dequantize_fp8(vq, vs, self.dtype)
        else:
            kq = quant.quantize_int(k, self.fmt, self.group, axis=-2)  # keys: per channel over G tokens
            vq = quant.quantize_int(v, self.fmt, self.group, axis=-1)  # values: per token over G channels
            kd, vd = quant.dequantize_int(kq, self.dtype), quant.dequantize_int(vq, self.dtype)
        self.kq[layer].append(kq)
        self.vq[layer].append(vq)
        self._k_deq[layer] = torch.cat([self._k_deq[layer], kd], dim=2)
        self._v_deq[layer] = torch.cat([self._v_deq[layer], vd], dim=2)
        self.n_quantized[layer] += k.shape[2]

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        past_k = torch.cat([self._k_deq[layer], self.k_res[layer]], dim=2)
        past_v = torch.cat([self._v_deq[layer], self.v_res[layer]], dim=2)
        k_res = torch.cat([self.k_res[layer], k_new], dim=2)
        v_res = torch.cat([self.v_res[layer], v_new], dim=2)
        if self.fmt == "fp8":
            n_move = k_res.shape[2]
        else:
            n_move = max(0, k_res.shape[2] - self.residual) // self.group * self.group
        if n_move:
            self._quantize(layer, k_res[:, :, :n_move], v_res[:, :, :n_move])
            k_res, v_res = k_res[:, :, n_move:], v_res[:, :, n_move:]
        self.k_res[layer], self.v_res[layer] = k_res.contiguous(), v_res.contiguous()
        return torch.cat([past_k, k_new], dim=2), torch.cat([past_v, v_new], dim=2)

    def stored_tensors(self) -> list[torch.Tensor]:
        """Everything the cache stores for K/V: quantized data, per-group scales and zero points, residual."""
        out = []
        for layer in range(self.shape.n_layers):
            for block in self.kq[layer] + self.vq[layer]:
                out += block.tensors() if isinstance(block, quant.IntGroups) else [block]
            out += [self.k_res[layer], self.v_res[layer]]
        return out

    def kv_bytes(self) -> int:
        return sum(t.nbytes for t in self.stored_tensors())

    def tensor_scale_bytes(self) -> int:
        """fp8's per-layer K and V scales (the formula counts per-tensor scales as 0: constants of the layer)."""
        return sum(s.nbytes for s in self.k_scale + self.v_scale if s is not None)

    def formula_bytes(self) -> int:
        """Quantized tokens in the quantized format plus full-precision residual tokens, by the shared formula."""
        batch = self.k_res[0].shape[0]
        one = dataclasses.replace(self.shape, n_layers=1)
        fmt = "fp8" if self.fmt == "fp8" else kivi_dtype(self.fmt, self.group)
        total = 0
        for n_q, res in zip(self.n_quantized, self.k_res, strict=False):
            total += kv_footprint(one, n_q, batch, fmt).total
            total += kv_footprint(one, res.shape[2], batch, dtype_name(self.dtype)).total
        return total


def full_formula_bytes(shape: KVSpec, n_tokens: int, dtype: torch.dtype, batch: int = 1) -> int:
    return kv_footprint(shape, n_tokens, batch, dtype_name(dtype)).total
