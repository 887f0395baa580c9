"""Read a llama-architecture GGUF file (llama.cpp's format) into kvviz's native decoder: its shape, its weights
dequantized to float32 with the `gguf` package, and its tokenizer rebuilt from the file's own vocabulary and merges.

The inverse of export.export_gguf: the same tensor-name map (gguf.get_tensor_name_map), and Q/K rows put back
from llama.cpp's interleaved RoPE layout into transformers' rotate-half one (export.permute_rotary undone, as
transformers' LlamaTensorProcessor._reverse_permute_weights does).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvviz.engine.config import DecoderConfig
from kvviz.errors import InputError

# Weight formats this reader dequantizes (gguf.quants.dequantize implements each; llama.cpp's ggml-quants.c
# defines them: Q8_0 = 32 int8 and an fp16 scale, Q4_0 = 32 4-bit and a scale, Q4_1 = a scale and a minimum).
WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


@dataclass
class GGUFCheckpoint:
    cfg: DecoderConfig
    state: dict[str, Any]  # our (= transformers') state-dict names -> float32 torch tensors
    tokenizer: Any  # a tokenizers.Tokenizer
    chat_template: str | None
    name: str
    tensor_types: dict[str, int] = field(default_factory=dict)  # GGUF weight format -> tensors stored in it


def unpermute_rotary(weight, n_heads: int):  # noqa: ANN001, ANN201 - a numpy [n_heads·d_head, d_in] array
    """llama.cpp's interleaved RoPE rows back to transformers' rotate-half order (export.permute_rotary undone)."""
    d_out = weight.shape[0]
    return (weight.reshape(n_heads, d_out // n_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def _fields(reader: Any) -> dict[str, Any]:
    out = {}
    for key, f in reader.fields.items():
        try:
            out[key] = f.contents()
        except Exception:  # noqa: BLE001 - a field the gguf package cannot decode is one we do not read
            continue
    return out


def _config(meta: dict[str, Any], tensors: set[str]) -> DecoderConfig:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise InputError("model.native_unsupported", what=f"GGUF architecture {arch}")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"llama.{key}", default)
        if value is None:
            raise InputError("model.gguf_field", field=f"llama.{key}")
        return value

    d_model, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    d_head = int(meta.get("llama.attention.key_length", d_model // n_heads))
    if int(meta.get("llama.rope.dimension_count", d_head)) != d_head:
        raise InputError("model.native_unsupported", what="partial rotary dimensions")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise InputError("model.native_unsupported", what=f"rope scaling {scaling}")
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    return DecoderConfig(
        n_layers=int(get("block_count")),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(meta.get("llama.attention.head_count_kv", n_heads)),
        d_head=d_head,
        d_ff=int(get("feed_forward_length")),
        vocab_size=int(meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", [])))),
        max_seq_len=int(get("context_length")),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in tensors,  # no output matrix: llama.cpp ties it to the embedding
        bos_id=None if bos is None else int(bos),
        eos_id=None if eos is None else int(eos),
        rope_type="linear" if scaling == "linear" else "default",
        rope_factor=float(meta.get("llama.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        o_bias="blk.0.attn_output.bias" in tensors,
    )


def _pre_tokenizer(pre: str) -> Any:
    """The split applied before BPE, as llama.cpp's llama-vocab.cpp does for this `tokenizer.ggml.pre`."""
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's regex
    if pre in ("gpt-2", "default"):
        return byte_level
    if pre == "smollm":  # LLAMA_VOCAB_PRE_TYPE_SMOLLM: each digit alone ("\\p{N}"), then GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise InputError("model.native_unsupported", what=f"GGUF pre-tokenizer {pre}")


def pre_name(pre_json: dict) -> str:
    """The `tokenizer.ggml.pre` whose split _pre_tokenizer builds for this tokenizer.json pre_tokenizer (the way
    back, for export): each digit alone before the byte-level regex is SmolLM's, the regex alone GPT-2's."""
    parts = pre_json.get("pretokenizers", [pre_json])
    digits = any(p.get("type") == "Digits" and p.get("individual_digits") for p in parts)
    return "smollm" if digits else "gpt-2"


def build_tokenizer(meta: dict[str, Any]) -> Any:
    """A `tokenizers` byte-level BPE from the file's tokens, token types and merges (llama.cpp's "gpt2" model).

    Control tokens (type 3: <|im_start|>, <|endoftext|>) are special added tokens, matched whole in any text;
    user-defined ones (type 4) are plain added tokens, as llama.cpp matches both whole."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise InputError("model.native_unsupported", what=f"GGUF tokenizer {kind}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types, strict=True) if kind == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, kind in zip(tokens, types, strict=True) if kind == 4])
    return tok


def read_gguf(path: str | Path, progress: Any = None) -> GGUFCheckpoint:
    """The whole checkpoint of a llama GGUF file; progress(fraction) is called as tensors are dequantized."""
    import gguf
    import numpy as np
    import torch
    from gguf.quants import dequantize

    path = Path(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise InputError("model.corrupt_file", path=path, reason=str(exc).splitlines()[0] if str(exc) else "?") \
            from None
    meta = _fields(reader)
    by_name = {t.name: t for t in reader.tensors}
    cfg = _config(meta, set(by_name))
    if "rope_freqs.weight" in by_name:  # Llama 3.1's per-frequency factors, stored as a tensor
        raise InputError("model.native_unsupported", what="rope_freqs (Llama 3.1 RoPE scaling)")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.n_layers)
    from kvviz.engine.model import Decoder

    with torch.device("meta"):
        wanted = list(Decoder(cfg).state_dict())
    if cfg.tie_embeddings:
        wanted.remove("lm_head.weight")
    state, types = {}, Counter()
    for i, key in enumerate(wanted):
        gname = names.get_name(key, try_suffixes=(".weight", ".bias"))
        tensor = by_name.get(gname) if gname else None
        if tensor is None:
            raise InputError("model.gguf_field", field=gname or key)
        kind = tensor.tensor_type.name
        if kind not in WEIGHT_TYPES:
            raise InputError("model.native_unsupported", what=f"GGUF weight format {kind}")
        types[kind] += 1
        data = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        if key.endswith("q_proj.weight") or key.endswith("q_proj.bias"):
            data = unpermute_rotary(data, cfg.n_heads)
        elif key.endswith("k_proj.weight") or key.endswith("k_proj.bias"):
            data = unpermute_rotary(data, cfg.n_kv_heads)
        # A copy: the file is mapped read-only, and torch wants writable memory.
        state[key] = torch.from_numpy(np.array(data, dtype=np.float32, order="C"))
        if progress is not None:
            progress((i + 1) / len(wanted))
    template = meta.get("tokenizer.chat_template")
    return GGUFCheckpoint(cfg, state, build_tokenizer(meta), template if isinstance(template, str) else None,
                          str(meta.get("general.name") or path.stem), dict(types))
