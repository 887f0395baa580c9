"""Requests served through the tiered store and measured: what each tier gave, what it cost, what recomputing the
same tokens costs here, and why each loaded prefix ends where it does. All model work runs in quiet()."""
from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kvviz.engine.backends.native import NativeBackend
from kvviz.engine.device import synchronize
from kvviz.engine.generation import Generation
from kvviz.engine.metrics import Spread, spread
from kvviz.engine.offload.store import TIERS, Loaded, Saved, TieredStore, copy_into, namespace
from kvviz.engine.paged.demo import shared_prefix_ids, suffix_ids
from kvviz.engine.timing import quiet, warm_up
from kvviz.engine.tolerance import Agreement, agreement, magnitude
from kvviz.errors import InputError
from kvviz.kv.formula import kv_footprint


def _prefill_s(backend: NativeBackend, ids: Sequence[int]) -> float:
    """One prefill of these tokens from nothing: the time to compute their K/V (and a first token)."""
    return Generation(backend, max_new_tokens=1, stop_at_eos=False).prefill(list(ids)).seconds


@dataclass
class Served:
    """One request through the store, measured once as it happened; recomputing it measured `repeats` times."""

    prompt_tokens: int
    loaded: Loaded
    prefill_s: float  # the rest of the prompt, after the load
    ttft_s: float  # lookup + load + prefill of the rest + the first token
    recompute_s: Spread | None  # the loaded tokens computed instead of loaded (None: nothing loaded)
    ttft_recompute_s: Spread  # the whole prompt computed, no store
    logits: Agreement  # last-position logits after the load vs a full recompute
    same_first_token: bool
    saved: Saved

    def to_dict(self) -> dict:
        ld = self.loaded
        return {
            "prompt_tokens": self.prompt_tokens,
            "tokens_by_tier": {**ld.tokens_by_tier, "computed": self.prompt_tokens - ld.n_tokens},
            "bytes_loaded": ld.bytes_by_tier,
            "load_s": ld.seconds_by_tier,
            "lookup_s": ld.lookup_s,
            "prefill_s": self.prefill_s,
            "recompute_s": None if self.recompute_s is None else self.recompute_s.median,
            "ttft_s": self.ttft_s,
            "ttft_recompute_s": self.ttft_recompute_s.median,
            "recompute_repeats": self.ttft_recompute_s.n,
            "miss_reason": ld.miss.to_dict(),
            "chunks": [list(c) for c in ld.chunks],
            "stored_chunks": self.saved.n_chunks,
            "stored_bytes": self.saved.bytes,
            "store_s": self.saved.seconds,
            "max_abs_logit_diff": self.logits.diff,
            "logit_rounding_tolerance": self.logits.tolerance,
            "logits_equal_up_to_rounding": self.logits.within,
            "same_first_token": self.same_first_token,
        }


def serve(backend: NativeBackend, store: TieredStore, prompt_ids: Sequence[int], *, repeats: int = 3) -> Served:
    """Load the longest stored prefix, prefill the rest, emit the first token, store the new chunks; then the same
    prompt recomputed whole and its loaded tokens recomputed alone, each `repeats` times (the median is kept)."""
    ids = list(prompt_ids)
    if not 1 <= len(ids) < backend.spec.max_context:
        raise InputError("prompt_too_long", n_tokens=len(ids), max_len=backend.spec.max_context)
    with quiet():
        cache = backend.new_cache(1, len(ids) + 1)
        synchronize(backend.device)
        t0 = time.perf_counter()
        loaded = store.load_prefix(ids, cache)
        gen = Generation(backend, max_new_tokens=1, stop_at_eos=False)
        event = gen.prefill(ids, past=cache)
        ttft = time.perf_counter() - t0
        saved = store.save(ids, gen.cache)
        fresh = backend.forward(torch.tensor([ids], device=backend.device), None, capture_attention=False,
                                all_logits=False).logits[:, -1].float()
        full, part = [], []
        for _ in range(repeats):
            full.append(_prefill_s(backend, ids))
            if loaded.n_tokens:
                part.append(_prefill_s(backend, ids[: loaded.n_tokens]))
    cached = gen.last_logits
    check = agreement(float((cached - fresh).abs().max()), backend.dtype, magnitude(cached, fresh),
                      backend.spec.d_model or 1)
    return Served(len(ids), loaded, event.seconds, ttft, spread(part), spread(full), check,
                  int(cached.argmax()) == int(fresh.argmax()), saved)


# ---- per-tier costs -------------------------------------------------------------------------------------------


@dataclass
class TierCost:
    """Bringing n tokens' K/V to the device from one tier vs computing them, each the median of `repeats`."""

    tier: str
    tokens: int
    bytes: int  # K/V bytes moved (the formula's, checked equal to the tensors')
    file_bytes: int | None  # disk: the files' size, safetensors header and checksum included
    load_s: Spread
    recompute_s: Spread

    @property
    def load_over_recompute(self) -> float:
        return self.load_s.median / self.recompute_s.median

    def to_dict(self) -> dict:
        return {**asdict(self), "load_over_recompute": self.load_over_recompute}


def tier_costs(backend: NativeBackend, directory: str | Path, *, n_chunks: int = 2, chunk_size: int = 256,
               repeats: int = 5) -> list[TierCost]:
    """The same n_chunks·chunk_size tokens loaded from memory, loaded from disk (page cache dropped before each
    read) and recomputed, interleaved `repeats` times."""
    n = n_chunks * chunk_size
    if n + 1 >= backend.spec.max_context:
        raise InputError("prompt_too_long", n_tokens=n + 1, max_len=backend.spec.max_context)
    ids = shared_prefix_ids(backend.tokenizer, n + 1)
    dtype = str(backend.dtype).removeprefix("torch.")
    big = 4 * kv_footprint(backend.spec, n, 1, dtype).total + 2**20
    store = TieredStore(directory, namespace(backend.spec, dtype), chunk_size=chunk_size, memory_bytes=big,
                        disk_bytes=big)
    infos = store.chunk_infos(ids)
    times: dict[str, list[float]] = {"memory": [], "disk": [], "recompute": []}
    with quiet():
        warm_up(backend)
        gen = Generation(backend, max_new_tokens=1, stop_at_eos=False)
        gen.prefill(ids)
        store.save(ids, gen.cache)
        for _ in range(repeats):
            for tier in TIERS:
                cache = backend.new_cache(1, n + 1)
                synchronize(backend.device)
                t0 = time.perf_counter()
                for info in infos:
                    chunk = store.memory.get(info.key, touch=False) if tier == "memory" else store.disk.get(info.key)
                    copy_into(cache, chunk, chunk_size)
                synchronize(backend.device)
                times[tier].append(time.perf_counter() - t0)
            times["recompute"].append(_prefill_s(backend, ids[:n]))
    moved = sum(store.memory.get(i.key, touch=False).nbytes for i in infos)
    files = sum(store.disk.files[i.key] for i in infos)
    return [TierCost(t, n, moved, files if t == "disk" else None, spread(times[t]), spread(times["recompute"]))
            for t in TIERS]


# ---- the demonstration --------------------------------------------------------------------------------------

# (what the request shows, its document, the question's index). "A*" is A with one token changed in its second
# chunk; "restart" reopens the store first (memory empty, disk read back); "corrupt" damages a file first. With
# 3 chunks of memory and 6 on disk: A*'s second chunk is pushed off the disk by C's (request 6) before A* returns.
SCRIPT = (("first", "A", 0), ("shared", "A", 1), ("changed", "A*", 2), ("other", "B", 3), ("from_disk", "A", 4),
          ("third", "C", 5), ("evicted", "A*", 6), ("restart", "A", 7), ("corrupt", "C", 8))


@dataclass
class OffloadDemo:
    """Nine requests through a small store, one advance() each: shared system prompts, a changed prompt, chunks
    pushed to disk and out of it, a restart, a damaged file. Capacities are whole chunks of K/V."""

    backend: NativeBackend
    directory: Path
    chunk_size: int = 256
    memory_chunks: int = 3
    disk_chunks: int = 6
    repeats: int = 3
    results: list[dict] = field(default_factory=list)
    store: TieredStore | None = None
    labels: dict[str, str] = field(default_factory=dict)  # chunk key -> "A1", "B2", "A*2"
    docs: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in (("chunk size", self.chunk_size), ("memory chunks", self.memory_chunks + 1),
                            ("disk chunks", self.disk_chunks + 1), ("repeats", self.repeats)):
            if value <= 0:
                raise InputError("positive_int", name=name, value=value)
        c, spec, tok = self.chunk_size, self.backend.spec, self.backend.tokenizer
        longest = 2 * c + c // 4 + 2 + 1
        if longest >= spec.max_context:
            raise InputError("moving.chunk_too_big", chunk=c, need=longest, max_len=spec.max_context)
        a = shared_prefix_ids(tok, 2 * c)
        changed = list(a)
        at = c + c // 2  # in the second chunk: the first chunk still hits
        changed[at] = 1 + (changed[at] % (spec.vocab_size - 1))  # another id, never 0 (BOS/EOS)
        self.docs = {"A": a, "A*": changed, "B": suffix_ids(spec.vocab_size, 2 * c, 101),
                     "C": suffix_ids(spec.vocab_size, 2 * c, 202)}
        self.dtype = str(self.backend.dtype).removeprefix("torch.")
        self.chunk_bytes = kv_footprint(spec, c, 1, self.dtype).total
        # Disk capacity counts whole files: half a chunk more leaves room for each file's header.
        self.memory_bytes = self.memory_chunks * self.chunk_bytes
        self.disk_bytes = self.disk_chunks * self.chunk_bytes + (self.chunk_bytes // 2 if self.disk_chunks else 0)
        self.store = TieredStore(self.directory, namespace(spec, self.dtype), chunk_size=c,
                                 memory_bytes=self.memory_bytes, disk_bytes=self.disk_bytes)
        for name, ids in self.docs.items():
            for i, info in enumerate(self.store.chunk_infos(ids)):
                self.labels.setdefault(info.key, f"{name}{i + 1}")
        self.warmed = False

    @classmethod
    def temporary(cls, backend: NativeBackend, **settings: int) -> OffloadDemo:
        """A demo whose disk tier lives in a fresh temporary folder of its own (one per browser session), removed
        with the demo when its session lets go of it."""
        path = Path(tempfile.mkdtemp(prefix="kvviz-offload-"))
        demo = cls(backend, path / "store", **settings)
        weakref.finalize(demo, shutil.rmtree, path, True)
        return demo

    @property
    def session_dir(self) -> Path:
        return Path(self.directory).parent

    @property
    def done(self) -> bool:
        return len(self.results) == len(SCRIPT)

    def prompt(self, step: int) -> list[int]:
        _, doc, q = SCRIPT[step]
        question = suffix_ids(self.backend.spec.vocab_size, self.chunk_size // 4 + 1 + q % 3, q)
        return self.docs[doc] + question

    def label(self, key: str) -> str:
        return self.labels.get(key, key[:6])

    def corrupt(self, doc: str) -> str | None:
        """Flip one byte in the middle of the file of the document's first chunk; returns its label (None when
        that chunk is not on disk)."""
        key = self.store.chunk_infos(self.docs[doc])[0].key
        if key not in self.store.disk:
            return None
        path = self.store.disk.path(key)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        return self.label(key)

    def advance(self) -> dict:
        """Serve the next scripted request; returns its row (also kept in `results`)."""
        if self.done:
            raise InputError("finished")
        step = len(self.results)
        kind, doc, _ = SCRIPT[step]
        event = None
        if not self.warmed:
            with quiet():
                warm_up(self.backend)
            self.warmed = True
        if kind == "restart":
            self.store = self.store.reopen()
            event = {"restart": len(self.store.disk.files)}
        elif kind == "corrupt":
            event = {"corrupted": self.corrupt(doc)}
        ids = self.prompt(step)
        served = serve(self.backend, self.store, ids, repeats=self.repeats)
        row = {"request": step + 1, "kind": kind, "doc": doc, "event": event, **served.to_dict()}
        row["chunks"] = [[s, e, tier, self.label(info.key)] for (s, e, tier), info
                         in zip(served.loaded.chunks, self.store.chunk_infos(ids), strict=False)]
        row["evicted"] = {t: [self.label(k) for k in keys] for t, keys in self.store.request_evicted.items()}
        row["after"] = {t: [self.label(i.key) for i in infos] for t, infos in self.store.contents().items()}
        self.results.append(row)
        return row

    def run(self, progress: Callable[[int, int], None] | None = None) -> dict:
        while not self.done:
            self.advance()
            if progress:
                progress(len(self.results), len(SCRIPT))
        return self.summary()

    def summary(self) -> dict:
        spec = self.backend.spec
        return {
            "model": spec.name, "dtype": self.dtype, "device": str(self.backend.device),
            "chunk_size": self.chunk_size, "chunk_bytes": self.chunk_bytes,
            "bytes_per_token": kv_footprint(spec, 1, 1, self.dtype).total,
            "memory_bytes": self.memory_bytes, "disk_bytes": self.disk_bytes,
            "memory_chunks": self.memory_chunks, "disk_chunks": self.disk_chunks,
            "directory": str(self.store.disk.directory), "recompute_repeats": self.repeats,
            "requests": self.results,
        }


def offload_report(backend: NativeBackend, store_dir: str | Path | None = None, *, chunk_size: int = 256,
                   memory_chunks: int = 3, disk_chunks: int = 6, repeats: int = 3, tier_repeats: int = 5,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """The whole OffloadDemo and, unless tier_repeats is 0, the per-tier table (2 chunks loaded from memory, from
    disk, recomputed). The disk tier lives in `store_dir`, kept afterwards, or in a temporary folder removed at the
    end."""
    root = Path(store_dir or tempfile.mkdtemp(prefix="kvviz-offload-"))
    try:
        demo = OffloadDemo(backend, root / "store", chunk_size=chunk_size, memory_chunks=memory_chunks,
                           disk_chunks=disk_chunks, repeats=repeats)
        out = demo.run(progress)
        tiers = []
        if tier_repeats:
            tiers = [t.to_dict() for t in tier_costs(backend, root / "tiers", n_chunks=2, chunk_size=chunk_size,
                                                     repeats=tier_repeats)]
    finally:
        if not store_dir:
            shutil.rmtree(root, ignore_errors=True)
    return {**out, "tiers": tiers, "store_kept": bool(store_dir)}
