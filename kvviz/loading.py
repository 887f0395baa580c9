"""Turn a model name into a ready backend: the shipped model, a seeded random shape, or a directory."""
from __future__ import annotations

from .backends.native import NativeBackend
from .config import DecoderConfig
from .errors import InputError
from .device import parse_dtype, resolve_device
from .model import Decoder
from .tokenizer import ByteTokenizer


def random_backend(cfg: DecoderConfig, *, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> NativeBackend:
    """The 'custom shape' model: seeded random init of any shape (mechanics only, no meaning)."""
    torch_dtype, torch_device = parse_dtype(dtype), resolve_device(device)
    model = Decoder(cfg).init_weights(seed).to(device=torch_device, dtype=torch_dtype)
    name = f"random L{cfg.n_layers} H{cfg.n_heads}/{cfg.n_kv_heads} d{cfg.d_head}"
    return NativeBackend(model, ByteTokenizer(cfg.vocab_size), name)


def load_backend(
    model: str = "tiny",
    *,
    dtype: str = "float32",
    device: str = "auto",
    shape: DecoderConfig | None = None,
    seed: int = 0,
) -> NativeBackend:
    if model == "random":
        return random_backend(shape or DecoderConfig(), seed=seed, dtype=dtype, device=device)
    raise InputError("unknown_model", name=model)
