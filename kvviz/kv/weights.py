"""The weights' bytes per GPU as vLLM loads a checkpoint: from the config (its linear layers in the checkpoint's
format, kvviz.kv.weight_format, and everything else in the model's dtype), or read exactly from a local model
directory's safetensors headers without loading a tensor.

What the config gives: the linear layers of the families kvviz knows (attention or MLA projections, dense or gated
MLPs, routed and shared experts, routers), with the module names vLLM's is_layer_skipped matches; the parameters
left (embeddings, LM head, norms, biases) are n_params minus those, in the model's dtype.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, weight_bytes
from kvviz.kv.weight_format import (
    DTYPE_BYTES,
    Bytes,
    WeightFormat,
    is_ignored,
    linear_bytes,
    mxfp4_expert_bytes,
    plain_format,
    weight_format,
)

# Where the weight format came from: the model's config.json, the preset's (its checkpoint ships quantized),
# --weight-dtype, the checkpoint's safetensors headers, or vLLM's --dtype auto for a config that says nothing
FORMAT_SOURCES = ("config", "preset", "flag", "read", "default")


@dataclass(frozen=True)
class Linear:
    """One linear layer (or one layer's routed experts, `count` matrices of one shape)."""

    module: str  # the name vLLM's quant configs match (model.layers.3.self_attn.q_proj)
    out: int
    inp: int
    count: int = 1
    kind: str = "linear"  # "linear", "experts", "router" (always in the model's dtype)
    replicated: bool = False  # ReplicatedLinear: every tensor-parallel rank holds all of it


DECODER = "model"  # the decoder's module in every Hugging Face checkpoint kvviz sizes (model.layers.3.mlp, ...)


def _moe_prefix(model_type: str) -> tuple[str, str]:
    """(the MoE block's module, its router's name) in each family's checkpoint (mixtral.py, gpt_oss.py, ...)."""
    if model_type == "mixtral":
        return "block_sparse_moe", "gate"
    return "mlp", "router" if model_type == "gpt_oss" else "gate"


def linear_inventory(spec: KVSpec) -> list[Linear] | None:
    """Every linear layer of the model vLLM builds from this config; None for a family whose layers the config does
    not say (no MLP width, an MLP kvviz cannot tell gated from plain)."""
    d, h = spec.d_model, spec.n_heads
    if d is None or spec.mlp_gated is None or (spec.d_ff is None and spec.n_dense_layers + (not spec.n_experts)):
        return None
    out: list[Linear] = []
    moe_block, router = _moe_prefix(spec.model_type)
    for i in range(spec.n_layers):
        a = f"{DECODER}.layers.{i}.self_attn"
        if spec.is_mla:  # deepseek_v2.py DeepseekV2MLAAttention: the a-projections are ReplicatedLinear
            nope, rope, v = spec.d_head, spec.qk_rope_head_dim, spec.v_head_dim or spec.d_head
            if spec.q_lora_rank:
                out += [Linear(f"{a}.q_a_proj", spec.q_lora_rank, d, replicated=True),
                        Linear(f"{a}.q_b_proj", h * (nope + rope), spec.q_lora_rank)]
            else:
                out.append(Linear(f"{a}.q_proj", h * (nope + rope), d))
            out += [Linear(f"{a}.kv_a_proj_with_mqa", spec.kv_lora_rank + rope, d, replicated=True),
                    Linear(f"{a}.kv_b_proj", h * (nope + v), spec.kv_lora_rank),
                    Linear(f"{a}.o_proj", d, h * v)]
        else:
            q, kv = h * spec.d_head, spec.n_kv_heads * spec.d_head
            out += [Linear(f"{a}.q_proj", q, d), Linear(f"{a}.k_proj", kv, d), Linear(f"{a}.v_proj", kv, d),
                    Linear(f"{a}.o_proj", d, q)]
        m = f"{DECODER}.layers.{i}.mlp"
        if spec.n_experts and i >= spec.n_dense_layers:
            e, width = spec.n_experts, spec.moe_d_ff
            if width is None:
                return None
            block = f"{DECODER}.layers.{i}.{moe_block}"
            out += [Linear(f"{block}.experts", 2 * width, d, e, "experts"),
                    Linear(f"{block}.experts.down", d, width, e, "experts"),
                    Linear(f"{block}.{router}", e, d, kind="router", replicated=True)]
            if spec.n_shared_experts:
                s = spec.n_shared_experts * width
                out += [Linear(f"{m}.shared_experts.gate_proj", s, d), Linear(f"{m}.shared_experts.up_proj", s, d),
                        Linear(f"{m}.shared_experts.down_proj", d, s)]
        elif spec.mlp_gated:
            out += [Linear(f"{m}.gate_proj", spec.d_ff, d), Linear(f"{m}.up_proj", spec.d_ff, d),
                    Linear(f"{m}.down_proj", d, spec.d_ff)]
        else:
            out += [Linear(f"{m}.fc1", spec.d_ff, d), Linear(f"{m}.fc2", d, spec.d_ff)]
    return out


@dataclass(frozen=True)
class WeightSizing:
    """One checkpoint's weights as vLLM holds them, in total and on each of tp GPUs."""

    format: WeightFormat
    source: str  # FORMAT_SOURCES
    model_dtype: str
    tp: int
    total_bytes: int | None  # None: the format is unknown or the family's layers are (see `unknown`)
    per_gpu_bytes: int | None
    per_gpu_range: tuple[int, int] | None = None  # what the GPU surely holds (an unknown format), or the backends
    quantized_bytes: int = 0  # the quantized matrices
    scale_bytes: int = 0  # their scales (and MXFP4 expert biases)
    zero_point_bytes: int = 0
    unquantized_bytes: int = 0  # embeddings, LM head, norms, routers, ignored layers, in the model's dtype
    unquantized_params: int = 0
    read: bool = False  # summed from the checkpoint's safetensors headers, not estimated
    files: int = 0
    unknown: str = ""  # why the bytes are not known ("method:NAME", "layers")
    notes: tuple[str, ...] = field(default_factory=tuple)
    backend: str = ""  # the MXFP4 expert kernel whose padding is counted
    one_dtype_per_gpu_bytes: int | None = None  # every parameter at the format's bits (--weight-dtype's answer)

    def to_dict(self) -> dict:
        return {"format": self.format.to_dict(), "source": self.source, "model_dtype": self.model_dtype,
                "tp": self.tp, "total_bytes": self.total_bytes, "per_gpu_bytes": self.per_gpu_bytes,
                "per_gpu_range": list(self.per_gpu_range) if self.per_gpu_range else None,
                "quantized_bytes": self.quantized_bytes, "scale_bytes": self.scale_bytes,
                "zero_point_bytes": self.zero_point_bytes, "unquantized_bytes": self.unquantized_bytes,
                "unquantized_params": self.unquantized_params, "read": self.read, "files": self.files,
                "unknown": self.unknown, "notes": list(self.notes), "backend": self.backend,
                "one_dtype_per_gpu_bytes": self.one_dtype_per_gpu_bytes}


def model_dtype(spec: KVSpec) -> str:
    """The dtype vLLM's --dtype auto gives unquantized tensors: the config's, float32 configs as bfloat16
    (ModelConfig._resolve_auto_dtype), bfloat16 where the config says nothing."""
    dtype = spec.dtype if spec.dtype in DTYPE_BYTES else "bfloat16"
    return "bfloat16" if dtype == "float32" else dtype


def _per_gpu(total: int, replicated: int, tp: int) -> int:
    """Sharded parts split over tp ranks (column/row-parallel linears, vocab-parallel embeddings), replicated
    parts whole on each."""
    return math.ceil((total - replicated) / tp) + replicated


def size_weights(spec: KVSpec, *, tp: int = 1, weight_dtype: str | None = None, preset: bool = False,
                 mxfp4_backend: str = "marlin") -> WeightSizing:
    """The weights of `spec` per GPU: in --weight-dtype when given (every parameter in it), else in the format its
    config (or the preset's checkpoint) states."""
    if spec.n_params is None:
        raise InputError("capacity.params_unknown", name=spec.name or "?")
    dtype = model_dtype(spec)
    if weight_dtype is not None:
        fmt, source = plain_format(weight_dtype), "flag"
        total = weight_bytes(spec.n_params, weight_dtype)
        return WeightSizing(fmt, source, weight_dtype, tp, total, math.ceil(total / tp), quantized_bytes=0,
                            unquantized_bytes=total, unquantized_params=spec.n_params)
    config = json.loads(spec.quantization) if spec.quantization else None
    source = ("preset" if preset else "config") if config or spec.dtype else "default"
    fmt = weight_format(config, dtype)
    all_plain = math.ceil(spec.n_params * DTYPE_BYTES[dtype])
    if not fmt.known:
        # what the GPU surely holds: at least nothing of the quantized part, at most every weight unquantized
        linears = linear_inventory(spec)
        low = 0 if linears is None else (spec.n_params - sum(x.out * x.inp * x.count for x in linears
                                                              if x.kind != "router")) * DTYPE_BYTES[dtype]
        return WeightSizing(fmt, source, dtype, tp, None, None, (math.ceil(low / tp), math.ceil(all_plain / tp)),
                            unknown=f"method:{fmt.method}")
    if not fmt.quantized:
        return WeightSizing(fmt, source, dtype, tp, all_plain, math.ceil(all_plain / tp),
                            unquantized_bytes=all_plain, unquantized_params=spec.n_params)
    linears = linear_inventory(spec)
    if linears is None:
        return WeightSizing(fmt, source, dtype, tp, None, None, (0, math.ceil(all_plain / tp)), unknown="layers")
    sized = _sized(spec, linears, fmt, dtype, mxfp4_backend)
    if sized is None:
        return WeightSizing(fmt, source, dtype, tp, None, None, (0, math.ceil(all_plain / tp)), unknown="layers")
    quantized, plain_params, replicated, notes = sized
    plain = math.ceil(plain_params * DTYPE_BYTES[dtype])
    total = quantized.total + plain
    per_gpu = _per_gpu(total, replicated, tp)
    rng = None
    if fmt.method == "mxfp4":  # each expert kernel pads its own way: the range over the two Hopper paths
        ends = [_sized(spec, linears, fmt, dtype, b) for b in ("triton", "marlin")]
        rng = tuple(sorted(_per_gpu(q.total + plain, r, tp) for q, _, r, _ in ends))
    return WeightSizing(fmt, source, dtype, tp, total, per_gpu, rng, quantized.weights, quantized.scales,
                        quantized.zero_points, plain, plain_params, notes=tuple(notes),
                        backend=mxfp4_backend if fmt.method == "mxfp4" else "",
                        one_dtype_per_gpu_bytes=math.ceil(spec.n_params * fmt.bits / 8 / tp))


def _sized(spec: KVSpec, linears: list[Linear], fmt: WeightFormat, dtype: str,
           backend: str) -> tuple[Bytes, int, int, list[str]] | None:
    """(the quantized layers' bytes, the parameters left in the model's dtype, replicated bytes, notes)."""
    quantized, quantized_params, replicated, notes = Bytes(), 0, 0, []
    ignored = 0
    for x in linears:
        params = x.out * x.inp * x.count
        if x.kind == "router" or is_ignored(x.module, fmt) or (fmt.experts_only and x.kind != "experts"):
            ignored += params if x.kind != "router" else 0
            if x.replicated:
                replicated += math.ceil(params * DTYPE_BYTES[dtype])
            continue
        if fmt.method == "mxfp4":
            if x.module.endswith(".down"):
                continue  # the layer's experts are sized at once with their gate_up
            b, padded = mxfp4_expert_bytes(x.count, spec.d_model, spec.moe_d_ff, backend, DTYPE_BYTES[dtype])
            quantized += b
            quantized_params += x.count * 3 * spec.moe_d_ff * spec.d_model
            # the checkpoint's biases are counted in n_params: take out the unpadded ones counted again here
            quantized_params += x.count * (2 * spec.moe_d_ff + spec.d_model)
            if padded and not notes:
                notes.append(f"mxfp4_padding:{backend}")
            continue
        b = linear_bytes(x.out, x.inp, fmt).times(x.count)
        quantized += b
        quantized_params += params
        if x.replicated:
            replicated += b.total
    plain_params = spec.n_params - quantized_params
    if plain_params < 0:
        return None  # the layers found hold more than the model's parameters: not this family's layout
    if ignored:
        notes.append(f"ignored_params:{ignored}")
    return quantized, plain_params, replicated, notes


# ---- a local checkpoint's safetensors headers --------------------------------------------------------------

# Bytes per element of the safetensors dtypes (the format's spec: safetensors/src/tensor.rs, Dtype)
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                     "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
MAX_HEADER = 100_000_000  # the format's own limit on the JSON header (safetensors: N_MAX_HEADER)


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str


def read_header(path: Path) -> dict[str, Tensor]:
    """One safetensors file's tensors from its header: 8 bytes little-endian N, then N bytes of JSON
    {name: {dtype, shape, data_offsets}}; no tensor data is read."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InputError("weights.header_bad", file=path.name, why="shorter than 8 bytes")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise InputError("weights.header_bad", file=path.name, why=f"header length {n:,} past the file's end")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise InputError("weights.header_bad", file=path.name, why="header is not JSON") from None
    out, data = {}, size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            width = SAFETENSORS_BYTES[dtype]
        except (KeyError, TypeError, ValueError):
            raise InputError("weights.header_bad", file=path.name, why=f"tensor {name}: {json.dumps(info)[:80]}") \
                from None
        nbytes = math.prod(shape) * width
        if end - start != nbytes or end > data:
            raise InputError("weights.header_bad", file=path.name,
                             why=f"tensor {name}: offsets {start}–{end} for {nbytes:,} bytes")
        out[name] = Tensor(dtype, shape, nbytes, path.name)
    return out


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a local model directory: those its index names (a sharded checkpoint), else
    every *.safetensors in it."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError):
            raise InputError("weights.header_bad", file=index.name, why="no weight_map") from None
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise InputError("weights.shard_missing", file=missing[0], index=index.name)
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def _expected(x: Linear, fmt: WeightFormat) -> list[tuple[str, tuple[int, ...]]]:
    """The checkpoint tensors one linear layer must have, with their shapes, in `fmt` (the layouts the quant
    methods' weight loaders take)."""
    if x.kind == "experts" or fmt.method in ("mxfp4", "bitsandbytes"):
        return []  # experts are stored per expert or fused per family; checked through the byte count only
    plain = [(f"{x.module}.weight", (x.out, x.inp))]
    if not fmt.quantized or is_ignored(x.module, fmt) or x.kind == "router":
        return plain
    if fmt.bits == 8:
        if fmt.block:
            bn, bk = fmt.block
            return plain + [(f"{x.module}.weight_scale_inv", (-(-x.out // bn), -(-x.inp // bk)))]
        return plain
    pack = 32 // int(fmt.bits)
    groups = 1 if fmt.group_size == -1 else (x.inp // fmt.group_size if fmt.group_size else 1)
    if fmt.method == "compressed-tensors":
        return [(f"{x.module}.weight_packed", (x.out, x.inp // pack)), (f"{x.module}.weight_scale", (x.out, groups))]
    if fmt.method == "awq":
        return [(f"{x.module}.qweight", (x.inp, x.out // pack)), (f"{x.module}.scales", (groups, x.out))]
    return [(f"{x.module}.qweight", (x.inp // pack, x.out)), (f"{x.module}.scales", (groups, x.out))]  # GPTQ


def read_checkpoint(folder: str | Path, spec: KVSpec, *, tp: int = 1) -> WeightSizing | None:
    """The weights of a local model directory, summed from its safetensors headers (None: no safetensors there).
    Tensors of layers past the config's num_hidden_layers (DeepSeek's multi-token-prediction layer) are not
    loaded by vLLM and not counted. A tensor the config implies but the headers lack, or of another shape, is an
    InputError naming it."""
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    files = checkpoint_files(folder)
    if not files:
        return None
    tensors: dict[str, Tensor] = {}
    for f in files:
        tensors |= read_header(f)
    dtype = model_dtype(spec)
    fmt = weight_format(json.loads(spec.quantization) if spec.quantization else None, dtype)
    linears = linear_inventory(spec) or []
    for x in linears:
        for name, shape in _expected(x, fmt):
            got = tensors.get(name)
            if got is None:
                raise InputError("weights.header_missing", tensor=name, files=len(files))
            if got.shape != shape:
                raise InputError("weights.header_shape", tensor=name, shape=list(got.shape), expected=list(shape),
                                 file=got.file)
    if spec.vocab_size and spec.d_model and "model.embed_tokens.weight" in tensors:
        got = tensors["model.embed_tokens.weight"]
        if got.shape != (spec.vocab_size, spec.d_model):
            raise InputError("weights.header_shape", tensor="model.embed_tokens.weight", shape=list(got.shape),
                             expected=[spec.vocab_size, spec.d_model], file=got.file)
    loaded = {n: t for n, t in tensors.items() if (_layer_of(n) or 0) < spec.n_layers}
    total = sum(t.nbytes for t in loaded.values())
    skipped = len(tensors) - len(loaded)
    replicated = 0
    for x in linears:  # ReplicatedLinear layers are whole on every rank
        if x.replicated:
            replicated += sum(t.nbytes for n, t in loaded.items() if n.startswith(x.module + "."))
    by_kind = {"quantized": 0, "scales": 0, "zero_points": 0, "plain": 0}
    for n, t in loaded.items():
        leaf = n.rsplit(".", 1)[-1]
        kind = ("scales" if "scale" in leaf or leaf in ("g_idx", "weight_shape") else
                "zero_points" if "zero" in leaf else
                "quantized" if t.dtype in ("F8_E4M3", "F8_E5M2", "I32", "I8", "U8") else "plain")
        by_kind[kind] += t.nbytes
    notes = [f"skipped_layers:{skipped}"] if skipped else []
    return WeightSizing(fmt, "read", dtype, tp, total, _per_gpu(total, replicated, tp),
                        quantized_bytes=by_kind["quantized"], scale_bytes=by_kind["scales"],
                        zero_point_bytes=by_kind["zero_points"], unquantized_bytes=by_kind["plain"], read=True,
                        files=len(files), notes=tuple(notes))
