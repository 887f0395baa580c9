"""Write a native Decoder as a standard transformers Llama directory (config, safetensors, tokenizer).

Our state_dict keys are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...), so the weights
are written unchanged; AutoModelForCausalLM and AutoTokenizer load the directory offline.
"""
from __future__ import annotations

import json
from pathlib import Path

from kvviz.engine.gguf_import import pre_name
from kvviz.engine.model import Decoder
from kvviz.engine.tokenizer import EOS_TOKEN, BPETokenizer
from kvviz.errors import InputError

HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def export_hf(model: Decoder, tokenizer: BPETokenizer, out_dir: str | Path) -> list[Path]:
    """Write the five files of a transformers Llama checkpoint into out_dir; return their paths."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("model.out_is_file", path=out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    dtype = str(model.lm_head.weight.dtype).removeprefix("torch.")
    _write_json(out / "config.json", {**cfg.to_hf_dict(), "dtype": dtype})
    special = {k: v for k, v in (("bos_token_id", cfg.bos_id), ("eos_token_id", cfg.eos_id)) if v is not None}
    if cfg.eos_id is not None:
        special["pad_token_id"] = cfg.eos_id  # batch padding with EOS, as for GPT-2
    _write_json(out / "generation_config.json", special)

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        state.pop("lm_head.weight")  # one tensor stored once; transformers ties it back
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    (out / "tokenizer.json").write_text(tokenizer.to_json(), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", {
        # The generic fast tokenizer reads tokenizer.json as is (byte-level BPE, no added BOS).
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "model_max_length": cfg.max_seq_len,
        "clean_up_tokenization_spaces": False,
    })
    return [out / name for name in HF_FILES]


# ---- GGUF: the same weights for llama.cpp ------------------------------------------------------------
# Tensor names come from the gguf package's own map (gguf.get_tensor_name_map for MODEL_ARCH.LLAMA), and
# Q/K are permuted as llama.cpp's converter does (conversion/llama.py, LlamaModel.permute): llama.cpp's
# LLAMA architecture rotates interleaved pairs (x0,x1),(x2,x3)…, HF's layout rotates halves (x_i, x_{i+d/2}).

def permute_rotary(weight, n_heads: int):  # noqa: ANN001, ANN201 - a torch/numpy [n_heads·d_head, d_in] array
    """Reorder each head's rows from HF's rotate-half layout to llama.cpp's interleaved one."""
    d_out = weight.shape[0]
    return (weight.reshape(n_heads, 2, d_out // n_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def _gguf_vocab(tokenizer_json: str, vocab_size: int) -> tuple[list[str], list[int], list[str], dict[int, bool]]:
    """tokens (byte-level strings, padded to vocab_size), token types, merges, and which ids are special."""
    import gguf

    data = json.loads(tokenizer_json)
    model = data.get("model") or {}
    pre = data.get("pre_tokenizer") or {}
    pre_types = [p.get("type") for p in pre.get("pretokenizers", [pre])]
    if model.get("type") != "BPE" or "ByteLevel" not in pre_types or model.get("byte_fallback"):
        raise InputError("serving.gguf_tokenizer", kind=model.get("type"), pre=",".join(map(str, pre_types)))
    by_id = {i: tok for tok, i in model["vocab"].items()}
    special = {}
    for added in data.get("added_tokens") or []:
        by_id[added["id"]] = added["content"]
        special[added["id"]] = bool(added.get("special", True))
    if by_id and max(by_id) >= vocab_size:
        raise InputError("serving.gguf_vocab", n_tokens=max(by_id) + 1, vocab_size=vocab_size)
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")  # an id the model has a row for but the tokenizer never emits
            types.append(gguf.TokenType.UNUSED)
        elif i in special:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if special[i] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    # tokenizers writes merges as "a b" strings (older files) or [a, b] pairs (newer ones).
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges, special


def export_gguf(model: Decoder, tokenizer: BPETokenizer, out_file: str | Path, name: str = "kvviz", *,
                add_bos: bool = False, q8_0: bool = False) -> Path:
    """Write a native Decoder as a float32 GGUF file that llama.cpp loads as a LLAMA model.

    Everything is read from the model's config and its tokenizer.json, so any shape this engine runs
    (and any byte-level BPE tokenizer) exports; llama.cpp then gives the same greedy tokens for the
    same prompt token ids (tests/serving/test_llamacpp.py checks it against a real llama-server).
    add_bos: mark the file so llama.cpp prepends the BOS token to text prompts, as Llama models do (kvviz's
    engine prepends none; the serving tests use it to check predictions that count the server's BOS).
    q8_0: every matrix in llama.cpp's Q8_0 (blocks of 32 int8 and an fp16 scale, gguf.quants.quantize as
    llama-quantize writes it), norms in float32: the int8 bytes per token llama.cpp runs, beside kvviz's int8.
    """
    import gguf
    import numpy as np

    out = Path(out_file)
    if out.is_dir():
        raise InputError("model.gguf_out_is_dir", path=out)
    if not out.parent.is_dir():  # a mistyped path is refused, not silently created
        raise InputError("model.gguf_no_parent", path=out, parent=out.parent)
    cfg = model.cfg
    arch = gguf.MODEL_ARCH.LLAMA
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8_0 else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.d_head)  # d_head need not be d_model / n_heads
    w.add_value_length(cfg.d_head)
    w.add_rope_dimension_count(cfg.d_head)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_vocab_size(cfg.vocab_size)

    tokens, types, merges, _ = _gguf_vocab(tokenizer.to_json(), cfg.vocab_size)
    w.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
    # The split before BPE, named as llama.cpp names it: GPT-2's regex, or SmolLM's digits first (a GGUF read in
    # keeps its own; gpt-2 for SmolLM2 split '٣٤' differently from its tokenizer)
    w.add_tokenizer_pre(pre_name(json.loads(tokenizer.to_json()).get("pre_tokenizer") or {}))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if cfg.bos_id is not None:
        w.add_bos_token_id(cfg.bos_id)
    if cfg.eos_id is not None:
        w.add_eos_token_id(cfg.eos_id)
        w.add_pad_token_id(cfg.eos_id)
    w.add_add_bos_token(add_bos)  # kvviz's engine feeds the prompt ids as given, no BOS prepended
    w.add_add_eos_token(False)

    names = gguf.get_tensor_name_map(arch, cfg.n_layers)
    state = model.state_dict()
    if cfg.tie_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}  # llama.cpp ties a missing output
    for key, tensor in state.items():
        data = tensor.detach().to("cpu").float()
        if key.endswith("q_proj.weight"):
            data = permute_rotary(data, cfg.n_heads)
        elif key.endswith("k_proj.weight"):
            data = permute_rotary(data, cfg.n_kv_heads)
        new = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise InputError("serving.gguf_tensor", name=key)
        array = np.ascontiguousarray(data.numpy(), dtype=np.float32)
        if q8_0 and array.ndim == 2:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(new, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            w.add_tensor(new, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
