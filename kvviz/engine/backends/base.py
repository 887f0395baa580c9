"""The protocol every backend implements, so the engine and pages never care which model runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kvviz.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class ArchInfo:
    """The architecture facts the pages need, read from the model's own config."""

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    vocab_size: int
    max_seq_len: int
    n_params: int
    kind: str = "native"  # native | hf
    # Multi-head latent attention (DeepSeek): a compressed latent and one shared RoPE key are cached.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_elems_per_token_per_layer(self) -> int:
        """Values one token leaves in one layer's cache: 2·H_kv·d_head (K and V), or the MLA latent + RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.mla else 2 * self.n_kv_heads * self.d_head

    @property
    def attention_kind(self) -> str:
        if self.mla:
            return "MLA"
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [B, T, V] (T = 1 when only the last position was asked for)
    attentions: list[torch.Tensor] | None  # per layer [B, n_heads, T_query, T_key]


class Backend(Protocol):
    arch: ArchInfo
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype

    def new_cache(self, batch_size: int, max_len: int) -> Any: ...

    def forward(
        self, input_ids: torch.Tensor, cache: Any | None, *, capture_attention: bool, all_logits: bool
    ) -> ForwardResult: ...

    def cache_lengths(self, cache: Any) -> list[int]: ...

    def cache_live_bytes(self, cache: Any) -> int: ...

    def cache_allocated_bytes(self, cache: Any) -> int: ...

    def layer_kv(self, cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, [B, n_kv_heads, cached positions, d_head]."""
        ...
