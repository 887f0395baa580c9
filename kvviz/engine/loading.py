"""Turn a model name into a ready backend: the shipped model, a seeded random shape, or a directory."""
from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

from kvviz.engine.backends.base import Backend
from kvviz.engine.backends.hf_policy import HFPolicy, policy_from
from kvviz.engine.backends.native import NativeBackend
from kvviz.engine.config import DecoderConfig
from kvviz.engine.device import parse_dtype, resolve_device
from kvviz.engine.model import Decoder
from kvviz.engine.shape import TINY_DIR, TINY_NAME, random_name
from kvviz.engine.tokenizer import BPETokenizer, ByteTokenizer, Tokenizer
from kvviz.errors import InputError

CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _require(path: Path) -> Path:
    if not path.is_file():
        raise InputError("model.missing_file", path=path)
    return path


def read_config(path: Path) -> DecoderConfig:
    """config.json in our DecoderConfig format or in Hugging Face's Llama format."""
    try:
        data = json.loads(_require(path).read_text(encoding="utf-8"))
        return DecoderConfig.from_hf_dict(data) if "hidden_size" in data else DecoderConfig.from_dict(data)
    except InputError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError("model.corrupt_file", path=path, reason=_one_line(exc)) from None


def read_weights(path: Path, cfg: DecoderConfig) -> Decoder:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(_require(path)))
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError("model.corrupt_file", path=path, reason=_one_line(exc)) from None
    if cfg.tie_embeddings:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight"))  # HF omits the tied copy
    # Built on the CPU (a meta-device build would import torch._dynamo: seconds on first use).
    model = Decoder(cfg)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except (RuntimeError, TypeError) as exc:
        raise InputError("model.weights_mismatch", path=path, reason=_one_line(exc)) from None
    if cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def read_tokenizer(path: Path) -> BPETokenizer:
    try:
        return BPETokenizer(_require(path))
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
        raise InputError("model.corrupt_file", path=path, reason=_one_line(exc)) from None


def load_directory(
    directory: str | Path, *, dtype: str = "float32", device: str = "auto", name: str | None = None
) -> NativeBackend:
    """A kvviz-format directory: config.json, model.safetensors and tokenizer.json."""
    directory = Path(directory)
    torch_dtype, torch_device = parse_dtype(dtype), resolve_device(device)
    cfg = read_config(directory / "config.json")
    tokenizer = read_tokenizer(directory / "tokenizer.json")
    model = read_weights(directory / "model.safetensors", cfg).to(device=torch_device, dtype=torch_dtype)
    return NativeBackend(model, tokenizer, name or directory.name)


@cache
def shipped_tokenizer() -> BPETokenizer:
    return read_tokenizer(TINY_DIR / "tokenizer.json")


def tokenizer_for(cfg: DecoderConfig) -> Tokenizer:
    """The shipped BPE when the vocabulary holds it (readable words), else raw UTF-8 bytes."""
    bpe = shipped_tokenizer()
    return bpe if cfg.vocab_size >= bpe.vocab_size else ByteTokenizer(cfg.vocab_size)


def random_backend(cfg: DecoderConfig, *, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> NativeBackend:
    """The 'custom shape' model: seeded random init of any shape (mechanics only, no meaning)."""
    torch_dtype, torch_device = parse_dtype(dtype), resolve_device(device)
    model = Decoder(cfg).init_weights(seed).to(device=torch_device, dtype=torch_dtype)
    name = random_name(cfg)
    return NativeBackend(model, tokenizer_for(cfg), name)


def load_backend(
    model: str = "tiny",
    *,
    dtype: str = "float32",
    device: str = "auto",
    shape: DecoderConfig | None = None,
    seed: int = 0,
    hf_policy: HFPolicy | None = None,
) -> Backend:
    """tiny (shipped), random (custom shape), a kvviz directory (native), or a transformers directory or
    hub id (the Hugging Face backend)."""
    if model == "tiny":
        return load_directory(TINY_DIR, dtype=dtype, device=device, name=TINY_NAME)
    if model == "random":
        return random_backend(shape or DecoderConfig(), seed=seed, dtype=dtype, device=device)
    if Path(model).is_dir() and not _is_transformers_dir(Path(model)):
        return load_directory(model, dtype=dtype, device=device)
    if model.strip():
        from kvviz.engine.backends.hf import (
            load_hf_backend,  # transformers is imported only when an HF model is asked for
        )

        # The web UI passes its policy (env + secrets); the CLI reads the environment.
        policy = hf_policy if hf_policy is not None else policy_from(os.environ)
        return load_hf_backend(model, dtype=dtype, device=device, policy=policy)
    raise InputError("unknown_model", name=model)


def _is_transformers_dir(directory: Path) -> bool:
    """A save_pretrained() directory names its model_type; a kvviz one holds DecoderConfig fields."""
    try:
        return "model_type" in json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # the native loader names the missing or broken file
