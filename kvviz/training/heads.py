"""What each attention head does, measured from the attention rows the model computes.

Scores are mean attention probabilities over the query positions of a text:
previous-token (key = query − 1), first-token (key 0, an "attention sink"), self (key = query),
and induction (on random tokens repeated twice: the key right after the earlier copy of the query).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.engine.model import Decoder


@dataclass(frozen=True)
class HeadScores:
    layer: int
    head: int
    previous: float
    first: float
    self: float
    induction: float

    @property
    def kind(self) -> str:
        """The dominant pattern, when one clearly dominates (above half of the attention)."""
        best = max(("previous-token", self.previous), ("first-token", self.first), ("self", self.self),
                   ("induction", self.induction), key=lambda kv: kv[1])
        return best[0] if best[1] > 0.5 else "mixed"


@torch.no_grad()
def attention_maps(model: Decoder, ids: list[int]) -> list[torch.Tensor]:
    """Per layer [n_heads, T, T] attention probabilities of one sequence."""
    out = model(torch.tensor([ids]), capture_attention=True)
    return [a[0].float() for a in out.attentions]


def head_scores(model: Decoder, ids: list[int], seed: int = 0, n_random: int = 50) -> list[HeadScores]:
    maps = attention_maps(model, ids)
    gen = torch.Generator().manual_seed(seed)
    rand = torch.randint(1, model.cfg.vocab_size, (n_random,), generator=gen).tolist()
    repeated = attention_maps(model, rand + rand)
    out = []
    for layer, (a, r) in enumerate(zip(maps, repeated, strict=True)):
        t = a.shape[-1]
        q = torch.arange(1, t)
        q2 = torch.arange(n_random, 2 * n_random)
        for head in range(a.shape[0]):
            out.append(HeadScores(
                layer=layer,
                head=head,
                previous=float(a[head, q, q - 1].mean()),
                first=float(a[head, q, 0].mean()),
                self=float(a[head, q, q].mean()),
                induction=float(r[head, q2, q2 - n_random + 1].mean()),
            ))
    return out
