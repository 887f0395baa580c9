"""What each attention head does, measured from the attention rows and weights of the model that runs.

From the attention rows over a text (mean over its query positions): previous-token (key = query − 1), first-token
(key 0: an "attention sink", StreamingLLM, Xiao et al. 2024 §3.1 and Figure 2), self (key = query). On random
tokens seen twice (Olsson et al. 2022, "In-context learning and induction heads", §2 and the head evaluators of
their Appendix): prefix matching (a query in the second copy attends to the token right after its earlier
occurrence), the loss on each copy (an induction head makes the second copy far cheaper to predict), and copying
from the head's OV circuit (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits", the OV
eigenvalue score Σλ / Σ|λ|: +1 when the head raises the logit of the very token it attends to).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvviz.engine.backends.base import Backend


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
def attention_maps(backend: Backend, ids: list[int]) -> list[torch.Tensor]:
    """Per layer [n_heads, T, T] attention probabilities of one sequence (one parallel pass, no cache)."""
    out = backend.forward(torch.tensor([ids], device=backend.device), None, capture_attention=True, all_logits=False)
    return [a[0].float().cpu() for a in out.attentions]


def random_tokens(backend: Backend, n: int, seed: int = 0) -> list[int]:
    """n seeded random ids from the ordinary vocabulary (no special token: those carry their own patterns)."""
    tok = backend.tokenizer
    gen = torch.Generator().manual_seed(seed)
    pool = [i for i in range(min(tok.vocab_size, backend.spec.vocab_size or tok.vocab_size))
            if i != tok.eos_id and not tok.token_text(i).startswith("<|")]
    return [pool[i] for i in torch.randint(0, len(pool), (n,), generator=gen).tolist()]


@dataclass(frozen=True)
class RepeatStudy:
    """Random tokens seen twice, in one parallel pass: each head's prefix matching, and the loss at each position
    (position i predicts token i + 1; an induction head makes the second copy far cheaper)."""

    n_random: int
    prefix_matching: np.ndarray  # [layers, heads]: mean attention from the second copy to the earlier successor
    losses: list[float]  # 2·n_random − 1 values, in nats

    @property
    def first_copy(self) -> float:  # predictions of tokens 1 … n−1: nothing to copy from yet
        return float(np.mean(self.losses[: self.n_random - 1]))

    @property
    def second_copy(self) -> float:  # predictions of tokens n+1 … 2n−1: each seen once before
        return float(np.mean(self.losses[self.n_random:]))

    @property
    def drop(self) -> float:
        return self.first_copy - self.second_copy


@torch.no_grad()
def repeat_study(backend: Backend, repeat: list[int]) -> RepeatStudy:
    n, ids = len(repeat), repeat + repeat
    out = backend.forward(torch.tensor([ids], device=backend.device), None, capture_attention=True, all_logits=True)
    q2 = torch.arange(n, 2 * n)
    prefix = np.array([a[0, :, q2, q2 - n + 1].float().mean(-1).cpu().numpy() for a in out.attentions])
    logp = out.logits[0, :-1].float().log_softmax(-1).cpu()
    nll = -logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return RepeatStudy(n, prefix, nll.tolist())


def head_scores(backend: Backend, ids: list[int], seed: int = 0, n_random: int = 50,
                repeat: list[int] | None = None) -> list[HeadScores]:
    """Scores on `ids`; induction (prefix matching) on `repeat` (default: n_random random tokens) seen twice."""
    maps = attention_maps(backend, ids)
    induction = repeat_study(backend, repeat if repeat is not None else random_tokens(backend, n_random, seed))
    out = []
    for layer, a in enumerate(maps):
        q = torch.arange(1, a.shape[-1])
        for head in range(a.shape[0]):
            out.append(HeadScores(
                layer=layer,
                head=head,
                previous=float(a[head, q, q - 1].mean()),
                first=float(a[head, q, 0].mean()),
                self=float(a[head, q, q].mean()),
                induction=float(induction.prefix_matching[layer, head]),
            ))
    return out


def grid(scores: list[HeadScores], field: str) -> np.ndarray:
    """One score as a [layers, heads] array (for a heatmap)."""
    n_layers, n_heads = max(s.layer for s in scores) + 1, max(s.head for s in scores) + 1
    out = np.zeros((n_layers, n_heads))
    for s in scores:
        out[s.layer, s.head] = getattr(s, field)
    return out


@torch.no_grad()
def copying_scores(model) -> np.ndarray:  # noqa: ANN001 - a native Decoder
    """[layers, heads] OV-circuit copying score of kvviz's decoder: Σλ / Σ|λ| over the eigenvalues of
    W_U·diag(g_final)·W_O^h·W_V^h·diag(g_ln)·W_Eᵀ (vocab × vocab), read from the d_head × d_head matrix
    W_V^h·diag(g_ln)·W_Eᵀ·W_U·diag(g_final)·W_O^h that has the same nonzero eigenvalues (eig(AB) = eig(BA)).
    RMSNorm's division by the RMS scales the whole circuit by a positive number, which the ratio ignores."""
    cfg = model.cfg
    d, group = cfg.d_head, cfg.n_heads // cfg.n_kv_heads
    e = model.model.embed_tokens.weight.float()
    unembed = model.lm_head.weight.float() * model.model.norm.weight.float()  # W_U·diag(g_final)
    eu = e.T @ unembed  # W_Eᵀ·W_U·diag(g_final): d_model × d_model
    out = np.zeros((cfg.n_layers, cfg.n_heads))
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        w_v = attn.v_proj.weight.float() * layer.input_layernorm.weight.float()  # W_V·diag(g_ln)
        w_o = attn.o_proj.weight.float()
        for h in range(cfg.n_heads):
            kv = h // group
            k = w_v[kv * d:(kv + 1) * d] @ eu @ w_o[:, h * d:(h + 1) * d]
            lam = torch.linalg.eigvals(k.double())
            out[i, h] = float(lam.real.sum() / lam.abs().sum())
    return out


def language_scores(backend: Backend, texts: dict[str, str], n_tokens: int = 512,
                    n_repeat: int = 100) -> dict[str, list[HeadScores]]:
    """Per language: scores on EOS + the first n_tokens-1 tokens of its text; induction on the first
    n_repeat tokens of that text seen twice (a real sentence repeated, not random ids)."""
    tokenizer = backend.tokenizer
    out = {}
    for lang, text in texts.items():
        ids = tokenizer.encode(text)
        eos = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        out[lang] = head_scores(backend, (eos + ids)[:n_tokens], repeat=eos + ids[:n_repeat])
    return out


def markdown_table(scores: dict[str, list[HeadScores]]) -> str:
    """One row per head: previous-token, first-token (sink) and induction mass in each language."""
    langs = list(scores)
    head = "| head | " + " | ".join(f"prev {lg} | sink {lg} | induct {lg}" for lg in langs) + " | kind |"
    rows = [head, "|" + "---|" * (2 + 3 * len(langs))]
    for i, s0 in enumerate(scores[langs[0]]):
        cells = " | ".join(f"{scores[lg][i].previous:.2f} | {scores[lg][i].first:.2f} | {scores[lg][i].induction:.2f}"
                           for lg in langs)
        kinds = sorted({scores[lg][i].kind for lg in langs})
        rows.append(f"| L{s0.layer}H{s0.head} | {cells} | {'/'.join(kinds)} |")
    return "\n".join(rows)


def main() -> int:
    """`python -m kvviz.lessons.heads [MODEL]`: the head table of a model on the outside prose of both languages."""
    import sys

    from kvviz.engine.loading import load_backend
    from kvviz.training.prose import PROSE

    backend = load_backend(sys.argv[1] if len(sys.argv) > 1 else "tiny", device="cpu")
    scores = language_scores(backend, {lang: "\n\n".join(p) for lang, p in PROSE.items()})
    print(markdown_table(scores))
    return 0


def uniform_first_share(n_tokens: int) -> float:
    """The share on position 0 that attention spread evenly would give, averaged like HeadScores.first over
    queries 1 … T−1: query q sees q + 1 keys, so mean of 1/(q + 1) = (H_T − 1)/(T − 1)."""
    if n_tokens < 2:
        return 1.0
    return sum(1.0 / (q + 1) for q in range(1, n_tokens)) / (n_tokens - 1)


if __name__ == "__main__":
    raise SystemExit(main())
