"""The real decode loop under a compressed cache: prefill a prompt, then feed the text one token at a time
(teacher forcing), each pass through the model with the compressed cache, keeping every next-token logit.

Native models run with an EvictingCache / QuantizedCache in place of the engine's KVCache; Hugging Face
models run their own DynamicCache, which an eviction policy shrinks after every pass.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvviz.compression.caches import EvictingCache, QuantizedCache, dtype_name
from kvviz.compression.eviction import EVICTION, STREAMING_SINKS, Policy, make_policy
from kvviz.compression.pooling import pool_kv_heads
from kvviz.engine.backends.base import Backend
from kvviz.engine.model import Decoder, apply_rotary, attend
from kvviz.errors import InputError
from kvviz.kv.formats import STORED_DTYPES, stored_dtype
from kvviz.kv.formula import KVSpec, kv_footprint

QUANT = STORED_DTYPES  # every format the one table of KV formats says kvviz stores (int8, int4, kivi2, fp8)
POOL = ("gqa", "mqa")
METHODS = ("full", *EVICTION, *QUANT, *POOL)
DEPLOY_DTYPES = ("bfloat16", "float16", "float32")  # KV dtypes a saving can be counted against


def method_family(name: str) -> str:
    """The family a method is charted as: eviction, a stored format's own (its table entry's), or sharing heads."""
    families = {"full": "full", **dict.fromkeys(EVICTION, "evict"), **dict.fromkeys(POOL, "share"),
                **{n: stored_dtype(n).stored.family for n in QUANT}}
    if name not in families:
        raise InputError("compression.unknown_method", name=name, choices=", ".join(METHODS[1:]))
    return families[name]


@dataclass(frozen=True)
class Method:
    name: str  # one of METHODS
    budget: int | None = None  # eviction: positions kept per layer and KV head
    sinks: int = STREAMING_SINKS  # streaming
    group: int | None = None  # KIVI's formats: group size G (None: the entry's, Stored.group_for)
    residual: int | None = None  # KIVI's formats: R, a multiple of G (None: the entry's R, Stored.residual_for)
    kv_heads: int | None = None  # gqa: KV heads after pooling (default: half of the model's); mqa: 1
    kv_scale: str = "default"  # fp8: vLLM's k/v_scale, "default" (1.0) or "calculate" (--calculate-kv-scales)

    @property
    def tensor_scaled(self) -> bool:
        """A format stored with one scale per layer tensor (float8), set as `kv_scale` says."""
        return self.name in QUANT and not stored_dtype(self.name).stored.grouped

    def label(self) -> str:
        if self.name in EVICTION:
            return f"{self.name} ({self.budget})"
        if self.name == "gqa":
            return f"gqa ({self.kv_heads})" if self.kv_heads else "gqa"
        if self.tensor_scaled:  # float8: how its scales were set
            return f"{self.name} (scale=1.0)" if self.kv_scale == "default" else f"{self.name} (--calculate-kv-scales)"
        return self.name


@dataclass
class StepView:
    """What one decode step looks like in the compressed cache: per layer, the original position of every kept
    key per KV head [H_kv, n_kept], and the new query's attention over them per query head [n_heads, n_kept]."""

    step: int
    position: int
    kept: list[np.ndarray]
    attention: list[np.ndarray]


@dataclass
class Trace:
    method: Method
    logits: torch.Tensor  # [M, V] float32: the prediction of each target token, in order
    kv_bytes: int  # measured from the stored tensors after the last pass
    formula_bytes: int  # the same through kvviz.kv.formula
    n_cached: int  # positions cached per layer after the last pass
    shape: KVSpec
    bookkeeping_bytes: int = 0  # positions / scores an eviction policy keeps beside K/V
    scale_bytes_outside_cache: int = 0  # fp8's per-layer tensor scales
    fp8_clipped: int = 0
    bytes_at: dict[str, int] = field(default_factory=dict)  # the same cache by the formula, full precision as each
    evicted: int = 0  # positions an eviction policy dropped, summed over layers (0: it left the cache whole)
    group: int | None = None  # KIVI's formats: the G and R used
    residual: int | None = None
    views: dict[int, StepView] = field(default_factory=dict)  # decode step → what the cache held then
    notes: list[str] = field(default_factory=list)

    @property
    def view(self) -> StepView | None:
        return next(iter(self.views.values()), None)


def kv_shape(backend: Backend) -> KVSpec:
    a = backend.spec
    if getattr(a, "kv_lora_rank", 0):
        raise InputError("compression.no_mla", name=a.name)
    return KVSpec(a.n_layers, a.n_heads, a.n_kv_heads, a.d_head)


def _rope_rotator(inv_freq: torch.Tensor):  # noqa: ANN202
    """rotate(k, delta): turn RoPE keys by delta positions (R(p + δ) = R(δ)·R(p), exact up to rounding)."""

    def rotate(k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        angles = delta.float().unsqueeze(-1) * inv_freq.to(k.device).float()
        cos = torch.cat([angles, angles], dim=-1).cos()
        signed_sin = torch.cat([-angles.sin(), angles.sin()], dim=-1)  # apply_rotary's table layout
        return apply_rotary(k.float(), cos, signed_sin).to(k.dtype)

    return rotate


def _native_rotator(model: Decoder):  # noqa: ANN202
    c = model.cfg
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.d_head, 2, dtype=torch.int64).float() / c.d_head))
    return _rope_rotator(inv)


def _hf_rotator(model: Any):  # noqa: ANN202, ANN401
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    inv = getattr(rotary, "inv_freq", None)
    d_head = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    if inv is None or 2 * inv.numel() != d_head:
        return None  # learned absolute positions (GPT-2) or partial RoPE: no exact re-rotation here
    # A scaled RoPE (YaRN) multiplies cos/sin once per key; turning by δ is the unscaled rotation R(δ).
    return _rope_rotator(inv)


def _view(step: int, position: int, kept: list[torch.Tensor], attentions: list[torch.Tensor]) -> StepView:
    return StepView(step, position, [k[0].cpu().numpy() for k in kept],
                    [a[0, :, -1].float().cpu().numpy() for a in attentions])


def _check(ids: list[int], n_prompt: int, method: Method) -> None:
    if not 1 <= n_prompt < len(ids):
        raise InputError("compression.bad_prompt", n_prompt=n_prompt, n_tokens=len(ids))
    if method.name not in METHODS:
        raise InputError("compression.unknown_method", name=method.name, choices=", ".join(METHODS[1:]))


def run_method(backend: Backend, ids: list[int], n_prompt: int, method: Method, *, view_step: int | None = None,
               view_steps: tuple[int, ...] = ()) -> Trace:
    """Prefill ids[:n_prompt], then feed ids[n_prompt:-1] one at a time; logits predict ids[n_prompt:].

    At each of view_steps (pass 0 = prefill) the kept positions and the newest query's attention are recorded."""
    steps = frozenset(view_steps) | ({view_step} if view_step is not None else frozenset())
    return drain(method_passes(backend, ids, n_prompt, method, steps))


def method_passes(backend: Backend, ids: list[int], n_prompt: int, method: Method,
                  view_steps: frozenset[int] = frozenset()) -> Generator[None, None, Trace]:
    """run_method one pass at a time: yields after each forward pass (len(ids) − n_prompt of them), returns the
    Trace, so a caller can show progress and stop between passes."""
    _check(ids, n_prompt, method)
    model = getattr(backend, "model", None)
    if isinstance(model, Decoder):
        return (yield from _run_native(backend, model, ids, n_prompt, method, view_steps))
    if method.name in QUANT or method.name in POOL:
        raise InputError("compression.native_only", method=method.name)
    return (yield from _run_hf(backend, ids, n_prompt, method, view_steps))


def drain(passes: Generator[None, None, Any]) -> Any:  # noqa: ANN401 - whatever the generator returns
    """Run a generator of passes to its end and return its value."""
    while True:
        try:
            next(passes)
        except StopIteration as stop:
            return stop.value


def _native_cache(backend: Backend, model: Decoder, method: Method, n_ids: int):  # noqa: ANN202
    """(model, shape, cache, policy, notes) a method runs with on kvviz's own decoder."""
    shape = kv_shape(backend)
    dtype, device = backend.dtype, backend.device
    policy: Policy | None = None
    notes: list[str] = []
    if method.name in EVICTION:
        policy = make_policy(method.name, _budget(method), sinks=method.sinks)
        cache: Any = EvictingCache(shape, 1, dtype, device, reposition=policy.reposition,
                                   rotate=_native_rotator(model))
    elif method.name in QUANT:
        stored = stored_dtype(method.name).stored  # KIVI's G and R: the method's, else the format's
        group = (method.group or stored.group_for(shape.d_head)) if stored.grouped else 0
        cache = QuantizedCache(shape, 1, dtype, device, method.name, kv_scale=method.kv_scale, group=group,
                               residual=(method.residual or stored.residual_for(group)) if group else 0)
    else:
        if method.name in POOL:
            target = 1 if method.name == "mqa" else (method.kv_heads or max(1, shape.n_kv_heads // 2))
            model = pool_kv_heads(model, target)
            shape = KVSpec(shape.n_layers, shape.n_heads, target, shape.d_head)
            notes.append(f"{backend.spec.n_kv_heads}→{target} KV heads by mean-pooling")
        cache = model.new_cache(1, n_ids)
    return model, shape, cache, policy, notes


def _kept(cache: Any, shape: KVSpec, device: torch.device) -> list[torch.Tensor]:  # noqa: ANN401
    """Original position of every cached key per layer [1, H_kv, n] (all of them unless a policy evicts)."""
    if isinstance(cache, EvictingCache):
        return cache.pos
    return [torch.arange(n, device=device).expand(1, shape.n_kv_heads, n) for n in cache.lengths]


def _run_native(backend: Backend, model: Decoder, ids: list[int], n_prompt: int, method: Method,
                view_steps: frozenset[int]) -> Generator[None, None, Trace]:
    model, shape, cache, policy, notes = _native_cache(backend, model, method, len(ids))
    x = torch.tensor([ids], device=backend.device)
    logits: list[torch.Tensor] = []
    views: dict[int, StepView] = {}
    for step in range(len(ids) - n_prompt):
        prefill = step == 0
        chunk = x[:, :n_prompt] if prefill else x[:, n_prompt + step - 1 : n_prompt + step]
        want_view = step in view_steps
        capture = prefill or want_view or bool(policy and policy.needs_attention)
        with torch.inference_mode():
            out = model(chunk, cache, capture_attention=capture, all_logits=False)
            logits.append(out.logits[0, -1].float())
            if want_view:
                views[step] = _view(step, n_prompt + step - 1, _kept(cache, shape, backend.device), out.attentions)
            if policy is not None:
                policy.after_pass(cache, out.attentions, prefill)
        yield
    return _trace(method, logits, cache, shape, backend.dtype, views, notes)


# Methods that run with the model's own weights, so they can decode as rows of one batch (pooling changes them).
BATCHED = ("full", *EVICTION, *QUANT)


def batchable(backend: Backend, method: Method) -> bool:
    return method.name in BATCHED and isinstance(getattr(backend, "model", None), Decoder)


def rows_passes(backend: Backend, ids: list[int], n_prompt: int, methods: list[Method],
                view_steps: frozenset[int] = frozenset()) -> Generator[None, None, list[Trace]]:
    """Every method of `methods` (each batchable) on the same ids, as rows of one batch: the prompt is prefilled
    once (every method's prefill is the same computation: nothing is compressed until its K/V are stored), then
    each decode pass reads the weights once for all rows, while each row keeps its own compressed cache, position
    and policy and attends to its own keys exactly as it would alone. Yields after each pass, returns one Trace per
    method, equal to run_method's up to the rounding of the batched matrix products (tests/compression)."""
    for m in methods:
        _check(ids, n_prompt, m)
        if not batchable(backend, m):
            raise InputError("compression.native_only", method=m.name)
    model: Decoder = backend.model
    device = backend.device
    x = torch.tensor([ids], device=device)
    setups = [_native_cache(backend, model, m, len(ids)) for m in methods]
    shape = setups[0][1]
    caches = [s[2] for s in setups]
    policies = [s[3] for s in setups]
    logits: list[list[torch.Tensor]] = [[] for _ in methods]
    views: list[dict[int, StepView]] = [{} for _ in methods]
    with torch.inference_mode():  # the shared prefill: its K/V then stored by each method's cache
        record = EvictingCache(shape, 1, backend.dtype, device)
        out = model(x[:, :n_prompt], record, capture_attention=True, all_logits=False)
        for r, cache in enumerate(caches):
            for layer in range(shape.n_layers):
                cache.append(layer, record.k[layer], record.v[layer])
            logits[r].append(out.logits[0, -1].float())
            if 0 in view_steps:
                views[r][0] = _view(0, n_prompt - 1, _kept(cache, shape, device), out.attentions)
            if policies[r] is not None:
                policies[r].after_pass(cache, out.attentions, True)
    yield
    rows = len(methods)
    for step in range(1, len(ids) - n_prompt):
        want_view = step in view_steps
        capture = [want_view or bool(p and p.needs_attention) for p in policies]
        with torch.inference_mode():
            token = x[:, n_prompt + step - 1 : n_prompt + step].expand(rows, 1)
            out_logits, attentions = _rows_pass(model, token, caches, capture)
            for r, cache in enumerate(caches):
                logits[r].append(out_logits[r, -1].float())
                if want_view:
                    views[r][step] = _view(step, n_prompt + step - 1, _kept(cache, shape, device), attentions[r])
                if policies[r] is not None:
                    policies[r].after_pass(cache, attentions[r], False)
        yield
    return [_trace(m, logits[r], caches[r], shape, backend.dtype, views[r], setups[r][4])
            for r, m in enumerate(methods)]


# Rows a batched pass computes its products over, at least: a one- to three-row product takes other CPU kernels
# (matrix-vector) than a wider one, which add in another order, while from four rows on each row's result is the
# same whatever the count (measured, torch 2.13 CPU). Padded to this, a method's numbers do not depend on how many
# other methods run beside it: alone with the full cache, or among all of them, it gets the very same logits.
MIN_ROWS = 8


def _rows_pass(model: Decoder, token: torch.Tensor, caches: list[Any],
               capture: list[bool]) -> tuple[torch.Tensor, list[list[torch.Tensor | None]]]:
    """One decode pass of B rows [B, 1], row r with caches[r]: Decoder.run_layers' steps with the projections,
    norms and MLP batched (over at least MIN_ROWS rows, the padding's attention left zero), and each row's rotary
    position, cache append and attention its own."""
    b = token.shape[0]
    n = max(b, MIN_ROWS)
    cfg = model.cfg
    hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    h = model.embed(token[:1].expand(n, 1))  # teacher forcing: every row reads the same token
    pos = torch.tensor([c.length for c in caches] + [0] * (n - b), device=token.device)
    cos = model.rope_cos[pos][:, None, None].to(h.dtype)  # [n, 1, 1, d_head]: each row at its own position
    sin = model.rope_sin[pos][:, None, None].to(h.dtype)
    pad = [torch.zeros(n - b, hq, 1, d, dtype=h.dtype, device=h.device)] if n > b else []
    attentions: list[list[torch.Tensor | None]] = [[] for _ in range(b)]
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        qkv = a.qkv(layer.input_layernorm.forward(h)).view(n, 1, hq + 2 * hkv, d)
        qk = apply_rotary(qkv[:, :, : hq + hkv], cos, sin)
        q, k, v = qk[:, :, :hq].transpose(1, 2), qk[:, :, hq:].transpose(1, 2), qkv[:, :, hq + hkv :].transpose(1, 2)
        outs = []
        for r, cache in enumerate(caches):
            k_r, v_r = cache.append(i, k[r : r + 1], v[r : r + 1])
            o, probs = attend(q[r : r + 1], k_r, v_r, None, capture=capture[r])
            outs.append(o)
            attentions[r].append(probs)
        out = torch.cat(outs + pad).transpose(1, 2).reshape(n, 1, hq * d)
        h = h + a.out(out)
        h = h + layer.mlp.forward(layer.post_attention_layernorm.forward(h))
    return model.head(h)[:b], attentions


def _budget(method: Method) -> int:
    if method.budget is None:
        raise InputError("compression.needs_budget", method=method.name)
    return method.budget


def _trace(method: Method, logits: list[torch.Tensor], cache: Any, shape: KVSpec, dtype: torch.dtype,
           views: dict[int, StepView], notes: list[str]) -> Trace:
    n = cache.lengths[0]
    if isinstance(cache, (EvictingCache, QuantizedCache)):
        measured, at = cache.kv_bytes(), {d: cache.formula_bytes(d) for d in DEPLOY_DTYPES}
    else:  # the engine's own KVCache
        measured, at = cache.live_bytes(), {d: kv_footprint(shape, n, 1, d).total for d in DEPLOY_DTYPES}
    quantized = isinstance(cache, QuantizedCache)
    return Trace(method, torch.stack(logits), measured, at[dtype_name(dtype)], n, shape,
                 bookkeeping_bytes=cache.bookkeeping_bytes() if isinstance(cache, EvictingCache) else 0,
                 scale_bytes_outside_cache=cache.tensor_scale_bytes() if quantized else 0,
                 fp8_clipped=cache.clipped if quantized else 0, bytes_at=at,
                 evicted=cache.evicted if isinstance(cache, EvictingCache) else 0,
                 group=cache.group if quantized and cache.grouped else None,
                 residual=cache.residual if quantized and cache.grouped else None,
                 views=views, notes=notes)


def _run_hf(backend: Backend, ids: list[int], n_prompt: int, method: Method,
            view_steps: frozenset[int]) -> Generator[None, None, Trace]:
    from transformers import DynamicCache

    shape = kv_shape(backend)
    model = backend.model
    policy = make_policy(method.name, _budget(method), sinks=method.sinks) if method.name in EVICTION else None
    notes: list[str] = []
    rotate = _hf_rotator(model)
    reposition = bool(policy and policy.reposition)
    if reposition and rotate is None:
        reposition = False  # positions live in the hidden state (learned embeddings): keep original ones
        notes.append("no RoPE to re-rotate: StreamingLLM kept original positions")
    dyn = DynamicCache(config=model.config)
    ecache = EvictingCache(shape, 1, backend.dtype, backend.device, reposition=reposition, rotate=rotate)
    x = torch.tensor([ids], device=backend.device)
    logits: list[torch.Tensor] = []
    views: dict[int, StepView] = {}
    for step in range(len(ids) - n_prompt):
        prefill = step == 0
        chunk = x[:, :n_prompt] if prefill else x[:, n_prompt + step - 1 : n_prompt + step]
        t = chunk.shape[1]
        kept = ecache.lengths[0]
        pos0 = ecache.length
        previous = model.config._attn_implementation
        # The same attention path for every pass (and its probabilities); set per pass, since the model is shared
        # and the loop may pause between passes.
        model.set_attn_implementation("eager")
        try:
            with torch.inference_mode():
                out = model(input_ids=chunk, cache=dyn, use_cache=True, output_attentions=True,
                            position_ids=torch.arange(pos0, pos0 + t, device=x.device)[None],
                            cache_position=torch.arange(kept, kept + t, device=x.device), logits_to_keep=1)
                logits.append(out.logits[0, -1].float())
                for i, layer in enumerate(dyn.layers):
                    ecache.append(i, layer.keys[:, :, kept:], layer.values[:, :, kept:])
                if step in view_steps:
                    views[step] = _view(step, n_prompt + step - 1, ecache.pos, list(out.attentions))
                if policy is not None:
                    policy.after_pass(ecache, list(out.attentions), prefill)
                for i, layer in enumerate(dyn.layers):
                    layer.keys, layer.values = ecache.k[i], ecache.v[i]
        finally:
            model.set_attn_implementation(previous)
        yield
    trace = _trace(method, logits, ecache, shape, backend.dtype, views, notes)
    trace.kv_bytes = backend.cache_live_bytes(dyn)  # what the model's own cache holds
    return trace
