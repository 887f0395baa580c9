"""The one reader of a model's KV description: any Hugging Face config (a config.json file, an upload, a
loaded transformers config's to_dict(), the presets, and the native model's own config as a Llama dict).

Field names differ between families (GPT-2's n_layer/n_head/n_embd, Falcon's multi_query /
new_decoder_architecture / num_kv_heads / n_head_kv, DeepSeek's MLA ranks, Gemma's own head_dim and
alternating sliding layers, Qwen2's max_window_layers); each is read here, as transformers reads it, and a
config that does not say what the formula needs gives a clear InputError naming the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec

# The first name found wins; GPT-2 and Falcon-style names follow the Llama-style ones.
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEAD_FIELDS = ("num_attention_heads", "n_head", "n_heads")
HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")
FFN_FIELDS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")


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


FALCON_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")
MOE_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts")
# Dense decoders with a gated MLP (gate, up, down) and Llama-style attention projections: the only families
# whose parameter count the config alone determines here; any other is "unknown" until the user gives it.
GATED_MLP_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")
# fc1 → activation → fc2 (no gate): the MLPs of these families in vLLM's model files (opt.py, gpt2.py, ...)
PLAIN_MLP_TYPES = ("opt", "gpt2", "gpt_neox", "gpt_bigcode", "gptj", "falcon", "RefinedWeb", "RefinedWebModel",
                   "phi", "starcoder2", "bloom")


def _n_kv_heads(cfg: dict[str, Any], n_heads: int) -> int:
    """KV heads as the model's attention module reads them (Falcon's flags decide which field counts)."""
    if cfg.get("model_type") in FALCON_TYPES:
        # transformers' FalconAttention: num_kv_heads if new_decoder_architecture or not multi_query, else 1.
        # RefinedWeb (Falcon-40B's original code) is the new architecture with n_head_kv; multi_query defaults
        # to True in FalconConfig, so a config that omits it is multi-query.
        new_arch = cfg.get("new_decoder_architecture", cfg.get("model_type") == "RefinedWeb")
        if new_arch:
            return _int_field(cfg, ("num_kv_heads", "n_head_kv"), required=False) or n_heads
        return 1 if cfg.get("multi_query", True) else n_heads
    n_kv = _int_field(cfg, KV_HEAD_FIELDS, required=False)
    if n_kv is None:
        n_kv = 1 if cfg.get("multi_query") is True else n_heads  # GPT-BigCode / SantaCoder say multi_query
    return n_kv


def _sliding_layers(cfg: dict[str, Any], n_layers: int) -> tuple[int, int]:
    """(window, layers that use it), as transformers' cache decides which layers slide."""
    window = cfg.get("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:
        return 0, 0
    if isinstance(window, bool) or not isinstance(window, int) or window <= 1:
        raise InputError("memory.config_bad_value", field="sliding_window", value=json.dumps(window))
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        if len(layer_types) != n_layers:
            raise InputError("memory.config_layer_types", listed=len(layer_types), n_layers=n_layers)
        return window, sum(t == "sliding_attention" for t in layer_types)
    if "max_window_layers" in cfg:
        # Qwen2/Qwen2-MoE: layers from max_window_layers on slide, the first ones attend fully (Qwen2Config).
        first = cfg["max_window_layers"]
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise InputError("memory.config_bad_value", field="max_window_layers", value=json.dumps(first))
        if not cfg.get("use_sliding_window"):
            return 0, 0
        return window, max(n_layers - first, 0)
    pattern = cfg.get("sliding_window_pattern")
    if pattern is None and cfg.get("model_type") == "gemma3_text":
        pattern = 6  # Gemma3TextConfig's default; gemma-3-27b-it's config.json leaves the pattern out
    if isinstance(pattern, int) and pattern > 0:
        return window, n_layers - n_layers // pattern  # Gemma 3: every pattern-th layer is global
    if cfg.get("model_type") == "gemma2":
        return window, math.ceil(n_layers / 2)  # Gemma 2 alternates: layers 0, 2, 4, ... are local
    return window, n_layers  # Mistral: every layer keeps only the window


def _mlp(cfg: dict[str, Any], d_model: int) -> tuple[int | None, bool | None]:
    """(inner width, gated) of a dense MLP as the family's config gives it; unknown for other families. GPT-2's
    n_inner and Falcon's ffn_hidden_size default to 4·d_model in their transformers configs."""
    model_type = cfg.get("model_type")
    gated = True if model_type in GATED_MLP_TYPES else False if model_type in PLAIN_MLP_TYPES else None
    d_ff = _int_field(cfg, FFN_FIELDS, required=False)
    if d_ff is None and model_type in ("gpt2", "falcon", "RefinedWeb", "RefinedWebModel", "gpt_bigcode"):
        d_ff = 4 * d_model
    return d_ff, gated


def _moe_and_mla(cfg: dict[str, Any], d_ff: int | None) -> dict[str, Any]:
    """The routed-MLP and MLA widths vLLM's profile run allocates for (mixtral.py, qwen3_moe.py, gpt_oss.py,
    deepseek_v2.py read the same fields); zeros where the config has none."""
    experts = _int_field(cfg, MOE_FIELDS, required=False) or 0
    out: dict[str, Any] = {"n_experts": experts}
    if experts:
        out |= {"n_experts_per_token": _int_field(cfg, ("num_experts_per_tok", "experts_per_token"), required=False)
                or 0,
                "moe_d_ff": _int_field(cfg, ("moe_intermediate_size",), required=False) or d_ff,
                "n_shared_experts": _int_field(cfg, ("n_shared_experts",), required=False) or 0,
                "n_dense_layers": _int_field(cfg, ("first_k_dense_replace",), required=False) or 0}
    if cfg.get("kv_lora_rank"):
        out |= {"q_lora_rank": _int_field(cfg, ("q_lora_rank",), required=False) or 0,
                "v_head_dim": _int_field(cfg, ("v_head_dim",), required=False) or 0}
    return out


def estimate_params(cfg: dict[str, Any], n_layers: int, n_heads: int, n_kv_heads: int, d_head: int,
                    d_model: int) -> int | None:
    """Parameters of a dense gated-MLP decoder (GATED_MLP_TYPES) from its config; None (unknown) for any other
    family (MoE, MLA, Falcon, GPT-2, GPT-NeoX, ...) or a config without vocab_size and intermediate_size.

    Counts the projections and embeddings, skips norms and biases (well under 0.1%).
    """
    if cfg.get("model_type") not in GATED_MLP_TYPES or any(k in cfg for k in MOE_FIELDS):
        return None
    vocab, d_ff = cfg.get("vocab_size"), cfg.get("intermediate_size")
    if not isinstance(vocab, int) or not isinstance(d_ff, int):
        return None
    attn = 2 * d_model * n_heads * d_head + 2 * d_model * n_kv_heads * d_head
    mlp = 3 * d_model * d_ff  # gate, up, down
    # Gemma ties input and output embeddings by default and its config.json does not always say so.
    tied = cfg.get("tie_word_embeddings", str(cfg.get("model_type", "")).startswith("gemma"))
    embeddings = vocab * d_model * (1 if tied else 2)
    return n_layers * (attn + mlp) + embeddings


def parse_hf_config(cfg: Any, name: str = "config.json") -> KVSpec:
    """The KV description of a Hugging Face config dict; InputError for anything the formula cannot trust."""
    if not isinstance(cfg, dict):
        raise InputError("memory.config_not_object")
    quantization = cfg.get("quantization_config")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if isinstance(cfg.get("text_config"), dict) and not any(f in cfg for f in LAYER_FIELDS):
        cfg = {**cfg["text_config"]}  # multimodal wrappers keep the decoder's fields one level down
        dtype = dtype or cfg.get("torch_dtype") or cfg.get("dtype")
    n_layers = _int_field(cfg, LAYER_FIELDS)
    n_heads = _int_field(cfg, HEAD_FIELDS)
    d_model = _int_field(cfg, HIDDEN_FIELDS)
    n_kv_heads = _n_kv_heads(cfg, n_heads)
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
    params = estimate_params(cfg, n_layers, n_heads, n_kv_heads, d_head, d_model)
    vocab = cfg.get("vocab_size")
    d_ff, gated = _mlp(cfg, d_model)
    moe = _moe_and_mla(cfg, d_ff)
    if moe["n_experts"] and gated is None:
        gated = True  # every MoE family vLLM serves gates its experts (w1·w3 → w2; gpt-oss's gate_up)
    return KVSpec(
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_head=d_head,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        sliding_window=window if n_sliding else 0,
        n_sliding_layers=n_sliding,
        name=name,
        d_model=d_model,
        vocab_size=vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else None,
        max_context=_int_field(cfg, CONTEXT_FIELDS, required=False),
        n_params=params,
        params_source="estimated" if params is not None else "unknown",
        is_moe=any(k in cfg for k in MOE_FIELDS),
        model_type=str(cfg.get("model_type", "")),
        d_ff=d_ff,
        mlp_gated=gated,
        quantization=json.dumps(quantization, sort_keys=True) if quantization else "",
        dtype=str(dtype).removeprefix("torch.") if isinstance(dtype, str) else "",
        **moe,
    )


def parse_config_text(text: str | bytes, name: str = "config.json") -> KVSpec:
    """Parse the text of a config.json (an upload or a file)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError("memory.config_not_json", line=exc.lineno, column=exc.colno) from None
    except UnicodeDecodeError:
        raise InputError("memory.config_not_text") from None
    return parse_hf_config(data, name)


def load_hf_config(path: str | Path) -> KVSpec:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError("memory.config_no_file", path=str(path))
    return parse_config_text(path.read_bytes(), path.parent.name or path.name)
