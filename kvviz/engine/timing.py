"""Measuring in quiet: what the process does while a timed pass runs, and how noisy the machine is now.

A page measures the model inside `quiet()` and draws only afterwards. Inside, the garbage collector
is paused (a collection of the previous run's objects otherwise lands inside a pass) and torch's
intra-op thread count is fixed to `measure_threads()`: one core is left to the browser and the
server, because on a loaded machine a parallel op waits for its slowest thread, so one thread
descheduled by another process stalls the whole pass.
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from kvviz.engine.backends.base import Backend
from kvviz.engine.device import synchronize
from kvviz.engine.generation import Generation
from kvviz.engine.machine import cpu_load

_lock = threading.Lock()
_depth = 0  # quiet() regions open in this process (any thread): the probe tests read


def measure_threads(cores: int | None = None) -> int:
    """Torch threads for a measurement: every core but one (left to the browser and the server), at least 1."""
    cores = cores if cores is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else os.cpu_count() or 1)
    return max(1, cores - 1)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with n CPU threads (None: unchanged). Hundreds of one-token passes through a small model are bound
    by op count: one thread beats two on a shared CPU by an order of magnitude (measured on the tiny model)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def in_quiet() -> bool:
    """True while any thread of this process is inside quiet(): a probe for tests that nothing draws then."""
    return _depth > 0


@contextlib.contextmanager
def quiet(threads: int | None = None) -> Iterator[None]:
    """A timed region: no garbage collection, a fixed torch thread count; both restored afterwards."""
    n = threads or measure_threads()
    before_threads, gc_was_on = torch.get_num_threads(), gc.isenabled()
    if before_threads != n:
        torch.set_num_threads(n)
    gc.disable()
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
        if gc_was_on:
            gc.enable()
        if torch.get_num_threads() != before_threads:
            torch.set_num_threads(before_threads)


@dataclass(frozen=True)
class Noise:
    """How much identical passes vary right now: p50, p90 and their ratio, plus the CPU load."""

    n_passes: int
    p50_s: float
    p90_s: float
    load: float | None
    cores: int | None

    @property
    def p90_over_p50(self) -> float:
        return self.p90_s / self.p50_s

    @property
    def level(self) -> str:
        """quiet | busy | noisy: quiet below p90/p50 = 1.25 and a load under the cores; noisy from 2 (or 2×cores)."""
        ratio = self.p90_over_p50
        load = self.load / self.cores if self.load is not None and self.cores else 0.0
        if ratio >= 2.0 or load >= 2.0:
            return "noisy"
        if ratio >= 1.25 or load >= 1.0:
            return "busy"
        return "quiet"


def _one_token_passes(backend: Backend, n: int) -> list[float]:
    """Wall times of n identical one-token passes (no cache), synchronized on CUDA."""
    x = torch.tensor([[backend.tokenizer.encode("a")[0]]], device=backend.device)
    times = []
    with torch.inference_mode():
        for _ in range(n):
            synchronize(backend.device)
            t0 = time.perf_counter()
            backend.forward(x, None, capture_attention=False, all_logits=False)
            synchronize(backend.device)
            times.append(time.perf_counter() - t0)
    return times


def noise_probe(backend: Backend, n_passes: int = 30) -> Noise:
    """Time the same one-token pass n_passes times (in quiet) and report their spread and the CPU load."""
    with quiet():
        times = _one_token_passes(backend, n_passes + 2)[2:]  # the first two warm the path
    load = cpu_load()
    return Noise(n_passes, float(np.percentile(times, 50)), float(np.percentile(times, 90)),
                 load[0] if load else None, load[1] if load else None)


def settle(backend: Backend, budget_s: float = 1.0, window: int = 8, steady: float = 1.15) -> float:
    """Untimed one-token passes until `window` of them in a row agree within `steady` (max ÷ min), or
    budget_s has passed; returns the seconds spent.

    A click reruns the page, and the browser redraws it on the same cores for a few hundred ms: a
    request timed right away shares the CPU with that redraw. Waiting until identical passes run
    steadily starts the timed runs after it, and costs nothing on a machine that is already quiet.
    """
    start = time.perf_counter()
    while time.perf_counter() - start < budget_s:
        times = _one_token_passes(backend, window)
        if max(times) <= steady * min(times):
            break
    return time.perf_counter() - start


def warm_up(backend: Backend) -> None:
    """A few short, untimed passes, so one-off costs (allocator growth, kernel choice) land in no timing."""
    Generation(backend, max_new_tokens=3, stop_at_eos=False).run([0] * min(8, backend.spec.max_context - 3))


@dataclass
class RepeatedRequest:
    """The same request measured `repeats` times as whole runs, a little per UI tick, always in quiet.

    advance() does model work only (prefill, decode steps) until its budget is spent, then returns so
    the page can draw; the first advance() warms the model up first, untimed. Safe across threads, as a sweep is:
    a Stop (or any rerun) can arrive while an older script thread is inside advance(); stop() raises a flag that
    advance() obeys after the pass under way, and an advance() that finds another running returns at once.
    """

    backend: Backend
    prompt_ids: list[int]
    max_new_tokens: int
    repeats: int = 3
    runs: list[Generation] = field(default_factory=list)
    warmed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def done(self) -> bool:
        return len(self.runs) == self.repeats and self.runs[-1].done

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def finished_runs(self) -> list[Generation]:
        return [g for g in self.runs if g.done]

    @property
    def passes_done(self) -> int:
        return sum(len(g.events) for g in self.runs)

    @property
    def passes_total(self) -> int:
        n_new = min(self.max_new_tokens, self.backend.spec.max_context - len(self.prompt_ids))
        return self.repeats * n_new

    def stop(self) -> None:
        """No more passes after the one under way (if any); the whole runs done are kept."""
        self._stop.set()

    def advance(self, budget_s: float = 1.0) -> None:
        """Model work until budget_s of wall time has passed (at least one pass), in quiet."""
        if not self._lock.acquire(blocking=False):
            return  # another thread is measuring: two would step the same generation at once
        try:
            start = time.perf_counter()
            with quiet():
                if not self.warmed:
                    warm_up(self.backend)
                    settle(self.backend)
                    self.warmed = True
                while not self.done and not self._stop.is_set():
                    gen = self.runs[-1] if self.runs and not self.runs[-1].done else None
                    if gen is None:
                        # Created right before its prefill: the queue is the wait before work starts, ~0 here.
                        gen = Generation(self.backend, max_new_tokens=self.max_new_tokens, stop_at_eos=False)
                        self.runs.append(gen)
                        gen.prefill(self.prompt_ids)
                    else:
                        gen.step()
                    if time.perf_counter() - start >= budget_s:
                        break
        finally:
            self._lock.release()
