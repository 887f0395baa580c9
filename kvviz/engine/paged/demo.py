"""Prefix sharing demonstrated on the real engine: prompts built from token ids, the same arrivals run with the
prefix cache on and off, and the prefill time a hit saves measured in isolation."""
from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from kvviz.engine.device import synchronize
from kvviz.engine.metrics import Spread, spread
from kvviz.engine.model import Decoder
from kvviz.engine.paged.scheduler import PagedEngine, Request
from kvviz.engine.timing import quiet
from kvviz.engine.tokenizer import Tokenizer
from kvviz.errors import InputError
from kvviz.kv.capacity import BLOCK_SIZE

FIRST_ID = 1  # id 0 is BOS/EOS in the shipped vocabulary; prompts draw from the rest


def shared_prefix_ids(tokenizer: Tokenizer, n_tokens: int) -> list[int]:
    """A system prompt of exactly n tokens: real text for a trained model, repeated to length."""
    from kvviz.engine.sweeps import FILLER

    base = tokenizer.encode(FILLER)
    return (base * (n_tokens // len(base) + 1))[:n_tokens]


def suffix_ids(vocab_size: int, n_tokens: int, index: int) -> list[int]:
    """Request `index`'s own tokens: seeded, and starting with a token no other index starts with, so two
    suffixes never share a block."""
    if vocab_size - FIRST_ID < 2:
        raise InputError("positive_int", name="vocabulary", value=vocab_size)
    gen = torch.Generator().manual_seed(1000 + index)
    ids = torch.randint(FIRST_ID, vocab_size, (n_tokens,), generator=gen).tolist()
    if ids:
        ids[0] = FIRST_ID + index % (vocab_size - FIRST_ID)
    return ids


def add_request(engine: PagedEngine, tokenizer: Tokenizer, shared: bool, system: int, own: int, new: int) -> list:
    """One demo request arriving now: the shared system prompt of `system` tokens (if `shared`), then its own `own`
    tokens, `new` to generate. Returns how it was added, [step, shared, system, own, new]: `replay` adds it again
    exactly (the same prompt ids at the same step)."""
    prompt = (shared_prefix_ids(tokenizer, system) if shared else []) + suffix_ids(
        engine.model.cfg.vocab_size, own, len(engine.requests))
    engine.add(prompt, new, "shared" if shared else "own")  # the label is translated when drawn
    return [engine.n_steps, shared, system, own, new]


def replay(engine: PagedEngine, tokenizer: Tokenizer, added: Sequence[Sequence], step: int,
           max_len: int) -> Iterator[list]:
    """Another engine brought to the same state: the requests `added` (add_request's records, in order) each added
    at its step, the engine stepped to `step` (the scheduler and the model are deterministic: the same blocks, hits
    and tokens). Each length is held to [1, max_len - 2], the page's boxes' range. Yields each record as it is added;
    an InputError (a pool too small for a request) stops it there."""
    def within(n: object) -> int:
        return min(max(int(n), 1), max_len - 2)

    for at, shared, *lengths in added:
        while engine.n_steps < min(int(at), step) and not engine.idle:
            engine.step()
        if int(at) > engine.n_steps:  # added after a step this engine did not reach
            return
        yield add_request(engine, tokenizer, bool(shared), *(within(n) for n in lengths))
    while engine.n_steps < step and not engine.idle:
        engine.step()


def warm_up(model: Decoder) -> None:
    """Two short runs, so one-off costs (allocator growth, first kernels) land in no timing."""
    eng = PagedEngine(model, 8, 4)
    for i in range(2):
        eng.add(suffix_ids(model.cfg.vocab_size, 9, i), 2)
    eng.run()


@dataclass
class DemoRun:
    engine: PagedEngine
    blocks_used: int  # blocks in use right after the last request's prefill
    blocks_shared: int  # of those, blocks held by two or more requests


def run_arrivals(model: Decoder, prompts: Sequence[list[int]], *, new_tokens: int, block_size: int,
                 n_blocks: int, prefix_caching: bool, same_step: bool = False) -> DemoRun:
    """Request i arrives once request i−1 has its first token (its prefill done), or (same_step) all arrive
    together and are admitted in one scheduler step; then all run to the end."""
    eng = PagedEngine(model, n_blocks, block_size, prefix_caching=prefix_caching, record_logits=True)
    used = shared = 0
    groups = [list(prompts)] if same_step else [[p] for p in prompts]
    for group in groups:
        reqs = [eng.add(prompt, new_tokens) for prompt in group]
        while any(r.first_token_s is None for r in reqs):
            eng.step()
        used = eng.pool.n_in_use()
        shared = sum(1 for n in eng.sharing().values() if n > 1)
    eng.run()
    return DemoRun(eng, used, shared)


def prefix_demo(model: Decoder, tokenizer: Tokenizer, *, n_requests: int = 8, shared_prefix: int = 256,
                suffix: int = 32, block_size: int = BLOCK_SIZE, new_tokens: int = 16,
                same_step: bool = False, repeats: int = 9) -> dict:
    """n requests sharing a system prompt, run with and without prefix caching on the same arrivals (one after
    another's prefill, or all in one step); TTFTs with their spread, and one hit's prefill saving measured alone."""
    for name, value in (("requests", n_requests), ("suffix", suffix), ("block size", block_size),
                        ("new tokens", new_tokens)):
        if value <= 0:
            raise InputError("positive_int", name=name, value=value)
    if shared_prefix < 0:
        raise InputError("positive_int", name="shared prefix", value=shared_prefix)
    total = shared_prefix + suffix + new_tokens
    if total > model.cfg.max_seq_len:
        raise InputError("sequence_too_long", n_tokens=total, max_len=model.cfg.max_seq_len)
    prefix = shared_prefix_ids(tokenizer, shared_prefix)
    prompts = [prefix + suffix_ids(model.cfg.vocab_size, suffix, i) for i in range(n_requests)]
    # room for all without sharing, nothing preempted, and the null block (vLLM's block 0, never handed out)
    n_blocks = n_requests * math.ceil(total / block_size) + 1
    warm_up(model)
    off = run_arrivals(model, prompts, new_tokens=new_tokens, block_size=block_size, n_blocks=n_blocks,
                       prefix_caching=False, same_step=same_step)
    on = run_arrivals(model, prompts, new_tokens=new_tokens, block_size=block_size, n_blocks=n_blocks,
                      prefix_caching=True, same_step=same_step)
    pairs = list(zip(on.engine.requests, off.engine.requests, strict=True))
    logits = [(a, b) for r_on, r_off in pairs for a, b in zip(r_on.logits, r_off.logits, strict=True)]
    diff = max((a - b).abs().max().item() for a, b in logits)
    same_tokens = all(a.output_ids == b.output_ids for a, b in pairs)
    hit = [i for i, r in enumerate(on.engine.requests) if r.cached_tokens]
    # One TTFT per request is one sample: the two sets are compared by their spread, as the page does, never
    # by a ratio of medians that a single slow step can make up.
    cached = spread(_distinct_ttfts(on.engine.requests[i] for i in hit))
    computed = spread(_distinct_ttfts(off.engine.requests[i] for i in hit))
    ttft = HitSaving.from_spreads(computed, cached) if hit else None
    first = on.engine.requests[hit[0]] if hit else None
    prefill = measure_hit_saving(model, first.prompt_ids, first.cached_tokens, repeats) if first else None
    return {
        "model": getattr(model, "name", None) or "native",
        "block_size": block_size,
        "pool_blocks": n_blocks,
        "new_tokens": new_tokens,
        "same_step": same_step,
        "requests": [
            {"prompt_tokens": len(r.prompt_ids), "cached_tokens": r.cached_tokens, "ttft_s": r.ttft_s,
             "ttft_no_prefix_cache_s": r_off.ttft_s}
            for r, r_off in pairs
        ],
        "hit_rate": on.engine.hit_rate(),
        "blocks_used": on.blocks_used,
        "blocks_shared": on.blocks_shared,
        "blocks_used_without_sharing": off.blocks_used,
        "ttft_cached": _spread_dict(cached),  # over the requests that hit
        "ttft_computed": _spread_dict(computed),  # the same requests, same arrivals, prefix cache off
        "ttft_saving": _saving_dict(ttft),  # fastest vs fastest, judged against the spread
        "prefill_saving": _saving_dict(prefill),  # one hit's prompt alone, whole vs after the hit
        "max_abs_logit_diff_vs_no_sharing": diff,
        "max_abs_logit": max(t.abs().max().item() for pair in logits for t in pair),  # the scale rounding is of
        "same_tokens_vs_no_sharing": same_tokens,
    }


def _distinct_ttfts(requests: Iterable[Request]) -> list[float]:
    """One TTFT per distinct measurement: requests that arrived and got their first token together (one step)
    share one timing, which is one sample, not several."""
    return list({(r.arrival_s, r.first_token_s): r.ttft_s for r in requests}.values())


def _spread_dict(s: Spread | None) -> dict | None:
    return None if s is None else {"median_s": s.median, "low_s": s.low, "high_s": s.high, "n": s.n}


def _saving_dict(h: HitSaving | None) -> dict | None:
    if h is None:
        return None
    return {"full_s": h.full_s, "with_hit_s": h.with_hit_s, "saved_s": h.saved_s, "noise_s": h.noise_s,
            "samples": h.repeats, "measurable": h.measurable}


@dataclass(frozen=True)
class HitSaving:
    """Seconds of the same work computed whole and after a prefix hit, each the fastest of `repeats` samples."""

    full_s: float
    with_hit_s: float
    noise_s: float  # the larger of the two runs' (median − fastest): how much repeated timings differ here
    repeats: int

    @classmethod
    def from_spreads(cls, whole: Spread, after: Spread) -> HitSaving:
        """Fastest against fastest; the noise is how far each set's median sits above its fastest."""
        return cls(whole.low, after.low, max(whole.median - whole.low, after.median - after.low),
                   min(whole.n, after.n))

    @property
    def saved_s(self) -> float:
        return self.full_s - self.with_hit_s

    @property
    def measurable(self) -> bool:
        """Whether the saving stands above the timing noise (a small hit on a small model may not); one sample
        each gives no noise estimate, so no verdict."""
        return self.repeats >= 2 and self.saved_s > self.noise_s


def measure_hit_saving(model: Decoder, prompt_ids: Sequence[int], cached_tokens: int, repeats: int = 9
                       ) -> HitSaving:
    """Prefill of a prompt computed whole vs with its first `cached_tokens` already in the cache (contiguous
    cache, one request alone, the two interleaved `repeats` times): the time a prefix hit saves."""
    ids = torch.tensor([list(prompt_ids)], device=model.lm_head.weight.device)
    full, partial = [], []
    with torch.inference_mode(), quiet():  # no GC pause or thread change inside the timings
        for _ in range(repeats + 1):
            cache = model.new_cache(1, len(prompt_ids))
            synchronize(ids.device)
            t0 = time.perf_counter()
            model(ids, cache, all_logits=False)
            synchronize(ids.device)
            full.append(time.perf_counter() - t0)
            cache.reset()
            if cached_tokens:
                model(ids[:, :cached_tokens], cache, all_logits=False)  # the hit: already there, not timed
            synchronize(ids.device)
            t0 = time.perf_counter()
            model(ids[:, cached_tokens:], cache, all_logits=False)
            synchronize(ids.device)
            partial.append(time.perf_counter() - t0)
    # The first pair is dropped: the first passes at new lengths pay one-time costs.
    return HitSaving.from_spreads(spread(full[1:]), spread(partial[1:]))
