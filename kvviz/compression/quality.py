"""Quality of a compressed cache against the full one on real text: perplexity, KL(full ‖ compressed) of the
next-token distribution, and top-1 agreement, over chunks of the shipped model's held-out split or a file."""
from __future__ import annotations

import math
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from kvviz.compression.runner import (
    DEPLOY_DTYPES,
    QUANT,
    Method,
    StepView,
    Trace,
    batchable,
    method_family,
    method_passes,
    rows_passes,
)
from kvviz.engine.backends.base import Backend
from kvviz.engine.sweeps import Sweep
from kvviz.errors import InputError

DEFAULT_TOKENS = 2048  # evaluated text per method: a few thousand tokens keeps a CPU run to seconds
# The page's default text per method. Every decode pass reads all the weights, so the comparison's time grows with
# the model's size: the shipped model (4.7M parameters) runs 512 tokens in seconds, SmolLM2 (135M) took 253 s for
# 512 on 2 cores (bench/compress_batched.py --page --budgets 64,128 --batched-only, docs/measurements.md): a model
# past SMALL_MODEL_PARAMS starts at one chunk of the default 256 instead, about half of that.
PAGE_TOKENS, LARGE_MODEL_PAGE_TOKENS, SMALL_MODEL_PARAMS = 512, 256, 50_000_000


def page_tokens(n_params: int) -> int:
    """The tokens the page evaluates by default for a model of n_params parameters."""
    return PAGE_TOKENS if n_params <= SMALL_MODEL_PARAMS else LARGE_MODEL_PAGE_TOKENS
MAX_TEXT_BYTES = 2_000_000


@cache
def held_out_text() -> str:
    """The shipped model's held-out documents, as the package ships them (kvviz/assets/held_out/, written by the
    training run from the corpus it split): no download and no system tool at run time."""
    from kvviz.training import corpus

    return "\n\n".join(d.text for d in corpus.shipped_held_out()[1])


def read_text(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise InputError("compression.no_text_file", path=str(p))
    if p.stat().st_size > MAX_TEXT_BYTES:
        raise InputError("compression.text_too_large", path=str(p), limit=MAX_TEXT_BYTES)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("compression.not_utf8", path=str(p)) from None


def chunks(backend: Backend, text: str, seq_len: int, n_tokens: int) -> list[list[int]]:
    """Consecutive whole pieces of seq_len tokens, at most n_tokens in all (at least one). A text shorter than one
    chunk is refused: a shorter piece would be reported as a chunk of seq_len with a prompt it did not have."""
    ids = backend.tokenizer.encode(text)
    n_pieces = max(1, n_tokens // seq_len)
    out = [c for c in (ids[i * seq_len : (i + 1) * seq_len] for i in range(n_pieces)) if len(c) == seq_len]
    if not out:
        raise InputError("compression.text_too_short", n_tokens=len(ids), seq_len=seq_len)
    return out


@dataclass
class Quality:
    method: str
    label: str
    perplexity: float
    kl_divergence: float  # nats per token, mean of KL(full ‖ compressed)
    top1_agreement: float  # share of positions whose argmax matches the full cache's
    kv_bytes: int  # measured off the stored tensors, in the dtype the model ran in
    formula_bytes: int
    n_cached: int
    full_perplexity: float
    full_kv_bytes: int
    full_n_cached: int
    n_predicted: int
    budget: int | None = None
    bookkeeping_bytes: int = 0
    scale_bytes_outside_cache: int = 0
    fp8_clipped: int = 0
    notes: tuple[str, ...] = ()
    bytes_at: dict[str, int] = field(default_factory=dict)  # the cache by the formula, full precision stored as each
    full_bytes_at: dict[str, int] = field(default_factory=dict)  # the uncompressed cache, likewise
    kv_dtype: str = "bfloat16"  # the deployment's KV dtype the saving is counted against
    evicted: int = 0  # positions dropped over every chunk and layer (eviction)
    group: int | None = None  # KIVI's formats: G and R
    residual: int | None = None
    kv_scale: str | None = None  # fp8: how k/v_scale were set
    views: dict[int, StepView] = field(default_factory=dict, repr=False)  # the first chunk's recorded steps

    def saved(self, kv_dtype: str | None = None) -> float:
        """Share of the KV bytes saved against the uncompressed cache, both stored as kv_dtype: a bfloat16
        deployment saves 50% with fp8, not the 75% a float32 run would show."""
        d = kv_dtype or self.kv_dtype
        return 1 - self.bytes_at[d] / self.full_bytes_at[d]

    @property
    def memory_saved(self) -> float:
        return self.saved()

    @property
    def family(self) -> str:
        """What the method does to the cache, as charted: evict, quantize or share (kvviz.compression.runner)."""
        return method_family(self.method)

    @property
    def left_whole(self) -> bool:
        """An eviction policy that dropped nothing (SnapKV with a prompt no longer than its budget)."""
        return self.budget is not None and self.evicted == 0

    def to_dict(self) -> dict:
        from dataclasses import asdict

        out = {**asdict(self), "notes": list(self.notes), "memory_saved": self.memory_saved,
               "kv_bytes_at_kv_dtype": self.bytes_at[self.kv_dtype],
               "full_kv_bytes_at_kv_dtype": self.full_bytes_at[self.kv_dtype], "left_whole": self.left_whole,
               "family": self.family}
        del out["views"]
        return out


def compare(full: list[Trace], comp: list[Trace], targets: list[torch.Tensor]) -> tuple[float, float, float, float]:
    """(perplexity, full perplexity, mean KL, top-1 agreement) pooled over every predicted token."""
    lf = torch.cat([t.logits for t in full]).log_softmax(-1)
    lc = torch.cat([t.logits for t in comp]).log_softmax(-1)
    y = torch.cat(targets)
    nll = -lc.gather(1, y[:, None]).mean().item()
    nll_full = -lf.gather(1, y[:, None]).mean().item()
    kl = (lf.exp() * (lf - lc)).sum(-1).clamp_min(0).mean().item()
    top1 = (lf.argmax(-1) == lc.argmax(-1)).float().mean().item()
    return math.exp(nll), math.exp(nll_full), kl, top1


def evaluate(backend: Backend, methods: list[Method], text: str, *, seq_len: int | None = None,
             n_tokens: int = DEFAULT_TOKENS, prompt_share: float = 0.5, view_steps: tuple[int, ...] = (),
             kv_dtype: str = "bfloat16", progress=None, batched: bool = True) -> list[Quality]:  # noqa: ANN001
    """Each method on the same chunks: prompt = the first prompt_share of a chunk, the rest decoded.
    view_steps: decode steps of the first chunk whose kept positions and attention each method records.
    kv_dtype: the KV dtype savings are counted against (bytes of every dtype are kept: Quality.saved).
    progress(done, total): called after every forward pass. batched=False runs every method alone, one after
    another (what `evaluation` measures itself against)."""
    sweep = evaluation(backend, methods, text, seq_len=seq_len, n_tokens=n_tokens, prompt_share=prompt_share,
                       view_steps=view_steps, kv_dtype=kv_dtype, batched=batched)
    rows: list[Quality] = []
    for done, rows in enumerate(sweep.runs, 1):  # noqa: B007 - the last rows are the answer
        if progress is not None:
            progress(done, sweep.total)
    return rows


def evaluation(backend: Backend, methods: list[Method], text: str, *, seq_len: int | None = None,
               n_tokens: int = DEFAULT_TOKENS, prompt_share: float = 0.5, view_steps: tuple[int, ...] = (),
               kv_dtype: str = "bfloat16", batched: bool = True) -> Sweep:
    """`evaluate` one forward pass per next(): a Sweep whose runs yield, after each pass, the rows measured so far
    (each method pooled over the chunks it has finished), so a page can show progress, estimate the time left and
    stop, keeping every method's finished chunks.

    Per chunk, the full cache and every method that keeps the model's weights run as rows of one batch, sharing
    the prompt's prefill (runner.rows_passes); head pooling, and every method of a Hugging Face model, run alone."""
    max_len = backend.spec.max_context
    seq_len = seq_len or max_len
    if seq_len > max_len:  # a longer chunk would be cut to the context and report lengths that did not run
        raise InputError("compression.seq_too_long", seq_len=seq_len, max_len=max_len, model=backend.spec.name)
    if seq_len < 2:
        raise InputError("compression.seq_too_short", seq_len=seq_len)
    if kv_dtype not in DEPLOY_DTYPES:
        raise InputError("unknown_kv_dtype", name=kv_dtype, choices=", ".join(DEPLOY_DTYPES))
    pieces = chunks(backend, text, seq_len, n_tokens)
    n_prompt = max(1, int(len(pieces[0]) * prompt_share))
    reference = next((m for m in methods if m.name == "full"), Method("full"))
    others = [m for m in methods if m.name != "full"]
    # The reference is in the batch whenever it can be, even with no other method there: its numbers then never
    # depend on which methods run beside it.
    batch = [reference, *(m for m in others if batchable(backend, m))] if batched and batchable(
        backend, reference) else []
    alone = [m for m in [reference, *others] if m not in batch]
    per_chunk = (len(pieces[0]) - n_prompt) * (bool(batch) + len(alone))
    return Sweep("compression", len(pieces) * per_chunk, len(methods),
                 _passes(backend, methods, pieces, n_prompt, reference, batch, alone, frozenset(view_steps), kv_dtype))


def _passes(backend: Backend, methods: list[Method], pieces: list[list[int]], n_prompt: int, reference: Method,
            batch: list[Method], alone: list[Method], view_steps: frozenset[int],
            kv_dtype: str) -> Iterator[list[Quality]]:
    traces: dict[Method, list[Trace]] = {m: [] for m in [*batch, *alone]}
    targets = [torch.tensor(ids[n_prompt:], device=backend.device) for ids in pieces]
    out: list[Quality] = []

    def measured() -> list[Quality]:
        full = traces[reference]
        return [_quality(m, traces[m if m.name != "full" else reference], full, targets, kv_dtype) for m in methods
                if traces[m if m.name != "full" else reference]]

    for i, ids in enumerate(pieces):
        steps = view_steps if i == 0 else frozenset()
        if batch:  # the reference first: a cancelled run always has it for what it finished
            done = yield from _each(rows_passes(backend, ids, n_prompt, batch, steps), out)
            for m, trace in zip(batch, done, strict=True):
                traces[m].append(trace)
            out = measured()
            yield out
        for m in alone:
            traces[m].append((yield from _each(method_passes(backend, ids, n_prompt, m, steps), out)))
            out = measured()
            yield out


def _each(passes: Generator[None, None, object], out: list[Quality]) -> Generator[list[Quality], None, object]:
    """Yield the rows measured so far after every pass of `passes` but its last (the caller yields the rows that
    include the finished run); return what `passes` returns."""
    next(passes)
    while True:
        try:
            next(passes)
        except StopIteration as stop:
            return stop.value
        yield out


def _quality(m: Method, comp: list[Trace], full: list[Trace], targets: list[torch.Tensor], kv_dtype: str) -> Quality:
    """A method pooled over the chunks it finished, against the full cache on the same chunks."""
    comp = full if m.name == "full" else comp
    full, targets = full[: len(comp)], targets[: len(comp)]
    ppl, ppl_full, kl, top1 = compare(full, comp, targets)
    last = comp[-1]
    return Quality(
        m.name, m.label(), ppl, kl, top1, last.kv_bytes, last.formula_bytes, last.n_cached, ppl_full,
        full[-1].kv_bytes, full[-1].n_cached, int(sum(len(t) for t in targets)), budget=m.budget,
        bookkeeping_bytes=last.bookkeeping_bytes, scale_bytes_outside_cache=last.scale_bytes_outside_cache,
        fp8_clipped=sum(t.fp8_clipped for t in comp), notes=tuple(last.notes), bytes_at=last.bytes_at,
        full_bytes_at=full[-1].bytes_at, kv_dtype=kv_dtype, evicted=sum(t.evicted for t in comp),
        group=last.group, residual=last.residual, kv_scale=m.kv_scale if m.tensor_scaled else None,
        views=comp[0].views)


# Perplexities within 10% of each other are called the same: a 512-token sample moves them by a few percent.
SINK_TOLERANCE = 0.10


@dataclass(frozen=True)
class SinkValue:
    """StreamingLLM against the plain window at one budget: what keeping the first tokens is worth (Xiao et al.
    2024, §3: without the sinks perplexity explodes once the first tokens leave the cache)."""

    budget: int
    window_perplexity: float
    streaming_perplexity: float

    @property
    def ratio(self) -> float:
        """How many times the window's perplexity is StreamingLLM's (above 1: the sinks help)."""
        return self.window_perplexity / self.streaming_perplexity

    @property
    def verdict(self) -> str:
        """"helps" (the window's perplexity more than SINK_TOLERANCE above), "same" (within it) or "hurts"."""
        if self.ratio > 1 + SINK_TOLERANCE:
            return "helps"
        return "same" if self.ratio >= 1 / (1 + SINK_TOLERANCE) else "hurts"


def sink_values(rows: Sequence[Quality]) -> list[SinkValue]:
    """Every budget at which both the window and StreamingLLM were measured, in budget order."""
    window = {r.budget: r.perplexity for r in rows if r.method == "window"}
    return [SinkValue(r.budget, window[r.budget], r.perplexity) for r in sorted(
        (r for r in rows if r.method == "streaming" and r.budget in window), key=lambda r: r.budget)]


def eviction_budgets(shares: Sequence[float], seq_len: int) -> tuple[list[int], list[float]]:
    """The positions each eviction method keeps for the shares of a chunk asked for, and the shares that were raised:
    SnapKV needs its observation window and one more position, so a smaller share is raised for every method (all
    run at the same budgets)."""
    from kvviz.compression.eviction import SNAPKV_WINDOW

    least = SNAPKV_WINDOW + 1
    return sorted({max(least, round(s * seq_len)) for s in shares}), [s for s in shares if round(s * seq_len) < least]


def chunk_steps(seq_len: int) -> tuple[int, tuple[int, ...]]:
    """A chunk's prompt (its first half) and the decode steps whose kept positions and attention are recorded."""
    n_prompt = seq_len // 2
    return n_prompt, tuple(sorted({round(f * (seq_len - n_prompt - 1)) for f in (0, 0.25, 0.5, 0.75, 1)}))


def all_methods(budgets: list[int], *, native: bool, n_kv_heads: int) -> list[Method]:
    """Every method the page compares: each eviction policy at each budget; on kvviz's own decoder also every
    stored format (KIVI's int8, int4 and KIVI-2, fp8), and head pooling (GQA halves the KV heads when it can, MQA
    keeps one)."""
    from kvviz.compression.eviction import EVICTION
    from kvviz.compression.quant import FP8_SCALES

    out = [Method(name, budget=b) for b in budgets for name in EVICTION]
    if native:  # each stored format; float8 with each of vLLM's two ways to set its scales
        for name in QUANT:
            out += [Method(name, kv_scale=how) for how in FP8_SCALES] if Method(name).tensor_scaled else [Method(name)]
        if n_kv_heads % 2 == 0 and n_kv_heads > 2:
            out.append(Method("gqa", kv_heads=n_kv_heads // 2))
        if n_kv_heads > 1:
            out.append(Method("mqa"))
    return out


def quality_report(backend: Backend, methods: list[Method], text: str | None = None, *, text_name: str | None = None,
                   seq_len: int, n_tokens: int = DEFAULT_TOKENS, kv_dtype: str = "bfloat16") -> dict:
    """`evaluate` as one table: each method's row headed by the model's shape, the dtype it ran in, the text (the
    held-out split when None) and the chunking, the same shape however many methods (`kvviz compress --json`)."""
    rows = evaluate(backend, methods, text if text is not None else held_out_text(), seq_len=seq_len,
                    n_tokens=n_tokens, kv_dtype=kv_dtype)
    spec = backend.spec
    n_prompt = seq_len // 2
    common = {"model": spec.name, "kind": spec.attention_kind, "n_layers": spec.n_layers, "n_heads": spec.n_heads,
              "n_kv_heads": spec.n_kv_heads, "d_head": spec.d_head,
              "dtype": str(backend.dtype).removeprefix("torch."),
              "text": text_name or "held-out split (kvviz/assets/held_out)", "seq_len": seq_len, "n_prompt": n_prompt,
              "n_chunks": rows[0].n_predicted // (seq_len - n_prompt)}
    return {"results": [{**common, **r.to_dict()} for r in rows]}
