"""Decoder shape: one dataclass that validates itself and maps onto a Hugging Face LlamaConfig."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from kvviz.errors import InputError


@dataclass(frozen=True)
class DecoderConfig:
    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 8
    n_kv_heads: int = 2
    d_head: int = 0  # 0 = d_model // n_heads, as in Llama; set it for Gemma-style heads
    d_ff: int = 688
    vocab_size: int = 4096
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    bos_id: int | None = None
    eos_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InputError("positive_int", name=name, value=value)
        if self.n_heads % self.n_kv_heads:
            raise InputError("not_divisible", n_heads=self.n_heads, n_kv_heads=self.n_kv_heads)
        if self.d_head == 0:
            if self.d_model % self.n_heads:
                raise InputError("d_model_heads", d_model=self.d_model, n_heads=self.n_heads)
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_head < 0 or self.d_head % 2:
            raise InputError("d_head_even", d_head=self.d_head)
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise InputError("rope_norm")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DecoderConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """The same shape as a transformers LlamaConfig (architectures, field names)."""
        out: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.d_model,
            "intermediate_size": self.d_ff,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.d_head,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_seq_len,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }
        if self.bos_id is not None:
            out["bos_token_id"] = self.bos_id
        if self.eos_id is not None:
            out["eos_token_id"] = self.eos_id
        return out

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> DecoderConfig:
        heads = hf["num_attention_heads"]
        return cls(
            n_layers=hf["num_hidden_layers"],
            d_model=hf["hidden_size"],
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            d_head=hf.get("head_dim") or 0,
            d_ff=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_id=hf.get("bos_token_id"),
            eos_id=hf.get("eos_token_id") if isinstance(hf.get("eos_token_id"), int) else None,
        )
