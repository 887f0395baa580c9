"""The two tiers below the device: CPU memory (LRU, bounded in bytes) and disk (one safetensors file per chunk,
bounded in bytes, LRU, read back after a restart). As LMCache's LocalCPUBackend and LocalDiskBackend: a store
writes a chunk to both, a lookup tries memory first, and a chunk read from disk is written back into memory.
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from kvviz.engine.offload import serde
from kvviz.engine.offload.serde import CorruptChunk


@dataclass(frozen=True)
class ChunkInfo:
    """Which tokens a chunk holds and where it sits in its prompt; `key` chains every token before it."""

    key: str  # hex of the chained hash (kvviz.engine.paged.blocks.block_hash)
    parent: str  # the previous chunk's key (the store's namespace root for a prompt's first chunk)
    start: int  # position of the chunk's first token in the prompt
    tokens: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def meta(self, namespace: str) -> dict[str, str]:
        return {"namespace": namespace, "key": self.key, "parent": self.parent, "start": str(self.start),
                "tokens": json.dumps(list(self.tokens))}

    @staticmethod
    def from_meta(meta: dict[str, str]) -> ChunkInfo:
        try:
            return ChunkInfo(meta["key"], meta["parent"], int(meta["start"]), tuple(json.loads(meta["tokens"])))
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptChunk(f"metadata without {exc}") from None


@dataclass
class Chunk:
    info: ChunkInfo
    k: torch.Tensor  # [layers, kv heads, chunk tokens, d_head] on the CPU
    v: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class MemoryTier:
    """Chunks in CPU memory, least recently used first; a put evicts from the front until the new one fits."""

    name = "memory"

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.chunks: OrderedDict[str, Chunk] = OrderedDict()
        self.used_bytes = 0

    def __contains__(self, key: str) -> bool:
        return key in self.chunks

    def get(self, key: str, *, touch: bool = True) -> Chunk | None:
        chunk = self.chunks.get(key)
        if chunk is not None and touch:
            self.chunks.move_to_end(key)
        return chunk

    def put(self, chunk: Chunk) -> list[str]:
        """Keep the chunk; returns the keys evicted to make room (the chunk's own key when it can never fit)."""
        key = chunk.info.key
        if key in self.chunks:
            self.chunks.move_to_end(key)
            return []
        if chunk.nbytes > self.capacity_bytes:
            return [key]
        evicted = []
        while self.used_bytes + chunk.nbytes > self.capacity_bytes:
            old_key, old = self.chunks.popitem(last=False)
            self.used_bytes -= old.nbytes
            evicted.append(old_key)
        self.chunks[key] = chunk
        self.used_bytes += chunk.nbytes
        return evicted

    def infos(self) -> list[ChunkInfo]:
        return [c.info for c in self.chunks.values()]


def _drop_page_cache(fd: int) -> None:
    """Ask the OS to forget this file's cached pages, so the next read comes from the device, as a disk tier's
    read does when the file is not in RAM (Linux posix_fadvise; elsewhere the page cache may serve it)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


class DiskTier:
    """One file per chunk in `directory`, named by its key. Written to a temporary name, synced and renamed, so a
    crash leaves a whole file or none; read back and checked against its sha256 before any K/V is used."""

    name = "disk"
    SUFFIX = ".safetensors"

    def __init__(self, directory: Path, capacity_bytes: int, namespace: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self.namespace = namespace
        self.files: OrderedDict[str, int] = OrderedDict()  # key -> file bytes, least recently used first
        self.index: dict[str, ChunkInfo] = {}
        self.removed_at_start: list[str] = []  # unreadable files found by the scan (a crash, a bad copy)
        for path in sorted(self.directory.glob("*" + self.SUFFIX), key=lambda p: p.stat().st_mtime):
            try:
                info = self._read_info(path)
            except (CorruptChunk, OSError):
                path.unlink(missing_ok=True)
                self.removed_at_start.append(path.name)
                continue
            self.files[info.key] = path.stat().st_size
            self.index[info.key] = info
        for tmp in self.directory.glob(".*.tmp"):  # a write cut off before its rename
            tmp.unlink(missing_ok=True)

    @property
    def used_bytes(self) -> int:
        return sum(self.files.values())

    def path(self, key: str) -> Path:
        return self.directory / (key + self.SUFFIX)

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def _read_info(self, path: Path) -> ChunkInfo:
        """The chunk's description from the file's header alone (the tensors are not read)."""
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CorruptChunk("shorter than a safetensors header")
            n = int.from_bytes(head, "little")
            if n > path.stat().st_size - 8:
                raise CorruptChunk("header longer than the file")
            meta = serde.metadata(head + f.read(n))
        info = ChunkInfo.from_meta(meta)
        if meta.get("namespace") != self.namespace or path.name != info.key + self.SUFFIX:
            raise CorruptChunk("a file of another model or under another name")
        return info

    def put(self, chunk: Chunk) -> list[str]:
        key = chunk.info.key
        if key in self.files:
            return []
        blob = serde.pack(chunk.k, chunk.v, chunk.info.meta(self.namespace))
        if len(blob) > self.capacity_bytes:
            return [key]
        evicted = []
        while self.used_bytes + len(blob) > self.capacity_bytes:
            old, _ = self.files.popitem(last=False)
            self.index.pop(old, None)
            self.path(old).unlink(missing_ok=True)
            evicted.append(old)
        tmp = self.directory / f".{key}.tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
            _drop_page_cache(f.fileno())
        os.replace(tmp, self.path(key))
        self.files[key] = len(blob)
        self.index[key] = chunk.info
        return evicted

    def get(self, key: str) -> Chunk | None:
        """The chunk read from its file and checked; a damaged file is deleted and CorruptChunk raised."""
        if key not in self.files:
            return None
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
                _drop_page_cache(f.fileno())
            k, v, meta = serde.unpack(blob)
            info = ChunkInfo.from_meta(meta)
            if info.key != key or meta.get("namespace") != self.namespace:
                raise CorruptChunk("the file holds another chunk")
        except (CorruptChunk, OSError) as exc:
            self.drop(key)
            raise CorruptChunk(f"{path.name}: {exc}") from None
        self.files.move_to_end(key)
        os.utime(path)  # the file's time is its place in the LRU order after a restart
        return Chunk(info, k, v)

    def drop(self, key: str) -> None:
        self.files.pop(key, None)
        self.index.pop(key, None)
        self.path(key).unlink(missing_ok=True)

    def infos(self) -> list[ChunkInfo]:
        return [self.index[k] for k in self.files]
