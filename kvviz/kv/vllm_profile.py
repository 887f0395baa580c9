"""vLLM's memory reserve predicted before launch: what its start-up profile run allocates, from the serving flags.

At start-up vLLM runs one dummy batch and measures its peak (the "PyTorch activation peak memory" of its log),
adds the memory CUDA and NCCL hold outside torch ("non_torch_memory") and, from 0.20, an estimate of the CUDA
graphs' memory; what is left of total × gpu_memory_utilization after the weights becomes KV cache. This module
predicts each of those terms from what a user knows before launching: the model's config, the GPU, the vLLM
version and the flags. Every default below was read in vLLM's released source (pip sdists of the versions named)
and carries the file it came from; every term is checked against real start-up logs in
kvviz/kv/startup_logs.json (tests/kv/test_vllm_profile.py).

The profile run, as read in the code:
- the batch: V0 `model_runner.profile_run` → `_dummy_run(max_num_batched_tokens, max_num_seqs)`, max_num_seqs
  prompts sharing max_num_batched_tokens tokens; V1 `gpu_model_runner.profile_run` → `_dummy_run(max_num_tokens)`
  with min(max_num_seqs, tokens) requests, then `_dummy_sampler_run` on one row per request.
- the forward pass peaks inside one decoder layer (vLLM's llama.py: the residual, the layer's input still held by
  the model's loop, the normed input, then gate_up [2·d_ff] and SiluAndMul's output [d_ff] live together).
- the sampler samples every row with top_k = vocab − 1 and top_p (0.99 in V0, 0.9 in V1), so the logits are
  copied to float32 and sorted: torch.sort of a [rows, vocab] float32 tensor keeps its values, int64 indices,
  int64 reverse indices and cub's alternate keys and values (PyTorch aten/src/ATen/native/cuda/SortStable.cu,
  `segmented_sort_pairs`). Later versions sample with FlashInfer or a Triton top-k/top-p kernel instead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.kv.formula import KVSpec

GIB = 2**30
MIB = 2**20
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py): lm_head rows are padded to it

# Bytes per logits element the sampler keeps alive at its peak, by implementation (the model-dtype logits of
# lm_head come on top):
# - sort: float32 copy 4 + sorted values 4 + int64 indices 8 + torch's int64 reverse indices 8 + cub's alternate
#   keys 4 and values 8 (V0 sampler.py `_apply_top_k_top_p`, V1 topk_topp_sampler.py `apply_top_k_top_p`);
# - flashinfer: float32 copy 4 + top-k masked logits 4 + probabilities 4 (`top_k_top_p_sampling_from_logits`);
# - triton: float32 copy 4 (masked in place, `apply_top_k_top_p_triton`) + probabilities 4 + the exponential
#   noise q 4 + probs / q 4 (`random_sample`).
SAMPLER_BYTES = {"sort": 36, "flashinfer": 12, "triton": 16}
SAMPLERS = tuple(SAMPLER_BYTES)

ENTRIES = ("serve", "llm")  # `vllm serve` (UsageContext.OPENAI_API_SERVER) and the LLM class (LLM_CLASS)
ENGINES = ("v0", "v1")


def parse_version(text: str) -> tuple[int, ...]:
    """'0.6.4.post1' → (0, 6, 4); 'v0.11' → (0, 11, 0); anything else is a clear error."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.\-+]?(?:post|rc|dev)\d*.*)?", str(text).strip())
    if not m:
        raise InputError("capacity.bad_version", value=text)
    return tuple(int(g or 0) for g in m.groups())  # '0.12' is 0.12.0


@dataclass(frozen=True)
class VllmLine:
    """A run of vLLM releases whose start-up arithmetic is the same. `first` is the first release read with it;
    the releases between two lines that were not read are given to the earlier one."""

    name: str
    first: tuple[int, ...]
    engine: str  # the default engine: "v0" until 0.8.0, then "v1" (VLLM_USE_V1=0 picks V0 until 0.10)
    measures: str  # "reserved": free memory before − after the profile run (the caching allocator's cached blocks
    #                count); "allocated": torch's allocated peak
    non_torch: str  # "device": used − torch allocated, CUDA context included; "increase": since the worker began
    v0_chunked_tokens: int | None  # V0's max_num_batched_tokens with chunked prefill (None: not on by default)
    samplers: tuple[str, ...]  # the sampler implementations a default install can run (first: pip install)
    cudagraph: str  # "after": captured after the KV cache, not reserved; "estimate": estimated and subtracted
    block_sizes: tuple[int, ...] | None  # --block-size choices; None: any multiple of 16 (FlashAttention)
    source: str
    prefill_copy: bool = False  # attention/backends/flash_attn.py copies FlashAttention's output into `output`


# Read in the pip sdists of 0.4.1, 0.5.4, 0.6.3, 0.6.4.post1, 0.6.5, 0.6.6, 0.7.2, 0.7.3, 0.8.0–0.8.5, 0.9.0–0.9.2,
# 0.10.0–0.10.2, 0.11.0–0.11.2, 0.12.0, 0.13.0, 0.16.0–0.25.0, 0.27.0–0.29.0, 0.31.0, 0.33.0.
LINES: tuple[VllmLine, ...] = (
    VllmLine("0.4", (0, 4, 0), "v0", "reserved", "increase", None, ("sort",), "after", (8, 16, 32),
             "0.4.1 worker/worker.py determine_num_available_blocks: free memory at init − free after the profile "
             "run (no empty_cache); config.py SchedulerConfig: max(max_model_len, 2048) tokens",
             prefill_copy=True),
    VllmLine("0.5.4", (0, 5, 4), "v0", "reserved", "increase", 512, ("sort",), "after", (8, 16, 32, 64, 128),
             "0.5.4 engine/arg_utils.py: chunked prefill on by default past 32K tokens; config.py: then 512 "
             "tokens, else max(max_model_len, 2048)", prefill_copy=True),
    VllmLine("0.6.3", (0, 6, 3), "v0", "reserved", "increase", 512, ("sort",), "after", (8, 16, 32, 64, 128),
             "0.6.3 attention/backends/flash_attn.py returns FlashAttention's output without a copy"),
    VllmLine("0.6.4", (0, 6, 4), "v0", "allocated", "device", 512, ("sort",), "after", (8, 16, 32, 64, 128),
             "0.6.4.post1 worker/worker.py: torch's allocated peak + (used − allocated) after empty_cache, the "
             "CUDA context included"),
    VllmLine("0.6.5", (0, 6, 5), "v0", "allocated", "increase", 2048, ("sort",), "after", (8, 16, 32, 64, 128),
             "0.6.5 worker/worker.py memory_profiling (non-torch measured as the increase since the worker "
             "began); config.py SchedulerConfig: 2048 tokens with chunked prefill"),
    VllmLine("0.8 (V1)", (0, 8, 0), "v1", "allocated", "device", 2048, ("sort", "flashinfer"), "after",
             (8, 16, 32, 64, 128),
             "0.8.0 v1/worker/gpu_worker.py determine_available_memory (the CUDA context in non-torch); "
             "engine/arg_utils.py _override_v1_engine_args; v1/sample/ops/topk_topp_sampler.py uses FlashInfer "
             "when installed (the docker image has it, pip does not)"),
    VllmLine("0.8.4 (V1)", (0, 8, 4), "v1", "allocated", "device", 2048, ("sort", "flashinfer"), "after",
             (8, 16, 32, 64, 128), "0.8.4 engine/arg_utils.py: 256 sequences unless the device name says H100/H200"),
    VllmLine("0.8.5 (V1)", (0, 8, 5), "v1", "allocated", "device", 2048, ("sort", "flashinfer"), "after",
             (8, 16, 32, 64, 128), "0.8.5 engine/arg_utils.py: the larger batch by device memory (≥ 70 GiB)"),
    VllmLine("0.9.0 (V1)", (0, 9, 0), "v1", "allocated", "device", 2048, ("sort", "flashinfer"), "after",
             (8, 16, 32, 64, 128), "0.9.0 engine/arg_utils.py: ≥ 70 GiB and not an A100"),
    VllmLine("0.9.1 (V1)", (0, 9, 1), "v1", "allocated", "increase", 2048, ("sort", "flashinfer"), "after",
             (8, 16, 32, 64, 128),
             "0.9.1 v1/worker/gpu_worker.py: memory_profiling from the worker's init snapshot"),
    VllmLine("0.10 (V1)", (0, 10, 0), "v1", "allocated", "increase", None, ("sort", "flashinfer"), "after",
             (1, 8, 16, 32, 64, 128), "0.10.2 config/cache.py BlockSize; V0 gone"),
    VllmLine("0.11.1 (V1)", (0, 11, 1), "v1", "allocated", "increase", None, ("sort",), "after",
             (1, 8, 16, 32, 64, 128),
             "0.11.1 topk_topp_sampler.py: FlashInfer sampling only with VLLM_USE_FLASHINFER_SAMPLER=1"),
    VllmLine("0.12 (V1)", (0, 12, 0), "v1", "allocated", "increase", None, ("sort",), "after",
             (1, 8, 16, 32, 64, 128, 256),
             "0.12.0 config/cache.py BlockSize adds 256; arg_utils: max_num_batched_tokens ≤ "
             "max_num_seqs · max_model_len"),
    VllmLine("0.17 (V1)", (0, 17, 0), "v1", "allocated", "increase", None, ("triton",), "after",
             (1, 8, 16, 32, 64, 128, 256),
             "0.17.0 topk_topp_sampler.py apply_top_k_top_p: Triton kernel for 8 rows or more"),
    VllmLine("0.18 (V1)", (0, 18, 0), "v1", "allocated", "increase", None, ("triton",), "after", None,
             "0.18.0 config/cache.py block_size: any int (FlashAttention: a multiple of 16); "
             "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS added, off by default"),
    VllmLine("0.20 (V1)", (0, 20, 0), "v1", "allocated", "increase", None, ("triton",), "estimate", None,
             "0.20.0 envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1: gpu_worker.py subtracts "
             "gpu_model_runner.profile_cudagraph_memory()"),
    VllmLine("0.21 (V1)", (0, 21, 0), "v1", "allocated", "increase", None, ("flashinfer",), "estimate", None,
             "0.21.0 envs.py VLLM_USE_FLASHINFER_SAMPLER defaults to on (FlashInfer a dependency since 0.12)"),
    VllmLine("0.29 (V1)", (0, 29, 0), "v1", "allocated", "increase", None, ("flashinfer",), "estimate", None,
             "0.29.0 engine/arg_utils.py get_batch_defaults: 16,384 tokens for both entries on GPUs ≥ 160 GiB"),
)


# Environment defaults the planner's terms depend on, each as the release's own vllm/envs.py sets it (read in the
# wheel of that release: `pip download vllm==X --no-deps`, `unzip -p vllm-X-*.whl vllm/envs.py`). The lines above
# follow them (tests/kv/test_vllm_kv_layout.py): copies of envs.py from other releases differ.
ENV_DEFAULTS: dict[str, tuple[tuple[tuple[int, ...], str, str], ...]] = {
    # gpu_worker.py subtracts profile_cudagraph_memory() only when this is on
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": tuple(
        (v, d, f"vllm {'.'.join(map(str, v))} wheel, vllm/envs.py: os.getenv(..., \"{d}\")")
        for v, d in (((0, 18, 0), "0"), ((0, 19, 0), "0"), ((0, 20, 0), "1"), ((0, 21, 0), "1"), ((0, 29, 0), "1"),
                     ((0, 33, 0), "1"), ((0, 34, 0), "1"))),
    # topk_topp_sampler.py samples with FlashInfer when this is true (None: only when set)
    "VLLM_USE_FLASHINFER_SAMPLER": tuple(
        (v, d, f"vllm {'.'.join(map(str, v))} wheel, vllm/envs.py: {d} when the variable is unset")
        for v, d in (((0, 11, 1), "None"), ((0, 18, 0), "None"), ((0, 20, 0), "None"), ((0, 21, 0), "True"),
                     ((0, 29, 0), "True"), ((0, 33, 0), "True"), ((0, 34, 0), "True"))),
    # fused_moe.py: the routed experts' buffers hold at most this many tokens
    "VLLM_FUSED_MOE_CHUNK_SIZE": tuple(
        (v, "32768", f"vllm {'.'.join(map(str, v))} wheel, vllm/envs.py: os.getenv(..., \"32768\")")
        for v in ((0, 8, 5), (0, 9, 0), (0, 9, 1), (0, 9, 2))),
}

# The releases whose source was read, to name each line by the first and last release read in it.
READ = ((0, 4, 1), (0, 5, 4), (0, 6, 3), (0, 6, 4), (0, 6, 5), (0, 6, 6), (0, 7, 2), (0, 7, 3), (0, 8, 0), (0, 8, 1),
        (0, 8, 3), (0, 8, 4), (0, 8, 5), (0, 9, 0), (0, 9, 1), (0, 9, 2), (0, 10, 0), (0, 10, 1), (0, 10, 2),
        (0, 11, 0), (0, 11, 1), (0, 11, 2), (0, 12, 0), (0, 13, 0), (0, 16, 0), (0, 17, 0), (0, 18, 0), (0, 19, 0),
        (0, 20, 0), (0, 21, 0), (0, 22, 0), (0, 23, 0), (0, 24, 0), (0, 25, 0), (0, 27, 0), (0, 28, 0), (0, 29, 0),
        (0, 31, 0), (0, 33, 0))


def line_label(line: VllmLine) -> str:
    """'0.10.0 – 0.11.0 (V1)': the releases read that follow this line's arithmetic."""
    i = LINES.index(line)
    end = LINES[i + 1].first if i + 1 < len(LINES) else (99,)
    read = [v for v in READ if line.first <= v < end]
    fmt = ".".join
    first, last = fmt(map(str, read[0])), fmt(map(str, read[-1]))
    span = first if first == last else f"{first} – {last}" + ("+" if i + 1 == len(LINES) else "")
    return f"{span} ({line.engine.upper()})"


def line_for(version: str) -> VllmLine:
    v = parse_version(version)
    if v < LINES[0].first:
        raise InputError("capacity.old_version", value=version, first=".".join(map(str, LINES[0].first)))
    return [line for line in LINES if line.first <= v][-1]


def block_size_allowed(block_size: int, line: VllmLine | None) -> bool:
    """--block-size as vLLM's argument parser accepts it (arg_utils.py choices, config/cache.py BlockSize); with
    no version, as any line does."""
    lines = LINES if line is None else (line,)
    return any(block_size in ln.block_sizes if ln.block_sizes else block_size % 16 == 0 for ln in lines)


@dataclass(frozen=True)
class ServingFlags:
    """What the user says about the launch; None = not said (the version's default, or a range over them)."""

    vllm_version: str | None = None
    engine: str | None = None  # "v0" / "v1" (VLLM_USE_V1)
    entry: str | None = None  # "serve" (vllm serve / api_server) or "llm" (the LLM class)
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enforce_eager: bool = False
    sampler: str | None = None  # "sort", "flashinfer", "triton"


@dataclass(frozen=True)
class Gpu:
    total_bytes: int  # torch.cuda.mem_get_info()[1], vLLM's total_gpu_memory
    name: str | None = None  # as vLLM reads it (get_device_name), None when not known


def _batch_defaults(line: VllmLine, engine: str, entry: str, gpu_name: str, gpu: Gpu,
                    max_model_len: int, chunked: bool) -> tuple[int, int, tuple[str, dict]]:
    """(max_num_batched_tokens, max_num_seqs, where from as a locale key and its values) as the version sets
    them when the user does not."""
    if engine == "v0":
        if chunked and line.v0_chunked_tokens:
            return line.v0_chunked_tokens, 256, ("capacity.batch_v0_chunked", {"tokens": line.v0_chunked_tokens})
        return max(max_model_len, 2048), 256, ("capacity.batch_v0", {})
    v = line.first
    name = gpu_name.lower()
    gib = gpu.total_bytes / GIB
    if v < (0, 8, 5):  # 0.8.0–0.8.4 arg_utils._override_v1_engine_args: by the device name
        big = "h100" in name or "h200" in name
        seqs = 1024 if (v < (0, 8, 4) or big) else 256
        why = "gpu_name_big" if big else "gpu_name_small"
    elif v < (0, 9, 0):  # 0.8.5: by device memory
        big = gib >= 70
        seqs, why = (1024 if big else 256), ("gpu_70" if big else "gpu_under_70")
    else:  # 0.9.0+ get_batch_defaults: ≥ 70 GiB and not an A100
        big = gib >= 70 and "a100" not in name
        seqs, why = (1024 if big else 256), ("gpu_70_not_a100" if big else "gpu_under_70_or_a100")
    tokens = (16384 if entry == "llm" else 8192) if big else (8192 if entry == "llm" else 2048)
    if v >= (0, 29, 0) and gib >= 160:  # 0.29.0 get_batch_defaults: ≥ 160 GiB (B200, B300)
        tokens, seqs, why = 16384, 1024, "gpu_160"
    if v >= (0, 12, 0):
        tokens = min(tokens, seqs * max_model_len)
    return tokens, seqs, ("capacity.batch_v1", {"entry": entry, "gpu": why})


@dataclass(frozen=True)
class Reserve:
    """One launch's reserve per GPU, term by term (bytes). vLLM measures one peak over its profile run, so the
    activation it logs is max(activation, sampler); the reserve is that peak + non_torch + cudagraph."""

    line: str
    engine: str
    entry: str
    sampler_path: str
    max_num_batched_tokens: int
    max_num_seqs: int
    activation: int  # the forward pass: one decoder layer's peak at max_num_batched_tokens tokens
    sampler: int  # logits + the sampler's temporaries for min(max_num_seqs, tokens) rows + the hidden states kept
    non_torch: int
    cudagraph: int
    batch_why: tuple[str, dict] = ("", {})  # where the batch came from: a locale key and its values
    non_torch_why: tuple[str, dict] = ("", {})
    first: tuple[int, ...] = ()  # the line's first release (the KV layout's rule follows it)

    def batch_source(self, lang: str = "en") -> str:
        return why_text(self.batch_why, lang)

    def non_torch_source(self, lang: str = "en") -> str:
        return why_text(self.non_torch_why, lang)


    @property
    def activation_peak(self) -> int:
        return max(self.activation, self.sampler)

    @property
    def total(self) -> int:
        return self.activation_peak + self.non_torch + self.cudagraph

    def terms(self) -> dict:
        return {"activation": self.activation, "sampler": self.sampler, "non_torch": self.non_torch,
                "cudagraph": self.cudagraph}


def why_text(why: tuple[str, dict] | list, lang: str = "en") -> str:
    """Where a default or a prior came from, in the user's language (a locale key and its values)."""
    key, values = why
    given = [t(f"capacity.flag_{f}", lang) for f in values.get("given", ())]
    values = {k: v for k, v in values.items() if k != "given"}
    if "gpu" in values:
        values |= {"entry": t(f"capacity.entry_{values['entry']}", lang), "gpu": t(f"capacity.{values['gpu']}", lang)}
    return (t("capacity.batch_given", lang, flags=", ".join(given)) + " " if given else "") + t(key, lang, **values)


# Non-torch memory is not in vLLM's code: CUDA context, cuBLAS/NCCL buffers and custom all-reduce buffers. Its
# priors (low, likely, high) are what real start-up logs measured (kvviz/kv/startup_logs.json), by how the version
# counts it and whether GPUs talk to each other.
NON_TORCH_GIB = {
    ("increase", 1): (0.04, 0.10, 0.22),  # logs: L4 0.04, A10G 0.06, L40 0.08, A100 0.10, H100 0.13, H200 0.22
    ("increase", 2): (0.25, 0.45, 0.80),  # logs: 2×RTX 4090 0.25, 2×H100 0.55, 2×H100 (0.5.4) 0.75 derived
    ("increase", 8): (0.25, 1.00, 7.75),  # no log of its own: from 2 GPUs to the 8-GPU device-level figures
    ("device", 1): (0.30, 0.40, 0.60),  # CUDA context included: RTX 3090 0.35
    ("device", 2): (0.50, 0.80, 1.50),  # no log of its own: one GPU's context + two GPUs' NCCL buffers
    ("device", 8): (5.20, 6.50, 7.75),  # 8×H200 (0.6.4): ranks 5.21–7.71, NCCL buffers included
}


def non_torch_kind(line: VllmLine, engine: str) -> str:
    """V0 measures non-torch memory from a baseline from 0.6.5 (worker.py memory_profiling), V1 from 0.9.1."""
    return "increase" if engine == "v0" and line.engine == "v1" else line.non_torch


def _non_torch(line: VllmLine, engine: str, tp: int, which: int) -> tuple[int, tuple[str, dict]]:
    kind = non_torch_kind(line, engine)
    values = NON_TORCH_GIB[(kind, 1 if tp == 1 else 2 if tp <= 4 else 8)]
    return round(values[which] * GIB), (f"capacity.non_torch_{kind}", {"tp": tp, "low": values[0],
                                                                       "high": values[2]})


def activation_bytes(weight_dtype: str) -> int:
    """The activations' element size: 16-bit unless the weights are float32 (quantized weights run in 16-bit)."""
    return 4 if weight_dtype == "float32" else 2


# vLLM's llama.py (Llama, Mistral) drops gate_up before down_proj from 0.6.4 (`x, _ = self.gate_up_proj(x)`);
# qwen2.py and llama.py before 0.6.4 keep `gate_up` alive through down_proj.
RELEASES_GATE_UP = {"llama": (0, 6, 4), "mistral": (0, 6, 4)}


def forward_peak(spec: KVSpec, tokens: int, tp: int, act: int, *, line: VllmLine | None = None) -> int | None:
    """One decoder layer's live tensors at its peak for a batch of `tokens` (vLLM's llama.py / qwen2.py /
    opt.py, run eagerly): the residual, the layer's input (held by the model's loop), the normed input and the
    output [d each], with
    - the MLP: gate_up [2·d_ff/tp] and SiluAndMul's output [d_ff/tp] (fc1 and its activation without a gate),
      and down_proj's output [d] too where the family keeps gate_up alive through down_proj;
    - the attention: qkv [(q + 2·kv)/tp] and the attention output [q/tp].
    Where vLLM measures reserved memory (≤ 0.6.3) the attention's freed blocks stay cached beside the MLP's
    (with, before 0.6.3, the copy of FlashAttention's output into the backend's own `output`).
    Mixtures of experts and MLA: moe_layer_peak and mla_attention. None when the shape does not say (no d_model
    or d_ff, or an MoE without its experts' width and top-k)."""
    if spec.d_model is None or spec.mlp_gated is None:
        return None
    version = line.first if line else LINES[-1].first
    if spec.is_moe:
        moe = moe_layer_peak(spec, tokens, tp, act, version)
        if moe is None:
            return None
        attention = mla_attention(spec, tokens, tp, act) if spec.is_mla else None
        dense = spec.n_dense_layers and spec.d_ff  # DeepSeek's first layers: a dense gated MLP of d_ff
        dense_mlp = tokens * (3 * spec.d_model + 3 * math.ceil(spec.d_ff / tp)) * act if dense else 0
        if attention is None:
            q, kv = spec.n_heads * spec.d_head // tp, max(1, spec.n_kv_heads // tp) * spec.d_head
            attention = tokens * (3 * spec.d_model + 2 * q + 2 * kv) * act
        return max(moe, attention, dense_mlp)
    if spec.d_ff is None:
        return None
    d = spec.d_model
    f = math.ceil(spec.d_ff / tp)
    q = spec.n_heads * spec.d_head // tp
    kv = max(1, spec.n_kv_heads // tp) * spec.d_head
    if spec.is_mla:
        return max(tokens * (3 * d + 3 * f) * act, mla_attention(spec, tokens, tp, act))
    released = RELEASES_GATE_UP.get(spec.model_type)
    holds = spec.mlp_gated and (released is None or version < released)
    mlp = 3 * d + (3 * f if spec.mlp_gated else 2 * f) + (d if holds else 0)
    attention = 3 * d + 2 * q + 2 * kv
    if line is not None and line.measures == "reserved":
        return tokens * (mlp + 2 * q + 2 * kv + (q if line.prefill_copy else 0)) * act
    return tokens * max(mlp, attention) * act


# VLLM_FUSED_MOE_CHUNK_SIZE (ENV_DEFAULTS; the type annotation beside it says 64 * 1024, the getenv default is what
# runs): the routed experts' buffers hold at most this many tokens.
FUSED_MOE_CHUNK = int(ENV_DEFAULTS["VLLM_FUSED_MOE_CHUNK_SIZE"][-1][1])
# The fused-MoE buffers (Triton path, the default for bf16 weights), read in the wheels:
# - 0.8.5 – 0.9.2 fused_moe.py fused_experts_impl: cache13 [M, k, max(2·I, d)] (cache1 and cache3 share it) and
#   cache2 [M·k, I], M = min(tokens, chunk);
# - 0.20.0 TritonExperts.workspace_shapes: workspace1 [M, k, max(I, d)], workspace2 [M, k, max(2·I, d)], output [M, d].
# Releases between 0.9.2 and 0.20.0 are given the later form (not read).
MOE_WORKSPACE_FROM = (0, 10, 0)


def moe_layer_peak(spec: KVSpec, tokens: int, tp: int, act: int, version: tuple[int, ...]) -> int | None:
    """One MoE layer's live bytes at the profile run's peak: the residual, the layer's input and the normed input
    [d each], the router's logits [E], top-k weights (float32) and ids (int32) [k each], the fused experts'
    buffers above with each expert's width split over tp (FusedMoE shards intermediate_size_per_partition), the
    experts' output [d], and the shared experts' output [d] held beside them (DeepSeek's shared MLP runs first;
    its own gate_up + act [3·S/tp] peak is a phase of its own). Not checked against a log: the range around it
    is the flags' (max_num_batched_tokens narrows it most); FP8 block-quantized, DeepGEMM and FlashInfer MoE
    kernels allocate their own workspaces, not modelled."""
    if not (spec.d_model and spec.moe_d_ff and spec.n_experts and spec.n_experts_per_token):
        return None
    d, k, e = spec.d_model, spec.n_experts_per_token, spec.n_experts
    f = math.ceil(spec.moe_d_ff / tp)
    m = min(tokens, FUSED_MOE_CHUNK)
    if version >= MOE_WORKSPACE_FROM:
        routed = m * k * (max(f, d) + max(2 * f, d)) + m * d
    else:
        routed = m * k * (max(2 * f, d) + f) + tokens * d
    shared = math.ceil(spec.n_shared_experts * spec.moe_d_ff / tp)
    held = tokens * (3 * d + e + (d if shared else 0)) * act
    routed_phase = held + routed * act + tokens * k * 8
    shared_phase = tokens * (3 * d + 3 * shared) * act
    return max(routed_phase, shared_phase)


def mla_attention(spec: KVSpec, tokens: int, tp: int, act: int) -> int:
    """MLA's prefill (the profile run is a prefill) in vLLM's deepseek_v2.py / MLA backend: the residual, input
    and normed input [d each], the query's latent [q_lora_rank] and its heads [H/tp · (nope + rope)], the
    compressed KV [kv_lora_rank + rope], kv_b_proj's up-projection [H/tp · (nope + v)], the keys assembled
    [H/tp · (nope + rope)], the values padded to the key width for FlashAttention, and the output [H/tp · v]."""
    h, nope, rope = spec.n_heads // tp, spec.d_head, spec.qk_rope_head_dim
    v = spec.v_head_dim or nope
    latent = spec.q_lora_rank + spec.kv_lora_rank + rope
    heads = h * (3 * (nope + rope) + (nope + v) + v)
    return tokens * (3 * spec.d_model + latent + heads) * act


def sampler_peak(spec: KVSpec, tokens: int, rows: int, path: str, act: int) -> int | None:
    """The sampler's phase: lm_head's logits [rows, padded vocab] in the model dtype, the sampler's float32
    temporaries (SAMPLER_BYTES per element; the logits are gathered whole on every rank under tensor
    parallelism) and the hidden states of the batch, still held."""
    if spec.vocab_size is None or spec.d_model is None:
        return None
    padded = -(-spec.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    return rows * padded * act + rows * spec.vocab_size * SAMPLER_BYTES[path] + tokens * spec.d_model * act


def cudagraph_estimate(spec: KVSpec, line: VllmLine, tokens: int, seqs: int, tp: int, act: int,
                       enforce_eager: bool) -> int:
    """What 0.20+ subtracts for CUDA graphs (gpu_model_runner.profile_cudagraph_memory): per capture mode, the
    first (largest) graph's memory plus at least 1 MiB for each further graph. Sizes: [1, 2, 4, 8, …, 248] then
    every 16 up to min(2·max_num_seqs, 512) (config/vllm.py _set_cudagraph_sizes); modes FULL (decode) and
    PIECEWISE. The largest graph's memory is taken as one layer's peak at its size (not checked against a log)."""
    if line.cudagraph != "estimate" or enforce_eager:
        return 0
    largest = min(2 * seqs, 512, tokens)
    sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)] if s <= largest]
    first = forward_peak(spec, largest, tp, act, line=line) or 0
    return 2 * (first + MIB * (len(sizes) - 1))


def reserve_for(spec: KVSpec, gpu: Gpu, flags: ServingFlags, *, line: VllmLine, engine: str, entry: str,
                sampler: str, gpu_name: str, max_model_len: int, tp: int, weight_dtype: str,
                non_torch_at: int = 1) -> Reserve | None:
    """The reserve of one fully specified launch; None when the model's activation cannot be predicted."""
    act = activation_bytes(weight_dtype)
    chunked = engine == "v1" or (line.v0_chunked_tokens is not None and max_model_len > 32768
                                 and not spec.n_sliding_layers)
    tokens, seqs, why = _batch_defaults(line, engine, entry, gpu_name, gpu, max_model_len, chunked)
    given: list[str] = []
    if flags.max_num_batched_tokens is not None:
        tokens = flags.max_num_batched_tokens
        given.append("max_num_batched_tokens")
    if flags.max_num_seqs is not None:
        seqs = flags.max_num_seqs
        given.append("max_num_seqs")
    rows = min(seqs, tokens)
    forward = forward_peak(spec, tokens, tp, act, line=line)
    sample = sampler_peak(spec, tokens, rows, sampler, act)
    if forward is None or sample is None:
        return None
    non_torch, nt_why = _non_torch(line, engine, tp, non_torch_at)
    why = (why[0], why[1] | {"given": tuple(given)})
    return Reserve(line=line_label(line), engine=engine, entry=entry, sampler_path=sampler,
                   max_num_batched_tokens=tokens,
                   max_num_seqs=seqs, activation=forward, sampler=sample, non_torch=non_torch,
                   cudagraph=cudagraph_estimate(spec, line, tokens, seqs, tp, act, flags.enforce_eager),
                   batch_why=why, non_torch_why=nt_why, first=line.first)


@dataclass(frozen=True)
class ReservePrediction:
    """The likely reserve, and the smallest and largest the unknown flags allow, with the flag that narrows the
    range most."""

    likely: Reserve
    low: Reserve
    high: Reserve
    unknown: tuple[str, ...] = ()  # flags the user did not give
    narrows: str | None = None  # the one whose value would narrow the range most
    narrowed: tuple[int, int] | None = None  # the reserve range once that flag is given (its likely value)
    scenarios: int = 1


NARROWING_FLAGS = ("vllm_version", "entry", "max_num_batched_tokens", "max_num_seqs", "sampler", "engine")


def _choices(flags: ServingFlags, gpu: Gpu) -> dict[str, list]:
    """For each flag the user did not give, the values a launch could have."""
    lines = [line_for(flags.vllm_version)] if flags.vllm_version else list(LINES)
    return {
        "line": lines,
        "engine": [flags.engine] if flags.engine else list(ENGINES),
        "entry": [flags.entry] if flags.entry else list(ENTRIES),
        "sampler": [flags.sampler] if flags.sampler else list(SAMPLERS),
        # vLLM's default batch reads the device name (H100/H200 by name, A100 excluded): unknown without one
        "gpu_name": [gpu.name] if gpu.name is not None else ["", "h100"],
    }


def _valid(line: VllmLine, engine: str, sampler: str) -> bool:
    """Whether a default install of that line runs that engine and sampler (VLLM_USE_V1=0 picks V0 from 0.8.0
    until 0.10.0; V0 samples with a sort)."""
    if engine == "v0":
        return sampler == "sort" and (line.engine == "v0" or (0, 8, 0) <= line.first < (0, 10, 0))
    return line.engine == "v1" and sampler in line.samplers


def _likely(flags: ServingFlags, gpu: Gpu) -> dict:
    """The single most likely launch: the newest version line, `vllm serve`, the sampler of a pip install."""
    if flags.vllm_version:
        line = line_for(flags.vllm_version)
    else:  # the newest line that runs the engine and sampler asked for
        line = [ln for ln in LINES if _valid(ln, flags.engine or ln.engine, flags.sampler or (
            "sort" if (flags.engine or ln.engine) == "v0" else ln.samplers[0]))][-1]
    engine = flags.engine or line.engine
    sampler = flags.sampler or ("sort" if engine == "v0" else line.samplers[0])
    return {"line": line, "engine": engine, "entry": flags.entry or "serve", "sampler": sampler,
            "gpu_name": gpu.name or ""}


def launch_batch(gpu: Gpu, flags: ServingFlags, *, max_model_len: int) -> tuple[tuple[int, ...], str, int]:
    """(release, engine, max_num_batched_tokens) of the likely launch, for a plan whose reserve the user gave:
    the KV layout of sliding layers depends on the batch."""
    args = _likely(flags, gpu)
    line, engine = args["line"], args["engine"]
    version = parse_version(flags.vllm_version) if flags.vllm_version else line.first
    if flags.max_num_batched_tokens is not None:
        return version, engine, flags.max_num_batched_tokens
    tokens, _, _ = _batch_defaults(line, engine, args["entry"], args["gpu_name"], gpu, max_model_len,
                                   engine == "v1")
    return version, engine, tokens


def _scenarios(spec: KVSpec, gpu: Gpu, flags: ServingFlags, common: dict) -> list[Reserve]:
    choices = _choices(flags, gpu)
    out = []
    for line in choices["line"]:
        for engine in choices["engine"]:
            for sampler in choices["sampler"]:
                if not _valid(line, engine, sampler):
                    continue
                for entry in choices["entry"]:
                    for gpu_name in choices["gpu_name"]:
                        for at in (0, 2):
                            out.append(reserve_for(spec, gpu, flags, line=line, engine=engine, entry=entry,
                                                   sampler=sampler, gpu_name=gpu_name, non_torch_at=at, **common))
    return out


@lru_cache(maxsize=256)  # a page reruns with the same launch for every unrelated widget change
def predict_reserve(spec: KVSpec, gpu: Gpu, flags: ServingFlags, *, max_model_len: int, tp: int = 1,
                    weight_dtype: str = "bfloat16") -> ReservePrediction | None:
    """The likely reserve per GPU and its range over what the flags leave open (None: the model's activation
    cannot be predicted here: give the reserve from a log)."""
    for name, allowed in (("engine", ENGINES), ("entry", ENTRIES), ("sampler", SAMPLERS)):
        value = getattr(flags, name)
        if value is not None and value not in allowed:
            raise InputError("capacity.bad_choice", name=name, value=value, choices=", ".join(allowed))
    for name in ("max_num_batched_tokens", "max_num_seqs"):
        value = getattr(flags, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise InputError("positive_int", name=name, value=value)
    args = _likely(flags, gpu)
    if not _valid(args["line"], args["engine"], args["sampler"]):
        raise InputError("capacity.engine_version", engine=args["engine"], line=line_label(args["line"]),
                         sampler=args["sampler"])
    common = dict(max_model_len=max_model_len, tp=tp, weight_dtype=weight_dtype)
    likely = reserve_for(spec, gpu, flags, **args, **common)
    if likely is None:
        return None
    scenarios = _scenarios(spec, gpu, flags, common)
    low = min(scenarios, key=lambda r: r.total)
    high = max(scenarios, key=lambda r: r.total)
    # the flag that, given at the likely launch's value, leaves the narrowest range
    given = {"vllm_version": ".".join(map(str, args["line"].first)), "entry": likely.entry,
             "max_num_batched_tokens": likely.max_num_batched_tokens, "max_num_seqs": likely.max_num_seqs,
             "sampler": likely.sampler_path, "engine": likely.engine}
    unknown = tuple(n for n in NARROWING_FLAGS if getattr(flags, n) is None)
    narrows, narrowed = None, None
    best = high.total - low.total
    for name in unknown:
        rs = _scenarios(spec, gpu, replace(flags, **{name: given[name]}), common)
        width = (min(r.total for r in rs), max(r.total for r in rs))
        if width[1] - width[0] < best * 0.99:  # a flag that narrows by under 1% is not worth naming
            narrows, narrowed, best = name, width, width[1] - width[0]
    return ReservePrediction(likely=likely, low=low, high=high, unknown=unknown, narrows=narrows,
                             narrowed=narrowed, scenarios=len(scenarios))


def with_given(prediction: ReservePrediction, reserve_bytes: int) -> ReservePrediction:
    """A reserve the user read in a log replaces the prediction: one number, no range."""
    fixed = replace(prediction.likely, activation=reserve_bytes, sampler=0, non_torch=0, cudagraph=0)
    return ReservePrediction(likely=fixed, low=fixed, high=fixed)
