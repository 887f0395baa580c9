"""Per-layer preallocated K/V buffers with a position counter (as gpt-fast and HF's StaticLayer), and the contract
every cache Decoder.forward() runs with (DecodeCache).

The cache is request-local: it is passed into Decoder.forward(), never stored on the model,
so one shared model can serve many sessions, each with its own cache.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from kvviz.errors import InputError


@runtime_checkable
class DecodeCache(Protocol):
    """What Decoder.forward() asks of a cache: the positions each layer holds, the rotary position of the next
    token, and appending a pass's new K/V to a layer, which returns the keys and values the pass attends to.
    KVCache, the speculative drafts' caches (KVCache) and kvviz.compression's EvictingCache and QuantizedCache
    keep it; the paged pool (kvviz.engine.paged.kv.PagedKV) is addressed by slots in Decoder.forward_paged instead."""

    @property
    def lengths(self) -> list[int]: ...

    @property
    def length(self) -> int: ...

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class KVCache:
    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        max_len: int,
        d_head: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if min(n_layers, batch_size, n_kv_heads, max_len, d_head) <= 0:
            smallest = min(n_layers, batch_size, n_kv_heads, max_len, d_head)
            raise InputError("positive_int", name="cache size", value=smallest)
        shape = (batch_size, n_kv_heads, max_len, d_head)
        # Preallocated once: appending is a copy into a slice, never a reallocation.
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.lengths = [0] * n_layers
        self.max_len = max_len

    @property
    def n_layers(self) -> int:
        return len(self.k)

    @property
    def length(self) -> int:
        """Cached positions (the same in every layer between forward passes)."""
        return self.lengths[0]

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions' K/V after the cached ones; return views of the whole prefix."""
        start = self.lengths[layer]
        end = start + k_new.shape[2]
        if end > self.max_len:
            raise InputError("cache_full", n_tokens=end, max_len=self.max_len)
        self.k[layer][:, :, start:end] = k_new
        self.v[layer][:, :, start:end] = v_new
        self.lengths[layer] = end
        return self.keys(layer), self.values(layer)

    def keys(self, layer: int) -> torch.Tensor:
        return self.k[layer][:, :, : self.lengths[layer]]

    def values(self, layer: int) -> torch.Tensor:
        return self.v[layer][:, :, : self.lengths[layer]]

    def crop(self, length: int, layers: range | None = None) -> int:
        """Forget every position from `length` on, in place: each layer's counter is set back and nothing is copied
        or freed (the next append overwrites those slots), the effect of transformers' DynamicCache.crop, which
        slices its tensors to a view. Returns the positions removed, summed over the layers."""
        removed = 0
        for layer in layers if layers is not None else range(self.n_layers):
            if not 0 <= length <= self.lengths[layer]:
                raise ValueError(f"crop to {length}: layer {layer} holds {self.lengths[layer]} positions")
            removed += self.lengths[layer] - length
            self.lengths[layer] = length
        return removed

    def reset(self) -> None:
        self.lengths = [0] * self.n_layers

    def live_bytes(self) -> int:
        """Bytes of the positions actually cached, read off the tensor views."""
        return sum(self.keys(i).nbytes + self.values(i).nbytes for i in range(self.n_layers))

    def allocated_bytes(self) -> int:
        """Bytes reserved by the preallocated buffers, cached or not."""
        return sum(k.nbytes + v.nbytes for k, v in zip(self.k, self.v, strict=True))
