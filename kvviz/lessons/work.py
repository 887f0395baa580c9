"""Work a decode pass does with and without a KV cache: Q/K/V projections and attention scores.

With a cache a step projects Q/K/V for the one new position and scores it against t keys (O(t));
without one the whole prefix of t positions is projected again and scored under the causal mask
(O(t²)). Summed over a generation of n tokens: O(n²) against O(n³).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvviz.kv.formula import KVSpec, attention_scores_per_pass

if TYPE_CHECKING:  # the charts import these lessons on the first page drawn, before torch is
    from kvviz.engine.generation import StepEvent


def qkv_vectors(arch: KVSpec, n_positions: int) -> int:
    """Head vectors projected for n_positions in all layers: one Q per query head, one K and V per KV head."""
    return arch.n_layers * n_positions * (arch.n_heads + 2 * arch.n_kv_heads)


@dataclass(frozen=True)
class PassWork:
    """What one real pass computed (cached) next to what the same pass costs recomputed from scratch."""

    n_keys: int  # t: positions the newest query attends to
    cached_positions: int  # positions projected to Q/K/V this pass
    cached_qkv: int
    cached_scores: int  # from the real event
    recompute_positions: int
    recompute_qkv: int
    recompute_scores: int


def pass_work(arch: KVSpec, event: StepEvent) -> PassWork:
    t = event.position + 1
    return PassWork(
        n_keys=t,
        cached_positions=event.n_input_tokens,
        cached_qkv=qkv_vectors(arch, event.n_input_tokens),
        cached_scores=event.attn_scores,
        recompute_positions=t,
        recompute_qkv=qkv_vectors(arch, t),
        recompute_scores=attention_scores_per_pass(arch, t, 0),
    )


@dataclass(frozen=True)
class CumulativeWork:
    """Attention scores summed over the passes so far, indexed by sequence length after each pass."""

    n_tokens: list[int]  # t of each pass (prompt_len for the prefill, then +1 per step)
    cached: list[int]
    recompute: list[int]


def cumulative_work(arch: KVSpec, events: Sequence[StepEvent]) -> CumulativeWork:
    n_tokens, cached, recompute = [], [], []
    total_cached = total_recompute = 0
    for event in events:
        work = pass_work(arch, event)
        total_cached += work.cached_scores
        total_recompute += work.recompute_scores
        n_tokens.append(work.n_keys)
        cached.append(total_cached)
        recompute.append(total_recompute)
    return CumulativeWork(n_tokens, cached, recompute)


def analytic_cached(arch: KVSpec, n: int) -> int:
    """Σ over positions 1..n of t scores: a causal prefill plus cached steps, L·H·n(n+1)/2 = O(n²)."""
    return arch.n_layers * arch.n_heads * n * (n + 1) // 2


def analytic_recompute(arch: KVSpec, prompt_len: int, n: int) -> int:
    """Σ over t = prompt_len..n of t(t+1)/2 scores, each pass re-scoring the whole prefix = O(n³)."""

    def tetra(m: int) -> int:  # Σ_{t=1..m} t(t+1)/2
        return m * (m + 1) * (m + 2) // 6

    return arch.n_layers * arch.n_heads * (tetra(n) - tetra(prompt_len - 1))
