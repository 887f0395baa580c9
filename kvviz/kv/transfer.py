"""Moving K/V instead of computing it, for real deployments (no torch): the bytes one prompt's cache holds (per
tensor-parallel rank and in total), their time over a link, and the prompt length from which loading them beats
recomputing them.

Loading n tokens takes KV bytes(n) / link bandwidth; recomputing them takes the prefill's FLOPs at the GPU's
datasheet rate (kvviz.kv.roofline: 2·params per token plus causal attention). Both are lower bounds: links carry
headers, and a prefill rarely reaches the datasheet rate, nor is a short lone prefill compute-bound (it waits on
reading the weights, a cost a batch shares). A slower prefill only makes loading win sooner, so the break-even
here is the longest it can be. With tensor parallelism each rank computes 1/tp of the FLOPs and moves its own
shard (the KV heads split as vLLM splits them, replicated when there are fewer KV heads than ranks), each over
its own link; one link shared by all ranks moves the total.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint, shard_for_tp
from kvviz.kv.hardware import LINKS, Hardware, Link
from kvviz.kv.roofline import Roofline


@dataclass(frozen=True)
class HandoffBytes:
    """The K/V one prompt of n tokens leaves, as a prefill→decode handoff moves it."""

    n_tokens: int
    kv_dtype: str
    tp: int
    kv_heads_per_rank: int
    replicated: bool  # fewer KV heads than ranks: every rank holds (and sends) a copy
    per_rank: int
    total: int  # all ranks together (what one shared link carries)

    def seconds(self, link: Link, *, shared_link: bool = False) -> float:
        """Transfer time: each rank over its own link (the ranks in parallel), or all of it over one link."""
        return link.seconds(self.total if shared_link else self.per_rank)

    def seconds_per_link(self, links: dict[str, Link] = LINKS) -> dict[str, dict]:
        """Each link's transfer time, per rank and on one shared link, with its bandwidth and that number's source."""
        return {name: {"per_rank_s": self.seconds(link), "shared_link_s": self.seconds(link, shared_link=True),
                       "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "source": link.bandwidth_source}
                for name, link in links.items()}

    def to_dict(self) -> dict:
        return asdict(self)


def handoff_bytes(spec: KVSpec, n_tokens: int, kv_dtype: str = "bfloat16", tp: int = 1) -> HandoffBytes:
    shard = shard_for_tp(spec, tp)
    per_rank = kv_footprint(shard, n_tokens, 1, kv_dtype).total
    replicated = tp > 1 and (spec.is_mla or tp > spec.n_kv_heads)  # an MLA latent is whole on every rank
    return HandoffBytes(n_tokens, kv_dtype, tp, shard.n_kv_heads, replicated, per_rank, per_rank * tp)


@dataclass(frozen=True)
class LoadVsRecompute:
    """One model on one GPU type (tp of them) with one link: times at a prompt length and the break-even."""

    spec: KVSpec
    hw: Hardware
    link: Link
    kv_dtype: str = "bfloat16"
    weight_dtype: str = "bfloat16"
    tp: int = 1

    def __post_init__(self) -> None:
        Roofline(self.spec, self.hw, self.weight_dtype, self.kv_dtype)  # refuses unknown parameters and MoE
        shard_for_tp(self.spec, self.tp)

    def load_s(self, n_tokens: int) -> float:
        return handoff_bytes(self.spec, n_tokens, self.kv_dtype, self.tp).seconds(self.link)

    def recompute_s(self, n_tokens: int) -> float:
        """Prefill FLOPs of n tokens at the datasheet rate of tp GPUs."""
        roof = Roofline(self.spec, self.hw, self.weight_dtype, self.kv_dtype)
        return roof.prefill_bound(n_prompt=n_tokens).compute_s / self.tp

    def loading_wins(self, n_tokens: int) -> bool:
        return self.load_s(n_tokens) < self.recompute_s(n_tokens)

    def break_even_tokens(self, max_tokens: int) -> int | None:
        """The shortest prompt from which loading beats recomputing at every length up to max_tokens; None when
        recomputing still wins at max_tokens. Found on a geometric grid, then bisected to the token."""
        if max_tokens < 1:
            raise InputError("positive_int", name="tokens", value=max_tokens)
        if not self.loading_wins(max_tokens):
            return None
        grid = length_grid(max_tokens)
        losing = [n for n in grid if not self.loading_wins(n)]
        if not losing:
            return 1
        lo = max(losing)  # recompute wins here; loading wins at every grid point above
        hi = min(n for n in grid if n > lo)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if not self.loading_wins(mid) else (lo, mid)
        return hi

    def curve(self, max_tokens: int, points: int = 60) -> list[dict]:
        return [{"tokens": n, "load_s": self.load_s(n), "recompute_s": self.recompute_s(n),
                 "bytes": handoff_bytes(self.spec, n, self.kv_dtype, self.tp).per_rank}
                for n in length_grid(max_tokens, points)]


def length_grid(max_tokens: int, points: int = 200) -> list[int]:
    """1 … max_tokens, geometrically spaced, whole and distinct, both ends included."""
    if max_tokens <= 1:
        return [1]
    step = math.log(max_tokens) / (points - 1)
    return sorted({1, max_tokens, *(min(max_tokens, round(math.exp(i * step))) for i in range(points))})
