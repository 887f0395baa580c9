"""Caches that hold less: kept positions after eviction, or K/V stored quantized. Both keep the contract the native
Decoder.forward(ids, cache) runs with (kvviz.engine.cache.DecodeCache: `lengths`, `append`, and `length`, the
rotary position of the next token).

Bytes are read off the tensors each cache stores; `formula_bytes()` gives the same through the shared KV
description (kvviz.kv.formula), which the tests hold equal.
"""
from __future__ import annotations

import dataclasses

import torch

from kvviz.compression import quant
from kvviz.errors import InputError
from kvviz.kv.formats import KVDtype, stored_dtype
from kvviz.kv.formula import KVSpec, kv_bytes, kv_footprint

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

    def formula_bytes(self, full_dtype: str | None = None) -> int:
        """The kept positions by the shared formula, stored as full_dtype (default: as stored here)."""
        batch = self.k[0].shape[0]
        return kv_bytes(self.shape, self.lengths, batch, full_dtype or dtype_name(self.dtype))

    @property
    def evicted(self) -> int:
        """Positions dropped so far, summed over layers (0: the policy left the cache whole)."""
        return sum(seen - n for seen, n in zip(self.seen, self.lengths, strict=True))


def kivi_dtype(fmt: str | KVDtype, group: int) -> KVDtype:
    """A format's entry as KIVI stores it: group size G, an fp16 scale and an fp16 minimum per group (KIVI is
    asymmetric at every bit width, kvviz.compression.quant); float8 is its own entry."""
    return stored_dtype(fmt).stored_at(group)


class QuantizedCache:
    """K/V stored quantized, in any format whose entry in kvviz.kv.formats.KV_DTYPES says how it is stored.

    KIVI's integer groups (int8, int4, KIVI-2's 2 bits), KIVI's rules (jy-yuan/KIVI, models/llama_kivi.py,
    LlamaAttention_KIVI.forward): keys are quantized per channel over groups of G tokens, R tokens at a time
    (R % G == 0, asserted there), so after n tokens the newest n mod R keys are in full precision; values are
    quantized per token over groups of G channels, one token per step, so exactly the newest min(n, R) values stay
    in full precision. The prefill follows the same
    rule (its first n − n mod R keys and n − R values quantized at once).

    float8 (fp8: vLLM's --kv-cache-dtype fp8, float8_e4m3fn): every token quantized with one float32 scale per layer
    for K and one for V. `kv_scale="default"`: 1.0, what vLLM uses when the checkpoint ships no scales
    (set_default_quant_scales in vllm/attention/layer.py); "calculate": |K|max/200 and |V|max/100 from the first
    forward pass, as `--calculate-kv-scales` (Attention.calc_kv_scales; K_SCALE_CONSTANT and V_SCALE_CONSTANT in
    vllm/envs.py). Values past ±448·scale saturate (counted in `clipped`).

    The tokens of the current pass attend to themselves in full precision and to the past through the
    dequantized store, as in KIVI's decode.
    """

    def __init__(self, shape: KVSpec, batch: int, dtype: torch.dtype, device: torch.device, fmt: str | KVDtype,
                 *, group: int = 32, residual: int = 32, kv_scale: str = "default") -> None:
        self.format = stored_dtype(fmt)  # an unknown name, or a format kvviz only sizes, is refused by name
        self.grouped = self.format.stored.grouped
        if self.grouped:
            per_byte = self.format.stored.per_byte
            if shape.d_head % per_byte:  # levels are packed along the channels of a head
                raise InputError("compression.bad_pack", name=self.format.name, per_byte=per_byte,
                                 d_head=shape.d_head)
            if group < 1 or shape.d_head % group:
                # Values grouped over G channels carry d_head/G scales per token; the shared formula counts
                # ceil(d_head/G) per vector: the two agree exactly when G divides d_head.
                raise InputError("compression.bad_group", group=group, d_head=shape.d_head)
            if residual < group or residual % group:  # KIVI: assert self.residual_length % self.group_size == 0
                raise InputError("compression.bad_residual", residual=residual, group=group)
        elif kv_scale not in quant.FP8_SCALES:
            raise InputError("compression.bad_kv_scale", name=kv_scale, choices=", ".join(quant.FP8_SCALES))
        self.shape, self.dtype, self.group, self.residual = shape, dtype, group, residual
        self.kv_scale = kv_scale
        n = shape.n_layers
        empty = torch.zeros(batch, shape.n_kv_heads, 0, shape.d_head, dtype=dtype, device=device)
        self.k_res, self.v_res = [empty] * n, [empty] * n  # full-precision newest keys / values
        self.kq: list[list] = [[] for _ in range(n)]  # quantized blocks (IntGroups, or fp8 tensors)
        self.vq: list[list] = [[] for _ in range(n)]
        self._k_deq, self._v_deq = [empty] * n, [empty] * n  # dequantized blocks, kept for attention
        self.k_scale: list[torch.Tensor | None] = [None] * n
        self.v_scale: list[torch.Tensor | None] = [None] * n
        self.clipped = 0  # fp8 values that saturated at ±448·scale

    @property
    def n_k_quantized(self) -> list[int]:
        return [k.shape[2] for k in self._k_deq]

    @property
    def n_v_quantized(self) -> list[int]:
        return [v.shape[2] for v in self._v_deq]

    @property
    def lengths(self) -> list[int]:
        return [q + r.shape[2] for q, r in zip(self.n_k_quantized, self.k_res, strict=False)]

    @property
    def length(self) -> int:
        return self.lengths[0]

    def _store(self, layer: int, x: torch.Tensor, is_key: bool) -> None:
        """Quantize x and append it to the layer's K or V store (and to its dequantized copy)."""
        if not self.grouped:  # float8 with the layer's K or V scale
            scales = self.k_scale if is_key else self.v_scale
            s = scales[layer]
            self.clipped += int((x.float().abs() > quant.FP8_MAX * s).sum())
            q = quant.quantize_fp8(x, s)
            deq = quant.dequantize_fp8(q, s, self.dtype)
        else:  # keys: per channel over G tokens; values: per token over G channels
            q = quant.quantize_int(x, self.format, self.group, axis=-2 if is_key else -1)
            deq = quant.dequantize_int(q, self.dtype)
        (self.kq if is_key else self.vq)[layer].append(q)
        stored = self._k_deq if is_key else self._v_deq
        stored[layer] = torch.cat([stored[layer], deq], dim=2)

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        past_k = torch.cat([self._k_deq[layer], self.k_res[layer]], dim=2)
        past_v = torch.cat([self._v_deq[layer], self.v_res[layer]], dim=2)
        k_res = torch.cat([self.k_res[layer], k_new], dim=2)
        v_res = torch.cat([self.v_res[layer], v_new], dim=2)
        if not self.grouped:
            if self.k_scale[layer] is None:  # set once, by the first pass (vLLM: calculate_kv_scales → False)
                self.k_scale[layer], self.v_scale[layer] = quant.fp8_scales(k_new, v_new, self.kv_scale)
            n_k = n_v = k_res.shape[2]
        else:
            n_k = k_res.shape[2] // self.residual * self.residual  # keys R at a time: n mod R stay
            n_v = max(0, v_res.shape[2] - self.residual)  # values one at a time: the last R stay
        if n_k:
            self._store(layer, k_res[:, :, :n_k], is_key=True)
        if n_v:
            self._store(layer, v_res[:, :, :n_v], is_key=False)
        self.k_res[layer], self.v_res[layer] = k_res[:, :, n_k:].contiguous(), v_res[:, :, n_v:].contiguous()
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

    def formula_bytes(self, full_dtype: str | None = None) -> int:
        """Quantized keys and values in the quantized format plus the full-precision ones, by the shared formula
        (K or V alone is half of its 2·H_kv vectors). full_dtype: count the full-precision tokens as that dtype
        (what a deployment storing bfloat16 would hold), default the dtype they are stored in here."""
        batch = self.k_res[0].shape[0]
        one = dataclasses.replace(self.shape, n_layers=1)
        fmt = self.format.stored_at(self.group)
        full = full_dtype or dtype_name(self.dtype)
        counts = [(n, fmt) for n in self.n_k_quantized + self.n_v_quantized]
        counts += [(r.shape[2], full) for r in self.k_res + self.v_res]
        return sum(kv_bytes(one, [n], batch, f) // 2 for n, f in counts)


def full_formula_bytes(shape: KVSpec, n_tokens: int, dtype: torch.dtype, batch: int = 1) -> int:
    return kv_footprint(shape, n_tokens, batch, dtype_name(dtype)).total
