"""The blocks a serving engine holds in its prefix cache, rebuilt from its KV events (kvviz.serving.kv_events):
each block under its parent, the copies of it in each medium (vLLM's BlockPool may cache one hash in several
blocks, and an offloading connector reports CPU and storage copies), when it was stored and removed, and whether
this picture can be trusted (a gap in the events, removals of blocks never seen).

Pure: no sockets, no clock but the batches' own times. `apply(batch)` folds one batch in; `cached()` is the set
the engine has cached (what the agreement test holds equal to vLLM's own pool); `history` answers "was this block
cached at time t, and when was it removed" for the attribution of requests (kvviz.serving.kv_attribution).
"""
from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

from kvviz.serving.kv_events import MEDIUM_GPU, Batch, Cleared, Fault, Removed, Stored

ROOT = None  # the parent of a prompt's first block


def medium_of(medium: str | None) -> str:
    """vLLM's GPU pool wrote None as its medium before MEDIUM_GPU existed."""
    return medium or MEDIUM_GPU


@dataclass(slots=True)
class Block:
    key: tuple  # (KV-cache group, hash)
    parent: object  # the parent's hash, or None at a prompt's start
    tokens: tuple[int, ...]
    copies: Counter  # medium -> blocks holding this hash there
    stored_ts: float
    kind: str | None = None
    sliding_window: int | None = None
    children: set = field(default_factory=set)


class BlockHistory:
    """When each hash was stored and removed (per group, all media together): for each of the last `max_keys` hashes
    that changed, its last `per_key` changes as (time, copies after it); `clears`: the times of every reset. Older
    hashes and changes are forgotten first, so a long run's memory stays bounded (`forgotten` counts them)."""

    def __init__(self, max_keys: int = 200_000, per_key: int = 32) -> None:
        self.max_keys, self.per_key = max_keys, per_key
        self.changes: OrderedDict[tuple, list[tuple[float, int]]] = OrderedDict()
        self.clears: list[float] = []
        self.forgotten = 0

    def note(self, key: tuple, ts: float, copies: int) -> None:
        seen = self.changes.pop(key, None) or []
        seen.append((ts, copies))
        if len(seen) > self.per_key:
            del seen[0]
        self.changes[key] = seen
        if len(self.changes) > self.max_keys:
            self.changes.popitem(last=False)
            self.forgotten += 1

    def _cleared_between(self, t0: float, t1: float) -> float | None:
        inside = [c for c in self.clears if t0 <= c <= t1]
        return inside[-1] if inside else None

    def present_at(self, key: tuple, ts: float) -> bool:
        """Whether some copy of `key` was cached at time `ts` (changes at `ts` itself count as before it)."""
        before = [(t, n) for t, n in self.changes.get(key, ()) if t <= ts]
        return bool(before) and before[-1][1] > 0 and self._cleared_between(before[-1][0], ts) is None

    def stored_before(self, key: tuple, ts: float) -> bool:
        return any(t <= ts and n > 0 for t, n in self.changes.get(key, ()))

    def last_removed_before(self, key: tuple, ts: float) -> tuple[float, bool] | None:
        """When the last copy of `key` left the cache at or before `ts`, and whether a reset (AllBlocksCleared, a
        restart) took it rather than an eviction; None if it never did."""
        last = None
        for t, n in self.changes.get(key, ()):
            if t > ts:
                break
            if n == 0:
                last = t
        stored = [t for t, n in self.changes.get(key, ()) if n > 0 and t <= ts]
        clear = self._cleared_between(stored[-1], ts) if stored else None
        if clear is not None and (last is None or clear >= last):
            return clear, True
        return None if last is None else (last, False)


class BlockTree:
    """The engine's cached blocks as a forest per KV-cache group, built from its events."""

    def __init__(self, max_history: int = 200_000) -> None:
        self.blocks: dict[tuple, Block] = {}
        self.roots: dict[int | None, set] = {}  # group -> keys of the blocks at a prompt's start
        self.waiting: dict[tuple, set] = {}  # (group, parent hash not cached) -> keys of the blocks under it
        self.history = BlockHistory(max_history)
        self.stored = 0  # blocks stored (each copy), since the start
        self.removed = 0
        self.cleared = 0
        self.unknown_removed = 0  # removals of a block this tree never saw stored
        self.batches = 0
        self.restarts = 0
        self.replayed = 0  # batches fetched from the replay socket after a gap
        self.skipped: Counter = Counter()  # what could not be read (an unknown layout or event kind) -> times
        self.events = 0
        self.incomplete: list[dict] = []  # why the tree may miss blocks (gaps), until a reset makes it whole
        self.block_sizes: set[int] = set()
        self.media: Counter = Counter()  # medium -> copies held now
        self.last_ts: float | None = None
        self.rates: dict[int, list[int]] = {}  # whole second of the publisher's clock -> [stored, removed]
        # (publisher's time, 0 stored / 1 removed, blocks) per event, the last 100,000: binned on a load run's own
        # clock (kvviz.serving.kv_run), whose start falls anywhere inside a whole second
        self.log: deque[tuple[float, int, int]] = deque(maxlen=100_000)
        self.first_ts: float | None = None
        self.int_hashes = False  # the server sends 64-bit integers (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
        # a prompt's first block's tokens -> its hash, as the events carried it: the start of a chain whose seed
        # kvviz does not know (kvviz.serving.kv_attribution); the last 10,000 kept
        self.first_blocks: OrderedDict[tuple, object] = OrderedDict()

    # ---- folding events in -----------------------------------------------------------------------------------
    def take(self, items: list[Batch | Fault]) -> None:
        """What a Subscriber's poll returned, in order: batches applied, faults noted (a restarted publisher
        empties the tree: a restarted server's cache is empty)."""
        for item in items:
            if isinstance(item, Batch):
                self.apply(item)
            elif item.kind == "restart":
                self.restarts += 1
                self.clear(self.last_ts or 0.0)
            elif item.kind == "gap":
                self.mark_incomplete("gap", **item.detail)
            elif item.kind == "gap_filled":
                self.replayed += item.detail["n"]
            else:
                self.skipped[item.detail["what"]] += 1

    def apply(self, batch: Batch) -> None:
        for tag in batch.unknown_events:
            self.skipped[f"event {tag}"] += 1
        self.batches += 1
        self.last_ts = batch.ts
        if self.first_ts is None:
            self.first_ts = batch.ts
        for event in batch.events:
            self.events += 1
            if isinstance(event, Stored):
                self.store(event, batch.ts)
            elif isinstance(event, Removed):
                self.remove(event, batch.ts)
            elif isinstance(event, Cleared):
                self.clear(batch.ts)

    def _rate(self, ts: float, i: int, n: int) -> None:
        self.log.append((ts, i, n))
        second = int(ts)
        self.rates.setdefault(second, [0, 0])[i] += n
        if len(self.rates) > 3600:  # an hour of seconds at most
            del self.rates[min(self.rates)]

    def store(self, e: Stored, ts: float) -> None:
        group, medium, size = e.group, medium_of(e.medium), e.block_size
        self.block_sizes.add(size)
        parent = e.parent
        if e.hashes and isinstance(e.hashes[0], int):
            self.int_hashes = True
        if parent is None and e.hashes:
            self.first_blocks[e.token_ids[:size]] = e.hashes[0]
            self.first_blocks.move_to_end(e.token_ids[:size])
            if len(self.first_blocks) > 10_000:
                self.first_blocks.popitem(last=False)
        for i, h in enumerate(e.hashes):
            key = (group, h)
            block = self.blocks.get(key)
            if block is None:
                block = Block(key, parent, e.token_ids[i * size:(i + 1) * size], Counter(), ts, e.spec_kind,
                              e.sliding_window)
                self.blocks[key] = block
                self._attach(block)
                # blocks still cached under this one (it was evicted first, or stored before kvviz subscribed)
                block.children = self.waiting.pop(key, set())
            block.copies[medium] += 1
            self.media[medium] += 1
            self.history.note(key, ts, sum(block.copies.values()))
            self.stored += 1
            parent = h
        self._rate(ts, 0, len(e.hashes))

    def remove(self, e: Removed, ts: float) -> None:
        medium = medium_of(e.medium)
        for h in e.hashes:
            key = (e.group, h)
            block = self.blocks.get(key)
            if block is None or block.copies[medium] <= 0:
                self.unknown_removed += 1
                continue
            block.copies[medium] -= 1
            self.media[medium] -= 1
            self.removed += 1
            if block.copies[medium] == 0:
                del block.copies[medium]
            if not block.copies:
                self._drop(block)
            self.history.note(key, ts, sum(block.copies.values()))
        self._rate(ts, 1, len(e.hashes))

    def _attach(self, block: Block) -> None:
        group = block.key[0]
        if block.parent is None:
            self.roots.setdefault(group, set()).add(block.key)
        elif (group, block.parent) in self.blocks:
            self.blocks[(group, block.parent)].children.add(block.key)
        else:
            self.waiting.setdefault((group, block.parent), set()).add(block.key)

    def _drop(self, block: Block) -> None:
        group = block.key[0]
        del self.blocks[block.key]
        if block.parent is None:
            self.roots[group].discard(block.key)
        elif (group, block.parent) in self.blocks:
            self.blocks[(group, block.parent)].children.discard(block.key)
        else:
            under = self.waiting[(group, block.parent)]
            under.discard(block.key)
            if not under:
                del self.waiting[(group, block.parent)]
        if block.children:  # still cached: they wait for a parent no longer there
            self.waiting[block.key] = block.children

    def clear(self, ts: float) -> None:
        """AllBlocksCleared, or a restarted server: nothing cached, and nothing missing either."""
        n = sum(sum(b.copies.values()) for b in self.blocks.values())
        self.blocks.clear()
        self.roots.clear()
        self.waiting.clear()
        self.media.clear()
        self.cleared += 1
        self.history.clears.append(ts)
        self.incomplete.clear()
        if n:
            self._rate(ts, 1, n)

    def mark_incomplete(self, reason: str, **detail: object) -> None:
        self.incomplete.append({"reason": reason, **detail})

    # ---- reading it --------------------------------------------------------------------------------------------
    def cached(self) -> dict[tuple, int]:
        """Every cached (group, hash) -> its copies across media: the set vLLM's pool holds."""
        return {k: sum(b.copies.values()) for k, b in self.blocks.items()}

    def parents(self) -> dict[tuple, object]:
        return {k: b.parent for k, b in self.blocks.items()}

    def orphans(self) -> int:
        """Cached blocks whose parent is not cached (stored before kvviz subscribed, or outliving their parent)."""
        return sum(len(keys) for keys in self.waiting.values())

    def n_tokens(self) -> int:
        return sum(len(b.tokens) for b in self.blocks.values())

    def find(self, group: int | None, h: object) -> Block | None:
        return self.blocks.get((group, h))

    def children_of(self, group: int | None, parent: object) -> list[Block]:
        """The cached blocks directly under `parent` (None: the prompt's start)."""
        if parent is None:
            return [self.blocks[k] for k in self.roots.get(group, ())]
        block = self.blocks.get((group, parent))
        return [] if block is None else [self.blocks[k] for k in block.children]

    def chains(self, limit: int = 300) -> dict:
        """The tree as a reader draws it: a straight run of blocks (each the only child of the one before, in the
        same media) is one chain; every branch starts new ones. Per chain: `id`, `parent` (a chain's id, a
        group's root "g<group>", or "?<group>" for blocks whose parent is not cached), blocks, tokens, media,
        `leaves` (cached continuations under it, itself included), `depth` (its first block's index from the
        prompt's start; None under "?"), the first block's hash and first tokens. At most `limit` chains, the
        widest first (`folded`: the chains left out, `folded_blocks` their blocks)."""
        out: list[dict] = []

        def label(h: object) -> str:
            return f"{h:016x}"[-8:] if isinstance(h, int) else bytes(h).hex()[:8] if isinstance(h, bytes) else str(h)

        def full(h: object) -> str:  # a chain's id: the whole hash (a short label may collide)
            return f"{h:x}" if isinstance(h, int) else bytes(h).hex() if isinstance(h, bytes) else str(h)

        def chain_from(key: tuple, parent_id: str, depth: int | None) -> tuple[dict, Block]:
            block = self.blocks[key]
            run = [block]
            while len(block.children) == 1:
                nxt = self.blocks[next(iter(block.children))]
                if set(nxt.copies) != set(run[0].copies):
                    break
                block = nxt
                run.append(block)
            return {"id": f"{key[0]}:{full(key[1])}", "parent": parent_id, "group": key[0], "blocks": len(run),
                    "tokens": sum(len(b.tokens) for b in run), "media": "+".join(sorted(run[0].copies)),
                    "copies": sum(run[0].copies.values()), "depth": depth, "hash": label(key[1]),
                    "first_tokens": list(run[0].tokens[:8]), "leaves": 0}, block

        # depth first with a stack (a conversation of many turns nests deeper than Python's recursion allows);
        # `out` lists parents before their children, so the leaves add up from its end
        groups = sorted({k[0] for k in self.blocks}, key=lambda g: (g is None, g))
        starts: list[tuple[tuple, str, int | None]] = []
        for g in groups:
            starts += [(k, f"g{g}", 0) for k in sorted(self.roots.get(g, ()), key=lambda k: str(k[1]))]
            for (wg, _), keys in self.waiting.items():
                if wg == g:
                    starts += [(k, f"?{g}", None) for k in sorted(keys, key=lambda k: str(k[1]))]
        stack = list(reversed(starts))
        while stack:
            key, parent_id, depth = stack.pop()
            chain, last = chain_from(key, parent_id, depth)
            out.append(chain)
            below = None if depth is None else depth + chain["blocks"]
            stack += [(k, chain["id"], below) for k in sorted(last.children, key=lambda k: str(k[1]), reverse=True)]
        index = {c["id"]: c for c in out}
        for c in reversed(out):
            c["leaves"] = c["leaves"] or 1
            if c["parent"] in index:
                index[c["parent"]]["leaves"] += c["leaves"]
        n = len(out)
        if n > limit:  # the widest chains, parents before children (a parent is at least as wide)
            keep = sorted(range(n), key=lambda i: (-out[i]["leaves"], i))[:limit]
            kept = {out[i]["id"] for i in keep}
            shown = [c for c in out if c["id"] in kept and (c["parent"] in kept or c["parent"][0] in "g?")]
        else:
            shown = out
        return {"chains": shown, "groups": groups, "folded": n - len(shown),
                "folded_blocks": sum(c["blocks"] for c in out) - sum(c["blocks"] for c in shown),
                "orphans": self.orphans()}

    def rate_rows(self, last_s: int = 120) -> list[dict]:
        """Blocks stored and removed per second of the publisher's clock, the last `last_s` seconds that had any."""
        seconds = sorted(self.rates)[-last_s:]
        return [{"t": s, "stored": self.rates[s][0], "removed": self.rates[s][1]} for s in seconds]

    def summary(self) -> dict:
        """The numbers the CLI prints and the page shows, as plain data."""
        return {
            "blocks": len(self.blocks), "copies": dict(self.media), "tokens": self.n_tokens(),
            "block_sizes": sorted(self.block_sizes),
            "groups": sorted({k[0] for k in self.blocks}, key=lambda g: (g is None, g)),
            "stored": self.stored, "removed": self.removed, "cleared": self.cleared,
            "unknown_removed": self.unknown_removed, "orphans": self.orphans(), "batches": self.batches,
            "events": self.events, "incomplete": list(self.incomplete), "restarts": self.restarts,
            "replayed": self.replayed, "skipped": dict(self.skipped),
            "leaves": sum(1 for b in self.blocks.values() if not b.children),
        }
