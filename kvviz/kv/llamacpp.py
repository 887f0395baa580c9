"""How llama.cpp sizes its KV cache for `llama-server -c N -np P [-kvu] -ctk T -ctv T`, so that kvviz's formula is
compared with the very buffer llama.cpp allocates (tests/engine/test_llamacpp_kv.py reads its log).

llama.cpp (the copy vendored by llama-cpp-python 0.3.36, src/llama-context.cpp, llama_context::llama_context):
    n_ctx = GGML_PAD(n_ctx, 256)                      (0 means the model's n_ctx_train)
    unified:      n_ctx_seq = n_ctx                   one stream that every sequence shares
    not unified:  n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256), n_ctx = n_ctx_seq · n_seq_max
and src/llama-kv-cache.cpp (llama_kv_cache::llama_kv_cache) gives every layer a K and a V tensor of
[n_embd_k_gqa, kv_size = n_ctx_seq, n_stream], n_stream = 1 when unified else n_seq_max, its bytes ggml_row_size of
the cache type. llama-server's -np is n_seq_max; left at auto it takes 4 slots and a unified cache
(tools/server/server.cpp).
"""
from __future__ import annotations

from dataclasses import dataclass

from kvviz.errors import InputError
from kvviz.kv.formats import kv_dtype
from kvviz.kv.formula import KVSpec, kv_footprint

PAD = 256  # GGML_PAD(·, 256) in llama_context::llama_context
# llama.cpp's cache-type names (-ctk/-ctv, ggml_type_name) for the formats kvviz sizes: ggml's f16/bf16/f32 and its
# q8_0/q4_0 blocks (kvviz.kv.formats.KV_DTYPES).
CACHE_TYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "q8_0": "q8_0", "q4_0": "q4_0"}


def _pad(x: int, n: int = PAD) -> int:
    return (x + n - 1) // n * n


@dataclass(frozen=True)
class LlamaCppKV:
    """llama.cpp's KV cache for one start-up: cells per stream, streams, and bytes by kvviz's formula."""

    n_ctx: int  # after padding (what llama.cpp logs as n_ctx)
    cells: int  # kv_size = n_ctx_seq: cells in each stream
    n_streams: int
    n_seq_max: int
    cache_type: str
    k_bytes: int
    v_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


def llamacpp_cells(n_ctx: int, n_parallel: int, *, unified: bool = False,
                   n_ctx_train: int | None = None) -> tuple[int, int, int]:
    """(n_ctx, cells per stream, streams) that llama.cpp derives from -c and -np (see the module's note)."""
    for name, value in (("n_ctx", n_ctx), ("n_parallel", n_parallel)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "n_ctx" else 1):
            raise InputError("positive_int", name=name, value=value)
    if n_ctx == 0:
        if n_ctx_train is None:
            raise InputError("positive_int", name="n_ctx", value=n_ctx)
        n_ctx = n_ctx_train
    n_ctx = _pad(n_ctx)
    if unified:
        return n_ctx, n_ctx, 1
    cells = _pad(n_ctx // n_parallel)
    return cells * n_parallel, cells, n_parallel


def llamacpp_kv(spec: KVSpec, n_ctx: int, n_parallel: int, cache_type: str = "f16", *, unified: bool = False
                ) -> LlamaCppKV:
    """The KV buffer llama-server allocates for this model: kvviz's kv_footprint over llama.cpp's cells and
    streams (every stream holds `cells` tokens of every layer, K and V alike)."""
    if spec.is_mla or spec.n_sliding_layers:  # llama.cpp's MLA and iSWA caches split K and V otherwise
        raise InputError("llamacpp_kv_kind", kind="MLA" if spec.is_mla else "sliding-window")
    if cache_type not in CACHE_TYPES:
        raise InputError("unknown_kv_dtype", name=cache_type, choices=", ".join(CACHE_TYPES))
    padded, cells, streams = llamacpp_cells(n_ctx, n_parallel, unified=unified, n_ctx_train=spec.max_context)
    total = kv_footprint(spec, cells, streams, kv_dtype(CACHE_TYPES[cache_type])).total
    return LlamaCppKV(padded, cells, streams, n_parallel, cache_type, total // 2, total - total // 2)
