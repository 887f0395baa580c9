"""Read a Hugging Face config.json into the KV shape the memory formula needs.

Field names differ between families (GPT-2's n_layer/n_head/n_embd, Falcon's multi_query, DeepSeek's
MLA ranks, Gemma's own head_dim and alternating sliding layers); each is read here, and a config that
does not say what the formula needs gives a clear InputError naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvviz.errors import InputError
from kvviz.kv.formula import KVShape

# The first name found wins; GPT-2 and Falcon-style names follow the Llama-style ones.
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEAD_FIELDS = ("num_attention_heads", "n_head", "n_heads")
HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")


@dataclass(frozen=True)
class ModelSpec:
    """A model as the memory page sees it: its KV shape, width, context and (when known) parameters."""

    name: str
    shape: KVShape
    d_model: int
    max_context: int | None = None
    n_params: int | None = None  # exact for presets; a dense-model estimate for an uploaded config
    params_estimated: bool = False
    model_type: str = ""


def _int_field(cfg: dict[str, Any], names: tuple[str, ...], *, required: bool = True) -> int | None:
    for name in names:
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError("memory.config_bad_value", field=name, value=json.dumps(value))
        return value
    if required:
        raise InputError("memory.config_missing", field=" / ".join(names))
    return None


def _sliding_layers(cfg: dict[str, Any], n_layers: int) -> tuple[int, int]:
    """(window, layers that use it). A window a config switches off (use_sliding_window false) is none."""
    window = cfg.get("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:
        return 0, 0
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise InputError("memory.config_bad_value", field="sliding_window", value=json.dumps(window))
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        if len(layer_types) != n_layers:
            raise InputError("memory.config_layer_types", listed=len(layer_types), n_layers=n_layers)
        return window, sum(t == "sliding_attention" for t in layer_types)
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return window, n_layers - n_layers // pattern  # Gemma 3: every pattern-th layer is global
    if cfg.get("model_type") == "gemma2":
        return window, math.ceil(n_layers / 2)  # Gemma 2 alternates: layers 0, 2, 4, ... are local
    return window, n_layers  # Mistral: every layer keeps only the window


def estimate_params(cfg: dict[str, Any], shape: KVShape, d_model: int) -> int | None:
    """Parameters of a dense gated-MLP decoder (Llama family) from its config; None for MoE or unknown MLPs.

    Counts the projections and embeddings, skips norms and biases (well under 0.1%).
    """
    if any(k in cfg for k in ("n_routed_experts", "num_experts", "num_local_experts")) or shape.is_mla:
        return None
    vocab, d_ff = cfg.get("vocab_size"), cfg.get("intermediate_size")
    if not isinstance(vocab, int) or not isinstance(d_ff, int):
        return None
    attn = 2 * d_model * shape.n_heads * shape.d_head + 2 * d_model * shape.n_kv_heads * shape.d_head
    mlp = 3 * d_model * d_ff  # gate, up, down
    # Gemma ties input and output embeddings by default and its config.json does not always say so.
    tied = cfg.get("tie_word_embeddings", str(cfg.get("model_type", "")).startswith("gemma"))
    embeddings = vocab * d_model * (1 if tied else 2)
    return shape.n_layers * (attn + mlp) + embeddings


def parse_hf_config(cfg: Any, name: str = "config.json") -> ModelSpec:
    """The KV shape of a Hugging Face config dict; InputError for anything the formula cannot trust."""
    if not isinstance(cfg, dict):
        raise InputError("memory.config_not_object")
    if isinstance(cfg.get("text_config"), dict) and not any(f in cfg for f in LAYER_FIELDS):
        cfg = {**cfg["text_config"]}  # multimodal wrappers keep the decoder's fields one level down
    n_layers = _int_field(cfg, LAYER_FIELDS)
    n_heads = _int_field(cfg, HEAD_FIELDS)
    d_model = _int_field(cfg, HIDDEN_FIELDS)
    n_kv_heads = _int_field(cfg, KV_HEAD_FIELDS, required=False)
    if n_kv_heads is None:
        # Falcon-7B says multi_query: true (one KV head); otherwise every query head has its own.
        n_kv_heads = 1 if cfg.get("multi_query") is True else n_heads
    kv_lora_rank = _int_field(cfg, ("kv_lora_rank",), required=False) or 0
    rope_dim = 0
    if kv_lora_rank:
        rope_dim = _int_field(cfg, ("qk_rope_head_dim",))
        # d_h of one head without its RoPE part, as DeepSeek-V2 compares MLA with MHA (2·n_h·d_h per layer)
        d_head = _int_field(cfg, ("qk_nope_head_dim",))
    else:
        d_head = _int_field(cfg, ("head_dim",), required=False)
        if d_head is None:
            if d_model % n_heads:
                raise InputError("memory.config_hidden_heads", d_model=d_model, n_heads=n_heads)
            d_head = d_model // n_heads
    if n_heads % n_kv_heads:
        raise InputError("memory.config_kv_split", n_heads=n_heads, n_kv_heads=n_kv_heads)
    window, n_sliding = _sliding_layers(cfg, n_layers)
    shape = KVShape(
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_head=d_head,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        sliding_window=window,
        n_sliding_layers=n_sliding,
    )
    params = estimate_params(cfg, shape, d_model)
    return ModelSpec(
        name=name,
        shape=shape,
        d_model=d_model,
        max_context=_int_field(cfg, CONTEXT_FIELDS, required=False),
        n_params=params,
        params_estimated=params is not None,
        model_type=str(cfg.get("model_type", "")),
    )


def parse_config_text(text: str | bytes, name: str = "config.json") -> ModelSpec:
    """Parse the text of a config.json (an upload or a file)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError("memory.config_not_json", line=exc.lineno, column=exc.colno) from None
    except UnicodeDecodeError:
        raise InputError("memory.config_not_text") from None
    return parse_hf_config(data, name)


def load_hf_config(path: str | Path) -> ModelSpec:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError("memory.config_no_file", path=str(path))
    return parse_config_text(path.read_bytes(), path.parent.name or path.name)
