"""The drafts that propose k tokens for the target to verify, each with the cache it keeps (or shares).

- NgramDraft: prompt lookup (vLLM's `ngram`): no model, no cache.
- EarlyExitDraft: the target's own first m layers, then its final norm and LM head (an early exit, as LayerSkip,
  Elhoushi et al. 2024, §4, and Draft & Verify, Zhang et al. 2023). It holds no cache of its own: its K/V go into
  the target's cache for layers 0..m−1, where the target would have put the same values, and the verify pass
  reuses them with the hidden states the draft left at layer m (LayerSkip §4.2, "exit query cache"): the verify
  runs only the last drafted token through the first m layers, then all k + 1 positions through the rest.
- ModelDraft: a separate, smaller model with the same tokenizer and a KV cache of its own, cropped back with the
  target's after every verify.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from kvviz.engine.backends.native import NativeBackend
from kvviz.engine.cache import KVCache
from kvviz.engine.spec import ngram
from kvviz.engine.spec.sampling import probabilities
from kvviz.errors import InputError
from kvviz.kv.formula import kv_footprint

if TYPE_CHECKING:
    from kvviz.engine.spec.decoding import SpeculativeGeneration

METHODS = ("ngram", "early-exit", "draft")


@dataclass
class Proposal:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), V]: the draft's q at the generation's temperature (None: greedy/n-gram)


class Draft(Protocol):
    method: str
    shared_layers: int  # target layers whose cache the draft writes into (early exit: m; others 0)

    def start(self, gen: SpeculativeGeneration) -> None: ...

    def propose(self, gen: SpeculativeGeneration, k: int) -> Proposal: ...

    def verify(self, gen: SpeculativeGeneration, tokens: list[int]) -> torch.Tensor:
        """Target logits [len(tokens), V] of the newest token and the drafts after it, through the cache."""
        ...

    def rollback(self, length: int) -> int:
        """Crop the draft's own cache to `length` positions; the positions removed."""
        ...

    @property
    def cache(self) -> KVCache | None: ...

    def kv_formula_bytes(self) -> int: ...


def _choose(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> tuple[int, torch.Tensor | None]:
    """The draft's own pick: its argmax, or a draw from its q = softmax(logits / T)."""
    if temperature == 0:
        return int(logits.argmax()), None
    q = probabilities(logits, temperature)
    return int(torch.multinomial(q, 1, generator=generator)), q


def _stack(rows: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    return torch.stack(rows) if rows and rows[0] is not None else None


def verify_pass(gen: SpeculativeGeneration, tokens: list[int]) -> torch.Tensor:
    """The target's one forward over the newest token and the drafts: K/V appended, logits of every position."""
    x = torch.tensor([tokens], device=gen.backend.device)
    return gen.backend.forward(x, gen.cache, capture_attention=False, all_logits=True).logits[0]


class NgramDraft:
    method = "ngram"
    shared_layers = 0
    cache = None

    def __init__(self, config: ngram.NgramConfig | None = None) -> None:
        self.config = config or ngram.NgramConfig()

    def start(self, gen: SpeculativeGeneration) -> None:
        pass

    def propose(self, gen: SpeculativeGeneration, k: int) -> Proposal:
        return Proposal(ngram.propose(gen.token_ids, k, self.config, gen.backend.spec.max_context), None)

    verify = staticmethod(verify_pass)

    def rollback(self, length: int) -> int:
        return 0

    def kv_formula_bytes(self) -> int:
        return 0


class EarlyExitDraft:
    method = "early-exit"
    cache = None  # none of its own: it writes into the target's

    def __init__(self, exit_layer: int) -> None:
        self.shared_layers = exit_layer
        self._hidden: list[torch.Tensor] = []  # [1, 1, d] at layer m of each drafted pass: the exit query cache

    def start(self, gen: SpeculativeGeneration) -> None:
        n_layers = gen.backend.spec.n_layers
        if not 1 <= self.shared_layers < n_layers:
            raise InputError("spec.bad_exit_layer", layer=self.shared_layers, n_layers=n_layers,
                             n_layers_minus_one=n_layers - 1)

    def propose(self, gen: SpeculativeGeneration, k: int) -> Proposal:
        model, cache, m = gen.backend.model, gen.cache, self.shared_layers
        position, token = cache.lengths[0], gen.generated[-1]
        self._hidden, tokens, probs = [], [], []
        for i in range(k):
            h = model.run_layers(model.embed(torch.tensor([[token]], device=gen.backend.device)), cache, range(m),
                                 position + i)
            self._hidden.append(h)
            token, q = _choose(model.head(h)[0, -1], gen.temperature, gen.rng)
            tokens.append(token)
            probs.append(q)
        return Proposal(tokens, _stack(probs))

    def verify(self, gen: SpeculativeGeneration, tokens: list[int]) -> torch.Tensor:
        if len(tokens) == 1:  # nothing drafted: a plain decode step
            return verify_pass(gen, tokens)
        model, cache, m = gen.backend.model, gen.cache, self.shared_layers
        position = cache.lengths[m]  # the layers past the exit have not seen the drafts yet
        last = model.run_layers(model.embed(torch.tensor([tokens[-1:]], device=gen.backend.device)), cache,
                                range(m), position + len(tokens) - 1)
        h = model.run_layers(torch.cat([*self._hidden, last], dim=1), cache, range(m, model.cfg.n_layers), position)
        self._hidden = []
        return model.head(h)[0]

    def rollback(self, length: int) -> int:
        return 0  # the generation crops the target's cache, shared layers included

    def kv_formula_bytes(self) -> int:
        return 0


class ModelDraft:
    method = "draft"
    shared_layers = 0

    def __init__(self, backend: NativeBackend, name: str | None = None) -> None:
        self.backend = backend
        self.name = name or backend.spec.name
        self.cache: KVCache | None = None

    def start(self, gen: SpeculativeGeneration) -> None:
        check_same_tokenizer(gen.backend, self.backend)
        capacity = gen.cache.max_len
        if capacity > self.backend.spec.max_context:
            raise InputError("spec.draft_context", n_tokens=capacity, max_len=self.backend.spec.max_context)
        self.cache = self.backend.new_cache(1, capacity)
        self._feed(gen.prompt_ids)  # the draft's own prefill

    def _feed(self, tokens: Sequence[int]) -> torch.Tensor:
        x = torch.tensor([list(tokens)], device=self.backend.device)
        return self.backend.forward(x, self.cache, capture_attention=False, all_logits=False).logits[0, -1]

    def propose(self, gen: SpeculativeGeneration, k: int) -> Proposal:
        # Whatever the draft has not seen yet: the newest token, or after a fully accepted step also the last draft.
        pending = gen.token_ids[self.cache.length:]
        tokens, probs = [], []
        for _ in range(k):
            token, q = _choose(self._feed(pending), gen.temperature, gen.rng)
            tokens.append(token)
            probs.append(q)
            pending = [token]
        return Proposal(tokens, _stack(probs))

    verify = staticmethod(verify_pass)

    def rollback(self, length: int) -> int:
        return self.cache.crop(min(self.cache.length, length))

    def kv_formula_bytes(self) -> int:
        return kv_footprint(self.backend.spec, self.cache.length if self.cache else 0, 1,
                            str(self.backend.dtype)).total


def check_same_tokenizer(target: NativeBackend, draft: NativeBackend) -> None:
    """A draft must speak the target's token ids: the same vocabulary, id for id."""
    a, b = target.tokenizer, draft.tokenizer
    same = a is b or (type(a) is type(b) and a.vocab_size == b.vocab_size
                      and getattr(a, "to_json", lambda: None)() == getattr(b, "to_json", lambda: None)())
    if not same:
        raise InputError("spec.tokenizer_mismatch", draft=draft.spec.name, target=target.spec.name)


def first_layers_draft(target: NativeBackend, n_layers: int) -> ModelDraft:
    """The target's first n layers as a separate draft model with a cache of its own (the weights are shared)."""
    small = NativeBackend(target.model.first_layers(n_layers), target.tokenizer, f"{target.spec.name} · first "
                          f"{n_layers} layers")
    return ModelDraft(small)


def default_exit_layer(n_layers: int) -> int:
    """Where the early exit leaves by default: after three quarters of the layers (a choice, shown with it)."""
    return max(1, 3 * n_layers // 4)


RANDOM_DRAFT = "random"  # a seeded random-weight shape sharing the target's tokenizer: mechanics only
LAYERS_DRAFT = "layers:"  # "layers:M": the target's first M layers as a separate model with its own cache


def load_draft(name: str, target: NativeBackend, *, seed: int = 0) -> ModelDraft:
    """A separate draft model: `random`, `layers:M`, or any model kvviz loads natively that shares the tokenizer."""
    if name == RANDOM_DRAFT:
        from kvviz.engine.config import DecoderConfig
        from kvviz.engine.model import Decoder

        p = target.model.lm_head.weight
        cfg = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=176,
                            vocab_size=target.model.cfg.vocab_size, max_seq_len=target.spec.max_context)
        model = Decoder(cfg).init_weights(seed).to(device=p.device, dtype=p.dtype)
        return ModelDraft(NativeBackend(model, target.tokenizer, f"random L2 d64 (seed {seed})"))
    if name.startswith(LAYERS_DRAFT):
        count = name.removeprefix(LAYERS_DRAFT)
        if not count.isdigit():
            raise InputError("spec.bad_layers", layers=count, n_layers=target.spec.n_layers)
        return first_layers_draft(target, int(count))
    from kvviz.engine.loading import load_backend

    backend = load_backend(name, dtype=str(target.dtype).removeprefix("torch."), device=str(target.device),
                           engine="native")
    check_same_tokenizer(target, backend)
    return ModelDraft(backend)
