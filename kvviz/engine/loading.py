"""Turn a model name into a ready backend: the name sorted into its kind once (resolve_model: the shipped model, a
seeded random shape, a fetched model, a GGUF file, a kvviz or transformers directory, a hub id), then loaded."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvviz.engine import fetch
from kvviz.engine.backends.base import Backend
from kvviz.engine.backends.hf_policy import HFPolicy, check_allowed, check_size, policy_from
from kvviz.engine.backends.native import NativeBackend
from kvviz.engine.config import DecoderConfig
from kvviz.engine.device import parse_dtype, resolve_device
from kvviz.engine.device_names import WEIGHTS
from kvviz.engine.model import Decoder
from kvviz.engine.shape import TINY_DIR, TINY_NAME, parameter_count, random_name
from kvviz.engine.tokenizer import BPETokenizer, ByteTokenizer, Tokenizer
from kvviz.errors import InputError

CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# A transformers directory the native decoder cannot read goes to the Hugging Face backend for these reasons:
# an architecture it does not implement, or weights/tokenizer in a form it does not read (e.g. .bin, no
# tokenizer.json). A damaged file is an error either way.
NATIVE_FALLBACK = ("model.native_unsupported", "model.missing_file")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _require(path: Path) -> Path:
    if not path.is_file():
        raise InputError("model.missing_file", path=path)
    return path


def read_config(path: Path, data: object = None) -> DecoderConfig:
    """config.json in our DecoderConfig format or in Hugging Face's Llama format (`data`: its contents, already
    read by resolve_model; None: read here)."""
    try:
        if data is None:
            data = json.loads(_require(path).read_text(encoding="utf-8"))
        # A transformers config names its model_type; kvviz's own holds DecoderConfig's fields.
        hf = "model_type" in data or "hidden_size" in data
        return DecoderConfig.from_hf_dict(data) if hf else DecoderConfig.from_dict(data)
    except InputError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError("model.corrupt_file", path=path, reason=_one_line(exc)) from None


def _weight_files(path: Path) -> list[Path]:
    """model.safetensors, or the shards a model.safetensors.index.json names (a large transformers save)."""
    index = path.with_name(path.name + ".index.json")
    if path.is_file() or not index.is_file():
        return [_require(path)]
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError("model.corrupt_file", path=index, reason=_one_line(exc)) from None
    return [_require(path.with_name(s)) for s in shards]


def read_weights(path: Path, cfg: DecoderConfig) -> Decoder:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state = {}
    for file in _weight_files(path):
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise InputError("model.corrupt_file", path=file, reason=_one_line(exc)) from None
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


def read_tokenizer(path: Path, *, eos_id: int | None = None) -> BPETokenizer:
    """tokenizer.json, with the chat template of a tokenizer_config.json beside it when there is one."""
    template = None
    side = path.with_name("tokenizer_config.json")
    if side.is_file():
        try:
            template = json.loads(side.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError) as exc:
            raise InputError("model.corrupt_file", path=side, reason=_one_line(exc)) from None
    if not isinstance(template, str):
        template = None  # absent, or a list of named templates, which kvviz does not choose between
    try:
        return BPETokenizer(_require(path), eos_id=eos_id, chat_template=template)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
        raise InputError("model.corrupt_file", path=path, reason=_one_line(exc)) from None


def transformers_tokenizer(directory: Path, *, eos_id: int | None = None) -> BPETokenizer:
    """A transformers directory's tokenizer as AutoTokenizer.from_pretrained builds it, so its prompt ids are
    transformers' own: its tokenizer class may replace tokenizer.json's normalizer and pre-tokenizer (transformers
    5 rebuilds LlamaTokenizer's Metaspace pipeline, for one), and reading tokenizer.json alone would then tokenize
    differently. Any tokenizer type transformers loads (BPE, WordLevel, Unigram); the chat template is the one
    AutoTokenizer reads (tokenizer_config.json or chat_template.jinja)."""
    _require(directory / "tokenizer.json")  # without it the Hugging Face backend runs the directory
    from transformers import AutoTokenizer  # only when a transformers directory is loaded

    try:
        auto = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
        backend = auto.backend_tokenizer  # the tokenizers.Tokenizer the fast tokenizer encodes with
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds on a damaged tokenizer
        raise InputError("model.corrupt_file", path=directory / "tokenizer.json", reason=_one_line(exc)) from None
    template = auto.chat_template if isinstance(auto.chat_template, str) else None
    return BPETokenizer(backend, eos_id=eos_id if eos_id is not None else auto.eos_token_id, chat_template=template)


def load_directory(
    directory: str | Path, *, dtype: str = "float32", device: str = "auto", name: str | None = None,
    config: dict | None = None,
) -> NativeBackend:
    """A kvviz-format directory (config.json, model.safetensors, tokenizer.json) or a transformers one (its
    tokenizer as AutoTokenizer loads it). `config`: config.json's contents when resolve_model read them."""
    directory = Path(directory)
    torch_dtype, torch_device = parse_dtype(dtype), resolve_device(device)
    if config is None:
        config = _config_json(directory)
    cfg = read_config(directory / "config.json", config)
    tokenizer = (transformers_tokenizer(directory, eos_id=cfg.eos_id) if _names_model_type(config)
                 else read_tokenizer(directory / "tokenizer.json", eos_id=cfg.eos_id))
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


def load_gguf(path: str | Path, *, dtype: str = "float32", device: str = "auto") -> NativeBackend:
    """A llama GGUF file straight into the native decoder (dequantized in memory; fetch-model caches this)."""
    from kvviz.engine.gguf_import import read_gguf

    torch_dtype, torch_device = parse_dtype(dtype), resolve_device(device)
    ckpt = read_gguf(path)
    model = Decoder(ckpt.cfg)
    model.load_state_dict(ckpt.state | ({"lm_head.weight": ckpt.state["model.embed_tokens.weight"]}
                                        if ckpt.cfg.tie_embeddings else {}), strict=True, assign=True)
    if ckpt.cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    tokenizer = BPETokenizer(ckpt.tokenizer, eos_id=ckpt.cfg.eos_id, chat_template=ckpt.chat_template)
    return NativeBackend(model.to(device=torch_device, dtype=torch_dtype), tokenizer, ckpt.name)


ENGINES = ("auto", "native", "hf")
# What a model name can be, each loaded one way: the shipped model, a seeded random shape, a model fetch-model
# fetched, a llama GGUF file, a kvviz-format directory, a transformers directory (kvviz's decoder where it
# implements the architecture, else the Hugging Face backend), a hub id (the Hugging Face backend).
SHIPPED, RANDOM, FETCHED, GGUF, KVVIZ_DIR, TRANSFORMERS_DIR, HUB = SOURCE_KINDS = (
    "shipped", "random", "fetched", "gguf", "kvviz_dir", "transformers_dir", "hub")


@dataclass(frozen=True)
class ModelSource:
    """A model name sorted into its kind, once, with what loading it needs."""

    kind: str  # one of SOURCE_KINDS
    name: str  # the name as given (a hub id stripped); the backend's title where kvviz gives one
    path: Path | None = None  # the directory or GGUF file (None: the random shape, a hub id)
    config: dict | None = None  # a directory's config.json, read once (None: not read, or not readable JSON)
    title: str | None = None  # the backend's name where kvviz chooses it (shipped, fetched)


def _config_json(directory: Path) -> object:
    """A directory's config.json as JSON, or None when it is missing or not JSON (the loader then names the file)."""
    try:
        return json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _names_model_type(config: object) -> bool:
    """A save_pretrained() config names its model_type; a kvviz one holds DecoderConfig fields."""
    return isinstance(config, dict) and "model_type" in config


def resolve_model(model: str) -> ModelSource:
    """The kind of model a name is, decided once; refuses a name that is none of them (a fetched model not yet
    fetched, a directory without its config.json, an empty name)."""
    if model == "tiny":
        return ModelSource(SHIPPED, model, TINY_DIR, title=TINY_NAME)
    if model == "random":
        return ModelSource(RANDOM, model)
    if model in fetch.MODELS:
        if not fetch.is_fetched(model):
            raise InputError("fetch.not_fetched", name=model)
        return ModelSource(FETCHED, model, fetch.model_dir(model), title=fetch.MODELS[model].title)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            # Weights without their config: a damaged checkpoint, named by its missing file; nothing at all: no model.
            if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
                raise InputError("model.missing_file", path=str(path / "config.json"))
            raise InputError("hf.no_model", name=model)
        config = _config_json(path)
        return ModelSource(TRANSFORMERS_DIR if _names_model_type(config) else KVVIZ_DIR, model, path, config)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(GGUF, model, path)
    if model.strip():
        return ModelSource(HUB, model.strip())
    raise InputError("unknown_model", name=model)


def load_backend(
    model: str = "tiny",
    *,
    dtype: str = "float32",
    device: str = "auto",
    shape: DecoderConfig | None = None,
    seed: int = 0,
    hf_policy: HFPolicy | None = None,
    engine: str = "auto",
    weights: str = "float",
) -> Backend:
    """tiny (shipped), random (custom shape), a fetched model (smollm2), a kvviz directory or GGUF file (native),
    or a transformers directory or hub id: on kvviz's decoder when it implements the architecture (engine
    "auto" or "native"), else on the Hugging Face backend, which then says why (backend.native_note).
    weights="int8": the native decoder's matrices quantized to int8 per output channel (Decoder.fuse)."""
    if weights not in WEIGHTS:
        raise InputError("model.bad_weights", weights=weights, choices=", ".join(WEIGHTS))
    if engine not in ENGINES:
        raise InputError("model.bad_engine", engine=engine, choices=", ".join(ENGINES))
    backend = load_source(resolve_model(model), dtype=dtype, device=device, shape=shape, seed=seed,
                          hf_policy=hf_policy, engine=engine)
    if weights != "float":
        if backend.kind != "native":
            raise InputError("model.int8_native_only", name=backend.spec.name)
        backend.use_weights(weights)
    return backend


def load_source(source: ModelSource, *, dtype: str = "float32", device: str = "auto",
                shape: DecoderConfig | None = None, seed: int = 0, hf_policy: HFPolicy | None = None,
                engine: str = "auto") -> Backend:
    """Load a resolved model, each kind one way."""
    if source.kind in (SHIPPED, FETCHED):
        return load_directory(source.path, dtype=dtype, device=device, name=source.title)
    if source.kind == RANDOM:
        return random_backend(shape or DecoderConfig(), seed=seed, dtype=dtype, device=device)
    # The web UI passes its policy (env + secrets); the CLI reads the environment. It holds for every path or hub
    # id, whichever engine then runs it.
    policy = hf_policy if hf_policy is not None else policy_from(os.environ)
    if source.kind == GGUF:
        check_allowed(source.name, policy)
        return load_gguf(source.path, dtype=dtype, device=device)
    if source.kind == KVVIZ_DIR:
        check_allowed(source.name, policy)
        return load_directory(source.path, dtype=dtype, device=device, config=source.config)
    note = None
    if source.kind == TRANSFORMERS_DIR and engine != "hf":
        check_allowed(source.name, policy)
        try:
            return _native_transformers_dir(source, policy, dtype=dtype, device=device)
        except InputError as exc:
            if engine == "native" or exc.key not in NATIVE_FALLBACK:
                raise
            note = exc  # the Hugging Face backend runs it, and says why
    elif source.kind == HUB and engine == "native":
        raise InputError("model.native_needs_directory", name=source.name)
    from kvviz.engine.backends.hf import load_hf_backend  # transformers is imported only for an HF model

    backend = load_hf_backend(source.name, dtype=dtype, device=device, policy=policy)
    backend.native_note = note
    return backend


def _native_transformers_dir(source: ModelSource, policy: HFPolicy, *, dtype: str, device: str) -> NativeBackend:
    """A transformers directory on kvviz's decoder, its size checked against the policy before weights are read;
    named as the Hugging Face backend names a directory: folder (model_type)."""
    path = source.path
    cfg = read_config(path / "config.json", source.config)
    check_size(str(path), parameter_count(cfg), policy)
    kind = source.config.get("model_type", "?")
    return load_directory(path, dtype=dtype, device=device, name=f"{path.name} ({kind})", config=source.config)
