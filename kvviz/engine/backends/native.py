"""The native decoder as a backend: our Decoder plus its static KVCache."""
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

    @property
    def weights(self) -> str:
        """"float" (the model's dtype) or "int8" (per-channel int8 matrices, see Decoder.fuse)."""
        return self.model.weights

    def use_weights(self, weights: str) -> None:
        self.model.fuse(weights)

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        return self.model.new_cache(batch_size, max_len)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, cache: KVCache | None, *, capture_attention: bool, all_logits: bool
    ) -> ForwardResult:
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
