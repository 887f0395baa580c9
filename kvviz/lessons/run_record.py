"""A finished or paused run as plain data (the "run record"): what a self-contained HTML export replays
(kvviz.charts.run_html) and what a test reads back out of the file. Built from a Generation's events, a
SpeculativeGeneration's events or the paged engine's per-step views; JSON types only (no numpy, no torch).

The numbers are the run's own: bytes, token ids and timings are copied, never recomputed; the attention rows are
rounded to ATTENTION_DIGITS decimals (a file of SmolLM2's 30 layers would otherwise be mostly digits).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from kvviz.errors import InputError
from kvviz.kv.formula import kv_footprint
from kvviz.lessons.decode_view import token_texts

FORMAT = 1  # the record's layout; a reader checks it
ATTENTION_DIGITS = 5


def _model(backend: Any) -> dict:
    spec = backend.spec
    return {"name": spec.name, "engine": getattr(backend, "kind", "native"), "n_layers": spec.n_layers,
            "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads, "d_head": spec.d_head,
            "attention_kind": spec.attention_kind, "max_context": spec.max_context,
            "dtype": str(backend.dtype).removeprefix("torch."), "device": str(backend.device)}


def _formula(backend: Any, n_tokens: int, batch: int = 1) -> dict:
    """The formula's terms for n cached positions: M = B · Σ_layers n_ℓ · (bytes one token leaves in one layer)."""
    fp = kv_footprint(backend.spec, n_tokens, batch, str(backend.dtype))
    return {"n_tokens": n_tokens, "batch": batch, "token_layers": fp.cached_token_layers,
            "per_token_per_layer": fp.per_token_per_layer, "values_per_token_per_layer": fp.values_per_token_per_layer,
            "bytes_per_elem": fp.bytes_per_elem, "total": fp.total}


def decode_record(gen: Any, settings: Mapping[str, Any] | None = None, *, n_steps: int | None = None) -> dict:
    """A Generation (prefill + steps) as a run record: the keys `generate --json` prints, with the same values,
    plus every pass's event and, when captured, the newest query's attention row per layer and head.
    `n_steps`: the passes to take (a page's run may still be growing on another thread)."""
    events = gen.events[: len(gen.events) if n_steps is None else n_steps]
    if not events:
        raise InputError("run_html.nothing_ran")
    n_prompt = len(gen.prompt_ids)
    generated = [e.token_id for e in events]
    ids = gen.prompt_ids + generated
    steps, attention = [], []
    for e in events:
        step = {k: v for k, v in asdict(e).items() if k not in ("attention", "top_k")}
        step["top_k"] = [{"token_id": t.token_id, "text": t.text, "prob": t.prob} for t in e.top_k]
        step["formula"] = _formula(gen.backend, e.position + 1, gen.batch_size) if gen.use_cache else None
        steps.append(step)
        attention.append(None if e.attention is None else
                         [a.round(ATTENTION_DIGITS).tolist() for a in e.attention])
    decode = [e.seconds for e in events[1:]]
    last = events[-1]
    return {
        "kvviz_run": FORMAT, "kind": "decode", "model": _model(gen.backend), "settings": dict(settings or {}),
        "use_cache": gen.use_cache, "prompt_tokens": n_prompt, "token_ids": generated,
        "text": gen.backend.tokenizer.decode(generated), "texts": token_texts(gen.backend.tokenizer, ids),
        "ttft_s": events[0].queue_s + events[0].seconds, "tpot_s": sum(decode) / len(decode) if decode else None,
        "step_seconds": [e.seconds for e in events], "cache_live_bytes": last.live_bytes,
        "cache_allocated_bytes": last.allocated_bytes, "formula_bytes": last.formula_bytes,
        "steps": steps, "attention": attention if any(a is not None for a in attention) else None,
        "attention_digits": ATTENTION_DIGITS,
    }


def spec_record(gen: Any, settings: Mapping[str, Any] | None = None, *, n_steps: int | None = None) -> dict:
    """A SpeculativeGeneration as a run record: every pass's event (drafted, accepted, rolled back, bytes before
    and after the rollback, draft and verify seconds) and the texts of every token and drafted token."""
    events = gen.events[: len(gen.events) if n_steps is None else n_steps]
    if not events:
        raise InputError("run_html.nothing_ran")
    generated = [t for e in events for t in e.emitted]
    ids = gen.prompt_ids + generated
    drafted = sorted({d for e in events for d in e.drafted})
    tok = gen.backend.tokenizer
    steps = []
    for e in events:
        step = asdict(e)
        step["formula"] = _formula(gen.backend, e.cache_lengths[0])
        steps.append(step)
    decode = sum(e.seconds for e in events[1:])
    return {
        "kvviz_run": FORMAT, "kind": "speculative", "model": _model(gen.backend), "settings": dict(settings or {}),
        "shared_layers": gen.draft.shared_layers, "draft": getattr(gen.draft, "name", None),
        "prompt_tokens": len(gen.prompt_ids), "token_ids": generated, "text": tok.decode(generated),
        "texts": token_texts(tok, ids), "draft_texts": dict(zip(map(str, drafted), token_texts(tok, drafted),
                                                                strict=True)),
        "ttft_s": events[0].seconds, "tpot_s": decode / (len(generated) - 1) if len(generated) > 1 else None,
        "step_seconds": [e.seconds for e in events], "cache_live_bytes": events[-1].live_bytes,
        "formula_bytes": events[-1].formula_bytes, "steps": steps, "attention": None,
    }


def paged_record(engine: Any, settings: Mapping[str, Any] | None = None, *, model_name: str | None = None) -> dict:
    """The paged engine's run as a record: per scheduler step its report (who ran, tokens, seconds, admitted,
    preempted, finished), the pool's counts and the blocks and requests as they stood (engine.views, recorded by
    an engine made with record_views=True)."""
    # The steps all three lists hold (a page's engine may be stepping on another thread while this reads it).
    n = min(len(engine.reports), len(engine.history), len(engine.views))
    if not n:
        raise InputError("run_html.nothing_ran")
    cfg = engine.model.cfg
    steps = []
    for report, sample, (blocks, requests) in zip(engine.reports[:n], engine.history[:n], engine.views[:n],
                                                  strict=True):
        steps.append({"report": asdict(report), "pool": asdict(sample), "blocks": [asdict(b) for b in blocks],
                      "requests": [asdict(r) for r in requests]})
    return {
        "kvviz_run": FORMAT, "kind": "paged", "settings": dict(settings or {}),
        "model": {"name": model_name or getattr(engine.model, "name", None) or "native", "n_layers": cfg.n_layers,
                  "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                  "d_head": cfg.d_head or cfg.d_model // cfg.n_heads, "max_context": cfg.max_seq_len},
        "block_size": engine.block_size, "n_blocks": engine.pool.n_blocks,
        "bytes_per_block": engine.kv.bytes_per_block(), "hit_rate": engine.hit_rate(),
        "step_seconds": [r.seconds for r in engine.reports[:n]], "steps": steps, "attention": None,
    }
