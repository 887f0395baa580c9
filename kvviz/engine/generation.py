"""One request's decode, a pass at a time: prefill() then step(), each returning a measured event.

Convention (as in serving): every forward pass emits one token. prefill() runs the whole prompt in one
parallel pass and emits the first token (so TTFT = queue + prefill); each step() feeds the newest token,
appends only its K/V to the cache, attends over the whole prefix and emits the next (TPOT).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvviz.engine.backends.base import Backend, ForwardResult
from kvviz.engine.device import device_memory_allocated, synchronize
from kvviz.errors import InputError
from kvviz.kv.formula import attention_scores_per_pass, kv_footprint


@dataclass(frozen=True)
class TopToken:
    token_id: int
    text: str
    prob: float


@dataclass
class StepEvent:
    phase: str  # "prefill" or "decode"
    index: int  # 0 for prefill, then 1, 2, ... for decode steps
    position: int  # absolute position of the last token fed in this pass
    n_input_tokens: int  # tokens run through the model this pass (whole prefix when there is no cache)
    token_id: int  # token emitted by this pass (batch row 0)
    token_ids: list[int]  # token emitted for each batch row
    token_text: str
    top_k: list[TopToken]  # next-token distribution of this pass, batch row 0
    seconds: float  # wall time of the model work, device-synchronized; no rendering inside
    cache_lengths: list[int]  # per layer, after this pass
    live_bytes: int  # measured from the cache tensors
    allocated_bytes: int
    formula_bytes: int  # kv_footprint() of the model's KV description for the positions cached (0 without a cache)
    attn_scores: int  # q·k dot products computed this pass, all layers and heads
    attention: list[np.ndarray] | None = None  # per layer [n_heads, n_keys]: the newest query's row
    device_memory_bytes: int | None = None  # allocator reading on CUDA/MPS
    queue_s: float = 0.0  # prefill only: time from request to the start of work
    compiled_mode: str | None = None  # the generation's compiled step that ran this pass (CompiledStep.mode), or None


def encode_prompt(backend: Backend, prompt: str | list[int]) -> list[int]:
    """A prompt's token ids, refused when empty or when it leaves no room in the context for a new token."""
    ids = backend.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    # Only whitespace or control characters is no prompt at all (each would still be a byte token).
    if not ids or (isinstance(prompt, str) and not any(c.isprintable() and not c.isspace() for c in prompt)):
        raise InputError("empty_prompt")
    if len(ids) >= backend.spec.max_context:
        raise InputError("prompt_too_long", n_tokens=len(ids), max_len=backend.spec.max_context)
    return ids


@dataclass
class Generation:
    backend: Backend
    max_new_tokens: int = 32
    use_cache: bool = True
    capture_attention: bool = False
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k filter when sampling
    seed: int = 0
    batch_size: int = 1
    stop_at_eos: bool = True
    prompt_ids: list[int] = field(default_factory=list)
    generated: list[list[int]] = field(default_factory=list)  # per batch row
    events: list[StepEvent] = field(default_factory=list)
    cache: Any = None
    last_logits: torch.Tensor | None = None  # [B, V] float32, of the latest pass
    created_at: float = field(default_factory=time.perf_counter)
    requested_new_tokens: int = 0  # what was asked, before prefill() capped it at the context
    adopted: bool = False  # prefilled by another worker (adopt()): events hold this worker's decode steps only
    # A compiled step (kvviz.engine.compiled.CompiledStep) this generation's decode steps run on where it can; the
    # prefill and any step it cannot run (it says why in why_not) run on the backend's own forward.
    compiled: Any = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise InputError("max_new_tokens", value=self.max_new_tokens)
        if self.batch_size < 1:
            raise InputError("batch_size", value=self.batch_size)
        if self.temperature < 0:
            raise InputError("temperature", value=self.temperature)
        self._rng = torch.Generator().manual_seed(self.seed)

    # ---- state -------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return bool(self.events) or self.adopted

    @property
    def n_generated(self) -> int:
        return len(self.generated[0]) if self.generated else 0

    @property
    def done(self) -> bool:
        if not self.started:
            return False
        if self.n_generated >= self.max_new_tokens:
            return True
        eos = self.backend.tokenizer.eos_id
        return self.stop_at_eos and eos is not None and self.generated[0][-1] == eos

    @property
    def token_ids(self) -> list[int]:
        """Prompt plus generated tokens of batch row 0."""
        return self.prompt_ids + (self.generated[0] if self.generated else [])

    @property
    def text(self) -> str:
        return self.backend.tokenizer.decode(self.generated[0]) if self.generated else ""

    # ---- the two phases -------------------------------------------------------------------------
    def prefill(self, prompt: str | list[int], *, past: Any = None) -> StepEvent:
        """Run the prompt and emit the first token. `past`: a cache (from backend.new_cache, room for the prompt
        and the new tokens) whose first positions already hold this prompt's K/V, loaded from an offload tier:
        only the rest of the prompt is computed (at least its last token, whose logits pick the first token)."""
        if self.started:
            raise InputError("already_prefilled")
        self.prompt_ids = ids = encode_prompt(self.backend, prompt)
        # Never decode past the context: fewer new tokens rather than an error mid-generation; the pages say so
        # (requested_new_tokens keeps what was asked), the CLI refuses beforehand.
        self.requested_new_tokens = self.max_new_tokens
        self.max_new_tokens = min(self.max_new_tokens, self.backend.spec.max_context - len(ids))
        n_loaded = 0
        if past is not None:
            n_loaded = self.backend.cache_lengths(past)[0]
            if not self.use_cache or self.batch_size != 1 or not 0 <= n_loaded < len(ids):
                raise InputError("moving.bad_past", n_loaded=n_loaded, n_tokens=len(ids))
            self.cache = past
        elif self.use_cache:
            self.cache = self.backend.new_cache(self.batch_size, len(ids) + self.max_new_tokens)
        queue_s = time.perf_counter() - self.created_at
        return self._pass([ids[n_loaded:]] * self.batch_size, n_past=n_loaded, phase="prefill", queue_s=queue_s)

    def adopt(self, prompt_ids: list[int], first_token: int, cache: Any) -> None:
        """Continue a request prefilled by another worker (a prefill→decode handoff): `cache` holds the prompt's
        K/V and `first_token` is the token that worker's prefill emitted; step() decodes on from there."""
        if self.started:
            raise InputError("already_prefilled")
        if self.backend.cache_lengths(cache)[0] != len(prompt_ids) or self.batch_size != 1:
            raise InputError("moving.bad_past", n_loaded=self.backend.cache_lengths(cache)[0],
                             n_tokens=len(prompt_ids))
        self.prompt_ids, self.cache, self.generated = list(prompt_ids), cache, [[int(first_token)]]
        self.requested_new_tokens = self.max_new_tokens
        self.max_new_tokens = min(self.max_new_tokens, self.backend.spec.max_context - len(prompt_ids))
        self.adopted = True

    def step(self) -> StepEvent:
        if not self.started:
            raise InputError("prefill_first")
        if self.done:
            raise InputError("finished")
        n_seen = len(self.prompt_ids) + self.n_generated - 1
        if self.use_cache:
            # Only the newest token goes in; everything before it is read from the cache.
            return self._pass([row[-1:] for row in self.generated], n_past=n_seen, phase="decode")
        return self._pass([self.prompt_ids + row for row in self.generated], n_past=0, phase="decode")

    def run(self, prompt: str | list[int]) -> list[StepEvent]:
        """Prefill and decode to the end."""
        self.prefill(prompt)
        while not self.done:
            self.step()
        return self.events

    # ---- one forward pass -----------------------------------------------------------------------
    def _pass(self, rows: list[list[int]], *, n_past: int, phase: str, queue_s: float = 0.0) -> StepEvent:
        be = self.backend
        x = torch.tensor(rows, device=be.device)
        synchronize(be.device)
        t0 = time.perf_counter()
        out = compiled_mode = None
        if self.compiled is not None and self.use_cache and phase == "decode":
            got = self.compiled(x, self.cache, capture=self.capture_attention)
            if got is not None:
                out, compiled_mode = ForwardResult(*got), self.compiled.mode
        if out is None:
            out = be.forward(x, self.cache if self.use_cache else None, capture_attention=self.capture_attention,
                             all_logits=False)
        logits = out.logits[:, -1].float()
        next_ids = self._choose(logits)
        synchronize(be.device)
        seconds = time.perf_counter() - t0

        if self.generated:
            for row, tok in zip(self.generated, next_ids, strict=True):
                row.append(tok)
        else:
            self.generated = [[tok] for tok in next_ids]
        self.last_logits = logits
        n_new = x.shape[1]
        n_keys = n_past + n_new
        spec = be.spec
        if self.use_cache:
            lengths = be.cache_lengths(self.cache)
            live, allocated = be.cache_live_bytes(self.cache), be.cache_allocated_bytes(self.cache)
            formula = kv_footprint(spec, n_keys, self.batch_size, str(be.dtype)).total
        else:
            lengths, live, allocated, formula = [0] * spec.n_layers, 0, 0, 0
        probs = torch.softmax(logits[0], dim=-1)
        top_p, top_i = probs.topk(min(5, probs.numel()))
        event = StepEvent(
            phase=phase,
            index=len(self.events),
            position=n_keys - 1,
            n_input_tokens=n_new,
            token_id=next_ids[0],
            token_ids=next_ids,
            token_text=be.tokenizer.token_text(next_ids[0]),
            top_k=[TopToken(int(i), be.tokenizer.token_text(int(i)), float(p))
                   for p, i in zip(top_p, top_i, strict=True)],
            seconds=seconds,
            cache_lengths=lengths,
            live_bytes=live,
            allocated_bytes=allocated,
            formula_bytes=formula,
            attn_scores=attention_scores_per_pass(spec, n_new, n_past),
            attention=[a[0, :, -1].float().cpu().numpy() for a in out.attentions] if out.attentions else None,
            device_memory_bytes=device_memory_allocated(be.device),
            queue_s=queue_s,
            compiled_mode=compiled_mode,
        )
        self.events.append(event)
        return event

    def _choose(self, logits: torch.Tensor) -> list[int]:
        if self.temperature == 0:
            return logits.argmax(dim=-1).tolist()
        scaled = logits.cpu() / self.temperature
        if self.top_k:
            kth = scaled.topk(min(self.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        # Sampled on the CPU from a seeded generator so a seed repeats on every device.
        return torch.multinomial(scaled.softmax(dim=-1), 1, generator=self._rng).squeeze(-1).tolist()

    # ---- checks the pages show ------------------------------------------------------------------
    def recompute_logits(self) -> torch.Tensor:
        """Logits of the latest pass recomputed from scratch over the whole prefix, with no cache."""
        seq = self.token_ids[:-1]  # the newest token has not been fed yet
        x = torch.tensor([seq], device=self.backend.device)
        out = self.backend.forward(x, None, capture_attention=False, all_logits=False)
        return out.logits[:, -1].float()

    def cache_vs_recompute(self) -> tuple[float, int, int]:
        """max |cached − recomputed| logit of the latest pass, and both greedy tokens."""
        if self.last_logits is None:
            raise InputError("prefill_first")
        fresh = self.recompute_logits()[0]
        cached = self.last_logits[0]
        return float((cached - fresh).abs().max()), int(cached.argmax()), int(fresh.argmax())

    # ---- measured summaries -----------------------------------------------------------------------
    @property
    def ttft_s(self) -> float | None:
        if self.adopted:  # the first token came from the worker that prefilled
            return None
        return self.events[0].queue_s + self.events[0].seconds if self.events else None

    @property
    def tpot_s(self) -> float | None:
        decode = [e.seconds for e in self.events[0 if self.adopted else 1:]]
        return sum(decode) / len(decode) if decode else None

