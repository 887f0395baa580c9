"""K/V as bytes: safetensors (two tensors, k and v, [layers, kv heads, tokens, d_head]) plus string metadata with
a sha256 of the tensor bytes. The disk tier writes these bytes to a file and the handoff sends them over a socket;
both check them with unpack(), which refuses a truncated or altered message instead of returning wrong K/V.
"""
from __future__ import annotations

import hashlib
import json
import struct

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

CHECKSUM_KEY = "sha256"


class CorruptChunk(Exception):
    """Bytes that are not the K/V they claim to be: truncated, altered, or for another model."""


def raw_bytes(t: torch.Tensor) -> memoryview:
    """A tensor's bytes as stored (bfloat16 included), for hashing and sending without a copy when contiguous."""
    return memoryview(t.detach().contiguous().view(torch.uint8).cpu().numpy()).cast("B")


def digest(k: torch.Tensor, v: torch.Tensor) -> str:
    h = hashlib.sha256()
    h.update(raw_bytes(k))
    h.update(raw_bytes(v))
    return h.hexdigest()


def pack(k: torch.Tensor, v: torch.Tensor, meta: dict[str, str]) -> bytes:
    """safetensors bytes of k and v with `meta` and their checksum in the header."""
    k, v = k.detach().contiguous().cpu(), v.detach().contiguous().cpu()
    return st_save({"k": k, "v": v}, metadata={**meta, CHECKSUM_KEY: digest(k, v)})


def header(blob: bytes | memoryview) -> dict:
    """The safetensors header (8-byte little-endian length, then JSON), or CorruptChunk."""
    if len(blob) < 8:
        raise CorruptChunk(f"{len(blob)} bytes: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", bytes(blob[:8]))
    if n > len(blob) - 8:
        raise CorruptChunk(f"header of {n} bytes in a {len(blob)}-byte message")
    try:
        return json.loads(bytes(blob[8 : 8 + n]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptChunk(f"unreadable header: {exc}") from None


def metadata(blob: bytes | memoryview) -> dict[str, str]:
    meta = header(blob).get("__metadata__")
    if not isinstance(meta, dict):
        raise CorruptChunk("no metadata in the header")
    return meta


def unpack(blob: bytes) -> tuple[torch.Tensor, torch.Tensor, dict[str, str]]:
    """k, v and the metadata, after checking the tensors against the checksum in the header."""
    meta = metadata(blob)
    try:
        tensors = st_load(bytes(blob))
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise CorruptChunk(f"unreadable tensors: {exc}") from None
    if set(tensors) != {"k", "v"}:
        raise CorruptChunk(f"tensors {sorted(tensors)} instead of k and v")
    k, v = tensors["k"], tensors["v"]
    if meta.get(CHECKSUM_KEY) != digest(k, v):
        raise CorruptChunk("the K/V bytes do not match their sha256")
    return k, v, meta
