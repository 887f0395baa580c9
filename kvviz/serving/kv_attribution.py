"""Which cached blocks a request of kvviz's own load run could hit, and why each miss missed: the block hashes the
server computes for the request's token ids (vLLM's prefix-caching hash), looked up in the tree its KV events built
(kvviz.serving.kv_tree) as vLLM's KVCacheManager looks them up.

The hash is vLLM 0.34.0's (vllm/v1/core/kv_cache_utils.py): `hash_block_tokens(hash_function, parent, tokens,
extra_keys)` = hash_function((parent or NONE_HASH, tuple(tokens), extra_keys)), chained block after block over full
blocks only (`get_request_block_hasher`); NONE_HASH = hash_function(seed) (`init_none_hash`), the seed being
PYTHONHASHSEED where the server sets it, else "vllm-none-hash" (`DEFAULT_NONE_HASH_SEED`) for the cryptographic
functions; the functions (vllm/utils/hashing.py, `--prefix-caching-hash-algo`): `sha256` = SHA-256 of the pickled
tuple (protocol HIGHEST_PROTOCOL), `sha256_cbor` = SHA-256 of its canonical CBOR. xxhash's seed is random unless
PYTHONHASHSEED is set, and xxhash is not computed here: said so, never guessed. With the wrong seed every hash is
wrong, but the rest of the chain does not depend on it: a first block whose tokens the events carried gives the
chain's start (`learned`). Events published as integers (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) carry the hash's last
64 bits (`maybe_convert_block_hash`).

The lookup is KVCacheManager.get_computed_blocks for one full-attention group: the longest run of cached blocks from
the prompt's start, at most num_tokens − 1 tokens of it (the last token is always computed, for its logits).
"""
from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvviz.errors import InputError
from kvviz.serving.kv_tree import BlockTree

HASH_ALGOS = ("sha256", "sha256_cbor")  # of vLLM's --prefix-caching-hash-algo choices, those computed here
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # kv_cache_utils.DEFAULT_NONE_HASH_SEED
DEFAULT_ALGO = "sha256"  # vLLM 0.34.0's CacheConfig.prefix_caching_hash_algo default (vllm/config/cache.py)


def sha256(value: object) -> bytes:
    """vllm.utils.hashing.sha256."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(value: object) -> bytes:
    """vllm.utils.hashing.sha256_cbor."""
    import cbor2

    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def hash_function(algo: str) -> Callable[[object], bytes]:
    if algo not in HASH_ALGOS:
        raise InputError("kv_events.bad_algo", algo=algo, known=", ".join(HASH_ALGOS))
    return sha256 if algo == "sha256" else sha256_cbor


def external(h: bytes, as_int: bool) -> bytes | int:
    """kv_cache_utils.maybe_convert_block_hash: the hash as the events carry it."""
    return int.from_bytes(h, "big") & ((1 << 64) - 1) if as_int else h


def block_hashes(tokens: Sequence[int], block_size: int, algo: str = "sha256", seed: str | None = None,
                 first: bytes | None = None) -> list[bytes]:
    """The hash of each full block of `tokens`, as vLLM chains them; `first`: the first block's hash when it is
    known from the events rather than computed (the server's seed unknown)."""
    fn = hash_function(algo)
    parent = fn(seed if seed is not None else DEFAULT_NONE_HASH_SEED)  # NONE_HASH
    out: list[bytes] = []
    for i in range(len(tokens) // block_size):
        h = first if i == 0 and first is not None else fn((parent, tuple(tokens[i * block_size:(i + 1) * block_size]),
                                                            None))
        out.append(h)
        parent = h
    return out


@dataclass
class Attribution:
    """One lookup: how many of the request's full blocks it could look up (`lookup`, vLLM's num_tokens − 1 rule),
    how many hit, and each block's fate: "hit", "evicted" (stored, evicted before the lookup; `removed_ts`), "reset"
    (stored, removed by a reset of the prefix cache or a restart),
    "diverged" (never stored; the cached prefix ended at this block), "never" (never stored, from the first
    block on), "unseeded" (not cached; why unknown: the server's hash seed is), "after_miss" (a hit must be a
    prefix), "last_token" (beyond the lookup)."""
    n_tokens: int
    block_size: int
    lookup: int
    hits: int
    reasons: list[str]
    removed_ts: dict[int, float] = field(default_factory=dict)
    learned: bool = False  # the first block's hash taken from the events (the seed unknown or different)

    @property
    def hit_tokens(self) -> int:
        return self.hits * self.block_size

    @property
    def first_miss(self) -> int | None:
        return self.hits if self.hits < self.lookup else None

    def as_dict(self) -> dict:
        miss = self.first_miss
        return {"tokens": self.n_tokens, "blocks": len(self.reasons), "lookup": self.lookup, "hit_blocks": self.hits,
                "hit_tokens": self.hit_tokens, "first_miss": miss,
                "reason": None if miss is None else self.reasons[miss],
                "removed_ts": None if miss is None else self.removed_ts.get(miss), "learned": self.learned,
                "reasons": self.reasons}


def attribute(tree: BlockTree, tokens: Sequence[int], block_size: int, *, algo: str = "sha256",
              seed: str | None = None, at: float | None = None, group: int | None = 0) -> Attribution:
    """The request's lookup against the tree: now (`at` None), or at the publisher's time `at` from its history.
    When the first block's hash is not one the events carried but its tokens are (the server's seed differs), the
    chain starts from the events' hash; where the events carry only 64 bits of it (integer hashes), the lookup walks
    the tree by tokens instead (now only; a miss's reason is then "unseeded")."""
    as_int = tree.int_hashes
    hashes = block_hashes(tokens, block_size, algo, seed)
    first = tree.first_blocks.get(tuple(tokens[:block_size])) if hashes else None
    if hashes and first is not None and not _ever(tree, group, external(hashes[0], as_int), at):
        if not as_int:
            return _lookup(tree, tokens, block_size, block_hashes(tokens, block_size, algo, seed, first=first),
                           as_int, at, group, learned=True)
        if at is None:
            return _walk(tree, tokens, block_size, group)
    return _lookup(tree, tokens, block_size, hashes, as_int, at, group)


def _lookup(tree: BlockTree, tokens: Sequence[int], block_size: int, hashes: list[bytes], as_int: bool,
            at: float | None, group: int | None, learned: bool = False) -> Attribution:
    keys = [(group, external(h, as_int)) for h in hashes]
    lookup = min(len(keys), max(0, len(tokens) - 1) // block_size)
    when = float("inf") if at is None else at
    reasons: list[str] = []
    removed: dict[int, float] = {}
    hits = 0
    for i, key in enumerate(keys):
        if i >= lookup:
            reasons.append("last_token")
        elif len(reasons) > hits:
            reasons.append("after_miss")
        elif (key in tree.blocks) if at is None else tree.history.present_at(key, at):
            reasons.append("hit")
            hits += 1
        elif tree.history.stored_before(key, when):
            gone = tree.history.last_removed_before(key, when)
            reasons.append("reset" if gone is not None and gone[1] else "evicted")
            if gone is not None:
                removed[i] = gone[0]
        else:
            reasons.append("diverged" if i > 0 else "never")
    return Attribution(len(tokens), block_size, lookup, hits, reasons, removed, learned)


def _walk(tree: BlockTree, tokens: Sequence[int], block_size: int, group: int | None) -> Attribution:
    """The lookup by tokens: from the prompt's start, a cached child with the next block's tokens, while one is."""
    n_full = len(tokens) // block_size
    lookup = min(n_full, max(0, len(tokens) - 1) // block_size)
    parent, hits, reasons = None, 0, []
    for i in range(n_full):
        block = tuple(tokens[i * block_size:(i + 1) * block_size])
        if i >= lookup:
            reasons.append("last_token")
        elif len(reasons) > hits:
            reasons.append("after_miss")
        else:
            match = next((b for b in tree.children_of(group, parent) if b.tokens == block), None)
            if match is None:
                reasons.append("unseeded")
            else:
                reasons.append("hit")
                hits += 1
                parent = match.key[1]
    return Attribution(len(tokens), block_size, lookup, hits, reasons, {}, learned=True)


def _ever(tree: BlockTree, group: int | None, h: object, at: float | None) -> bool:
    key = (group, h)
    return key in tree.blocks or tree.history.stored_before(key, float("inf") if at is None else at)


REASONS = ("hit", "evicted", "reset", "diverged", "never", "unseeded", "after_miss", "last_token")


def summarize(rows: list[dict]) -> dict:
    """A load run's lookups together: requests, blocks hit and looked up, first misses by reason."""
    by = {r: 0 for r in REASONS if r not in ("hit", "after_miss", "last_token")}
    for r in rows:
        if r["reason"] in by:
            by[r["reason"]] += 1
    return {"requests": len(rows), "hit_blocks": sum(r["hit_blocks"] for r in rows),
            "lookup_blocks": sum(r["lookup"] for r in rows), "first_miss": by}
