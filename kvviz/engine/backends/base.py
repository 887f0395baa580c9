"""The protocol every backend implements, so the engine and pages never care which model runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kvviz.engine.tokenizer import Tokenizer
from kvviz.kv.formula import KVSpec


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [B, T, V] (T = 1 when only the last position was asked for)
    attentions: list[torch.Tensor] | None  # per layer [B, n_heads, T_query, T_key]


class Backend(Protocol):
    arch: KVSpec
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
