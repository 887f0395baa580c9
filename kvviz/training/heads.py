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


def head_scores(model: Decoder, ids: list[int], seed: int = 0, n_random: int = 50,
                repeat: list[int] | None = None) -> list[HeadScores]:
    """Scores on `ids`; induction on `repeat` (default: n_random random tokens) seen twice."""
    maps = attention_maps(model, ids)
    if repeat is None:
        gen = torch.Generator().manual_seed(seed)
        repeat = torch.randint(1, model.cfg.vocab_size, (n_random,), generator=gen).tolist()
    n_random = len(repeat)
    repeated = attention_maps(model, repeat + repeat)
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


def language_scores(model: Decoder, tokenizer, texts: dict[str, str], n_tokens: int = 512,  # noqa: ANN001
                    n_repeat: int = 100) -> dict[str, list[HeadScores]]:
    """Per language: scores on EOS + the first n_tokens-1 tokens of its text; induction on the first
    n_repeat tokens of that text seen twice (a real sentence repeated, not random ids)."""
    out = {}
    for lang, text in texts.items():
        ids = tokenizer.encode(text)
        eos = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        out[lang] = head_scores(model, (eos + ids)[:n_tokens], repeat=eos + ids[:n_repeat])
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
    """`python -m kvviz.training.heads`: the head table of the shipped model on the outside prose of both languages."""
    from kvviz.engine.loading import load_backend
    from kvviz.training.prose import PROSE

    backend = load_backend("tiny", device="cpu")
    scores = language_scores(backend.model, backend.tokenizer, {lang: "\n\n".join(p) for lang, p in PROSE.items()})
    print(markdown_table(scores))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
