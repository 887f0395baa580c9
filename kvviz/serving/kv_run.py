"""The Serving page's own load run against the server whose KV events kvviz follows: each request attributed to the
cached blocks at the moment it was sent (kvviz.serving.kv_attribution), and the blocks stored and removed per second
on the run's own clock, beside its request timeline. Pure: a BlockTree and the run's snapshot in, plain data out.

A request's prompt is taken as the server's cache sees it (kvviz.serving.client.cache_ids, kept by the run when
asked: BenchPlan.keep_cache_ids); the block size is the one the server's BlockStored events carry; the hash function
and seed are what the user says the server runs (vLLM's --prefix-caching-hash-algo, default "sha256" in vLLM
0.34.0's CacheConfig, vllm/config/cache.py; the seed PYTHONHASHSEED, else vLLM's own). A request's send time is the
client's wall clock (its point's start_unix_s + its start_s); the events' `ts` is the server's (vLLM's
KVEventBatch.ts, time.time() where its scheduler publishes): the two compare only where the clocks agree (one host,
or clocks kept in step to well under the gap between requests). The server looks a request up after it is sent, so
blocks another request stored in between (requests in flight together) are not counted as hits: exact for requests
sent one after another. What cannot be known is said per request, never guessed: the server has no /tokenize, the
run kept no prompts (started before subscribing), no block stored yet (block size unknown), the request was sent
before the subscription began (the cache's content then is unknown), or the events hash the prompt's first block
otherwise than the hash and seed given (`other_seed`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from kvviz.serving.kv_attribution import attribute, block_hashes, external, summarize
from kvviz.serving.kv_tree import BlockTree
from kvviz.serving.results import x_label

# the bins' widths (s) a point's rates are counted in: the narrowest that leaves at most MAX_BINS over the point,
# so a point of a few milliseconds is not one bar and one of an hour not thousands; rates always per second
BIN_WIDTHS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
MAX_BINS = 40


def block_size_of(tree: BlockTree) -> tuple[int | None, str | None]:
    """The block size the server's events carry, or None and why not (no block stored yet; several groups' sizes,
    which kvviz's one-group lookup does not read)."""
    sizes = sorted(tree.block_sizes)
    if not sizes:
        return None, "no_block_size"
    if len(sizes) > 1:
        return None, "several_block_sizes"
    return sizes[0], None


def attribute_run(tree: BlockTree, run: dict, *, algo: str, seed: str | None, since_unix: float | None) -> dict:
    """Every measured request of the run, looked up in `tree` at its send time. `since_unix`: when kvviz's
    subscription began (this machine's wall clock), None if it has not. Per row: the point, the request's number,
    its send time from the run's start (s), the ids' source, then the lookup (blocks looked up and hit, the first
    miss, its reason, when its block was removed, from the run's start) or `unknown` (why not)."""
    points = run.get("points") or []
    t0 = next((p["start_unix_s"] for p in points if p.get("start_unix_s") is not None), None)
    size, size_why = block_size_of(tree)
    rows: list[dict] = []
    for p in points:
        start = p.get("start_unix_s")
        for r in sorted(p.get("requests", []), key=lambda r: (r.get("request", 0), r["start_s"])):
            sent = None if start is None else start + r["start_s"]
            row = {"point": x_label(p), "request": r.get("request", 0) + 1,
                   "sent_s": None if sent is None or t0 is None else sent - t0, "ids_from": r.get("cache_ids_from"),
                   "tokens": None, "lookup": None, "hit_blocks": None, "hit_tokens": None, "first_miss": None,
                   "reason": None, "removed_s": None, "unknown": None, "server_cached": r.get("cached_tokens")}
            ids = r.get("cache_ids")
            why = ("no_ids" if "cache_ids" not in r or sent is None else r.get("cache_ids_from") if ids is None
                   else size_why if size is None
                   else "before_events" if since_unix is None or sent < since_unix else None)
            if why is not None:
                row["unknown"] = why
                rows.append(row)
                continue
            if _other_seed(tree, ids, size, algo, seed):
                row["unknown"] = "other_seed"
                rows.append(row)
                continue
            d = attribute(tree, ids, size, algo=algo, seed=seed, at=sent).as_dict()
            removed = d["removed_ts"]
            row.update(tokens=d["tokens"], lookup=d["lookup"], hit_blocks=d["hit_blocks"], hit_tokens=d["hit_tokens"],
                       first_miss=d["first_miss"], reason=d["reason"],
                       removed_s=None if removed is None or t0 is None else removed - t0)
            rows.append(row)
    known = [r for r in rows if r["unknown"] is None]
    unknown: dict[str, int] = {}
    for r in rows:
        if r["unknown"] is not None:
            unknown[r["unknown"]] = unknown.get(r["unknown"], 0) + 1
    # the server's own count where its usage reports one (vLLM's prompt_tokens_details.cached_tokens): the same
    # lookup seen from inside, equal when the attribution is right (requests in flight together may differ)
    compared = [r for r in known if r["server_cached"] is not None]
    agree = sum(1 for r in compared if r["server_cached"] == r["hit_tokens"])
    return {"block_size": size, "algo": algo, "seed": seed, "rows": rows, "summary": summarize(known),
            "unknown": unknown, "incomplete": bool(tree.incomplete), "t0_unix": t0,
            "server_agree": {"agree": agree, "compared": len(compared)}}


def bin_width_s(end_s: float) -> float:
    """The bins' width for a point lasting `end_s` seconds (BIN_WIDTHS_S, MAX_BINS)."""
    return next((w for w in BIN_WIDTHS_S if end_s / w <= MAX_BINS), BIN_WIDTHS_S[-1])


def _other_seed(tree: BlockTree, ids: list[int], size: int, algo: str, seed: str | None) -> bool:
    """Whether the events carried this prompt's first block under another hash than the one computed here (the
    server hashes with another function or seed) while they carry only 64 bits of each hash: the chain cannot be
    followed from the events' hash then (kv_attribution.attribute does, where they carry whole hashes), and a lookup
    in the past cannot walk the tree by tokens, so every miss would be misread as "never stored"."""
    if not tree.int_hashes or len(ids) < size:
        return False
    theirs = tree.first_blocks.get(tuple(ids[:size]))
    return theirs is not None and theirs != external(block_hashes(ids[:size], size, algo, seed)[0], True)


def run_rates(log: Sequence[tuple[float, int, int]], start_unix: float, end_s: float,
              bin_s: float = 1.0) -> list[dict]:
    """Blocks stored and removed per second in each `bin_s` bin from a point's start to `end_s` after it (every bin,
    a quiet one as 0: the events are complete unless the tree says otherwise), from the tree's event log: x is the
    bin's middle in seconds from the start, as the request timeline counts them; `width_s` the bin's width."""
    n = max(1, math.ceil(end_s / bin_s))
    bins = [[0, 0] for _ in range(n)]
    for ts, kind, blocks in log:
        k = math.floor((ts - start_unix) / bin_s)
        if 0 <= k < n:
            bins[k][kind] += blocks
    return [{"t_s": (k + 0.5) * bin_s, "width_s": bin_s, "stored": s / bin_s, "removed": r / bin_s}
            for k, (s, r) in enumerate(bins)]


def point_end_s(point: dict) -> float:
    """When a point's last request ended, in seconds from its start (0 before any)."""
    ends = [r["start_s"] + (r.get("e2e_s") or 0.0) for r in point.get("requests", [])]
    return max(ends, default=0.0)
