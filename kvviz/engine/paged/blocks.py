"""The block pool: fixed-size KV blocks, a block table per request, and vLLM's prefix-caching rules.

Rules (vLLM v1 automatic prefix caching, docs/design/prefix_caching.md and vllm/v1/core/block_pool.py):
- a block's hash chains its parent's hash and its own token ids, so equal hashes mean equal whole prefixes;
- only full blocks get a hash and can be shared;
- a lookup walks the prompt's full blocks from the start and stops at the first miss;
- the last prompt token is always computed (its logits pick the next token), so an n-token prompt reuses at
  most ⌊(n−1)/B⌋·B tokens;
- a freed block keeps its hash on an LRU free list and can be hit again until it is taken for new tokens; a freed
  block without a hash (a partial last block) goes to the front of the list, to be reused first (free_blocks);
- block 0 is the null block (BlockPool.__init__ takes it off the free list): never handed out, and usage counts
  the other n − 1 (get_usage);
- blocks are not de-duplicated: every block id is kept under its hash (BlockHashToBlockMap.insert), a lookup
  takes the first (get_one_block), and evicting one copy leaves the others findable (BlockHashToBlockMap.pop).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.errors import InputError
from kvviz.kv.capacity import BLOCK_SIZE  # vLLM's default block size (CacheConfig.block_size), defined once


def block_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """Hash of a full block: its parent's hash and its own token ids (sha256, so a hit is a real match)."""
    h = hashlib.sha256(parent or b"root")
    h.update(b",".join(str(t).encode() for t in tokens))
    return h.digest()


def prompt_block_hashes(token_ids: Sequence[int], block_size: int, root: bytes | None = None) -> list[bytes]:
    """The chained hashes of every full block of a token sequence. `root` seeds the chain (an offload store
    keys it by model and dtype, as LMCache's CacheEngineKey carries model_name and kv_dtype beside the hash)."""
    hashes: list[bytes] = []
    parent = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


def max_cacheable_tokens(n_prompt: int, block_size: int) -> int:
    """The most tokens an n-token prompt can take from the cache: full blocks, keeping the last token."""
    return max(n_prompt - 1, 0) // block_size * block_size


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full and registered
    n_filled: int = 0  # token slots written (a partial last block has fewer than block_size)


NULL_BLOCK = 0  # vLLM's null_block: a placeholder id (padding of sliding-window tables), never allocated


class BlockPool:
    """Physical blocks 0..n_blocks−1, block 0 the null block. Any other block is in use (ref_count > 0),
    cached-but-free (ref_count 0 with a hash: reusable on a hit, evicted when taken) or free (ref_count 0, no
    hash)."""

    def __init__(self, n_blocks: int, block_size: int = BLOCK_SIZE) -> None:
        if n_blocks <= 0:
            raise InputError("positive_int", name="blocks", value=n_blocks)
        if block_size <= 0:
            raise InputError("positive_int", name="block size", value=block_size)
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(n_blocks)]
        # Free blocks in the order allocation takes them, from the front (evicting a cached one). Block 0 is taken
        # off at once as the null block (vLLM's BlockPool.__init__: null_block = free_block_queue.popleft()).
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, n_blocks))
        # hash -> every block id holding it, first cached first (vLLM's BlockHashToBlockMap: block tables are
        # append-only, so a block that fills up equal to a cached one stays, and both are findable)
        self.cached: dict[bytes, dict[int, None]] = {}
        self.hits = 0  # tokens served from the cache, over the pool's life
        self.queries = 0  # prompt tokens looked up
        self.evictions = 0

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def n_usable(self) -> int:
        """Blocks a request can ever hold: all but the null block."""
        return self.n_blocks - 1

    @property
    def n_free(self) -> int:
        """Blocks that can be taken now: the free ones and the cached-but-free ones."""
        return len(self.free)

    def n_in_use(self) -> int:
        return self.n_usable - len(self.free)

    def usage(self) -> float:
        """The share of usable blocks not free, as vLLM's get_usage (over num_gpu_blocks − 1; 0 with none)."""
        return 1.0 - self.n_free / self.n_usable if self.n_usable else 0.0

    def n_cached_free(self) -> int:
        return sum(1 for i in self.free if self.blocks[i].hash is not None)

    def lookup(self, hashes: Sequence[bytes], n_prompt: int) -> list[int]:
        """The physical blocks of the longest cached prefix: full blocks only, the last token kept out,
        stopping at the first miss. Does not take them (see `take_cached`)."""
        limit = max_cacheable_tokens(n_prompt, self.block_size) // self.block_size
        found: list[int] = []
        for h in hashes[:limit]:
            copies = self.cached.get(h)
            if not copies:
                break
            found.append(next(iter(copies)))  # the first copy, as get_one_block
        return found

    def take_cached(self, block_ids: Sequence[int]) -> None:
        """A request now shares these cached blocks: one more reference each (off the free list if unused)."""
        for i in block_ids:
            b = self.blocks[i]
            if b.ref_count == 0:
                del self.free[i]
            b.ref_count += 1

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks from the front of the free list; a cached one taken here loses its hash (evicted)."""
        if n > len(self.free):
            raise InputError("paged.pool_full", needed=n, free=len(self.free))
        out = []
        for _ in range(n):
            i, _ = self.free.popitem(last=False)
            b = self.blocks[i]
            if b.hash is not None:  # evicted: this copy leaves the cache, other copies stay (pop(key, block_id))
                copies = self.cached[b.hash]
                del copies[i]
                if not copies:
                    del self.cached[b.hash]
                b.hash = None
                self.evictions += 1
            b.ref_count, b.n_filled = 1, 0
            out.append(i)
        return out

    def release(self, block_ids: Sequence[int]) -> None:
        """A request lets go of its blocks, last block first (vLLM's SingleTypeKVCacheManager.free). Those left
        unused with a hash join the tail of the free list, so a request's last cached blocks are evicted first of
        its own; those without one (never a hit) go to the front in that order, to be reused first
        (BlockPool.free_blocks: prepend_n, "LIFO reuse of non-cached blocks", then append_n)."""
        first: list[int] = []
        for i in reversed(block_ids):
            b = self.blocks[i]
            b.ref_count -= 1
            if b.ref_count < 0:
                raise RuntimeError(f"block {i} released more often than taken")
            if b.ref_count == 0:
                if b.hash is None:
                    first.append(i)
                else:
                    self.free[i] = None
        for i in reversed(first):  # prepend_n keeps its order: the first of `first` ends at the very front
            self.free[i] = None
            self.free.move_to_end(i, last=False)

    def register(self, block_id: int, h: bytes) -> None:
        """A full block becomes findable by its hash, beside any other copy (vLLM's cache_full_blocks)."""
        b = self.blocks[block_id]
        if b.hash is not None:  # cached already (a hit, or registered earlier): the same tokens, the same hash
            if b.hash != h:
                raise RuntimeError(f"block {block_id} registered under two hashes")
            return
        b.hash = h
        self.cached.setdefault(h, {})[block_id] = None

    def state(self, block_id: int) -> str:
        if block_id == NULL_BLOCK:
            return "null"
        b = self.blocks[block_id]
        if b.ref_count > 0:
            return "used"
        return "cached" if b.hash is not None else "free"
