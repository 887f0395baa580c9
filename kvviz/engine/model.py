"""A Llama-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU) whose tensor names match
transformers.LlamaForCausalLM one to one, so weights move both ways unchanged.

The KV cache is an argument of forward(), not module state: one model object serves many requests.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kvviz.engine.cache import DecodeCache, KVCache, write_at
from kvviz.engine.config import DecoderConfig
from kvviz.engine.device_names import WEIGHTS
from kvviz.engine.kernels import f32 as f32_kernel
from kvviz.engine.kernels import int8 as int8_kernel
from kvviz.errors import InputError

if TYPE_CHECKING:
    from kvviz.engine.paged.kv import PagedBatch, PagedKV


@dataclass(frozen=True)
class Int8Weight:
    """A weight matrix [N, K] stored as int8 per output channel, symmetric: w ≈ q · scale[:, None] with
    scale ≥ max|row| / 127 (the per-channel weight-only int8 of gpt-fast's int8 mode and torchao's
    int8_weight_only). A step reads the int8 bytes and the N scales, nothing else (linear() below)."""

    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N] bfloat16, the kernel's dtype

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Int8Weight:
        w32 = w.detach().float()
        amax = w32.abs().amax(dim=1).clamp(min=torch.finfo(torch.bfloat16).tiny) / 127
        # Stored in bfloat16, rounded up (bf16 rounds by at most 2⁻⁹): no |w / scale| exceeds 127, so nothing is
        # clipped and every entry moves by at most half a step.
        scale = (amax * (1 + 2**-8)).to(torch.bfloat16)
        q = torch.round(w32 / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scale)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale.float()[:, None]  # exact: 8-bit × 8-bit significands


@dataclass(frozen=True)
class PackedWeight:
    """A matrix prepack()ed for the CPU's one-row product, named as such: inside a compiled step a traced tensor no
    longer says it is opaque (is_mkldnn reads False there), so linear() tells it by this type. `kernel` says whose
    product multiplies one row by it ("kvviz": kernels.f32; "mkl"; "onednn") and `w` is the matrix in its layout.
    kvviz's and MKL's packed matrices multiply one input row only: `parts` are the plain matrices (the model's own
    parameters, no copy) whose rows, stacked, are the matrix, and multiply any other number of rows."""

    w: torch.Tensor
    parts: tuple[torch.Tensor, ...] = ()  # kvviz's and MKL's packed matrices only: [N_i, K] each, ΣN_i = N
    kernel: str = "onednn"

    @property
    def shape(self) -> torch.Size:
        if not self.parts:
            return self.w.shape
        return torch.Size((sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]))


def prepack(*parts: torch.Tensor) -> torch.Tensor | PackedWeight:
    """A float matrix [N, K], given as the matrices whose rows stacked make it (fused Q/K/V: q, k and v), as the
    decode step reads it on a CPU, for the kernel that multiplies one row by it fastest:
    - float32 where kvviz's float32 kernel built (kernels.f32: AVX2 and FMA) and K is a multiple of 8: its packed
      layout, which it streams at about a plain read's rate, 1.1× (one thread) and 1.5× (two) as fast as torch's
      best packed kernel on SmolLM2's step (bench/gemv_paths.py, --threads 2);
    - elsewhere packed once into the layout of torch's faster kernel; inductor's weight-prepack pass makes the same
      two choices under freezing (mkldnn_fusion.py pack_linear_weight: MKL's packed sgemm for float32 at a fixed row
      count, oneDNN for bfloat16): float32 with more outputs than inputs (N > K: fused Q/K/V, fused gate/up, the LM
      head) on one thread MKL's packed sgemm (torch.ops.mkl._mkl_reorder_linear_weight for one row), which streams
      SmolLM2's such matrices 1.1-1.7× as fast as oneDNN's on one thread here and 1.1-1.5× slower where N ≤ K (O,
      down); on more threads oneDNN's, as MKL keeps a one-row product on one thread (the thread count is read here,
      when Decoder.fuse packs); other float32 and bfloat16 matrices oneDNN's blocked layout
      (torch.ops.mkldnn._reorder_linear_weight), which streams 1.0-1.6× (float32) and 1.5-2.2× (bfloat16) the bytes
      per second F.linear does on SmolLM2's shapes.
    Elsewhere (CUDA, MPS, float16, no oneDNN) the matrix itself, detached (a Parameter set on a module would join
    state_dict)."""
    parts = tuple(p.detach() for p in parts)
    w = parts[0] if len(parts) == 1 else torch.cat(parts)
    if w.device.type != "cpu":
        return w
    if w.dtype == torch.float32 and w.shape[1] % 8 == 0 and f32_kernel.why_not() is None:
        return PackedWeight(f32_kernel.pack(w), parts, kernel="kvviz")
    if not torch.backends.mkldnn.is_available():
        return w
    n, k = w.shape
    if (w.dtype == torch.float32 and n > k and torch.get_num_threads() == 1 and torch.backends.mkl.is_available()
            and not torch.ops.mkldnn._is_mkldnn_acl_supported()):
        return PackedWeight(torch.ops.mkl._mkl_reorder_linear_weight(w, 1), parts, kernel="mkl")
    if w.dtype == torch.float32 or (w.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return PackedWeight(torch.ops.mkldnn._reorder_linear_weight(w, 1))
    return w


def _parts_product(x: torch.Tensor, parts: Sequence[torch.Tensor], bias: torch.Tensor | None) -> torch.Tensor:
    """x times the matrix that `parts` stack into, part by part: what kvviz's and MKL's packed matrices leave to the
    plain ones. One part (O, down, the LM head) is its own product: no copy through cat."""
    y = F.linear(x, parts[0]) if len(parts) == 1 else torch.cat([F.linear(x, p) for p in parts], dim=-1)
    return y if bias is None else y + bias


def _packed_product(x: torch.Tensor, w: torch.Tensor, parts: list[torch.Tensor],
                    bias: torch.Tensor | None) -> torch.Tensor:
    if not parts:
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
    n, k = sum(p.shape[0] for p in parts), parts[0].shape[1]
    if x.numel() == k:  # one row: the packed matrix (mkl_linear reads only the shape of its plain-matrix argument)
        return torch.ops.mkl._mkl_linear(x, w, parts[0].new_zeros(1, 1).expand(n, k), bias, 1)
    return _parts_product(x, parts, bias)  # more rows (prefill, a batch)


def _f32_product(x: torch.Tensor, w: torch.Tensor, parts: list[torch.Tensor],
                 bias: torch.Tensor | None) -> torch.Tensor:
    """x times a float32 matrix prepack()ed for kvviz's float32 kernel: one row (decode at batch 1) by the kernel,
    more rows (prefill, a batch) or a row that needs a gradient by the parts' own products."""
    if x.numel() != x.shape[-1] or x.requires_grad:
        return _parts_product(x, parts, bias)
    y = f32_kernel.product(x.contiguous(), w, sum(p.shape[0] for p in parts))
    return y if bias is None else y + bias


def _int8_product(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., K] times an int8 matrix, in x's dtype: kvviz's int8 kernel on a CPU where it built (kernels.int8:
    activations as int16 per block of 256, integer products), else torch's weight-only int8 kernel (aten
    _weight_int8pack_mm, the one gpt-fast and torchao call; activations in bfloat16, its fast path on CPU). Neither
    makes a float copy of the matrix."""
    if q.is_cpu and scale.dtype == torch.bfloat16 and int8_kernel.why_not() is None:  # the kernel reads bf16 scales
        y = int8_kernel.product(x, q, scale)
        return y if y.dtype == x.dtype else y.to(x.dtype)
    y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), q, scale)
    return y.to(x.dtype).view(*x.shape[:-1], -1)


def _int8_product_fake(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], q.shape[0])


# The packed product as one operator of kvviz's own, so that a compiled step calls it as it is: inductor lowers
# aten's packed linears only for matrices it froze itself, and would turn a traced one into a plain mm that cannot
# read an opaque tensor. Defined through torch.library.Library, not custom_op: the compiled graph calls it ~120
# times a step, and custom_op's Python wrapper cost more than SmolLM2's smaller products themselves.
def _packed_product_fake(x: torch.Tensor, w: torch.Tensor, parts: list[torch.Tensor],
                         bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], sum(p.shape[0] for p in parts) if parts else w.shape[0])


_LIB = None  # kept referenced: a Library's operators go when it is freed
if not hasattr(torch.ops.kvviz, "packed_linear"):  # once a process (another copy of this file reuses it)
    _LIB = torch.library.Library("kvviz", "DEF")  # noqa: TOR901 - a low-overhead operator, see above
    _LIB.define("packed_linear(Tensor x, Tensor w, Tensor[] parts, Tensor? bias) -> Tensor")
    _LIB.impl("packed_linear", _packed_product, "CompositeExplicitAutograd")  # any key: the matrix is MkldnnCPU
    torch.library.register_fake("kvviz::packed_linear", _packed_product_fake, lib=_LIB)
    # kvviz's float32 and int8 products likewise: the compiled graph cannot trace into a ctypes call
    _LIB.define("f32_linear(Tensor x, Tensor w, Tensor[] parts, Tensor? bias) -> Tensor")
    _LIB.impl("f32_linear", _f32_product, "CompositeExplicitAutograd")
    torch.library.register_fake("kvviz::f32_linear", _packed_product_fake, lib=_LIB)
    _LIB.define("int8_linear(Tensor x, Tensor q, Tensor scale) -> Tensor")
    _LIB.impl("int8_linear", _int8_product, "CompositeExplicitAutograd")
    torch.library.register_fake("kvviz::int8_linear", _int8_product_fake, lib=_LIB)


def linear(x: torch.Tensor, w: torch.Tensor | Int8Weight | PackedWeight,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear over a float, a prepacked (prepack()) or an int8 weight (_int8_product)."""
    if isinstance(w, Int8Weight):
        product = torch.ops.kvviz.int8_linear if torch.compiler.is_compiling() else _int8_product
        y = product(x, w.q, w.scale)
        return y if bias is None else y + bias
    if isinstance(w, PackedWeight):
        if w.kernel == "kvviz":
            product = torch.ops.kvviz.f32_linear if torch.compiler.is_compiling() else _f32_product
            return product(x, w.w, list(w.parts), bias)
        if w.parts and x.requires_grad:  # MKL's packed product has no gradient: the parts' products have
            return _parts_product(x, w.parts, bias)
        if torch.compiler.is_compiling():
            return torch.ops.kvviz.packed_linear(x, w.w, list(w.parts), bias)
        return _packed_product(x, w.w, list(w.parts), bias)
    return F.linear(x, w, bias)


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # [B, T, V], or [B, 1, V] for the last position only
    attentions: list[torch.Tensor] | None = None  # per layer [B, n_heads, T_query, T_key] probabilities


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one fused op: decode is op-bound
        # Normalised in float32 and cast back, as LlamaRMSNorm does, so bf16 matches HF; the float32 part in one
        # fused op (4 ops a norm instead of 8: a bf16 decode step runs 61 norms).
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)


def rope_inv_freq(cfg: DecoderConfig) -> torch.Tensor:
    """RoPE's inverse frequencies, scaled as transformers' modeling_rope_utils does for each rope_type."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.d_head, 2, dtype=torch.int64).float() / cfg.d_head))
    if cfg.rope_type == "linear":  # _compute_linear_scaling_rope_parameters: positions / factor
        return inv_freq / cfg.rope_factor
    if cfg.rope_type == "llama3":  # _compute_llama3_parameters: long wavelengths slowed, short kept, smooth between
        old, low, high = cfg.rope_original_max_len, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / cfg.rope_factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def rotary_tables(cfg: DecoderConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for every position up to max_seq_len, in HF's non-interleaved (rotate_half) layout; the sin table's
    first half negated, rotate_half's sign, so that apply_rotary needs no negation of its own."""
    inv_freq = rope_inv_freq(cfg)
    freqs = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), torch.cat([-freqs.sin(), freqs.sin()], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin, as transformers' apply_rotary_pos_emb: rotate_half(x) = [−x₂, x₁] is
    roll(x)·[−1, 1] and the sign sits in the table ((−a)·b = a·(−b) exactly), one op fewer than cat(−x₂, x₁)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *,
           capture: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(QKᵀ/√d)·V for q [B, H, T, d] over k, v [B, H_kv, n, d]: [B, H, T, d], and with capture the
    probabilities [B, H, T, n]. One home for the decoder's attention (compression's batched rows call it too)."""
    b, hq, t, d = q.shape
    hkv, n_keys = k.shape[1], k.shape[2]
    if capture or (t == 1 and q.device.type == "cpu"):
        # Explicit softmax(QKᵀ/√d): the probabilities can be returned, and for one decode query two
        # small matmuls beat the fused SDPA kernel on CPU. Query heads are grouped under their
        # shared KV head ([B, H_kv, group·T, d]) instead of copying K/V per query head.
        # On CPU both products run in float32 whatever the model's dtype: a bfloat16 batched matmul at decode shapes
        # (a key count new every step) took 1.3-2× the time of casting q, k, v to float32 and multiplying there
        # (bench/gemv_paths.py --attention), and float32 is the more exact of the two.
        dtype = q.dtype
        if q.device.type == "cpu" and dtype != torch.float32:
            q, k, v = q.float(), k.float(), v.float()
        g = hq // hkv
        qg = q.reshape(b, hkv, g * t, d)
        scores = (qg @ k.transpose(-1, -2)).view(b, hq, t, n_keys) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = scores.float().softmax(dim=-1).to(q.dtype)
        out = (probs.view(b, hkv, g * t, n_keys) @ v).view(b, hq, t, d)
        if out.dtype != dtype:
            out, probs = out.to(dtype), (probs.to(dtype) if capture else None)
        return out, probs if capture else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hkv != hq), None


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=cfg.o_bias)
        # fused copies for inference, see Decoder.fuse()
        self.qkv_weight: torch.Tensor | Int8Weight | PackedWeight | None = None
        self.qkv_bias: torch.Tensor | None = None
        self.o_weight: torch.Tensor | Int8Weight | PackedWeight | None = None

    def qkv(self, x: torch.Tensor) -> torch.Tensor:
        """Q, K and V projections side by side: one matmul when fused (a decode step is bound by op count)."""
        if self.qkv_weight is not None:
            return linear(x, self.qkv_weight, self.qkv_bias)
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)

    def out(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.o_weight if self.o_weight is not None else self.o_proj.weight, self.o_proj.bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: DecodeCache | None,
        layer: int,
        *,
        causal: bool,
        capture: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t, _ = x.shape
        d, hq, hkv = self.d_head, self.n_heads, self.n_kv_heads
        qkv = self.qkv(x).view(b, t, hq + 2 * hkv, d)
        qk = apply_rotary(qkv[:, :, : hq + hkv], cos, sin)  # Q and K heads rotated together, in one pass
        q, k = qk[:, :, :hq].transpose(1, 2), qk[:, :, hq:].transpose(1, 2)
        v = qkv[:, :, hq + hkv :].transpose(1, 2)
        past = 0
        if cache is not None:
            past = cache.lengths[layer]
            k, v = cache.append(layer, k, v)  # only the new positions are computed; the prefix is read
        n_keys = k.shape[2]

        mask = None  # None = every query sees every key
        if causal and t > 1:
            # Query i sits at absolute position past + i and may see keys 0..past + i.
            mask = torch.ones(t, n_keys, dtype=torch.bool, device=x.device).tril(diagonal=past)
        out, probs = attend(q, k, v, mask, capture=capture)
        out = out.transpose(1, 2).reshape(b, t, hq * d)
        return self.out(out), probs

    def forward_static(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_buf: torch.Tensor,
                       v_buf: torch.Tensor, pos: torch.Tensor, visible: torch.Tensor, *,
                       capture: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One new position per row ([B, 1, d]) written into this layer's whole cache buffers at the position tensor
        `pos` (cache.write_at: index_copy_, as gpt-fast and transformers' StaticCache), then attention over the
        whole buffer with the slots past `pos` masked (`visible`, [1, max_len]): no shape and no Python number
        depends on the position, so a compiled step is one graph for every position. Probabilities, with capture,
        span the whole buffer."""
        b, t, _ = x.shape
        d, hq, hkv = self.d_head, self.n_heads, self.n_kv_heads
        qkv = self.qkv(x).view(b, t, hq + 2 * hkv, d)
        qk = apply_rotary(qkv[:, :, : hq + hkv], cos, sin)
        q, k = qk[:, :, :hq].transpose(1, 2), qk[:, :, hq:].transpose(1, 2)
        k, v = write_at(k_buf, v_buf, pos, k, qkv[:, :, hq + hkv :].transpose(1, 2))
        out, probs = attend(q, k, v, visible, capture=capture)
        return self.out(out.transpose(1, 2).reshape(b, t, hq * d)), probs

    def forward_paged(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: PagedKV, layer: int,
                      batch: PagedBatch) -> torch.Tensor:
        """Many requests' new tokens at once ([1, T, d]): K/V written into their block slots, then each request's
        queries attend to its own keys, gathered through its block table (as PagedAttention)."""
        _, t, _ = x.shape
        d, hq, hkv = self.d_head, self.n_heads, self.n_kv_heads
        qkv = self.qkv(x).view(t, hq + 2 * hkv, d)
        qk = apply_rotary(qkv[:, : hq + hkv], cos, sin)
        q, k_new, v_new = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv :]
        kv.k[layer][batch.slots] = k_new
        kv.v[layer][batch.slots] = v_new
        out = torch.empty(t, hq * d, dtype=x.dtype, device=x.device)
        for grp in batch.groups:  # the decoding requests together; each prefilling request alone
            r, max_q = grp.query_index.shape
            k = kv.k[layer][grp.key_slots].permute(0, 2, 1, 3)  # [R, H_kv, max_ctx, d], through the block tables
            v = kv.v[layer][grp.key_slots].permute(0, 2, 1, 3)
            qp = q[grp.query_index].permute(0, 2, 1, 3)  # [R, H, max_q, d]
            o = F.scaled_dot_product_attention(qp, k, v, attn_mask=grp.mask, enable_gqa=hkv != hq)
            out[grp.out_index] = o.permute(0, 2, 1, 3).reshape(r * max_q, hq * d)[grp.unpad_index]
        return self.out(out.unsqueeze(0))


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.gate_up_weight: torch.Tensor | Int8Weight | PackedWeight | None = None  # fused copy for inference
        self.down_weight: torch.Tensor | Int8Weight | PackedWeight | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is not None:
            gate, up = linear(x, self.gate_up_weight).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return linear(F.silu(gate) * up, self.down_weight if self.down_weight is not None else self.down_proj.weight)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)


def static_layer(layer: DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_buf: torch.Tensor,
                 v_buf: torch.Tensor, pos: torch.Tensor, visible: torch.Tensor, *,
                 capture: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One layer of a static decode step (Attention.forward_static, then the MLP): everything it reads is an
    argument, so one compiled graph serves every layer (a layer's weights and buffers are its inputs) and every
    position."""
    a, probs = layer.self_attn.forward_static(layer.input_layernorm.forward(h), cos, sin, k_buf, v_buf, pos, visible,
                                              capture=capture)
    h = h + a
    return h + layer.mlp.forward(layer.post_attention_layernorm.forward(h)), probs


class LlamaModel(nn.Module):
    """The trunk, named `model` inside Decoder so state_dict keys read `model.layers.0...` as in HF."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rotary_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.head_weight: torch.Tensor | Int8Weight | PackedWeight | None = None  # set by fuse()
        self.embed_weight: torch.Tensor | Int8Weight | PackedWeight | None = None
        self.weights = "float"

    def init_weights(self, seed: int, std: float = 0.02) -> Decoder:
        """Seeded random init (the 'custom shape' model and training's starting point)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or "layernorm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    def fuse(self, weights: str = "float") -> Decoder:
        """Concatenate Q/K/V and gate/up weights for inference (one matmul each); every matrix a step multiplies by
        (those two, O, down and the LM head) is then prepacked for the CPU's kernel (prepack(): on CPU a second copy
        of the fused matrices beside the parameters), or with weights="int8" quantized to int8 per output channel
        (Int8Weight, a tied embedding too). Any later .to() or train() drops them, back to the float parameters. A
        compiled step reads them as they are (kvviz.engine.compiled)."""
        if weights not in WEIGHTS:
            raise InputError("model.bad_weights", weights=weights, choices=", ".join(WEIGHTS))
        int8 = weights == "int8"

        def pack(*parts: torch.Tensor) -> torch.Tensor | Int8Weight | PackedWeight:
            if not int8:
                return prepack(*parts)
            return Int8Weight.quantize(torch.cat(parts) if len(parts) > 1 else parts[0].detach())

        with torch.no_grad():
            for layer in self.model.layers:
                a, m = layer.self_attn, layer.mlp
                a.qkv_weight = pack(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)
                if a.q_proj.bias is not None:
                    a.qkv_bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
                m.gate_up_weight = pack(m.gate_proj.weight, m.up_proj.weight)
                a.o_weight = pack(a.o_proj.weight)
                m.down_weight = pack(m.down_proj.weight)
            self.head_weight = pack(self.lm_head.weight)
            # A tied table is read from its one quantized copy, as llama.cpp reads token_embd for both.
            self.embed_weight = self.head_weight if int8 and self.cfg.tie_embeddings else None
        if int8 and self.lm_head.weight.is_cpu:
            int8_kernel.why_not()  # built (or found) now, at load, rather than inside a first timed pass
        self.weights = weights
        return self

    def __deepcopy__(self, memo: dict) -> Decoder:
        """A copy of the parameters, unfused (fuse() it again): oneDNN's prepacked matrices are opaque tensors with no
        storage to copy."""
        fused = [self.head_weight, self.embed_weight] + [w for layer in self.model.layers for w in (
            layer.self_attn.qkv_weight, layer.self_attn.qkv_bias, layer.self_attn.o_weight, layer.mlp.gate_up_weight,
            layer.mlp.down_weight)]
        memo.update({id(w): None for w in fused if w is not None})  # copied as None: left out
        new = Decoder.__new__(Decoder)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        new.weights = "float"
        return new

    def _unfuse(self) -> None:
        for layer in self.model.layers:
            layer.self_attn.qkv_weight = None
            layer.self_attn.qkv_bias = None
            layer.self_attn.o_weight = None
            layer.mlp.gate_up_weight = None
            layer.mlp.down_weight = None
        self.head_weight = self.embed_weight = None
        self.weights = "float"

    def step_weight_bytes(self) -> int:
        """Bytes of the weights a decode step reads as stored: every matrix and norm once, a tied table once (as the
        LM head), an untied embedding table counted whole; once fused to int8, the int8 matrices and their scales."""
        params = {id(p): p for p in self.parameters()}.values()
        if self.weights != "int8":
            return sum(p.numel() * p.element_size() for p in params)
        packed = [self.head_weight] + [w for layer in self.model.layers for w in (
            layer.self_attn.qkv_weight, layer.self_attn.o_weight, layer.mlp.gate_up_weight, layer.mlp.down_weight)]
        vectors = sum(p.numel() * p.element_size() for p in params if p.dim() == 1)  # norms and biases stay float
        table = 0 if self.cfg.tie_embeddings else self.model.embed_tokens.weight.nbytes
        return sum(w.nbytes for w in packed) + vectors + table

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's signature
        self._unfuse()  # a dtype/device move would leave the fused copies stale
        return super()._apply(fn, recurse)

    def train(self, mode: bool = True) -> Decoder:
        if mode:
            self._unfuse()
        return super().train(mode)

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: DecodeCache | None = None,
        *,
        capture_attention: bool = False,
        causal: bool = True,
        all_logits: bool = True,
    ) -> DecoderOutput:
        attentions: list[torch.Tensor] | None = [] if capture_attention else None
        start = cache.length if cache is not None else 0
        h = self.run_layers(self.embed(input_ids), cache, range(self.cfg.n_layers), start, causal=causal,
                            attentions=attentions)
        return DecoderOutput(self.head(h if all_logits else h[:, -1:]), attentions)

    # The three parts of forward(), public so that a speculative draft can run the first layers only (an early
    # exit) and a verify pass can resume from the hidden states the draft left there (LayerSkip's exit query cache).
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        w = self.embed_weight if self.embed_weight is not None else self.model.embed_tokens.weight
        if isinstance(w, Int8Weight):
            rows = F.embedding(input_ids, w.q).float() * w.scale.float()[input_ids, None]
            return rows.to(self.lm_head.weight.dtype)
        return F.embedding(input_ids, w)

    def run_layers(self, h: torch.Tensor, cache: DecodeCache | None, layers: range, position: int, *,
                   causal: bool = True, attentions: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Hidden states [B, T, d] of the tokens at absolute positions position, position + 1, ... through `layers`;
        their K/V are appended to those layers of the cache."""
        t = h.shape[1]
        if position + t > self.cfg.max_seq_len:
            raise InputError("sequence_too_long", n_tokens=position + t, max_len=self.cfg.max_seq_len)
        # Submodules are called through .forward() and F.linear: the same ops without nn.Module's per-call
        # hook machinery, which a decode step (dozens of tiny calls) would otherwise pay every time.
        # [t, 1, d_head]: broadcast over the heads of a [B, t, heads, d_head] projection
        cos = self.rope_cos[position : position + t, None].to(h.dtype)
        sin = self.rope_sin[position : position + t, None].to(h.dtype)
        capture = attentions is not None
        for i in layers:
            layer = self.model.layers[i]
            a, probs = layer.self_attn.forward(
                layer.input_layernorm.forward(h), cos, sin, cache, i, causal=causal, capture=capture
            )
            h = h + a
            h = h + layer.mlp.forward(layer.post_attention_layernorm.forward(h))
            if attentions is not None:
                attentions.append(probs)
        return h

    def step_static(self, input_ids: torch.Tensor, cache: KVCache, pos: torch.Tensor, *, capture: bool = False,
                    layer_step: Callable | None = None) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """One decode step ([B, 1] token ids) at the position tensor `pos` ([1], int64), each layer's K/V written
        there (static_layer): the logits [B, 1, V] and, with capture, each layer's probabilities over the whole
        buffer. The cache's counters are not touched (a compiled graph cannot move Python ints): the caller advances
        them (KVCache.advance). `layer_step`: static_layer compiled (kvviz.engine.compiled), one graph that every
        layer runs with its own weights and buffers."""
        layer_step = layer_step or static_layer
        h = self.embed(input_ids)
        cos = self.rope_cos[pos, None].to(h.dtype)  # [1, 1, d_head]
        sin = self.rope_sin[pos, None].to(h.dtype)
        visible = (torch.arange(cache.max_len, device=pos.device) <= pos)[None]  # [1, max_len]: slots 0..pos
        attentions: list[torch.Tensor] | None = [] if capture else None
        for i, layer in enumerate(self.model.layers):
            h, probs = layer_step(layer, h, cos, sin, cache.k[i], cache.v[i], pos, visible, capture=capture)
            if attentions is not None:
                attentions.append(probs)
        return self.head(h), attentions

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states: the final norm and the LM head (an early exit applies them after any layer)."""
        return linear(self.model.norm.forward(h), self.head_weight if self.head_weight is not None
                      else self.lm_head.weight)

    def forward_paged(self, batch: PagedBatch, kv: PagedKV, *, all_logits: bool = False) -> torch.Tensor:
        """One batched forward over several requests in a paged cache: the logits of each request's last new
        token, [R, V], or with all_logits of every new token, [T, V] (a speculative verify reads each drafted
        position's). The contiguous forward() above is untouched; this path only adds block-table gathers."""
        if int(batch.positions.max()) >= self.cfg.max_seq_len:
            raise InputError("sequence_too_long", n_tokens=int(batch.positions.max()) + 1,
                             max_len=self.cfg.max_seq_len)
        h = self.embed(batch.input_ids).unsqueeze(0)  # [1, T, d]
        cos = self.rope_cos[batch.positions, None].to(h.dtype)  # [T, 1, d_head]: each token at its own position
        sin = self.rope_sin[batch.positions, None].to(h.dtype)
        for i, layer in enumerate(self.model.layers):
            h = h + layer.self_attn.forward_paged(layer.input_layernorm(h), cos, sin, kv, i, batch)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.head(h[0] if all_logits else h[0, batch.last_index])

    def first_layers(self, n_layers: int) -> Decoder:
        """A smaller decoder made of this one's embedding, first n_layers layers, final norm and LM head: the same
        modules (no weight is copied), but a model of its own that runs with a cache of its own."""
        if not 1 <= n_layers <= self.cfg.n_layers:
            raise InputError("spec.bad_layers", layers=n_layers, n_layers=self.cfg.n_layers)
        small = Decoder.__new__(Decoder)
        nn.Module.__init__(small)
        small.cfg = replace(self.cfg, n_layers=n_layers)
        small.model = LlamaModel.__new__(LlamaModel)
        nn.Module.__init__(small.model)
        small.model.embed_tokens, small.model.norm = self.model.embed_tokens, self.model.norm
        small.model.layers = nn.ModuleList(self.model.layers[:n_layers])
        small.lm_head = self.lm_head
        small.head_weight, small.embed_weight, small.weights = self.head_weight, self.embed_weight, self.weights
        small.register_buffer("rope_cos", self.rope_cos, persistent=False)
        small.register_buffer("rope_sin", self.rope_sin, persistent=False)
        return small.train(self.training)

    def new_paged_kv(self, n_blocks: int, block_size: int) -> PagedKV:
        from kvviz.engine.paged.kv import PagedKV

        p = self.lm_head.weight
        return PagedKV(self.cfg.n_layers, n_blocks, block_size, self.cfg.n_kv_heads, self.cfg.d_head,
                       dtype=p.dtype, device=p.device)

    def new_cache(self, batch_size: int = 1, max_len: int | None = None) -> KVCache:
        p = self.lm_head.weight
        return KVCache(
            self.cfg.n_layers,
            batch_size,
            self.cfg.n_kv_heads,
            max_len or self.cfg.max_seq_len,
            self.cfg.d_head,
            dtype=p.dtype,
            device=p.device,
        )

    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
