"""The file llama-server writes for `POST /slots/{id}?action=save`, read field by field, so its size can be held
against kvviz's formula byte for byte.

Layout, as llama.cpp writes it (llama-context.cpp llama_context::state_seq_save_file; llama-kv-cache.cpp
llama_kv_cache::state_write, state_write_meta, state_write_data; tools/server/server-common.cpp
server_tokens::serialize):

    u32 magic 'ggsq' (LLAMA_STATE_SEQ_MAGIC), u32 version (LLAMA_STATE_SEQ_VERSION), u32 n_token_count
    n_token_count × i32: the slot's prompt packed by the server: LLAMA_TOKEN_NULL, u32 format version,
        u32 n, the n token ids, u32 media-chunk count (0 for text)
    u32 n_stream, then per stream: u32 cell_count and, when cells > 0,
        per cell: i32 pos, u32 n_seq_id, n_seq_id × i32 seq_id   (M-RoPE models add a cell extension: not read here)
        u32 v_trans, u32 n_layer
        per layer: i32 K type, u64 K row bytes, cell_count rows of K
        per layer (V not transposed): i32 V type, u64 V row bytes, cell_count rows of V
        per layer (V transposed):     i32 V type, u32 element bytes, u32 V width, width × cell_count elements
"""
from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

MAGIC = 0x67677371  # 'ggsq', LLAMA_FILE_MAGIC_GGSQ in include/llama.h
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: the server's packed-prompt marker
# ggml_type ids (ggml/include/ggml.h) whose KV bytes kvviz's formula describes, by kvviz's dtype names.
GGML_TYPES = {0: "float32", 1: "float16", 30: "bfloat16"}


class SlotFileError(ValueError):
    """Not a slot file this reader understands (another version, a multimodal prompt, a cut-off file)."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise SlotFileError(f"the file ends at byte {len(self.data)}, inside a field at {self.pos}")
        out = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return out

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise SlotFileError(f"{n} bytes of K/V at {self.pos} run past the end ({len(self.data)})")
        self.pos += n


@dataclass
class SlotFile:
    """A slot save file split into what holds K/V and everything around it."""

    size: int
    version: int
    tokens: list[int]  # the prompt the slot held
    n_cells: int  # cached positions (one per token)
    n_layers: int
    v_trans: bool
    kv_types: list[str]  # per layer: K then V, ggml's type id as kvviz's dtype name (or "ggml type N")
    kv_bytes: int  # K and V rows of every layer
    parts: dict[str, int] = field(default_factory=dict)  # every byte of the file, by what it is

    @property
    def header_bytes(self) -> int:
        return self.size - self.kv_bytes

    @property
    def kv_dtype(self) -> str | None:
        """One kvviz dtype name for every K and V tensor, or None when they differ or kvviz has no name for it."""
        names = set(self.kv_types)
        return names.pop() if len(names) == 1 and next(iter(names)) in GGML_TYPES.values() else None

    def to_dict(self) -> dict:
        return {**asdict(self), "header_bytes": self.header_bytes, "kv_dtype": self.kv_dtype}


def read_slot_file(path: str | Path) -> SlotFile:
    data = Path(path).read_bytes()
    r = _Reader(data)
    magic, version, n_packed = r.take("<III")
    if magic != MAGIC:
        raise SlotFileError(f"magic {magic:#x}, not llama.cpp's sequence-state 'ggsq' ({MAGIC:#x})")
    packed = list(r.take(f"<{n_packed}i")) if n_packed else []
    tokens = _unpack_prompt(packed)
    (n_stream,) = r.take("<I")
    parts = {"file header (magic, version, count)": 12, "packed prompt": 4 * n_packed,
             "stream counts": 4 + 4 * n_stream}
    n_cells = n_layers = 0
    v_trans = False
    kv_types: list[str] = []
    kv_bytes = cells_bytes = layer_heads = 0
    for _ in range(n_stream):
        (cells,) = r.take("<I")
        if cells == 0:
            continue
        start = r.pos
        for _ in range(cells):
            _pos, n_seq = r.take("<iI")
            r.take(f"<{n_seq}i")
        cells_bytes += r.pos - start
        trans, n_layer = r.take("<II")
        layer_heads += 8
        for _ in range(n_layer):  # K
            k_type, row = r.take("<iQ")
            layer_heads += 12
            kv_types.append(GGML_TYPES.get(k_type, f"ggml type {k_type}"))
            r.skip(row * cells)
            kv_bytes += row * cells
        for _ in range(n_layer):  # V
            if trans:
                v_type, el, width = r.take("<iII")
                size = el * width * cells
            else:
                v_type, row = r.take("<iQ")
                size = row * cells
            layer_heads += 12
            kv_types.append(GGML_TYPES.get(v_type, f"ggml type {v_type}"))
            r.skip(size)
            kv_bytes += size
        n_cells, n_layers, v_trans = n_cells + cells, n_layer, bool(trans)
    if r.pos != len(data):
        raise SlotFileError(f"{len(data) - r.pos} bytes left after the last layer (a cell extension, or a new layout)")
    parts |= {"cells (pos, seq ids)": cells_bytes, "layer headers (type, row size)": layer_heads, "K/V": kv_bytes}
    return SlotFile(len(data), version, tokens, n_cells, n_layers, v_trans, kv_types, kv_bytes, parts)


def _unpack_prompt(packed: list[int]) -> list[int]:
    """server_tokens::deserialize: a packed prompt starts with LLAMA_TOKEN_NULL; an older file is the bare ids."""
    if not packed or packed[0] != TOKEN_NULL:
        return packed
    if len(packed) < 3 or packed[2] + 3 > len(packed):
        raise SlotFileError("a packed prompt shorter than its own count")
    n = packed[2]
    media = packed[3 + n] if len(packed) > 3 + n else 0
    if media:
        raise SlotFileError(f"a prompt with {media} media chunks (multimodal): not read here")
    return packed[3 : 3 + n]
