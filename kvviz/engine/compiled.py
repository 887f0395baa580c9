"""The native decode step compiled once per model, dtype and batch shape, as gpt-fast compiles decode_one_token:
one token per row written into the static cache at a position tensor (Decoder.step_static), so that no shape or
Python number in the step depends on the position and one graph serves every step. The graph is one layer
(model.static_layer), which every layer runs with its own weights and buffers, so compiling a 30-layer model costs
what one layer does (torch.compile's regional compilation). On CPU inductor fuses the small operations between the
matrix products (the products stay the calls prepack() chose, kvviz's float32 or int8 kernel or torch's packed
product, each one of kvviz's own operators in model.py); on CUDA the graph is also replayed as a CUDA graph
(torch.compile's mode="reduce-overhead"), one launch per layer instead of one per operation.

On a CPU where kvviz's C decode step runs the model (kernels/step.py: AVX2, float32 activations, every matrix on
kvviz's int8 or float32 kernel) the step is that instead ("kernels" mode): the whole step in one C call, as llama.cpp
computes a step's whole graph in C (step.c cites where), with nothing to compile but the C file, once per machine; a
step of more than one row runs uncompiled.

Where compiling is not possible (no C++ compiler, no Triton on a GPU, an operation the compiler refuses) the step
runs as before, uncompiled, and `why_not` says why in one line.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvviz.engine.cache import KVCache
from kvviz.engine.kernels import step as step_kernel
from kvviz.engine.model import static_layer

if TYPE_CHECKING:
    from kvviz.engine.model import Decoder

MODES = ("inductor", "cuda graphs", "kernels")


def mode_for(device: torch.device, model: Decoder | None = None) -> str:
    """CUDA graphs on a CUDA device (a small model's step is otherwise bound by kernel launches); on a CPU kvviz's C
    step where it runs `model` (kernels/step.py), inductor elsewhere."""
    if device.type == "cuda":
        return "cuda graphs"
    return "kernels" if model is not None and step_kernel.why_not(model) is None else "inductor"


def missing_compiler(device: torch.device) -> str | None:
    """Why torch.compile cannot build a step on this device, before trying; None when it can try."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "no Triton (the compiler inductor uses for CUDA) is installed"
    if device.type != "cpu":
        return f"torch.compile does not build {device.type} steps here"
    from torch._inductor import config  # the compilers inductor will search for (its cpp.cxx, CXX when set)

    names = [c for c in (config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)) if c]
    if not any(shutil.which(c) for c in names):
        return f"no C++ compiler ({', '.join(names) or 'none named'}) to build inductor's CPU kernels"
    return None


def one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}"[:200]


@dataclass
class Compiled:
    """What compiling a model's step cost, once it ran (or why it runs uncompiled)."""

    mode: str
    capture: bool  # the step that also returns attention probabilities (a graph of its own)
    first_step_s: float | None = None  # the first compiled step's wall time: tracing, compiling and one run
    why_not: str | None = None


class CompiledStep:
    """A model's decode step compiled on first use, for each capture flag; __call__ returns None when the step
    must run uncompiled (then `why_not` says why)."""

    def __init__(self, model: Decoder, device: torch.device, mode: str | None = None) -> None:
        self.model, self.device = model, torch.device(device)
        self.mode = mode or mode_for(self.device, model)  # "inductor" on CUDA too: the graph without CUDA graphs
        if self.mode not in MODES or (self.mode == "cuda graphs" and self.device.type != "cuda"):
            raise ValueError(f"compiled step mode {self.mode!r} on {self.device.type}")
        self.why_not = step_kernel.why_not(model) if self.mode == "kernels" else missing_compiler(self.device)
        self.compiles: dict[bool, Compiled] = {}
        self._fn = None
        if self.mode == "cuda graphs":
            _static_weights(model)

    def usable(self, input_ids: torch.Tensor, cache: KVCache) -> bool:
        """One new token per row on a plain KVCache (not compression's caches: they evict, quantize) whose layers all
        hold the same positions, with room for it."""
        if type(cache) is not KVCache:
            return False
        lengths = cache.lengths
        return (self.why_not is None and input_ids.shape[1] == 1 and lengths.count(lengths[0]) == len(lengths)
                and lengths[0] < cache.max_len
                and (self.mode != "kernels" or step_kernel.runs_on(cache)))

    def __call__(self, input_ids: torch.Tensor, cache: KVCache, *,
                 capture: bool) -> tuple[torch.Tensor, list[torch.Tensor] | None] | None:
        if not self.usable(input_ids, cache):
            return None
        if self.mode == "kernels":
            return self._kernel_step(input_ids, cache, capture)
        if self._fn is None:
            # fullgraph: a break would split the step into pieces and bring back the Python between them.
            self._fn = torch.compile(static_layer, fullgraph=True,
                                     mode="reduce-overhead" if self.mode == "cuda graphs" else None)
        _prepare(cache, self.device)
        n_keys = cache.length + 1
        pos = torch.tensor([cache.length], device=self.device)
        # On CPU a one-query step computes the probabilities anyway (model.attend), so one graph returns them and
        # serves both kinds of step; on CUDA the step without them keeps the fused attention kernel.
        traced = capture or self.device.type == "cpu"
        first = traced not in self.compiles
        t0 = time.perf_counter()
        if self.mode == "cuda graphs":
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's graph outputs may be reused
        try:
            logits, probs = self.model.step_static(input_ids, cache, pos, capture=traced, layer_step=self._layer)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the step runs as before, saying why
            self.why_not = one_line(exc)
            self.compiles[traced] = Compiled(self.mode, traced, why_not=self.why_not)
            return None
        if first:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.compiles[traced] = Compiled(self.mode, traced, first_step_s=time.perf_counter() - t0)
        cache.advance(1)
        if not capture:  # the logits come from the uncompiled head: a tensor of their own
            return logits, None
        # A CUDA graph's outputs are overwritten by its next replay: the rows kept are copied out.
        return logits, [p[..., :n_keys].clone() if self.mode == "cuda graphs" else p[..., :n_keys] for p in probs]

    def _kernel_step(self, input_ids: torch.Tensor, cache: KVCache,
                     capture: bool) -> tuple[torch.Tensor, list[torch.Tensor] | None] | None:
        """The step in kvviz's C (kernels/step.py) on a plan of the model's matrices and the cache's buffers, made
        again when either changed (a new fuse(), a new cache); None, saying why, where the model no longer suits it
        (its matrices changed under the step: .to(), train(), another dtype)."""
        plan = getattr(cache, "_step_plan", None)
        if plan is None or not plan.current(self.model, cache):
            if (why := step_kernel.why_not(self.model, cache)) is not None:
                self.why_not = why
                return None
            plan = cache._step_plan = step_kernel.Plan(self.model, cache)
        first = capture not in self.compiles
        t0 = time.perf_counter()
        pos = cache.length
        logits, probs = step_kernel.run(plan, self.model.embed(input_ids), self.model.rope_cos[pos],
                                        self.model.rope_sin[pos], pos, capture=capture)
        if first:
            self.compiles[capture] = Compiled(self.mode, capture, first_step_s=time.perf_counter() - t0)
        cache.advance(1)
        return logits, None if probs is None else list(probs[..., : pos + 1])

    def _layer(self, *args: torch.Tensor | torch.nn.Module, capture: bool) -> tuple:
        """The compiled layer, its mask's length marked dynamic as the buffers' are (one graph for any cache size)."""
        torch._dynamo.maybe_mark_dynamic(args[-1], 1)
        return self._fn(*args, capture=capture)

    @torch.inference_mode()
    def warm_up(self, batch_size: int = 1, *, capture: bool = False) -> Compiled | None:
        """Compile now, on a scratch cache of a few positions (the length is dynamic: a request's own cache reuses
        the graph), so that no request's first step pays for it: what it cost, or None when it cannot compile."""
        cache = self.model.new_cache(batch_size, 4)
        ids = torch.zeros(batch_size, 1, dtype=torch.long, device=self.device)
        if self(ids, cache, capture=capture) is None:
            return None
        return self.compiles[capture or (self.device.type == "cpu" and self.mode == "inductor")]


def _static_weights(model: Decoder) -> None:
    """On CUDA graphs: the fused matrices' addresses marked static (parameters are already), so that a replay reads
    them where they are instead of copying each into the graph's inputs every step."""
    from kvviz.engine.model import Int8Weight

    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        for w in (a.qkv_weight, a.qkv_bias, a.o_weight, m.gate_up_weight, m.down_weight):
            for t in (w.q, w.scale) if isinstance(w, Int8Weight) else (w,) if isinstance(w, torch.Tensor) else ():
                torch._dynamo.mark_static_address(t, guard=False)


def _prepare(cache: KVCache, device: torch.device) -> None:
    """Once per cache: its buffers' length marked dynamic (one graph for every cache size a request allocates), and
    on CUDA their addresses static (a CUDA graph writes into them in place)."""
    if getattr(cache, "_compiled_ready", False):
        return
    for buf in (*cache.k, *cache.v):
        torch._dynamo.maybe_mark_dynamic(buf, 2)
        if device.type == "cuda":
            torch._dynamo.mark_static_address(buf, guard=False)
    cache._compiled_ready = True
