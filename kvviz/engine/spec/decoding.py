"""One request decoded speculatively, a pass at a time: prefill(), then step() = draft → verify → accept → roll back.

Convention (as Generation): prefill runs the prompt in one pass and emits the first token. Between passes the
target's cache holds every token but the newest. A step drafts up to k tokens after the newest, runs the newest and
the drafts through the target in ONE forward pass over k + 1 positions (their K/V appended to every layer), keeps
the longest prefix of drafts the target agrees with plus one token of its own, and crops every cache back to the
tokens kept: the per-layer position counters are set back in place (KVCache.crop), no tensor is copied or freed,
as transformers' DynamicCache.crop. A step emits between 1 and k + 1 tokens for one target pass.

Measured per step (device-synchronized wall time around finished work, nothing drawn inside): the draft's seconds,
the verify's seconds, the cache lengths right after the verify and after the rollback, live bytes read off the
tensors beside kv_footprint() of the positions kept. Acceptance as vLLM counts it (SpecStats).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from kvviz.engine.backends.native import NativeBackend
from kvviz.engine.cache import KVCache
from kvviz.engine.device import synchronize
from kvviz.engine.generation import encode_prompt
from kvviz.engine.spec import sampling
from kvviz.engine.spec.drafts import Draft
from kvviz.errors import InputError
from kvviz.kv.formula import kv_footprint

MAX_K = 32  # vLLM's rejection sampler: MAX_SPEC_LEN = 32 (vllm/v1/sample/rejection_sampler.py)


@dataclass
class SpecStats:
    """vLLM's SpecDecodingStats (vllm/v1/spec_decode/metrics.py): only steps that drafted something count."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.num_accepted_tokens_per_pos = self.num_accepted_tokens_per_pos or [0] * self.num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts, the bonus token included (metrics.py compute_acceptance_len; 1 with no drafts)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate_per_pos(self) -> list[float | None]:
        """Per draft position: the share of drafting steps that kept a token there (SpecDecodingLogging.log)."""
        return [n / self.num_drafts if self.num_drafts else None for n in self.num_accepted_tokens_per_pos]

    @property
    def draft_acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


@dataclass
class SpecEvent:
    phase: str  # "prefill" or "verify"
    index: int  # 0 for prefill, then 1, 2, ... for the steps
    position: int  # positions cached before this pass; the newest token is written at this position
    drafted: list[int]  # the draft's tokens (empty: nothing drafted, a plain decode step)
    accepted: int  # drafted tokens kept
    emitted: list[int]  # the tokens this pass added to the output (accepted drafts, then the target's own)
    target_probs: list[float]  # p_i(d_i) of each drafted token under the target
    draft_probs: list[float]  # q_i(d_i) under the draft (empty when greedy or n-gram)
    verify_lengths: list[int]  # per layer, right after the pass (rejected positions still counted)
    cache_lengths: list[int]  # per layer, after the rollback
    rolled_back: int  # positions cropped from each target layer
    draft_lengths: list[int] | None  # the draft model's own cache after its rollback (None: it has none)
    draft_rolled_back: int
    live_bytes: int  # the target cache's live bytes after the rollback, read off the tensors
    allocated_bytes: int
    formula_bytes: int  # kv_footprint() of the positions kept
    peak_live_bytes: int  # live bytes right after the verify pass, before the rollback
    draft_live_bytes: int
    draft_formula_bytes: int  # the draft's own cache after its rollback
    draft_peak_formula_bytes: int  # the draft's own cache right after drafting, before its rollback: the most it held
    draft_seconds: float
    verify_seconds: float
    seconds: float  # the whole pass: draft, verify, acceptance and rollback


@dataclass
class SpeculativeGeneration:
    backend: NativeBackend
    draft: Draft
    k: int = 4
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0
    stop_at_eos: bool = True
    prompt_ids: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    events: list[SpecEvent] = field(default_factory=list)
    cache: KVCache | None = None
    requested_new_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.backend, NativeBackend):
            raise InputError("spec.native_only", name=self.backend.spec.name)
        if not 1 <= self.k <= MAX_K:
            raise InputError("spec.bad_k", k=self.k, max_k=MAX_K)
        if self.max_new_tokens < 1:
            raise InputError("max_new_tokens", value=self.max_new_tokens)
        if self.temperature < 0:
            raise InputError("temperature", value=self.temperature)
        self.rng = torch.Generator().manual_seed(self.seed)  # every draw: the draft's, the acceptance's, the target's
        self.stats = SpecStats(self.k)

    # ---- state -------------------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return bool(self.events)

    @property
    def n_generated(self) -> int:
        return len(self.generated)

    @property
    def done(self) -> bool:
        if not self.started:
            return False
        eos = self.backend.tokenizer.eos_id
        return self.n_generated >= self.max_new_tokens or (
            self.stop_at_eos and eos is not None and self.generated[-1] == eos)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.generated

    @property
    def text(self) -> str:
        return self.backend.tokenizer.decode(self.generated)

    @property
    def target_passes(self) -> int:
        return len(self.events)

    @property
    def plain_passes(self) -> int:
        """Passes plain decoding needs for the same tokens: one per token."""
        return self.n_generated

    @property
    def rollback_tokens(self) -> int:
        """Target positions written by a verify pass and then rolled back, over the whole generation."""
        return sum(e.rolled_back for e in self.events)

    @property
    def tpot_s(self) -> float | None:
        """Seconds per output token after the first: decode time / (N − 1)."""
        decode = sum(e.seconds for e in self.events[1:])
        return decode / (self.n_generated - 1) if self.n_generated > 1 else None

    # ---- the passes ---------------------------------------------------------------------------------------
    def prefill(self, prompt: str | list[int]) -> SpecEvent:
        if self.started:
            raise InputError("already_prefilled")
        self.prompt_ids = ids = encode_prompt(self.backend, prompt)
        self.requested_new_tokens = self.max_new_tokens  # as Generation: fewer new tokens if the context is short
        self.max_new_tokens = min(self.max_new_tokens, self.backend.spec.max_context - len(ids))
        # Room for every token kept and for the last verify's drafts, which run past max_new_tokens (see step).
        self.cache = self.backend.new_cache(1, min(len(ids) + self.max_new_tokens + self.k,
                                                   self.backend.spec.max_context))
        with torch.inference_mode():
            synchronize(self.backend.device)
            t0 = time.perf_counter()
            logits = self.backend.forward(torch.tensor([ids], device=self.backend.device), self.cache,
                                          capture_attention=False, all_logits=False).logits[0, -1]
            first = self._sample(logits)
            t1 = time.perf_counter()
            self.draft.start(self)  # a draft model prefills its own cache
            synchronize(self.backend.device)
            t2 = time.perf_counter()
        self.generated = [first]
        return self._record("prefill", 0, [], sampling.Verdict(0, first, []), list(self.cache.lengths), 0, None,
                            draft_s=t2 - t1, verify_s=t1 - t0, seconds=t2 - t0)

    def step(self) -> SpecEvent:
        if not self.started:
            raise InputError("prefill_first")
        if self.done:
            raise InputError("finished")
        position = self.cache.length
        # k drafts even when fewer tokens are left to emit: vLLM's Scheduler.schedule cuts a request's new tokens
        # only by the token budget and by max_model_len − num_computed_tokens − 1, then check_stop drops the
        # tokens past max_tokens while the acceptance statistics count every draft verified.
        k_step = min(self.k, self.backend.spec.max_context - 2 - position)
        with torch.inference_mode():
            synchronize(self.backend.device)
            t0 = time.perf_counter()
            proposal = self.draft.propose(self, k_step) if k_step > 0 else None
            drafted = proposal.tokens if proposal else []
            draft_peak = self.draft.kv_formula_bytes()
            synchronize(self.backend.device)
            t1 = time.perf_counter()
            logits = self.draft.verify(self, [self.generated[-1], *drafted])
            verify_lengths, peak = list(self.cache.lengths), self.cache.live_bytes()
            if self.temperature == 0:
                verdict = sampling.greedy(drafted, logits)
            else:
                verdict = sampling.speculative_sample(drafted, proposal.probs if proposal else None,
                                                      sampling.probabilities(logits, self.temperature), self.rng)
            emitted = self._until_eos(verdict.emitted(drafted))[: self.max_new_tokens - self.n_generated]
            # Roll back: every layer keeps the newest token and the drafts kept; the new token is not fed yet.
            rolled = self.cache.crop(position + len(emitted)) // self.cache.n_layers
            draft_rolled = self.draft.rollback(position + len(emitted))
            synchronize(self.backend.device)
            t2 = time.perf_counter()
        if drafted:
            self.stats.observe_draft(len(drafted), verdict.n_accepted)
        self.generated.extend(emitted)
        draft_probs = ([float(proposal.probs[i, d]) for i, d in enumerate(drafted)]
                       if proposal is not None and proposal.probs is not None else [])
        return self._record("verify", position, drafted, verdict, verify_lengths, rolled, draft_rolled,
                            emitted=emitted, draft_probs=draft_probs, peak=peak, draft_peak=draft_peak,
                            draft_s=t1 - t0, verify_s=t2 - t1,
                            seconds=t2 - t0)

    def run(self, prompt: str | list[int]) -> list[SpecEvent]:
        self.prefill(prompt)
        while not self.done:
            self.step()
        return self.events

    # ---- helpers ------------------------------------------------------------------------------------------
    def _sample(self, logits: torch.Tensor) -> int:
        """The target's own token: argmax, or a draw from softmax(logits / T) (as Generation._choose)."""
        if self.temperature == 0:
            return int(logits.argmax())
        probs = sampling.probabilities(logits, self.temperature)
        return int(torch.multinomial(probs, 1, generator=self.rng))

    def _until_eos(self, tokens: list[int]) -> list[int]:
        """Tokens up to and including an end-of-sequence one (vLLM's check_stop trims the same way)."""
        eos = self.backend.tokenizer.eos_id
        if self.stop_at_eos and eos is not None and eos in tokens:
            return tokens[: tokens.index(eos) + 1]
        return tokens

    def _record(self, phase: str, position: int, drafted: list[int], verdict: sampling.Verdict,
                verify_lengths: list[int], rolled: int, draft_rolled: int | None, *, emitted: list[int] | None = None,
                draft_probs: list[float] | None = None, peak: int | None = None,
                draft_peak: int | None = None, draft_s: float, verify_s: float,
                seconds: float) -> SpecEvent:
        be, cache, own = self.backend, self.cache, self.draft.cache
        live = cache.live_bytes()
        event = SpecEvent(
            phase=phase, index=len(self.events), position=position, drafted=list(drafted),
            accepted=verdict.n_accepted, emitted=emitted if emitted is not None else [verdict.next_token],
            target_probs=verdict.target_probs, draft_probs=draft_probs or [], verify_lengths=verify_lengths,
            cache_lengths=list(cache.lengths), rolled_back=rolled,
            draft_lengths=list(own.lengths) if own is not None else None, draft_rolled_back=draft_rolled or 0,
            live_bytes=live, allocated_bytes=cache.allocated_bytes(),
            formula_bytes=kv_footprint(be.spec, cache.length, 1, str(be.dtype)).total,
            peak_live_bytes=live if peak is None else peak,
            draft_live_bytes=own.live_bytes() if own is not None else 0,
            draft_formula_bytes=self.draft.kv_formula_bytes(),
            draft_peak_formula_bytes=self.draft.kv_formula_bytes() if draft_peak is None else draft_peak,
            draft_seconds=draft_s, verify_seconds=verify_s, seconds=seconds)
        self.events.append(event)
        return event
