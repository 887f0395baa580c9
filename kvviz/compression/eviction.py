"""Which cached positions to keep: sliding window, StreamingLLM, H2O, SnapKV. Each policy runs after every
forward pass of the real decode loop and shrinks an EvictingCache to its budget (SnapKV: once, after prefill).

Selection is per layer and per KV head (H2O and SnapKV score heads separately, as in their papers); with
GQA a KV head's score is the sum over the query heads that share it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvviz.compression.caches import EvictingCache
from kvviz.errors import InputError

# "4 initial tokens ... suffice" (Xiao et al. 2024, StreamingLLM, §3.2 and Table 1); mit-han-lab/streaming-llm
# kv_cache.py StartRecentKVCache(start_size=4)
STREAMING_SINKS = 4
# SnapKV's observation window: 32 in FasterDecoding/SnapKV snapkv_utils.py init_snapkv (config.window_size),
# 64 in its SnapKVCluster.__init__ and in NVIDIA/kvpress SnapKVPress; 32 leaves room to select on short prompts.
SNAPKV_WINDOW = 32
SNAPKV_KERNEL = 5  # snapkv_utils.py and kvpress: avg_pool1d(kernel_size=5, padding=2, stride=1), count_include_pad
H2O_RECENT_SHARE = 0.5  # H2O's main setting splits the budget evenly: heavy hitters and recent tokens


def _last(n: int, m: int, ref: torch.Tensor) -> torch.Tensor:
    """Index of the last m of n entries, shaped like ref's [B, H] leading dims."""
    b, h = ref.shape[:2]
    return torch.arange(n - m, n, device=ref.device).expand(b, h, m)


@dataclass
class Policy:
    name: str
    budget: int  # cached positions kept per layer and KV head
    needs_attention: bool = False
    reposition: bool = False

    def check(self) -> None:
        if self.budget < 1:
            raise InputError("positive_int", name="budget", value=self.budget)

    def after_pass(self, cache: EvictingCache, attentions: list[torch.Tensor] | None, prefill: bool) -> None:
        for layer in range(cache.shape.n_layers):
            if self.needs_attention and attentions is not None:
                cache.add_attention(layer, attentions[layer])
            n = cache.lengths[layer]
            if n > self.budget and (prefill or not self.prefill_only):
                cache.keep(layer, self.select(cache, layer, attentions[layer] if attentions else None, n))

    prefill_only = False

    def select(self, cache: EvictingCache, layer: int, probs: torch.Tensor | None, n: int) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class Window(Policy):
    """The last `budget` tokens, at their original rotary positions (sliding-window attention)."""

    def select(self, cache, layer, probs, n):  # noqa: ANN001, ANN201
        return _last(n, self.budget, cache.k[layer])


@dataclass
class Streaming(Policy):
    """StreamingLLM: the first `sinks` tokens (attention sinks) + the most recent budget − sinks.

    Positions within the cache (the paper's §3.2): keys are re-rotated to their slot after each eviction, the
    same keys streaming-llm's pos_shift/modify_llama.py gets by caching keys before RoPE and rotating them at
    key_position_ids = arange(kv_seq_len) on every pass."""

    sinks: int = STREAMING_SINKS
    reposition: bool = True

    def check(self) -> None:
        super().check()
        if not 0 <= self.sinks < self.budget:
            raise InputError("compression.bad_sinks", sinks=self.sinks, budget=self.budget)

    def select(self, cache, layer, probs, n):  # noqa: ANN001, ANN201
        ref = cache.k[layer]
        head = torch.arange(self.sinks, device=ref.device).expand(*ref.shape[:2], self.sinks)
        return torch.cat([head, _last(n, self.budget - self.sinks, ref)], dim=2)


@dataclass
class H2O(Policy):
    """Heavy hitters (largest attention accumulated over all queries so far) + the most recent tokens."""

    needs_attention: bool = True
    recent_share: float = H2O_RECENT_SHARE

    def select(self, cache, layer, probs, n):  # noqa: ANN001, ANN201
        recent = min(self.budget, max(1, round(self.budget * self.recent_share)))
        heavy = self.budget - recent
        ref = cache.k[layer]
        tail = _last(n, recent, ref)
        if heavy == 0:
            return tail
        top = cache.score[layer][:, :, : n - recent].topk(heavy, dim=-1).indices
        return torch.cat([top.sort(dim=-1).values, tail], dim=2)


@dataclass
class SnapKV(Policy):
    """One compression after prefill (SnapKVCluster.update_kv in FasterDecoding/SnapKV snapkv_utils.py): the
    prompt's last `window` queries vote (attention summed, then average-pooled over neighbouring positions with
    torch's default count_include_pad=True) for budget − window earlier positions; the window is kept. With GQA
    a KV head's vote sums its query heads' (kvpress SnapKVPress.score averages them: the same ranking). A prompt
    shorter than the budget is left whole (update_kv: `if q_len < max_capacity_prompt: return`), and decoded
    tokens are all kept afterwards, so the cache ends at min(prompt, budget) + decoded positions."""

    needs_attention: bool = True
    window: int = SNAPKV_WINDOW
    kernel: int = SNAPKV_KERNEL
    prefill_only = True

    def check(self) -> None:
        super().check()
        if self.budget <= self.window:
            raise InputError("compression.bad_snap_budget", budget=self.budget, window=self.window)

    def after_pass(self, cache, attentions, prefill):  # noqa: ANN001, ANN201
        if prefill:  # the score is the observation window's vote, not an accumulation
            super().after_pass(cache, attentions, prefill)

    def select(self, cache, layer, probs, n):  # noqa: ANN001, ANN201
        w = min(self.window, probs.shape[2])
        b, hq = probs.shape[:2]
        hkv = cache.shape.n_kv_heads
        vote = probs[:, :, -w:, : n - w].float().sum(2)  # [B, Hq, n − w]
        vote = vote.view(b, hkv, hq // hkv, n - w).sum(2)
        vote = F.avg_pool1d(vote, self.kernel, stride=1, padding=self.kernel // 2)  # count_include_pad=True
        top = vote.topk(self.budget - w, dim=-1).indices.sort(dim=-1).values
        return torch.cat([top, _last(n, w, cache.k[layer])], dim=2)


EVICTION = {"window": Window, "streaming": Streaming, "h2o": H2O, "snapkv": SnapKV}


def make_policy(method: str, budget: int, *, sinks: int = STREAMING_SINKS) -> Policy:
    if method not in EVICTION:
        raise InputError("compression.unknown_method", name=method, choices=", ".join(EVICTION))
    policy = Streaming(method, budget, sinks=sinks) if method == "streaming" else EVICTION[method](method, budget)
    policy.check()
    return policy
