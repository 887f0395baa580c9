"""Decoder shape: one dataclass that validates itself and maps onto a Hugging Face LlamaConfig."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from kvviz.errors import InputError

ROPE_TYPES = ("default", "linear", "llama3")
# transformers model types whose decoder is this one (Llama layout: RMSNorm, RoPE, GQA, SwiGLU), given the
# checks in from_hf_dict; anything else runs on the Hugging Face backend.
NATIVE_MODEL_TYPES = ("llama", "mistral", "qwen2")


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
    # Projection biases: Qwen2 biases Q/K/V only (hard-wired in transformers' Qwen2Attention); Llama's
    # `attention_bias=True` biases Q/K/V and O.
    qkv_bias: bool = False
    o_bias: bool = False
    # RoPE frequency scaling as transformers' rope_parameters (modeling_rope_utils: _compute_linear_scaling_
    # rope_parameters, _compute_llama3_parameters); "default" is plain RoPE.
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 0

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
        if self.rope_type not in ROPE_TYPES:
            raise InputError("model.native_unsupported", what=f"rope_type {self.rope_type}")
        if self.rope_factor <= 0 or (self.rope_type == "llama3" and (
                self.rope_original_max_len <= 0 or self.rope_high_freq_factor <= self.rope_low_freq_factor)):
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
        # Q/K/V bias without an O bias is Qwen2's layout, which LlamaConfig cannot say.
        qwen2 = self.qkv_bias and not self.o_bias
        out: dict[str, Any] = {
            "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
            "model_type": "qwen2" if qwen2 else "llama",
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
            "mlp_bias": False,
        }
        if not qwen2:
            out["attention_bias"] = self.o_bias
        if self.rope_type != "default":
            out["rope_scaling"] = {"rope_type": self.rope_type, "factor": self.rope_factor}
            if self.rope_type == "llama3":
                out["rope_scaling"] |= {"low_freq_factor": self.rope_low_freq_factor,
                                        "high_freq_factor": self.rope_high_freq_factor,
                                        "original_max_position_embeddings": self.rope_original_max_len}
        if self.bos_id is not None:
            out["bos_token_id"] = self.bos_id
        if self.eos_id is not None:
            out["eos_token_id"] = self.eos_id
        return out

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> DecoderConfig:
        """A transformers config.json (v4's rope_theta/rope_scaling or v5's rope_parameters) as this decoder's
        shape; InputError("model.native_unsupported") names what this decoder does not implement."""
        kind = hf.get("model_type", "llama")
        if kind not in NATIVE_MODEL_TYPES:
            raise InputError("model.native_unsupported", what=f"model_type {kind}")
        act = hf.get("hidden_act", "silu")
        if act != "silu" or hf.get("mlp_bias"):
            raise InputError("model.native_unsupported", what=f"MLP {act}{' with bias' if hf.get('mlp_bias') else ''}")
        if _has_sliding_window(hf):
            raise InputError("model.native_unsupported", what=f"sliding window {hf.get('sliding_window')}")
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        heads = hf["num_attention_heads"]
        bias = kind == "qwen2" or bool(hf.get("attention_bias"))
        eos = hf.get("eos_token_id")
        return cls(
            n_layers=hf["num_hidden_layers"],
            d_model=hf["hidden_size"],
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            d_head=hf.get("head_dim") or 0,
            d_ff=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_id=hf.get("bos_token_id"),
            eos_id=eos[0] if isinstance(eos, list) and eos else eos if isinstance(eos, int) else None,
            qkv_bias=bias,
            o_bias=bias and kind != "qwen2",
            rope_type=rope_type,
            rope_factor=float(rope.get("factor", 1.0)),
            rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            rope_original_max_len=int(rope.get("original_max_position_embeddings", 0)),
        )


def _has_sliding_window(hf: dict[str, Any]) -> bool:
    """Does any layer attend through a window shorter than the context (Mistral v0.1, Qwen2 with
    use_sliding_window)? Read by the one KV reader, which knows every config's way of saying it."""
    from kvviz.kv.reader import parse_hf_config

    try:
        return parse_hf_config(hf).n_sliding_layers > 0
    except InputError:
        return False  # the shape itself is checked by DecoderConfig
