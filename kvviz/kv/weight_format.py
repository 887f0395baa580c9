"""A checkpoint's weight format, read from config.json's quantization_config, and the bytes one linear layer
(or one layer's experts) takes in it as vLLM creates its parameters: the quantized matrix, its scales and zero
points. Which layers are quantized and the model's own tensors are kvviz.kv.weights' business.

Each rule names the vLLM function it follows (vllm/model_executor/layers/quantization/, the 0.34.0 wheel and the
releases it names). A method not listed here is named as unknown, never taken as bfloat16.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from dataclasses import dataclass

from kvviz.errors import InputError
from kvviz.i18n import t

# Bytes per value of the dtypes a config.json names (torch_dtype / dtype) and the flag --weight-dtype takes.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1, "int4": 0.5}

MXFP4_BLOCK = 32  # OCP MX: 32 values share one E8M0 (uint8) scale (mxfp4_utils.py, OCP_MX_BLOCK_SIZE)
# The MXFP4 expert kernels pad one expert's widths (fused_moe/oracle/mxfp4.py,
# mxfp4_round_up_hidden_size_and_intermediate_size): Marlin rounds the intermediate size up to 128 and the hidden
# size to 256 (vLLM 0.10.1 chose Marlin on an H100: "Your GPU does not have native support for FP4", vllm#23278);
# the Triton matmul_ogs path only rounds the intermediate size to 64.
MXFP4_PADDING = {"marlin": (128, 256), "triton": (64, 1)}


@dataclass(frozen=True)
class WeightFormat:
    """How the quantized matrices of a checkpoint are stored once vLLM has created their parameters."""

    method: str  # "none", "fp8", "compressed-tensors", "awq", "gptq", "mxfp4", "bitsandbytes", or an unknown name
    bits: float  # bits of one weight value (16 unquantized)
    group_size: int = 0  # values along the input that share a scale; 0 = one per output row, -1 = one per tensor
    block: tuple[int, int] | None = None  # fp8 block-wise: [block_n, block_k] values per float32 scale
    zero_points: bool = False  # AWQ, GPTQ, asymmetric compressed-tensors: packed zero points beside the scales
    scale_bytes: int = 2  # one scale: float32 for fp8 and int8, the model's dtype for AWQ/GPTQ/W4A16
    act_order: bool = False  # GPTQ desc_act: an int32 g_idx per input column
    experts_only: bool = False  # MXFP4: only the routed experts are quantized (Mxfp4Config.get_quant_method)
    ignore: tuple[str, ...] = ()  # modules left in the model's dtype (ignore / modules_to_not_convert / ...)
    known: bool = True
    label_key: str = "plain"  # weights.fmt_<key> names the format in each language ("fp8 block [128, 128]")
    label_args: tuple[tuple[str, object], ...] = ()
    rule: str = ""  # the vLLM function the sizes follow

    @property
    def quantized(self) -> bool:
        return self.method != "none"

    def label_in(self, lang: str) -> str:
        return t(f"weights.fmt_{self.label_key}", lang, **dict(self.label_args))

    @property
    def label(self) -> str:
        return self.label_in("en")

    def to_dict(self) -> dict:
        return {"method": self.method, "bits": self.bits, "group_size": self.group_size,
                "block": list(self.block) if self.block else None, "zero_points": self.zero_points,
                "ignore": list(self.ignore), "known": self.known, "label": self.label, "label_key": self.label_key,
                "label_args": dict(self.label_args), "rule": self.rule}


def plain_format(dtype: str) -> WeightFormat:
    """Every weight in one dtype (an unquantized checkpoint, or --weight-dtype)."""
    from kvviz.kv.formats import kv_dtype

    return WeightFormat("none", kv_dtype(dtype).data_bytes * 8, label_args=(("dtype", dtype),),
                        rule="UnquantizedLinearMethod.create_weights")


def _int(cfg: dict, key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError("weights.quant_bad_field", field=key, value=json.dumps(value))
    return value


def _names(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _compressed_tensors(cfg: dict) -> WeightFormat:
    """compressed-tensors: the weights of its first config group (CompressedTensorsConfig.from_config,
    _quantization_scheme_map_from_config): num_bits, type int/float, strategy tensor/channel/group/block,
    group_size, symmetric; `ignore` lists the modules left alone."""
    groups = cfg.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise InputError("weights.quant_bad_field", field="config_groups", value=json.dumps(groups))
    weights = next(iter(groups.values())).get("weights") or {}
    bits, kind = _int(weights, "num_bits"), weights.get("type", "int")
    strategy = weights.get("strategy", "tensor")
    ignore = _names(cfg.get("ignore"))
    if bits == 8:
        # CompressedTensorsW8A8Fp8 / W8A8Int8.create_weights: an 8-bit matrix and float32 scales per tensor,
        # per output channel or per [n, k] block
        block = tuple(weights.get("block_structure") or ()) or None
        group = {"channel": 0, "tensor": -1, "block": 0}.get(strategy, 0)
        return WeightFormat("compressed-tensors", 8, group, block if strategy == "block" else None, False, 4,
                            ignore=ignore, label_key="ct_w8",
                            label_args=(("kind", kind), ("strategy", strategy)),
                            rule="CompressedTensorsW8A8Fp8 / CompressedTensorsW8A8Int8.create_weights")
    # CompressedTensorsWNA16.create_weights: weight_packed int32 (bits·in/32 per row), weight_scale in the
    # model's dtype per group (one per row for "channel"), weight_zero_point packed int32 when not symmetric
    group = _int(weights, "group_size", 0) if strategy == "group" else 0
    symmetric = weights.get("symmetric", True)
    act_order = weights.get("actorder") == "group"
    return WeightFormat("compressed-tensors", bits, group, None, not symmetric, 2, act_order,
                        ignore=ignore, label_key="ct_wn" + ("_group" if group else "") + ("" if symmetric else "_asym"),
                        label_args=(("bits", bits), ("strategy", strategy), ("group", group)),
                        rule="CompressedTensorsWNA16.create_weights")


def weight_format(quantization_config: dict | None, model_dtype: str = "bfloat16") -> WeightFormat:
    """The format a config.json's quantization_config describes; unquantized (the model's dtype) without one."""
    if not quantization_config:
        return plain_format(model_dtype)
    if not isinstance(quantization_config, dict):
        raise InputError("weights.quant_bad_field", field="quantization_config",
                         value=json.dumps(quantization_config))
    cfg = quantization_config
    method = str(cfg.get("quant_method", "")).lower()
    if method == "fp8":
        block = cfg.get("weight_block_size")
        ignore = _names(cfg.get("ignored_layers")) or _names(cfg.get("modules_to_not_convert"))
        if block:
            if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
                raise InputError("weights.quant_bad_field", field="weight_block_size", value=json.dumps(block))
            # Fp8LinearMethod.create_weights + create_fp8_scale_parameter(BlockQuantScaleParameter): float32
            # weight_scale_inv of cdiv(out, block_n) × cdiv(in, block_k)
            return WeightFormat("fp8", 8, 0, (block[0], block[1]), False, 4, ignore=ignore,
                                label_key="fp8_block", label_args=(("n", block[0]), ("k", block[1])),
                                rule="Fp8LinearMethod.create_weights, create_fp8_scale_parameter")
        # per-tensor: one float32 weight_scale per logical matrix (PerTensorScaleParameter)
        return WeightFormat("fp8", 8, -1, None, False, 4, ignore=ignore, label_key="fp8_tensor",
                            rule="Fp8LinearMethod.create_weights (PerTensorScaleParameter)")
    if method in ("awq", "gptq"):
        bits, group = _int(cfg, "bits", 4), _int(cfg, "group_size", 128)
        if bits not in (2, 3, 4, 8) or group == 0 or group < -1:
            raise InputError("weights.quant_bad_field", field="bits / group_size", value=f"{bits} / {group}")
        if method == "awq":
            # AutoAWQLinearMethod.create_weights: qweight int32 (in, out·bits/32), qzeros int32 (in/g,
            # out·bits/32), scales in the model's dtype (in/g, out); modules_to_not_convert stay unquantized
            return WeightFormat("awq", bits, group, None, cfg.get("zero_point", True), 2,
                                ignore=_names(cfg.get("modules_to_not_convert")),
                                label_key="awq", label_args=(("bits", bits), ("group", group)),
                                rule="AutoAWQLinearMethod.create_weights")
        # AutoGPTQLinearMethod.create_weights: qweight int32 (in·bits/32, out), qzeros (in/g, out·bits/32),
        # scales (in/g, out); g_idx (int32 per input column) with desc_act
        return WeightFormat("gptq", bits, group, None, True, 2, bool(cfg.get("desc_act")),
                            ignore=_names(cfg.get("modules_to_not_convert")),
                            label_key="gptq_act" if cfg.get("desc_act") else "gptq",
                            label_args=(("bits", bits), ("group", group)),
                            rule="AutoGPTQLinearMethod.create_weights")
    if method == "compressed-tensors":
        return _compressed_tensors(cfg)
    if method == "mxfp4":
        # Mxfp4Config.get_quant_method: linear layers fall back to UnquantizedLinearMethod; only the routed
        # experts are MXFP4 (Mxfp4MoEMethod.create_weights: uint8 pairs + a uint8 scale per 32 values)
        return WeightFormat("mxfp4", 4, MXFP4_BLOCK, None, False, 1, experts_only=True,
                            ignore=_names(cfg.get("modules_to_not_convert")), label_key="mxfp4",
                            rule="Mxfp4Config.get_quant_method, Mxfp4MoEMethod.create_weights")
    if method == "bitsandbytes":
        # BitsAndBytesLinearMethod.create_weights (bitsandbytes.py of the 0.10–0.11 releases; the 0.34 wheel has
        # no bitsandbytes method): 4-bit packs two values per uint8, and the loader keeps each matrix's quant
        # state, a float32 absmax per 64-value block (one uint8 per block with double quantization); 8-bit int8
        # with a float32 SCB per row
        if cfg.get("load_in_8bit"):
            return WeightFormat("bitsandbytes", 8, 0, None, False, 4,
                                ignore=_names(cfg.get("llm_int8_skip_modules")), label_key="bnb8",
                                rule="BitsAndBytesLinearMethod.create_weights (create_qweight_for_8bit)")
        double = bool(cfg.get("bnb_4bit_use_double_quant"))
        return WeightFormat("bitsandbytes", 4, 64, None, False, 1 if double else 4,
                            ignore=_names(cfg.get("llm_int8_skip_modules")),
                            label_key="bnb4_double" if double else "bnb4",
                            label_args=(("kind", cfg.get("bnb_4bit_quant_type", "fp4")),),
                            rule="BitsAndBytesLinearMethod.create_weights (create_qweight_for_4bit)")
    return WeightFormat(method or "?", 0, known=False, label_key="unknown", label_args=(("method", method or "?"),))


# is_layer_skipped's match_mode: fp8 and compressed-tensors name exact modules (or a prefix of them); AWQ's
# modules_to_not_convert match any module whose name contains them (AutoAWQConfig: match_mode="substring");
# bitsandbytes' llm_int8_skip_modules a whole component of the name (is_layer_skipped_bnb). MXFP4 quantizes only
# the routed experts whatever its list says (Mxfp4Config.from_config keeps none).
SUBSTRING_METHODS = ("awq",)


def is_ignored(module: str, fmt: WeightFormat) -> bool:
    """Whether a module stays unquantized (utils/quant_utils.py is_layer_skipped; compressed-tensors'
    should_ignore_layer for "re:" patterns; gpt-oss' globs such as "model.layers.*.self_attn")."""
    for pattern in fmt.ignore:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif "*" in pattern:
            if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*"):
                return True
        elif pattern == module or module.startswith(pattern + ".") or (
                fmt.method in SUBSTRING_METHODS and pattern in module) or (
                fmt.method == "bitsandbytes" and pattern in module.split(".")):
            return True
    return False


@dataclass(frozen=True)
class Bytes:
    """One linear's parameters, split as the planner shows them."""

    weights: int = 0
    scales: int = 0
    zero_points: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.scales + self.zero_points

    def __add__(self, other: Bytes) -> Bytes:
        return Bytes(self.weights + other.weights, self.scales + other.scales, self.zero_points + other.zero_points)

    def times(self, n: int) -> Bytes:
        return Bytes(self.weights * n, self.scales * n, self.zero_points * n)


def linear_bytes(out: int, inp: int, fmt: WeightFormat, *, parts: int = 1) -> Bytes:
    """Bytes of one linear layer of out × in values in `fmt` (parts: the logical matrices fused into it, each
    with its own per-tensor scale)."""
    if fmt.method == "none":
        return Bytes(math.ceil(out * inp * fmt.bits / 8))
    data = math.ceil(out * inp * fmt.bits / 8)
    if fmt.method in ("fp8", "compressed-tensors") and fmt.bits == 8:
        if fmt.block:
            bn, bk = fmt.block
            return Bytes(data, -(-out // bn) * -(-inp // bk) * fmt.scale_bytes)
        return Bytes(data, (parts if fmt.group_size == -1 else out) * fmt.scale_bytes)
    if fmt.method == "bitsandbytes":
        if fmt.bits == 8:
            return Bytes(data, out * 4)
        blocks = -(-out * inp // fmt.group_size)
        nested = -(-blocks // 256) * 4 if fmt.scale_bytes == 1 else 0  # double quant: float32 per 256 absmax
        return Bytes(data, blocks * fmt.scale_bytes + nested)
    groups = 1 if fmt.group_size == -1 else (inp // fmt.group_size if fmt.group_size else 1)
    scales = groups * out * fmt.scale_bytes
    if fmt.method == "compressed-tensors":
        scales += 16  # CompressedTensorsWNA16.create_weights: weight_shape, two int64
    zeros = math.ceil(groups * out * fmt.bits / 8) if fmt.zero_points else 0
    g_idx = inp * 4 if fmt.act_order else 0
    return Bytes(data, scales + g_idx, zeros)


def mxfp4_expert_bytes(n_experts: int, hidden: int, inter: int, backend: str, bias_bytes: int) -> tuple[Bytes, int]:
    """One MoE layer's experts in MXFP4 as Mxfp4MoEMethod.create_weights makes them, after the backend's padding
    (MXFP4_PADDING): w13 (E, 2I, H/2) + scales (E, 2I, H/32), w2 (E, H, I/2) + scales (E, H, I/32), and the
    biases (E, 2I) and (E, H) in the model's dtype. Returns (bytes, padded values beyond the checkpoint's)."""
    i_step, h_step = MXFP4_PADDING[backend]
    i_pad, h_pad = -(-inter // i_step) * i_step, -(-hidden // h_step) * h_step
    values = n_experts * 3 * i_pad * h_pad
    data = values // 2
    scales = values // MXFP4_BLOCK
    bias = n_experts * (2 * i_pad + h_pad) * bias_bytes
    return Bytes(data, scales + bias), values - n_experts * 3 * inter * hidden
