"""Many requests in one paged pool: admit with prefix hits, decode the running ones in one batched forward,
preempt by recompute when the pool runs out (as vLLM's scheduler, without chunked prefill).

With num_speculative_tokens = k, each running request drafts up to k tokens by prompt lookup (vLLM's `ngram`) and
brings 1 + k tokens to the forward (vLLM's num_new_tokens = num_tokens_with_spec − num_computed_tokens); its slots
are allocated for all of them (the n-gram method reserves no lookahead slots: vLLM sets num_lookahead_tokens only
for EAGLE and draft models). After the greedy verify, vLLM's Scheduler.update_from_output rolls the request back,
`num_computed_tokens -= num_rejected`, and frees nothing: the blocks stay in the block table and the next step
overwrites the rejected slots. Only blocks full of verified tokens get a hash (allocate_slots caches up to
request.num_tokens, never draft tokens).

Each step: (1) every running request gets a slot for its next token, the most recently admitted request
being preempted (blocks freed, put back at the head of the queue, recomputed later) while the pool is short;
(2) if nobody was preempted, waiting requests are admitted first come first served while their blocks fit,
each taking the longest cached prefix of full blocks; (3) one forward over all scheduled tokens; (4) each
request takes its greedy next token, finished requests free their blocks.

A block that this step fills is hashed when it is allocated, before the forward (vLLM's
KVCacheManager.allocate_slots → cache_blocks, "so that the block can be reused by other requests in the same
batch", docs/design/prefix_caching.md): a request admitted later in the same step hits it, and the forward
writes its K/V in each layer before any request of the batch attends to it.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvviz.engine.device import synchronize
from kvviz.engine.model import Decoder
from kvviz.engine.paged.blocks import BlockPool, block_hash
from kvviz.engine.paged.kv import build_batch
from kvviz.engine.spec import ngram, sampling
from kvviz.engine.spec.decoding import SpecStats
from kvviz.errors import InputError
from kvviz.kv.capacity import BLOCK_SIZE

ARRIVING, WAITING, RUNNING, FINISHED = "arriving", "waiting", "running", "finished"


@dataclass(eq=False)  # identity: two requests with the same tokens are still two requests
class Request:
    request_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    label: str = ""
    output_ids: list[int] = field(default_factory=list)
    status: str = WAITING
    block_table: list[int] = field(default_factory=list)
    n_computed: int = 0  # tokens whose K/V sit in the request's blocks
    cached_tokens: int | None = None  # prompt tokens taken from the prefix cache at first admission
    recompute_cached_tokens: int = 0  # tokens found again in the cache when recomputed after preemption
    n_preemptions: int = 0
    arrival_s: float | None = None  # when it first could be scheduled (the step it arrived in)
    first_token_s: float | None = None
    prefill_step_s: float | None = None  # seconds of the forward that computed its prompt (with its batch)
    admitted_step: int | None = None
    logits: list[torch.Tensor] = field(default_factory=list)  # per output token, when recorded
    hashes: list[bytes] = field(default_factory=list)  # chained hashes of its full blocks so far
    draft_ids: list[int] = field(default_factory=list)  # tokens drafted for the step being scheduled
    rolled_back: int = 0  # positions written by a verify and then rolled back, over its life
    n_released: int = 0  # blocks it gave back when it finished

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None or self.arrival_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def done(self) -> bool:
        return self.status == FINISHED

    def extend_hashes(self, block_size: int) -> list[bytes]:
        ids = self.all_ids
        while (len(self.hashes) + 1) * block_size <= len(ids):
            j = len(self.hashes)
            self.hashes.append(block_hash(self.hashes[-1] if self.hashes else None,
                                          ids[j * block_size : (j + 1) * block_size]))
        return self.hashes


@dataclass
class StepReport:
    step: int
    scheduled: list[int]  # request ids in this forward
    n_tokens: int  # new tokens computed
    seconds: float
    admitted: list[int]
    preempted: list[int]
    finished: list[int]


@dataclass
class PoolSample:
    """The pool after one step, for the usage-over-time figure."""

    step: int
    used: int
    cached_free: int
    free: int
    running: int
    waiting: int
    preempted: list[int]
    live_tokens: int  # tokens whose K/V is held, counting a shared block once


class PagedEngine:
    def __init__(self, model: Decoder, n_blocks: int, block_size: int = BLOCK_SIZE, *,
                 prefix_caching: bool = True, record_logits: bool = False, num_speculative_tokens: int = 0,
                 ngram_config: ngram.NgramConfig | None = None, record_views: bool = False) -> None:
        self.model = model
        self.pool = BlockPool(n_blocks, block_size)
        self.kv = model.new_paged_kv(n_blocks, block_size)
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.record_logits = record_logits
        self.requests: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.arriving: list[tuple[int, Request]] = []  # (step it arrives at, request)
        self.running: list[Request] = []
        self.n_steps = 0
        self.history: list[PoolSample] = []
        # With record_views, the blocks and requests as they stood after each step (snapshot()): a page's run
        # replayed step by step in an exported file (kvviz.charts.run_html).
        self.record_views = record_views
        self.views: list[tuple[list[BlockView], list[RequestView]]] = []
        self.reports: list[StepReport] = []
        self.num_speculative_tokens = num_speculative_tokens
        self.ngram_config = ngram_config or ngram.NgramConfig()
        self.spec_stats = SpecStats(num_speculative_tokens)

    # ---- requests ------------------------------------------------------------------------------------
    def add(self, prompt_ids: Sequence[int], max_new_tokens: int, label: str = "", *, at_step: int | None = None
            ) -> Request:
        """Queue a request now, or (at_step) have it arrive when the scheduler reaches that step."""
        prompt = [int(t) for t in prompt_ids]
        max_len = self.model.cfg.max_seq_len
        if not prompt:
            raise InputError("paged.empty_prompt")
        if max_new_tokens <= 0:
            raise InputError("positive_int", name="new tokens", value=max_new_tokens)
        total = len(prompt) + max_new_tokens
        if total > max_len:
            raise InputError("sequence_too_long", n_tokens=total, max_len=max_len)
        # Slots its last verify may write: drafts run past max_new_tokens up to the context (see _propose).
        slots = min(total + self.num_speculative_tokens, max_len)
        if math.ceil(slots / self.block_size) > self.pool.n_usable:  # it could never run, even alone
            raise InputError("paged.request_too_big", blocks=math.ceil(slots / self.block_size),
                             pool=self.pool.n_usable)
        req = Request(len(self.requests), prompt, max_new_tokens, label)
        self.requests.append(req)
        if at_step is not None and at_step > self.n_steps:
            req.status = ARRIVING
            self.arriving.append((at_step, req))
        else:
            self.waiting.append(req)
        return req

    def _arrive(self) -> None:
        due = [req for at, req in self.arriving if at <= self.n_steps]
        self.arriving = [(at, req) for at, req in self.arriving if at > self.n_steps]
        for req in due:
            req.status = WAITING
            self.waiting.append(req)
        now = time.perf_counter()
        for req in self.waiting:  # the clock starts when the scheduler first sees it, not when a page queued it
            if req.arrival_s is None:
                req.arrival_s = now

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and not self.arriving

    # ---- one scheduler step -----------------------------------------------------------------------------
    def _blocks_for(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.block_size)

    def _preempt(self, req: Request) -> None:
        self.pool.release(req.block_table)
        self._note_filled(req)
        req.block_table, req.n_computed, req.status, req.draft_ids = [], 0, WAITING, []
        req.n_preemptions += 1
        self.running.remove(req)
        self.waiting.appendleft(req)

    def _cache_blocks(self, req: Request) -> None:
        """Hash every block this step leaves full, now (vLLM's allocate_slots caches up to the request's
        num_tokens: its prompt at admission, the token it decodes next afterwards)."""
        if not self.prefix_caching:
            return
        hashes = req.extend_hashes(self.block_size)
        for j in range(len(req.all_ids) // self.block_size):
            self.pool.register(req.block_table[j], hashes[j])

    def _note_filled(self, req: Request) -> None:
        for j, b in enumerate(req.block_table):
            self.pool.blocks[b].n_filled = min(self.block_size, max(req.n_computed - j * self.block_size, 0))

    def _schedule(self) -> tuple[list[tuple[Request, list[int]]], list[int], list[int]]:
        scheduled: list[tuple[Request, list[int]]] = []
        preempted: list[int] = []
        for req in list(self.running):
            if req.status != RUNNING:
                continue  # preempted earlier in this loop
            req.draft_ids = self._propose(req)
            # Slots for the newest token and every draft (blocks already held from a rolled-back step count).
            need = max(0, self._blocks_for(req.n_computed + 1 + len(req.draft_ids)) - len(req.block_table))
            while need > self.pool.n_free:
                victim = self.running[-1]  # the most recently admitted goes first, as vLLM
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            if req.status != RUNNING:
                continue
            req.block_table += self.pool.allocate(need)
            self._cache_blocks(req)  # drafts are not the request's tokens yet: never hashed (vLLM's num_tokens)
            scheduled.append((req, [req.all_ids[-1], *req.draft_ids]))
        admitted: list[int] = []
        while self.waiting and not preempted:
            req = self.waiting[0]
            ids = req.all_ids
            hit = self.pool.lookup(req.extend_hashes(self.block_size), len(ids)) if self.prefix_caching else []
            need = self._blocks_for(len(ids)) - len(hit)
            free_after_hit = self.pool.n_free - sum(1 for b in hit if self.pool.blocks[b].ref_count == 0)
            if need > free_after_hit:
                break
            self.waiting.popleft()
            self.pool.take_cached(hit)
            req.block_table = hit + self.pool.allocate(need)
            req.n_computed = len(hit) * self.block_size
            self._cache_blocks(req)  # before the next waiting request looks up: a same-step hit
            if req.cached_tokens is None:
                req.cached_tokens = req.n_computed
                req.admitted_step = self.n_steps
                self.pool.hits += req.n_computed
                self.pool.queries += len(req.prompt_ids)
            else:
                req.recompute_cached_tokens += req.n_computed
            req.status = RUNNING
            self.running.append(req)
            admitted.append(req.request_id)
            scheduled.append((req, ids[req.n_computed :]))
        return scheduled, admitted, preempted

    def _propose(self, req: Request) -> list[int]:
        """Up to k drafts by prompt lookup, cut only where the context ends, not at max_new_tokens: vLLM's
        Scheduler.schedule caps a running request's new tokens by the token budget and by max_model_len −
        num_computed_tokens − 1 and trims spec_token_ids to what fits; the tokens past max_tokens are dropped
        after the verify (check_stop), while the acceptance statistics count every draft verified."""
        k = min(self.num_speculative_tokens, self.model.cfg.max_seq_len - 1 - req.n_computed - 1)
        return ngram.propose(req.all_ids, k, self.ngram_config, self.model.cfg.max_seq_len) if k > 0 else []

    @torch.inference_mode()
    def step(self) -> StepReport:
        """Schedule, run one batched forward, take each request's next token."""
        self._arrive()
        scheduled, admitted, preempted = self._schedule()
        seconds, finished = 0.0, []
        if scheduled:
            batch = build_batch([t for _, t in scheduled], [r.n_computed for r, _ in scheduled],
                                [r.block_table for r, _ in scheduled], self.block_size, self.kv.k[0].device)
            synchronize(self.kv.k[0].device)
            start = time.perf_counter()
            speculating = self.num_speculative_tokens > 0
            logits = self.model.forward_paged(batch, self.kv, all_logits=speculating)
            # Each request's rows: all its new tokens' logits when speculating (a verify reads each draft's), else
            # its last token's.
            rows = ([logits[a : a + len(t)] for a, (_, t) in zip(_starts(scheduled), scheduled, strict=True)]
                    if speculating else [logits[i : i + 1] for i in range(len(scheduled))])
            # Greedy: the drafts the target agrees with, then its own token (a prefill drafted nothing).
            verdicts = [sampling.greedy(req.draft_ids, r[len(r) - 1 - len(req.draft_ids):])
                        for (req, _), r in zip(scheduled, rows, strict=True)]
            synchronize(self.kv.k[0].device)
            end = time.perf_counter()
            seconds = end - start
            for (req, toks), row, verdict in zip(scheduled, rows, verdicts, strict=True):
                drafted = req.draft_ids
                req.n_computed += len(toks)
                if drafted:
                    # vLLM's update_from_output: num_computed_tokens -= num_rejected; no block is freed.
                    rejected = len(drafted) - verdict.n_accepted
                    req.n_computed -= rejected
                    req.rolled_back += rejected
                    self.spec_stats.observe_draft(len(drafted), verdict.n_accepted)
                req.draft_ids = []
                produced = verdict.emitted(drafted)
                emitted = produced[: req.max_new_tokens - len(req.output_ids)]
                # vLLM's _update_request_with_output trims at the stop and keeps num_computed_tokens one short of
                # the tokens kept (num_computed_tokens -= len(new_token_ids) − num_new).
                req.n_computed -= len(produced) - len(emitted)
                req.output_ids.extend(emitted)
                self._note_filled(req)
                if req.first_token_s is None:
                    req.first_token_s = end
                if req.prefill_step_s is None:  # its first forward computed its prompt
                    req.prefill_step_s = seconds
                if self.record_logits:
                    req.logits.extend(r.detach().clone() for r in row[len(row) - 1 - len(drafted):][:len(emitted)])
                if len(req.output_ids) >= req.max_new_tokens:
                    # Freed, and gone from the request (vLLM's free pops req_to_blocks): its blocks may now be
                    # reused by others, so a finished request shows how many it released, not their ids.
                    self.pool.release(req.block_table)
                    req.n_released, req.block_table = len(req.block_table), []
                    req.status = FINISHED
                    self.running.remove(req)
                    finished.append(req.request_id)
        report = StepReport(self.n_steps, [r.request_id for r, _ in scheduled], sum(len(t) for _, t in scheduled),
                            seconds, admitted, preempted, finished)
        self.reports.append(report)
        self.history.append(PoolSample(self.n_steps, self.pool.n_in_use(), self.pool.n_cached_free(),
                                       self.pool.n_free - self.pool.n_cached_free(), len(self.running),
                                       len(self.waiting), preempted, self.live_tokens()))
        if self.record_views:
            self.views.append(snapshot(self))
        self.n_steps += 1
        return report

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if self.idle:
                return
            self.step()

    # ---- what the page and the CLI read -----------------------------------------------------------------
    def live_tokens(self) -> int:
        """Token positions held in blocks in use, each shared block counted once."""
        filled = {}
        for req in self.running:
            for j, b in enumerate(req.block_table):
                filled[b] = max(filled.get(b, 0), min(self.block_size, max(req.n_computed - j * self.block_size, 0)))
        return sum(filled.values())

    def hit_rate(self) -> float | None:
        """Prompt tokens served from the cache / prompt tokens admitted (first admissions only)."""
        return self.pool.hits / self.pool.queries if self.pool.queries else None

    def sharing(self) -> dict[int, int]:
        """block id -> how many running requests hold it."""
        return {b.block_id: b.ref_count for b in self.pool.blocks if b.ref_count > 0}


def _starts(scheduled: Sequence[tuple[Request, list[int]]]) -> list[int]:
    """Where each scheduled request's new tokens begin in the batch's concatenated [T]."""
    out, at = [], 0
    for _, toks in scheduled:
        out.append(at)
        at += len(toks)
    return out


# ---- pure views for the page's figures --------------------------------------------------------------------
@dataclass(frozen=True)
class BlockView:
    block_id: int
    state: str  # used | cached (free, still hashable) | free
    ref_count: int
    n_filled: int
    owners: tuple[int, ...]  # running request ids holding it


@dataclass(frozen=True)
class RequestView:
    request_id: int
    label: str
    status: str
    prompt_tokens: int
    output_tokens: int
    n_computed: int
    cached_tokens: int | None
    block_table: tuple[int, ...]  # empty once finished: the blocks went back to the pool
    n_preemptions: int
    ttft_s: float | None
    n_released: int = 0  # blocks released when it finished


def snapshot(engine: PagedEngine) -> tuple[list[BlockView], list[RequestView]]:
    owners: dict[int, list[int]] = {}
    for req in engine.running:
        for b in req.block_table:
            owners.setdefault(b, []).append(req.request_id)
    blocks = [BlockView(b.block_id, engine.pool.state(b.block_id), b.ref_count, b.n_filled,
                        tuple(owners.get(b.block_id, ()))) for b in engine.pool.blocks]
    requests = [RequestView(r.request_id, r.label, r.status, len(r.prompt_ids), len(r.output_ids), r.n_computed,
                            r.cached_tokens, tuple(r.block_table), r.n_preemptions, r.ttft_s, r.n_released)
                for r in engine.requests]
    return blocks, requests


@dataclass(frozen=True)
class Fragmentation:
    """The running requests' K/V four ways, in bytes read off the pool's tensors."""

    live_bytes: int  # token positions actually held (a shared block counted once)
    paged_bytes: int  # blocks in use × bytes per block
    paged_unshared_bytes: int  # the blocks they would take without prefix sharing: Σ ⌈n/B⌉
    contiguous_bytes: int  # each request reserving max_seq_len up front
    bytes_per_token: int


def fragmentation(engine: PagedEngine) -> Fragmentation | None:
    from kvviz.kv.capacity import compare_allocation

    lengths = [r.n_computed for r in engine.running if r.n_computed]
    if not lengths:
        return None
    per_token = engine.kv.bytes_per_block() // engine.block_size
    cmp = compare_allocation(lengths, engine.model.cfg.max_seq_len, per_token, engine.block_size)
    return Fragmentation(engine.live_tokens() * per_token, engine.pool.n_in_use() * engine.kv.bytes_per_block(),
                         cmp.paged_bytes, cmp.contiguous_bytes, per_token)
