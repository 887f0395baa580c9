"""Turn a model name into a ready backend: the shipped model, a seeded random shape, or a directory."""
from __future__ import annotations

import os

from .backends.base import Backend
from .backends.hf_policy import HFPolicy, policy_from
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
    hf_policy: HFPolicy | None = None,
) -> Backend:
    if model == "random":
        return random_backend(shape or DecoderConfig(), seed=seed, dtype=dtype, device=device)
    if model.strip() and model != "tiny":
        from .backends.hf import load_hf_backend  # transformers is imported only when an HF model is asked for

        # The web UI passes its policy (env + secrets); the CLI reads the environment.
        policy = hf_policy if hf_policy is not None else policy_from(os.environ)
        return load_hf_backend(model, dtype=dtype, device=device, policy=policy)
    raise InputError("unknown_model", name=model)
