"""A Hugging Face transformers causal LM as a backend: any pretrained decoder through the same protocol.

The cache is transformers' own DynamicCache (what `model.generate()` uses), passed into forward() and kept
by the request, so one loaded model serves many sessions. Bytes are read off the real cache tensors.
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import torch

from kvviz.engine.backends.base import ForwardResult
from kvviz.engine.backends.hf_policy import OPEN_POLICY, HFPolicy, check_allowed, check_size
from kvviz.engine.device import parse_dtype, resolve_device
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec
from kvviz.kv.reader import parse_hf_config

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_TRUE = {"1", "true", "yes", "on"}


class HFTokenizer:
    """A transformers tokenizer behind the kvviz Tokenizer protocol."""

    def __init__(self, tokenizer: Any, eos_id: int | None) -> None:
        self._tok = tokenizer
        self.vocab_size = len(tokenizer)
        self.eos_id = eos_id
        bos = tokenizer.bos_token_id
        with_special = tokenizer.encode("a", add_special_tokens=True)
        plain = tokenizer.encode("a", add_special_tokens=False)
        # Prepend BOS only when the model's own tokenizer does (Llama 2 style); never append EOS to a prompt.
        self._bos = bos if bos is not None and with_special[:1] == [bos] and plain[:1] != [bos] else None

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False)
        return [self._bos, *ids] if self._bos is not None else ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def token_text(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            # The model's embedding can be wider than its tokenizer (GPT-2: 50,257 entries padded to 50,304):
            # such an id has no text, shown as the native tokenizer shows one, ⟨id⟩.
            return f"⟨{token_id}⟩"
        text = self._tok.decode([token_id])
        if not text or "\ufffd" in text:
            # Part of a multi-byte character: show the vocabulary entry itself (e.g. "<0xE2>" or "âĢ").
            entry = self._tok.convert_ids_to_tokens(token_id)
            return f"⟨{token_id}⟩" if entry is None else str(entry)
        return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def spec_from_config(config: Any, name: str) -> KVSpec:
    """The KV description of a transformers config (its text part for multimodal models), read by the same
    reader as a config.json, so Falcon's flags, windows and MLA count the same everywhere."""
    spec = parse_hf_config(config.get_text_config(decoder=True).to_dict(), name)
    if spec.max_context is None:
        raise InputError("hf.no_context", name=name)
    return spec


def _layer_kv(layer: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A cache layer's K and V tensors, or None before its first update (or for a non-attention layer)."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.dim() == 4:
        return keys, values
    return None


class HFBackend:
    def __init__(self, model: Any, tokenizer: HFTokenizer, name: str) -> None:
        self.model = model.eval()
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        n_params = sum(t.numel() for t in {id(t): t for t in model.parameters()}.values())
        self.spec = spec_from_config(model.config, name).with_params(n_params, "counted")
        self.kind = "hf"
        if self.spec.vocab_size is not None and tokenizer.vocab_size > self.spec.vocab_size:
            raise InputError("vocab_mismatch", tokenizer=tokenizer.vocab_size, model=self.spec.vocab_size)
        self.tokenizer = tokenizer
        # SDPA is faster but returns no weights; eager is switched on only for passes that show attention.
        self._fast_attention = model.config._attn_implementation
        # The attention choice lives on the shared model, so passes from concurrent sessions take turns.
        self._lock = threading.Lock()

    def new_cache(self, batch_size: int, max_len: int) -> Any:
        from transformers import DynamicCache

        # HF's default cache grows by concatenation, so it needs no length up front (allocated == live).
        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, cache: Any | None, *, capture_attention: bool, all_logits: bool
    ) -> ForwardResult:
        b, t = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if past + t > self.spec.max_context:
            raise InputError("sequence_too_long", n_tokens=past + t, max_len=self.spec.max_context)
        # Explicit positions: the new tokens sit after the cached ones (RoPE angle or learned embedding row).
        position_ids = torch.arange(past, past + t, device=input_ids.device).expand(b, t)
        with self._lock:
            attention = "eager" if capture_attention else self._fast_attention
            if self.model.config._attn_implementation != attention:
                self.model.set_attn_implementation(attention)
            out = self.model(
                input_ids=input_ids,
                cache=cache,
                use_cache=cache is not None,
                position_ids=position_ids,
                output_attentions=capture_attention,
                logits_to_keep=0 if all_logits else 1,
            )
        attentions = None
        if capture_attention:
            if not out.attentions or any(a is None for a in out.attentions):
                raise InputError("hf.no_attention", name=self.spec.name)
            attentions = list(out.attentions)
        return ForwardResult(out.logits, attentions)

    def cache_lengths(self, cache: Any) -> list[int]:
        return [kv[0].shape[2] if (kv := _layer_kv(layer)) else 0 for layer in cache.layers]

    def cache_live_bytes(self, cache: Any) -> int:
        return sum(k.nbytes + v.nbytes for k, v in filter(None, map(_layer_kv, cache.layers)))

    def cache_allocated_bytes(self, cache: Any) -> int:
        """Bytes of the storages behind the cache tensors (larger than live when a cache preallocates)."""
        storages = {}
        for kv in filter(None, map(_layer_kv, cache.layers)):
            for x in kv:
                storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return sum(storages.values())

    def layer_kv(self, cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = _layer_kv(cache.layers[layer])
        if kv is None:
            raise InputError("prefill_first")
        return kv


# ---- loading ----------------------------------------------------------------------------------------
def _offline() -> bool:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE or bool(constants.HF_HUB_OFFLINE)


def _source(name: str) -> tuple[str, bool]:
    """(what to pass to from_pretrained, whether it is a local directory)."""
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise InputError("hf.no_model", name=name)
        return str(path), True
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1:
        raise InputError("hf.no_such_path", name=name)
    if not _HUB_ID.fullmatch(name):
        raise InputError("hf.bad_name", name=name)
    return name, False


def _load_config(name: str, source: str, local: bool, offline: bool) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=False, local_files_only=offline)
    except OSError:
        if local:
            raise InputError("hf.no_model", name=name) from None
        raise InputError("hf.offline" if offline else "hf.not_found", name=name) from None
    except ValueError:
        # An unknown model_type: it would need the repository's own code, which we never run.
        raise InputError("hf.unsupported", name=name) from None


def check_causal_lm(name: str, config: Any) -> None:
    """A decoder-only model with a causal LM head, or an InputError that says what it is instead."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL

    kind = getattr(config, "model_type", "?")
    archs = getattr(config, "architectures", None) or []
    causal_arch = any(a in CAUSAL.values() or a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    encoder = getattr(config, "is_decoder", True) is False  # BERT-style configs: bidirectional unless told
    if kind not in CAUSAL or getattr(config, "is_encoder_decoder", False) or ((archs or encoder) and not causal_arch):
        what = ", ".join(archs) or kind
        raise InputError("hf.not_causal", name=name, what=what)


def _count_params(config: Any) -> int:
    """Parameters of the model a config describes, without reading weights (built on the meta device)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def load_hf_backend(
    name: str, *, dtype: str = "float32", device: str = "auto", policy: HFPolicy = OPEN_POLICY
) -> HFBackend:
    """A local directory or hub id as a ready backend; every failure a user can cause is an InputError."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    name = name.strip()
    if not name:
        raise InputError("hf.empty_name")
    check_allowed(name, policy)
    torch_dtype, torch_device = parse_dtype(dtype), resolve_device(device)
    source, local = _source(name)
    offline = _offline()
    config = _load_config(name, source, local, offline)
    check_causal_lm(name, config)
    try:
        spec_from_config(config, name)
    except InputError as exc:
        if exc.key != "memory.config_missing":
            raise
        # A state-space or recurrent LM (Mamba, RWKV): no attention heads, so no KV cache to show.
        raise InputError("hf.no_kv_cache", name=name, what=config.model_type) from None
    if policy.max_params is not None:
        check_size(name, _count_params(config), policy)
    hf_logging.disable_progress_bar()  # a progress bar per load would clutter the CLI's stderr
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, trust_remote_code=False, local_files_only=offline
        ).to(torch_device)
    except OSError:
        raise InputError("hf.no_weights", name=name) from None
    except (RuntimeError, MemoryError) as exc:
        if _is_oom(exc):
            raise InputError("hf.out_of_memory", name=name, device=str(torch_device)) from None
        raise
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, local_files_only=offline)
    except (OSError, ValueError, TypeError):
        raise InputError("hf.no_tokenizer", name=name) from None
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        raise InputError("hf.no_tokenizer", name=name)
    label = f"{Path(source).name} ({config.model_type})" if local else name
    return HFBackend(model, HFTokenizer(tokenizer, _eos_id(model, tokenizer)), label)


def _eos_id(model: Any, tokenizer: Any) -> int | None:
    """The stop token: the tokenizer's EOS, else the first of the generation config's."""
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos
