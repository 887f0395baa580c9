"""Which drafted tokens the target keeps, and the one token it adds.

Greedy (temperature 0): a drafted token is kept while it equals the target's argmax at its position; the first
disagreement is replaced by the target's argmax (the correction), and when all k agree the target's argmax after
the last one is added (the bonus token), as vLLM's rejection_greedy_sample_kernel (vllm/v1/sample/
rejection_sampler.py). The output is the target's own greedy decode, token for token.

Sampling (temperature T > 0): speculative sampling, Leviathan et al. 2023 (arXiv:2211.17192, Algorithm 1) and
Chen et al. 2023 (arXiv:2302.01318, Algorithm 2): draft token d_i, drawn from the draft's q_i, is kept with
probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is drawn from norm(max(0, p_i − q_i));
when all are kept the bonus is drawn from p_{k+1}. Every emitted token is then distributed exactly as the target's
p (Leviathan et al., Theorem 3.5). An n-gram draft has no distribution: q_i is a point mass on d_i, so it is kept
with probability p_i(d_i) and the replacement is drawn from p_i without d_i, as vLLM's IS_NGRAM branch does.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    n_accepted: int  # drafted tokens kept, from the first
    next_token: int  # the target's own token after them: the correction, or the bonus when all were kept
    target_probs: list[float]  # p_i(d_i) of each drafted token (temperature-scaled; softmax of the logits when greedy)

    def emitted(self, drafted: Sequence[int]) -> list[int]:
        return list(drafted[: self.n_accepted]) + [self.next_token]


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float32 on the CPU (T = 0: the plain softmax, for display only)."""
    scaled = logits.detach().float().cpu()
    return (scaled / temperature if temperature > 0 else scaled).softmax(dim=-1)


def greedy(drafted: Sequence[int], target_logits: torch.Tensor) -> Verdict:
    """target_logits [len(drafted) + 1, V]: keep drafts while each is the target's argmax."""
    choice = target_logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(drafted) and drafted[n] == choice[n]:
        n += 1
    probs = probabilities(target_logits[: len(drafted)], 0.0)
    return Verdict(n, int(choice[n]), [float(probs[i, d]) for i, d in enumerate(drafted)])


def speculative_sample(drafted: Sequence[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                       generator: torch.Generator) -> Verdict:
    """Leviathan et al. 2023, Algorithm 1. draft_probs [k, V] (None: an n-gram draft, a point mass on each drafted
    token), target_probs [k + 1, V], both already temperature-scaled; one uniform draw per drafted token."""
    k = len(drafted)
    p_of = [float(target_probs[i, d]) for i, d in enumerate(drafted)]
    for i, d in enumerate(drafted):
        q_i = _point_mass(d, target_probs.shape[-1]) if draft_probs is None else draft_probs[i]
        q = float(q_i[d])
        r = float(torch.rand((), generator=generator))
        if q > 0 and p_of[i] / q >= r:  # kept with probability min(1, p/q); vLLM's test is the same `>=`
            continue
        residual = (target_probs[i] - q_i).clamp(min=0)
        if float(residual.sum()) <= 0:  # p ≤ q everywhere means p = q: never rejected; kept for rounding
            residual = target_probs[i]
        return Verdict(i, _draw(residual, generator), p_of)
    return Verdict(k, _draw(target_probs[k], generator), p_of)


def _point_mass(token: int, vocab: int) -> torch.Tensor:
    q = torch.zeros(vocab)
    q[token] = 1.0
    return q


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One token from unnormalised weights, on the CPU from the seeded generator (a seed repeats on every device)."""
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
