"""Weights as vLLM loads them (issue 46): the quantization_config read, each format's bytes, the presets that ship
quantized, an unknown method named, and a local checkpoint sized exactly from its safetensors headers."""

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from kvviz.cli import main
from kvviz.errors import InputError
from kvviz.kv.capacity import plan_capacity
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.log_check import check_all
from kvviz.kv.presets import get_preset
from kvviz.kv.reader import load_hf_config, parse_hf_config
from kvviz.kv.weight_format import linear_bytes, weight_format
from kvviz.kv.weights import read_checkpoint, size_weights

GIB = 2**30


# ---- the formats ----------------------------------------------------------------------------------------------
def test_each_quant_method_is_read():
    fp8 = weight_format({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
    assert (fp8.method, fp8.bits, fp8.block, fp8.scale_bytes) == ("fp8", 8, (128, 128), 4)
    assert weight_format({"quant_method": "fp8", "activation_scheme": "static"}).label == "fp8 per-tensor"
    awq = weight_format({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                         "modules_to_not_convert": ["visual"]})
    assert (awq.bits, awq.group_size, awq.zero_points, awq.ignore) == (4, 128, True, ("visual",))
    gptq = weight_format({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": True})
    assert (gptq.bits, gptq.group_size, gptq.act_order) == (8, -1, True)
    ct = weight_format({"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*mlp.gate$"],
                        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                            "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                            "symmetric": False}}}})
    assert (ct.bits, ct.group_size, ct.zero_points, ct.ignore) == (4, 32, True, ("lm_head", "re:.*mlp.gate$"))
    w8 = weight_format({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "channel"}}}})
    assert (w8.bits, w8.group_size, w8.scale_bytes) == (8, 0, 4)
    assert weight_format({"quant_method": "mxfp4"}).experts_only
    bnb = weight_format({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                         "bnb_4bit_use_double_quant": True})
    assert (bnb.bits, bnb.group_size, bnb.scale_bytes) == (4, 64, 1)
    hqq = weight_format({"quant_method": "hqq", "nbits": 4})
    assert not hqq.known and hqq.method == "hqq"


def test_linear_bytes_follow_the_parameter_shapes():
    """Each format's parameters for a 4096 × 14336 down projection, as the create_weights cited make them."""
    out, inp = 4096, 14336
    fp8 = linear_bytes(out, inp, weight_format({"quant_method": "fp8", "weight_block_size": [128, 128]}))
    assert fp8.weights == out * inp and fp8.scales == 32 * 112 * 4  # weight_scale_inv cdiv(out,128)×cdiv(in,128)
    awq = linear_bytes(out, inp, weight_format({"quant_method": "awq", "bits": 4, "group_size": 128}))
    # qweight (in, out/8) int32, qzeros (in/128, out/8) int32, scales (in/128, out) fp16
    assert (awq.weights, awq.zero_points, awq.scales) == (inp * out // 8 * 4, inp // 128 * out // 8 * 4,
                                                          inp // 128 * out * 2)
    gptq = linear_bytes(out, inp, weight_format({"quant_method": "gptq", "bits": 4, "group_size": 128,
                                                 "desc_act": True}))
    assert gptq.scales == inp // 128 * out * 2 + inp * 4  # scales + g_idx


# ---- presets that ship quantized ------------------------------------------------------------------------------
def test_deepseek_v3_is_fp8_by_default():
    """Issue 46's first example: DeepSeek-V3 on 8 × H200 at 32k with no weight flag serves, in FP8 blocks."""
    spec = get_preset("DeepSeek-V3")
    h200 = HARDWARE["H200"]
    plan = plan_capacity(spec, h200.memory_bytes, max_model_len=32768, tp=8, gpu_name=h200.name, preset=True)
    w = plan.weights
    assert (w["source"], w["format"]["label"]) == ("preset", "fp8 block [128, 128]")
    # independent count: every linear at 1 B, its float32 scale per 128 × 128 block, the rest in bfloat16
    h, d = 128, 7168
    attn = [(1536, d), (h * 192, 1536), (576, d), (h * 256, 512), (d, h * 128)]
    mlp_dense, expert = [(18432, d), (18432, d), (d, 18432)], [(2048, d), (2048, d), (d, 2048)]
    linears = 61 * attn + 3 * mlp_dense + 58 * (256 * expert + expert)
    fp8 = sum(o * i for o, i in linears)
    scales = sum(-(-o // 128) * -(-i // 128) * 4 for o, i in linears)
    rest = (spec.n_params - fp8) * 2
    assert w["total_bytes"] == fp8 + scales + rest
    replicated = 61 * (1536 + 576) * d + 61 * (-(-1536 // 128) + -(-576 // 128)) * 56 * 4 + 58 * 256 * d * 2
    assert plan.weights_bytes == math.ceil((fp8 + scales + rest - replicated) / 8) + replicated
    assert plan.weights_fit and plan.kv_cache_tokens > 600_000
    flag = plan_capacity(spec, h200.memory_bytes, max_model_len=32768, tp=8, gpu_name=h200.name, weight_dtype="fp8")
    assert flag.weights["source"] == "flag" and flag.weights_bytes < plan.weights_bytes
    bf16 = plan_capacity(spec, h200.memory_bytes, max_model_len=32768, tp=8, gpu_name=h200.name,
                         weight_dtype="bfloat16")
    assert not bf16.weights_fit  # the flag still overrides


def test_deepseek_v3_per_device_weights_match_a_real_load():
    """HabanaAI/vllm-fork#809 (DeepSeek-R1, DeepSeek-V3's architecture and FP8 checkpoint, on 8 Gaudi devices):
    "Pre-loading model weights on hpu:0 took 79.41 GiB". Weights only: that fork's KV arithmetic is not vLLM's GPU
    path, so it is not one of the start-up logs the planner is checked against."""
    w = size_weights(get_preset("DeepSeek-V3"), tp=8, preset=True)
    assert abs(w.per_gpu_bytes / GIB - 79.41) / 79.41 < 0.005  # 79.29 GiB: −0.15%
    flag = size_weights(get_preset("DeepSeek-V3"), tp=8, weight_dtype="fp8")
    assert abs(flag.per_gpu_bytes / GIB - 79.41) / 79.41 > 0.015  # one dtype, no scales, nothing replicated: −1.6%


def test_deepseek_cli_says_where_the_format_came_from(capsys):
    assert main(["capacity", "--preset", "DeepSeek-V3", "--gpu", "H200", "--tp", "8",
                 "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "format fp8 block [128, 128] (from the preset's checkpoint)" in out and "do not fit" not in out
    assert main(["capacity", "--config", _write_config(capsys, get_deepseek_config()), "--gpu", "H200", "--tp", "8",
                 "--max-model-len", "32768", "--params", str(get_preset("DeepSeek-V3").n_params), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["weights"]["source"] == "config" and r["weights_fit"]


def get_deepseek_config() -> dict:
    from kvviz.kv.presets import CONFIGS

    return CONFIGS["DeepSeek-V3"]


def _write_config(capsys, cfg: dict, tmp=[]) -> str:  # noqa: B006 — one temp dir per session
    import tempfile
    from pathlib import Path

    if not tmp:
        tmp.append(Path(tempfile.mkdtemp()))
    path = tmp[0] / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_gpt_oss_logged_weights_within_a_quarter_percent():
    """vllm#23278: gpt-oss-120b on an H100 with vLLM 0.10.1 (Marlin MXFP4): 'Model loading took 65.9651 GiB'."""
    check = next(c for c in check_all() if c.id == "vllm-23278-h100-gpt-oss-120b")
    assert check.weight_format == "MXFP4 experts" and check.weight_source == "preset"
    assert abs(check.term("weights").difference) < 0.0025
    assert abs(check.term("reserve").difference) < 0.02
    assert check.term("kv_memory").predicted < 0 and check.kv_within  # nothing fits, as the engine found


# ---- an unknown method --------------------------------------------------------------------------------------
def test_unknown_method_is_named_never_bfloat16(capsys):
    cfg = {**get_preset_config("Llama-3.1-8B"), "quantization_config": {"quant_method": "hqq", "nbits": 4}}
    spec = parse_hf_config(cfg, "llama-hqq")
    with pytest.raises(InputError) as err:
        plan_capacity(spec, HARDWARE["H100 SXM"].memory_bytes, max_model_len=8192)
    assert err.value.key == "weights.unknown_method" and err.value.params["method"] == "hqq"
    sizing = size_weights(spec)
    lo, hi = sizing.per_gpu_range
    assert sizing.total_bytes is None and lo == (spec.n_params - 32 * 218_103_808) * 2 and hi == spec.n_params * 2
    assert main(["capacity", "--config", _write_config(capsys, cfg), "--gpu", "H100 SXM"]) != 0
    err_text = capsys.readouterr().err
    assert "hqq" in err_text and "Traceback" not in err_text


def get_preset_config(name: str) -> dict:
    from kvviz.kv.presets import CONFIGS

    return dict(CONFIGS[name])


# ---- a local checkpoint read from its headers -----------------------------------------------------------------
SMALL = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000,
         "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
LINEARS = {"self_attn.q_proj": (256, 256), "self_attn.k_proj": (128, 256), "self_attn.v_proj": (128, 256),
           "self_attn.o_proj": (256, 256), "mlp.gate_proj": (512, 256), "mlp.up_proj": (512, 256),
           "mlp.down_proj": (256, 512)}


def _tensors(kind: str) -> dict[str, torch.Tensor]:
    """A two-layer Llama in each format's checkpoint layout (what its vLLM weight loader takes)."""
    dtype = torch.float16 if kind in ("awq", "gptq") else torch.bfloat16
    t = {"model.embed_tokens.weight": torch.zeros(1000, 256, dtype=dtype), "lm_head.weight":
         torch.zeros(1000, 256, dtype=dtype), "model.norm.weight": torch.ones(256, dtype=dtype)}
    for i in range(2):
        t[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(256, dtype=dtype)
        t[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(256, dtype=dtype)
        for name, (out, inp) in LINEARS.items():
            m = f"model.layers.{i}.{name}"
            if kind == "bf16":
                t[f"{m}.weight"] = torch.zeros(out, inp, dtype=dtype)
            elif kind == "fp8":
                t[f"{m}.weight"] = torch.zeros(out, inp, dtype=torch.float8_e4m3fn)
                t[f"{m}.weight_scale_inv"] = torch.ones(-(-out // 128), -(-inp // 128), dtype=torch.float32)
            elif kind == "w4a16":  # compressed-tensors pack-quantized
                t[f"{m}.weight_packed"] = torch.zeros(out, inp // 8, dtype=torch.int32)
                t[f"{m}.weight_scale"] = torch.ones(out, inp // 128, dtype=dtype)
                t[f"{m}.weight_shape"] = torch.tensor([out, inp], dtype=torch.int64)
            elif kind == "awq":
                t[f"{m}.qweight"] = torch.zeros(inp, out // 8, dtype=torch.int32)
                t[f"{m}.qzeros"] = torch.zeros(inp // 128, out // 8, dtype=torch.int32)
                t[f"{m}.scales"] = torch.ones(inp // 128, out, dtype=dtype)
            elif kind == "gptq":
                t[f"{m}.qweight"] = torch.zeros(inp // 8, out, dtype=torch.int32)
                t[f"{m}.qzeros"] = torch.zeros(inp // 128, out // 8, dtype=torch.int32)
                t[f"{m}.scales"] = torch.ones(inp // 128, out, dtype=dtype)
                t[f"{m}.g_idx"] = torch.arange(inp, dtype=torch.int32) // 128
    return t


QUANT = {"bf16": None,
         "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
         "w4a16": {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                       "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}}},
         "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
         "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True}}


def _checkpoint(tmp_path, kind: str, shards: int = 2):
    cfg = dict(SMALL, torch_dtype="float16" if kind in ("awq", "gptq") else "bfloat16")
    if QUANT[kind]:
        cfg["quantization_config"] = QUANT[kind]
    folder = tmp_path / kind
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    tensors = _tensors(kind)
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(folder / file))
        weight_map |= dict.fromkeys(part, file)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder, tensors


def _data_bytes(folder) -> int:
    """Each file's size less its 8-byte length and JSON header: the tensor data as stored."""
    total = 0
    for f in folder.glob("*.safetensors"):
        with f.open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
        total += f.stat().st_size - 8 - n
    return total


@pytest.mark.parametrize("kind", list(QUANT))
def test_sharded_checkpoint_read_exactly(tmp_path, kind):
    """Header bytes = file bytes = the tensors' bytes; the config's estimate differs only by the norms it skips."""
    folder, tensors = _checkpoint(tmp_path, kind)
    spec = load_hf_config(folder)
    read = read_checkpoint(folder, spec)
    assert read.read and read.files == 2 and read.source == "read"
    assert read.total_bytes == _data_bytes(folder) == sum(t.numel() * t.element_size() for t in tensors.values())
    estimate = size_weights(spec)
    norms = (2 * 2 * 256 + 256) * 2
    assert read.total_bytes - estimate.total_bytes == norms


def test_read_checkpoint_in_the_cli(tmp_path, capsys):
    folder, _ = _checkpoint(tmp_path, "fp8")
    assert main(["capacity", "--config", str(folder), "--gpu", "H100 SXM", "--max-model-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "weights read from 2 safetensors file(s), format fp8 block [128, 128] (from the config)" in out
    assert main(["capacity", "--config", str(folder), "--gpu", "H100 SXM", "--max-model-len", "4096",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["weights"]["read"] and r["weights_bytes"] == _data_bytes(folder)


def test_header_that_does_not_match_the_config_is_named(tmp_path, capsys):
    folder, tensors = _checkpoint(tmp_path, "fp8", shards=1)
    del tensors["model.layers.1.mlp.down_proj.weight_scale_inv"]
    save_file(tensors, str(folder / "model-00001-of-00001.safetensors"))
    (folder / "model.safetensors.index.json").unlink()
    with pytest.raises(InputError) as err:
        read_checkpoint(folder, load_hf_config(folder))
    assert err.value.key == "weights.header_missing"
    assert err.value.params["tensor"] == "model.layers.1.mlp.down_proj.weight_scale_inv"
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 640}))
    assert main(["capacity", "--config", str(folder), "--gpu", "H100 SXM", "--max-model-len", "4096"]) != 0
    assert "model.layers.0.mlp.gate_proj.weight" in capsys.readouterr().err


def test_truncated_header_is_a_clear_error(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMALL))
    (folder / "model.safetensors").write_bytes((10**6).to_bytes(8, "little") + b"{}")
    with pytest.raises(InputError) as err:
        read_checkpoint(folder, load_hf_config(folder))
    assert err.value.key == "weights.header_bad"


# ---- the derived numbers ---------------------------------------------------------------------------------------
def test_derived_groups_labelled_in_json(capsys):
    assert main(["capacity", "--preset", "gpt-oss-120b", "--gpu", "H200", "--max-model-len", "131072",
                 "--vllm-version", "0.29.0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    d = r["derived"]
    assert [(g["kind"], g["layers"]) for g in d["groups"]] == [("full", 18), ("sliding", 18)]
    assert sum(g["blocks_per_request"] for g in d["groups"]) == d["blocks_per_request"] == r["blocks_per_request"]
    assert sum(g["share"] for g in d["groups"]) == pytest.approx(1)
    assert d["num_blocks"] == r["num_blocks"] and d["kv_cache_tokens"] == r["kv_cache_tokens"]
    # 0.21+: int(concurrency · max_model_len)
    assert d["kv_cache_tokens"] == int(d["num_blocks"] / d["blocks_per_request"] * 131072)


def test_memory_command_weights_in_the_checkpoints_format(capsys):
    assert main(["memory", "--preset", "DeepSeek-V3"]) == 0
    fp8 = size_weights(get_preset("DeepSeek-V3"), preset=True).total_bytes
    assert f"fp8 block [128, 128] (from the preset's checkpoint) = {fp8} B" in capsys.readouterr().out
    cfg = {**get_preset_config("Llama-3.1-8B"), "quantization_config": {"quant_method": "hqq"}}
    assert main(["memory", "--config", _write_config(capsys, cfg)]) == 0
    assert "weights              unknown: hqq (unknown) is not a format kvviz can size" in capsys.readouterr().out
