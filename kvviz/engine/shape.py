"""The native models' descriptions, known before any weight is allocated (no torch): the shipped model's,
a custom shape's size and name, and the limit the sidebar enforces."""
from __future__ import annotations

from functools import cache
from pathlib import Path

from kvviz.engine.config import DecoderConfig
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec
from kvviz.kv.reader import parse_hf_config

TINY_DIR = Path(__file__).parents[1] / "assets" / "tiny"  # the shipped model (see its MODEL_CARD.md)
TINY_NAME = "kvviz-tiny"

# A seeded random model is built on the server for every new shape: keep it to what a laptop CPU holds.
MAX_CUSTOM_PARAMS = 300_000_000


def parameter_count(cfg: DecoderConfig) -> int:
    """Parameters of the Llama-style decoder of this shape (equals Decoder(cfg).num_parameters())."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * cfg.d_ff + 2 * d  # attention, SwiGLU, two RMSNorms
    per_layer += (q + 2 * kv if cfg.qkv_bias else 0) + (d if cfg.o_bias else 0)  # Qwen2's / Llama's biases
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return cfg.vocab_size * d + cfg.n_layers * per_layer + d + head


def native_spec(cfg: DecoderConfig, name: str = "") -> KVSpec:
    """The native decoder's KV description: its config as a Llama config.json, through the one reader."""
    return parse_hf_config(cfg.to_hf_dict(), name).with_params(parameter_count(cfg), "counted")


def check_custom_shape(cfg: DecoderConfig, max_params: int = MAX_CUSTOM_PARAMS) -> DecoderConfig:
    n = parameter_count(cfg)
    if n > max_params:
        raise InputError("shape.too_large", params=f"{n:,}", limit=f"{max_params:,}")
    return cfg


@cache
def shipped_spec() -> KVSpec:
    """The shipped model's description from its config.json alone: no weights read, no torch imported."""
    return native_spec(DecoderConfig.load(TINY_DIR / "config.json"), TINY_NAME)


def fetched_spec(name: str) -> KVSpec:
    """A fetched model's description from its converted config.json alone (no weights read, no torch)."""
    from kvviz.engine import fetch

    return native_spec(DecoderConfig.load(fetch.model_dir(name) / "config.json"), fetch.model_info(name).title)


def random_name(cfg: DecoderConfig) -> str:
    """A custom shape's model name, as captions and the checks show it."""
    return f"random L{cfg.n_layers} H{cfg.n_heads}/{cfg.n_kv_heads} d{cfg.d_head}"


def config_spec(path: str | Path) -> KVSpec:
    """A model's description from a config path: a kvviz model directory (the shipped model, a fetched one) from
    its own config, counted exactly; anything else as a Hugging Face config.json (or its directory)."""
    from kvviz.kv.reader import load_hf_config

    folder = Path(path)
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return native_spec(DecoderConfig.load(folder / "config.json"), folder.name)
    return load_hf_config(path)
