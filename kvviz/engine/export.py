"""Write a native Decoder as a standard transformers Llama directory (config, safetensors, tokenizer).

Our state_dict keys are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...), so the weights
are written unchanged; AutoModelForCausalLM and AutoTokenizer load the directory offline.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from kvviz.engine.model import Decoder
from kvviz.engine.tokenizer import EOS_TOKEN
from kvviz.errors import InputError

HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def export_hf(model: Decoder, tokenizer_path: str | Path, out_dir: str | Path) -> list[Path]:
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

    shutil.copyfile(tokenizer_path, out / "tokenizer.json")
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
