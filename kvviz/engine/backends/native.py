"""The native decoder as a backend: our Decoder plus its static KVCache, its decode step compiled on request."""
from __future__ import annotations

import torch

from kvviz.engine.backends.base import ForwardResult
from kvviz.engine.cache import KVCache
from kvviz.engine.model import Decoder
from kvviz.engine.shape import native_spec
from kvviz.engine.tokenizer import Tokenizer
from kvviz.errors import InputError


class NativeBackend:
    def __init__(self, model: Decoder, tokenizer: Tokenizer, name: str) -> None:
        if tokenizer.vocab_size > model.cfg.vocab_size:
            raise InputError("vocab_mismatch", tokenizer=tokenizer.vocab_size, model=model.cfg.vocab_size)
        p = model.lm_head.weight
        self.model = model.eval().fuse()
        self.tokenizer = tokenizer
        self.device, self.dtype = p.device, p.dtype
        # The native config goes through the same reader as any Hugging Face config.json.
        self.spec = native_spec(model.cfg, name)
        self.kind = "native"
        self.compiled = None  # a CompiledStep once compile() is asked for
        self.c_step = None  # kvviz's C step for one page's own generations (kvviz.app.models.c_step), once asked for

    @property
    def weights(self) -> str:
        """"float" (the model's dtype) or "int8" (per-channel int8 matrices, see Decoder.fuse)."""
        return self.model.weights

    def use_weights(self, weights: str) -> None:
        self.model.fuse(weights)
        if self.compiled is not None:
            self.compile(self.compiled.mode)  # new matrices: a new graph

    def compile(self, mode: str | None = None):  # noqa: ANN201 - a CompiledStep (torch.compile set up when asked)
        """Decode steps compiled from now on (kvviz.engine.compiled; mode: "inductor", or "cuda graphs", CUDA's
        default): the first step compiles, later ones reuse it; where compiling is impossible, steps run as before
        and compiled.why_not says why."""
        from kvviz.engine.compiled import CompiledStep

        self.compiled = CompiledStep(self.model, self.device, mode)
        return self.compiled

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        return self.model.new_cache(batch_size, max_len)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, cache: KVCache | None, *, capture_attention: bool, all_logits: bool
    ) -> ForwardResult:
        if self.compiled is not None and cache is not None:  # CompiledStep.usable() says which caches it takes
            out = self.compiled(input_ids, cache, capture=capture_attention)
            if out is not None:
                return ForwardResult(*out)
        out = self.model(input_ids, cache, capture_attention=capture_attention, all_logits=all_logits)
        return ForwardResult(out.logits, out.attentions)

    def cache_lengths(self, cache: KVCache) -> list[int]:
        return list(cache.lengths)

    def cache_live_bytes(self, cache: KVCache) -> int:
        return cache.live_bytes()

    def cache_allocated_bytes(self, cache: KVCache) -> int:
        return cache.allocated_bytes()

    def layer_kv(self, cache: KVCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return cache.keys(layer), cache.values(layer)
