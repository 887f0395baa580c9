"""kvviz's decode step in C (step.c): every layer of one token's step in one call, the matrices multiplied by kvviz's
own kernels (int8.py, f32.py) and everything between them (norms, RoPE, the cache write, attention, the MLP's gate)
in the same C, one call a step, as llama.cpp's llama_decode computes a step's whole graph in C (step.c cites where).
Built once per machine into the user's cache (kernels.build) where the CPU runs AVX2 and FMA. It runs a step where
`why_not(model, cache)` is None: a CPU, float32 activations and cache, batch 1, every matrix on one of kvviz's kernels
(int8, or float32 packed by prepack); kvviz.engine.compiled calls it as its "kernels" mode and says why not in one
line elsewhere.
"""
from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

import torch

from kvviz.engine.kernels import build
from kvviz.engine.kernels import f32 as f32_kernel
from kvviz.engine.kernels import int8 as int8_kernel

if TYPE_CHECKING:
    from kvviz.engine.cache import KVCache
    from kvviz.engine.model import Decoder

SOURCE = "step.c"


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str | None]:
    """The built step (kernels.build), or None and why not."""
    flags = build.vector_flags()
    if not flags:
        return None, "kvviz's C decode step needs AVX2 and FMA, which this CPU's torch does not run"
    lib, why = build.load(SOURCE, "kvviz's C decode step", flags)
    if lib is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.kvviz_step.argtypes = [p, p, p, ctypes.c_float, p, p, ctypes.c_int, p, p, i64, p, p, p]
        lib.kvviz_step.restype = ctypes.c_int
    return lib, why


def _matrix(w: object) -> list[int] | str:
    """A matrix as step.c reads it (data, scales, bias, N, K), or why no kernel of kvviz's multiplies it."""
    from kvviz.engine.model import Int8Weight, PackedWeight

    if isinstance(w, Int8Weight):
        if w.scale.dtype != torch.bfloat16 or int8_kernel.why_not() is not None:
            return int8_kernel.why_not() or "an int8 matrix without bfloat16 scales"
        return [w.q.data_ptr(), w.scale.data_ptr(), 0, *w.q.shape]
    if isinstance(w, PackedWeight) and w.kernel == "kvviz":
        return [w.w.data_ptr(), 0, 0, *w.shape]
    return "a matrix not packed for kvviz's float32 kernel (" + (
        f"{w.kernel}'s" if isinstance(w, PackedWeight) else "unpacked") + ")"


def _matrices(layer: torch.nn.Module) -> tuple:
    """A layer's fused matrices in step.c's order: Q/K/V, O, gate/up, down."""
    a, m = layer.self_attn, layer.mlp
    return a.qkv_weight, a.o_weight, m.gate_up_weight, m.down_weight


def runs_on(cache: KVCache) -> bool:
    """Whether step.c runs a step on this cache: one row, float32."""
    return cache.k[0].dtype == torch.float32 and cache.k[0].shape[0] == 1


class Plan:
    """What step.c reads for one model and one cache, gathered once: the layers' pointers, the sizes, the kernels."""

    def __init__(self, model: Decoder, cache: KVCache) -> None:
        cfg, layers = model.cfg, model.model.layers
        rows = []
        for i, layer in enumerate(layers):
            row = [layer.input_layernorm.weight.data_ptr(), layer.post_attention_layernorm.weight.data_ptr(),
                   cache.k[i].data_ptr(), cache.v[i].data_ptr()]
            biases = (layer.self_attn.qkv_bias, layer.self_attn.o_proj.bias, None, None)
            for w, bias in zip(_matrices(layer), biases, strict=True):
                mat = _matrix(w)
                mat[2] = bias.data_ptr() if bias is not None else 0
                row += mat
            rows.append(row)
        self.layers = torch.tensor(rows, dtype=torch.int64)
        self.head = torch.tensor([model.model.norm.weight.data_ptr(), *_matrix(model.head_weight)], dtype=torch.int64)
        self.dims = torch.tensor([cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_ff,
                                  cache.max_len], dtype=torch.int64)
        self.eps, self.vocab, self.max_len = cfg.norm_eps, int(self.head[4]), cache.max_len
        self.probs_shape = (cfg.n_layers, 1, cfg.n_heads, 1, cache.max_len)  # with capture: every head's row
        int8_lib, f32_lib = int8_kernel._library()[0], f32_kernel._library()[0]
        self.int8 = ctypes.cast(int8_lib.kvviz_int8_linear, ctypes.c_void_p).value if int8_lib else None
        self.f32 = ctypes.cast(f32_lib.kvviz_f32_linear, ctypes.c_void_p).value if f32_lib else None
        self.sources = _sources(model, cache)  # what the pointers point into, kept alive and compared by current()

    def current(self, model: Decoder, cache: KVCache) -> bool:
        """Whether the model's matrices and the cache's buffers are still the ones this plan points into."""
        return all(a is b for a, b in zip(self.sources, _sources(model, cache), strict=True))


def _sources(model: Decoder, cache: KVCache) -> tuple:
    return (model.head_weight, *cache.k, *cache.v, *(w for layer in model.model.layers for w in _matrices(layer)))


def why_not(model: Decoder, cache: KVCache | None = None) -> str | None:
    """None where step.c can run `model`'s decode step on `cache` (None: any float32 cache of batch 1), else why not,
    in one line."""
    if (why := _library()[1]) is not None:
        return why
    cfg = model.cfg
    if model.lm_head.weight.device.type != "cpu" or model.lm_head.weight.dtype != torch.float32:
        return "kvviz's C decode step runs float32 models on CPUs"
    if cfg.d_head % 8:
        return f"kvviz's C decode step needs a head size that is a multiple of 8 (this model's: {cfg.d_head})"
    if cache is not None and not runs_on(cache):
        return "kvviz's C decode step runs one row of a float32 cache"
    for w in (*_matrices(model.model.layers[0]), model.head_weight):
        if isinstance(why := _matrix(w), str):
            return f"kvviz's C decode step multiplies with kvviz's kernels only: {why}"
    return None


def run(plan: Plan, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: int, *,
        capture: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step: h [1, 1, d_model] (the token's embedding, float32) → logits [1, 1, V] and, with capture, every
    layer's probabilities [n_layers, 1, n_heads, 1, max_len] (0 past pos). The K/V land in the cache at pos."""
    h = h.contiguous().clone()
    logits = h.new_empty(1, 1, plan.vocab)
    probs = h.new_empty(plan.probs_shape) if capture else None
    if _library()[0].kvviz_step(plan.layers.data_ptr(), plan.head.data_ptr(), plan.dims.data_ptr(), plan.eps,
                                plan.int8, plan.f32, torch.get_num_threads(), cos.data_ptr(), sin.data_ptr(), pos,
                                h.data_ptr(), logits.data_ptr(), probs.data_ptr() if capture else None):
        raise MemoryError("kvviz's C decode step could not allocate its scratch rows")
    return logits, probs
