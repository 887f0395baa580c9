"""A tiered KV store in front of the engine, keyed as LMCache keys it.

Rules (LMCache, lmcache/v1/token_database.py ChunkedTokenDatabase and the vLLM adapter's get_num_new_matched_tokens):
- a prompt is cut into chunks of `chunk_size` tokens (256 by default); a chunk's key hashes its parent's key and its
  own tokens, so equal keys mean equal whole prefixes (kvviz uses the paged cache's block_hash for this chain);
- only full chunks are stored here (LMCache can also save the partial last chunk: save_unfull_chunk);
- a lookup walks the chunks from the start, each from the fastest tier holding it, and stops at the first miss
  (storage_manager: retrieval is prefix-based across tiers);
- when the whole prompt is found, its last token is still computed: its logits choose the first new token;
- a store writes every new chunk to each tier; a chunk read from disk is written back into memory.

Every request gets the reason its loaded prefix ends where it does (LMCache/LMCache#3659 asks exactly this).
"""
from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kvviz.engine.cache import KVCache
from kvviz.engine.device import synchronize
from kvviz.engine.offload.serde import CorruptChunk
from kvviz.engine.offload.tiers import Chunk, ChunkInfo, DiskTier, MemoryTier
from kvviz.engine.paged.blocks import prompt_block_hashes
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec

DEFAULT_CHUNK_SIZE = 256  # LMCache's default chunk_size (lmcache/v1/config.py; ChunkedTokenDatabase without config)
TIERS = ("memory", "disk")  # fastest first: a lookup tries them in this order
MAX_CATALOGUE = 65536  # chunks remembered for miss reasons (their tokens and parent, no K/V)


def namespace(spec: KVSpec, dtype: str) -> str:
    """What a stored chunk must match besides its tokens: the model and the K/V format (LMCache's CacheEngineKey
    carries model_name and kv_dtype beside the chunk hash)."""
    return f"{spec.name}|{dtype}|L{spec.n_layers}|Hkv{spec.n_kv_heads}|d{spec.d_head}"


@dataclass(frozen=True)
class MissReason:
    """Why the loaded prefix ends at `token`. reason: never_stored | evicted | prompt_changed | corrupt |
    chunk_boundary (the tokens after the last full chunk are never stored) | last_token (the whole prompt was
    found; its last token is computed for its logits)."""

    reason: str
    token: int  # the first prompt position computed
    tier: str | None = None  # evicted, corrupt: the tier that lost the chunk
    request: int | None = None  # evicted: the request whose store pushed it out
    changed_at: int | None = None  # prompt_changed: the first token that differs (its whole chunk is computed)

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.changed_at is None:  # said only where it differs from `token`
            del out["changed_at"]
        return out


@dataclass
class Loaded:
    """What one lookup brought to the device, tier by tier, measured."""

    n_tokens: int
    tokens_by_tier: dict[str, int]
    bytes_by_tier: dict[str, int]
    seconds_by_tier: dict[str, float]
    chunks: list[tuple[int, int, str]]  # (start, end, tier) of each chunk loaded, in order
    miss: MissReason
    lookup_s: float = 0.0  # hashing the prompt's chunks


@dataclass
class Saved:
    n_chunks: int
    bytes: int  # K/V bytes of the chunks newly stored
    seconds: float
    evicted: dict[str, list[str]] = field(default_factory=dict)  # tier -> keys pushed out by this request


@dataclass
class _Entry:
    info: ChunkInfo
    evicted: dict[str, int] = field(default_factory=dict)  # tier -> request that evicted it
    corrupt: bool = False


class TieredStore:
    """Chunks of one model's K/V in CPU memory and on disk under `directory` (its own folder per namespace)."""

    def __init__(self, directory: str | Path, name_space: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 memory_bytes: int, disk_bytes: int) -> None:
        for label, value in (("chunk size", chunk_size), ("memory tier bytes", memory_bytes + 1),
                             ("disk tier bytes", disk_bytes + 1)):
            if value <= 0:
                raise InputError("positive_int", name=label, value=value)
        self.root = Path(directory)
        self.namespace = name_space
        self.chunk_size = chunk_size
        self.root_key = hashlib.sha256(name_space.encode()).digest()
        folder = hashlib.sha256(name_space.encode()).hexdigest()[:16]  # one model's files apart from another's
        self.memory = MemoryTier(memory_bytes)
        self.disk = DiskTier(self.root / folder, disk_bytes, name_space)
        self.requests = 0  # lookups served, numbering requests for eviction reasons
        self.request_evicted: dict[str, list[str]] = {t: [] for t in TIERS}  # by the latest request, load and save
        self.catalogue: OrderedDict[str, _Entry] = OrderedDict()
        self.children: dict[str, set[str]] = {}
        for info in self.disk.infos():  # after a restart the disk's chunks are known again (their history is not)
            self._remember(info)

    @property
    def tiers(self) -> dict[str, MemoryTier | DiskTier]:
        return {"memory": self.memory, "disk": self.disk}

    def reopen(self) -> TieredStore:
        """The same directory opened afresh, as a restarted server would: memory empty, the disk read back."""
        return TieredStore(self.root, self.namespace, chunk_size=self.chunk_size,
                           memory_bytes=self.memory.capacity_bytes, disk_bytes=self.disk.capacity_bytes)

    # ---- keys -------------------------------------------------------------------------------------------
    def chunk_infos(self, token_ids: Sequence[int]) -> list[ChunkInfo]:
        """Every full chunk of a prompt with its chained key (the paged cache's block hash, rooted in the namespace)."""
        keys = prompt_block_hashes(token_ids, self.chunk_size, root=self.root_key)
        c, parents = self.chunk_size, [self.root_key.hex()] + [k.hex() for k in keys]
        return [ChunkInfo(k.hex(), parents[i], i * c, tuple(token_ids[i * c : (i + 1) * c]))
                for i, k in enumerate(keys)]

    def _remember(self, info: ChunkInfo) -> None:
        entry = self.catalogue.get(info.key)
        if entry is None:
            self.catalogue[info.key] = _Entry(info)
            self.children.setdefault(info.parent, set()).add(info.key)
            while len(self.catalogue) > MAX_CATALOGUE:
                old_key, old = self.catalogue.popitem(last=False)
                self.children.get(old.info.parent, set()).discard(old_key)
        else:
            entry.evicted.clear()
            entry.corrupt = False
            self.catalogue.move_to_end(info.key)

    def _put(self, tier: str, chunk: Chunk) -> None:
        """Into one tier; what it pushes out is recorded (a chunk larger than the whole tier is not kept there)."""
        gone = [k for k in self.tiers[tier].put(chunk) if k != chunk.info.key]
        self._evicted(tier, gone)

    def _evicted(self, tier: str, keys: Sequence[str]) -> None:
        self.request_evicted[tier] += keys
        for key in keys:
            if key in self.catalogue:
                self.catalogue[key].evicted[tier] = self.requests

    def explain(self, info: ChunkInfo) -> MissReason:
        """Why this chunk is in no tier: it was lost (evicted, corrupt), a stored neighbour shows where the prompt
        changed, or nothing like it was ever stored."""
        entry = self.catalogue.get(info.key)
        if entry is not None:
            if entry.corrupt:
                return MissReason("corrupt", info.start, tier="disk")
            if not entry.evicted:  # stored, yet larger than every tier: kept nowhere
                return MissReason("never_stored", info.start)
            tier = "disk" if "disk" in entry.evicted else "memory"
            return MissReason("evicted", info.start, tier=tier, request=entry.evicted.get(tier))
        best = -1
        for key in self.children.get(info.parent, ()):
            stored = self.catalogue[key].info.tokens
            same = next((i for i, (a, b) in enumerate(zip(stored, info.tokens, strict=False)) if a != b),
                        min(len(stored), len(info.tokens)))
            best = max(best, same)
        # A first chunk that shares no token with any stored one is a new prompt, not a changed one.
        if best >= 0 and (best > 0 or info.start > 0):
            return MissReason("prompt_changed", info.start, changed_at=info.start + best)
        return MissReason("never_stored", info.start)

    # ---- load -------------------------------------------------------------------------------------------
    def load_prefix(self, token_ids: Sequence[int], cache: KVCache) -> Loaded:
        """Copy the longest stored prefix of the prompt into an empty cache, chunk by chunk from the fastest tier
        holding it (disk → memory → device), and say why it stops there. At most n − 1 tokens are loaded."""
        if cache.length:
            raise InputError("moving.bad_past", n_loaded=cache.length, n_tokens=len(token_ids))
        self.requests += 1
        self.request_evicted = {t: [] for t in TIERS}
        n = len(token_ids)
        t0 = time.perf_counter()
        infos = self.chunk_infos(token_ids)
        lookup_s = time.perf_counter() - t0
        tokens = dict.fromkeys(TIERS, 0)
        nbytes = dict.fromkeys(TIERS, 0)
        seconds = dict.fromkeys(TIERS, 0.0)
        loaded: list[tuple[int, int, str]] = []
        miss = None
        for info in infos:
            t0 = time.perf_counter()
            chunk, tier = self.memory.get(info.key), "memory"
            if chunk is None:
                tier = "disk"
                try:
                    chunk = self.disk.get(info.key)
                except CorruptChunk:
                    self.catalogue[info.key] = self.catalogue.get(info.key) or _Entry(info)
                    self.catalogue[info.key].corrupt = True
                    chunk = None
                if chunk is not None:
                    self._put("memory", chunk)  # written back, as LMCache's StorageManager.get() does
            if chunk is None:
                miss = self.explain(info)
                break
            use = min(info.end, n - 1) - info.start  # the last prompt token is always computed
            copy_into(cache, chunk, use)
            synchronize(cache.k[0].device)
            seconds[tier] += time.perf_counter() - t0
            tokens[tier] += use
            nbytes[tier] += chunk.nbytes * use // len(info.tokens)
            loaded.append((info.start, info.start + use, tier))
        if miss is None:
            done = cache.length
            miss = MissReason("last_token" if done == n - 1 and len(infos) * self.chunk_size == n
                              else "chunk_boundary", done)
        return Loaded(cache.length, tokens, nbytes, seconds, loaded, miss, lookup_s)

    # ---- store ------------------------------------------------------------------------------------------
    def save(self, token_ids: Sequence[int], cache: KVCache) -> Saved:
        """Write every full chunk of the prompt the cache holds and no tier has yet, to every tier."""
        t0 = time.perf_counter()
        out = Saved(0, 0, 0.0, {t: [] for t in TIERS})
        for info in self.chunk_infos(token_ids):
            if info.end > cache.length:
                break
            have = {t for t in TIERS if info.key in self.tiers[t]}
            if len(have) == len(TIERS):
                continue
            chunk = chunk_from(cache, info)
            self._remember(info)
            for tier in TIERS:
                if tier not in have:
                    self._put(tier, chunk)
            out.n_chunks += 1
            out.bytes += chunk.nbytes
        out.seconds = time.perf_counter() - t0
        out.evicted = {t: list(self.request_evicted[t]) for t in TIERS}
        return out

    def contents(self) -> dict[str, list[ChunkInfo]]:
        """What each tier holds now, least recently used first."""
        return {t: self.tiers[t].infos() for t in TIERS}


def copy_into(cache: KVCache, chunk: Chunk, n_tokens: int) -> None:
    """Append the chunk's first n_tokens positions to every layer of a batch-1 cache (host → device)."""
    device, dtype = cache.k[0].device, cache.k[0].dtype
    for layer in range(cache.n_layers):
        cache.append(layer, chunk.k[layer, None, :, :n_tokens].to(device, dtype),
                     chunk.v[layer, None, :, :n_tokens].to(device, dtype))


def chunk_from(cache: KVCache, info: ChunkInfo) -> Chunk:
    """The chunk's K/V copied off the device: [layers, kv heads, chunk tokens, d_head] on the CPU."""
    k = torch.stack([cache.keys(i)[0, :, info.start : info.end] for i in range(cache.n_layers)]).cpu().clone()
    v = torch.stack([cache.values(i)[0, :, info.start : info.end] for i in range(cache.n_layers)]).cpu().clone()
    return Chunk(info, k, v)
