"""The protocol every backend implements, so the engine and pages never care which model runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..tokenizer import Tokenizer


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
    mla: bool = False  # multi-head latent attention (DeepSeek): K/V come from a compressed latent

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
