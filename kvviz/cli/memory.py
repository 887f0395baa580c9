"""`memory` (KV-cache bytes with every intermediate), `capacity` (KV tokens and concurrent requests on a GPU, as
vLLM or SGLang size them at start-up) and `presets` (the model presets' KV shapes and parameters).

No model runs and torch is never imported: the numbers come from kvviz.kv (formula, capacity, presets). This
module checks which flags go together and prints.
"""
from __future__ import annotations

import argparse

from kvviz.cli.common import (
    CliError,
    add_command,
    add_json,
    add_kv_dtype,
    add_spec_source,
    non_negative_float,
    positive_float,
    positive_int,
)
from kvviz.kv.capacity import BLOCK_SIZE
from kvviz.kv.formats import KV_DTYPES
from kvviz.kv.formula import KVSpec
from kvviz.units import format_binary


def register(sub: argparse._SubParsersAction) -> None:
    m = add_command(sub, "memory", memory, show_memory,
                    help="KV-cache bytes, M = 2·B·L·n·H_kv·d_head·bytes, with every intermediate")
    add_spec_source(m)
    add_weight_dtype(m)
    m.add_argument("--layers", type=positive_int)
    m.add_argument("--kv-heads", type=positive_int)
    m.add_argument("--head-dim", type=positive_int)
    m.add_argument("--tokens", type=positive_int, default=4096)
    m.add_argument("--batch", type=positive_int, default=1)
    add_kv_dtype(m)
    add_json(m)

    c = add_command(sub, "capacity", capacity, show_capacity,
                    help="KV tokens and concurrent requests on a GPU, computed as vLLM (or SGLang) does at start-up, "
                         "with its reserve predicted from the serving flags")
    add_spec_source(c)
    c.add_argument("--params", type=positive_int, help="the parameter count, where the config cannot give it")
    c.add_argument("--gpu", help="a GPU from the table (see --list-gpus); its total as the device reports it")
    c.add_argument("--gpu-memory-gib", type=positive_float,
                   help="one GPU's total as torch.cuda.mem_get_info() reports it (vLLM's total_gpu_memory)")
    c.add_argument("--list-gpus", action="store_true", help="print the GPU table with sources and exit")
    c.add_argument("--check-logs", action="store_true",
                   help="the planner against every real start-up log kvviz keeps (predicted vs logged, per term)")
    c.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    c.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size (GPUs sharing the model)")
    c.add_argument("--gpu-memory-utilization", type=positive_float, default=0.9)
    add_kv_dtype(c)
    add_weight_dtype(c)
    c.add_argument("--max-model-len", type=positive_int, help="tokens per request (default: the model's context)")
    c.add_argument("--block-size", type=positive_int, default=BLOCK_SIZE, help="tokens per KV block (vLLM's choices)")
    c.add_argument("--reserve-gib", type=non_negative_float,
                   help="activation peak + non-torch memory per GPU, as your vLLM log states them "
                        "(default: predicted from the flags below)")
    c.add_argument("--vllm-version", help="e.g. 0.11 or 0.6.4.post1 (default: a range over the releases read)")
    c.add_argument("--vllm-engine", choices=["v0", "v1"], help="VLLM_USE_V1 (default: the version's)")
    c.add_argument("--entry", choices=["serve", "llm"], help="vllm serve, or the LLM class in Python")
    c.add_argument("--max-num-batched-tokens", type=positive_int, help="vLLM's flag (default: the version's)")
    c.add_argument("--max-num-seqs", type=positive_int, help="vLLM's flag (default: the version's)")
    c.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    c.add_argument("--sampler", choices=["sort", "flashinfer", "triton"],
                   help="the top-k/top-p implementation (default: the version's; FlashInfer's when installed)")
    c.add_argument("--mem-fraction-static", type=positive_float, help="SGLang's flag (default: SGLang's)")
    c.add_argument("--sglang-version", help="e.g. 0.4.6 (selects the default --mem-fraction-static rule)")
    add_json(c)

    p = add_command(sub, "presets", presets, show_presets,
                    help="the model presets: KV shape, bytes per token, parameters")
    add_json(p)


def add_weight_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weight-dtype", choices=list(KV_DTYPES),
                   help="every parameter in this dtype (default: the checkpoint's format, from its config's "
                        "quantization_config or the preset's, or read from a model directory's safetensors)")


def model_spec(args: argparse.Namespace, command: str) -> KVSpec:
    """The model of --preset or --config (exactly one of them), with --params where the command takes it."""
    from kvviz.engine.shape import config_spec
    from kvviz.kv.presets import get_preset

    if (args.preset is None) == (args.config is None):
        raise CliError(f"{command} takes one of --preset or --config")
    spec = get_preset(args.preset) if args.preset else config_spec(args.config)
    if getattr(args, "params", None):
        spec = spec.with_params(args.params, "given")
    return spec


def memory(args: argparse.Namespace) -> dict:
    from kvviz.kv.formula import footprint_report, shape_footprint

    shape_flags = [args.layers, args.kv_heads, args.head_dim]
    if sum(x is not None for x in (args.preset, args.config)) + any(f is not None for f in shape_flags) > 1:
        raise CliError("memory takes one of --preset, --config, or --layers/--kv-heads/--head-dim")
    if args.preset or args.config:
        spec = model_spec(args, "memory")
        report = footprint_report(spec, n_tokens=args.tokens, batch=args.batch, kv_dtype_name=args.kv_dtype,
                                  weight_dtype=args.weight_dtype or "bfloat16")
        if spec.n_params is None:
            return report
        from kvviz.kv.weights import size_weights

        w = size_weights(spec, weight_dtype=args.weight_dtype, preset=args.preset is not None)
        return report | {"weight_dtype": f"{w.format.label} (from {format_source(w.source)})",
                         "weight_bytes": w.total_bytes,
                         "weights": w.to_dict()}
    missing = [f"--{n.replace('_', '-')}" for n in ("layers", "kv_heads", "head_dim") if getattr(args, n) is None]
    if missing:
        raise CliError(f"memory needs {', '.join(missing)} (the model's shape), or --preset / --config")
    return shape_footprint(args.layers, args.kv_heads, args.head_dim, n_tokens=args.tokens, batch=args.batch,
                           kv_dtype_name=args.kv_dtype)


def capacity(args: argparse.Namespace) -> dict:
    from kvviz.kv.capacity import capacity_report
    from kvviz.kv.hardware import HARDWARE
    from kvviz.kv.vllm_profile import ServingFlags

    if args.list_gpus:
        return {"gpus": [vars(h) for h in HARDWARE.values()]}
    if args.check_logs:
        from kvviz.kv.log_check import TOLERANCE, check_all

        return {"tolerance": TOLERANCE, "logs": [c.to_dict() for c in check_all()]}
    spec = model_spec(args, "capacity")
    if (args.gpu is None) == (args.gpu_memory_gib is None):
        raise CliError("capacity takes one of --gpu NAME or --gpu-memory-gib X")
    smi_mib = None
    if args.gpu is not None:
        if args.gpu not in HARDWARE:
            raise CliError(f"unknown --gpu {args.gpu!r}: choose one of {', '.join(HARDWARE)}")
        gpu = HARDWARE[args.gpu]
        if gpu.memory_bytes is None:
            raise CliError(f"{gpu.name}: its memory size is not known here; give --gpu-memory-gib")
        total, source, smi_mib = gpu.memory_bytes, f"{gpu.name} ({gpu.memory_kind}): {gpu.memory_source}", \
            gpu.nvidia_smi_total_mib
    else:
        total, source = round(args.gpu_memory_gib * 2**30), "--gpu-memory-gib"
    if spec.n_params is None:
        raise CliError(f"{spec.name}: the parameter count cannot be read from this config; give --params N")
    max_len = args.max_model_len or spec.max_context
    if max_len is None:
        raise CliError(f"{spec.name}: the config gives no context length; give --max-model-len N")
    flags = ServingFlags(vllm_version=args.vllm_version, engine=args.vllm_engine, entry=args.entry,
                         max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                         enforce_eager=args.enforce_eager, sampler=args.sampler)
    weights = None
    if args.config and args.weight_dtype is None:
        from kvviz.kv.weights import read_checkpoint

        weights = read_checkpoint(args.config, spec, tp=args.tp)  # a model directory with safetensors: read
    return capacity_report(spec, total, device_total_source=source, max_model_len=max_len, engine=args.engine,
                           tp=args.tp, kv_dtype_name=args.kv_dtype, weight_dtype=args.weight_dtype,
                           gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
                           reserve_bytes=None if args.reserve_gib is None else round(args.reserve_gib * 2**30),
                           flags=flags, gpu_name=args.gpu, smi_mib=smi_mib,
                           mem_fraction_static=args.mem_fraction_static, sglang_version=args.sglang_version,
                           weights=weights, preset=args.preset is not None)


def presets(args: argparse.Namespace) -> dict:
    from kvviz.kv.presets import preset_table

    return {"presets": preset_table()}


def show_memory(r: dict) -> None:
    if "model" in r:
        print(f"{r['model']} ({r['kind']}), KV dtype {r['kv_dtype']}")
    factors = (f"({r['kv_lora_rank']}+{r['qk_rope_head_dim']})" if "kv_lora_rank" in r
               else f"2·{r['n_kv_heads']}·{r['d_head']}")
    scales = f" + {r['scale_bytes_per_token_per_layer']} B scales" if r.get("scale_bytes_per_token_per_layer") else ""
    print(f"per token per layer  {factors}·{r['bytes_per_elem']} B{scales} = "
          f"{r['per_token_per_layer']} B ({format_binary(r['per_token_per_layer'])})")
    print(f"per token            ·{r['n_layers']} layers = {r['per_token']} B ({format_binary(r['per_token'])})")
    window = (f" (window {r['sliding_window']} on {r['n_sliding_layers']} layers: "
              f"{r['cached_token_layers']} token·layers)" if r.get("n_sliding_layers") else "")
    print(f"per request          ·{r['n_tokens']} tokens{window} = {r['per_request']} B "
          f"({format_binary(r['per_request'])})")
    print(f"total                ·{r['batch']} requests = {r['total']} B ({format_binary(r['total'])})")
    if r.get("weight_bytes") is not None:
        print(f"weights              {r['n_params']} params ({r['params_source']}) · {r['weight_dtype']} = "
              f"{r['weight_bytes']} B ({format_binary(r['weight_bytes'])})")
    elif r.get("weights"):  # a format kvviz cannot size: named, never taken as bfloat16
        lo, hi = r["weights"]["per_gpu_range"]
        print(f"weights              unknown: {r['weights']['format']['label']} is not a format kvviz can size "
              f"({format_binary(lo)} – {format_binary(hi)})")
    elif "n_params" in r:
        print("weights              unknown: the config does not give the parameter count")


def show_presets(r: dict) -> None:
    for p in r["presets"]:
        extra = (f" MLA {p['kv_lora_rank']}+{p['qk_rope_head_dim']}" if p["kv_lora_rank"] else "") + (
            f" window {p['sliding_window']} on {p['n_sliding_layers']}/{p['n_layers']} layers"
            if p["sliding_window"] else "") + (f" weights {p['weight_format']}" if p.get("weight_format") else "")
        print(f"{p['name']:14s} {p['kind']:3s} L={p['n_layers']:<3d} H={p['n_heads']:<3d} H_kv={p['n_kv_heads']:<3d} "
              f"d_head={p['d_head']:<3d} {format_binary(p['bf16_bytes_per_token']):>10s}/token (bf16) "
              f"{p['n_params'] / 1e9:7.2f}B params ({p['params_source']}){extra}")


def show_capacity(r: dict) -> None:
    if "gpus" in r:
        _show_gpus(r["gpus"])
    elif "logs" in r:
        _show_log_check(r)
    elif r.get("engine") == "sglang":
        _show_sglang(r)
    else:
        _show_vllm(r)


GIB = 2**30


def _show_gpus(gpus: list[dict]) -> None:
    for g in gpus:
        mem = f"{g['memory_bytes']:,} B ({g['memory_kind']})" if g["memory_bytes"] else "memory unknown"
        print(f"{g['name']:28s} {mem:32s} {g['bandwidth_bytes_per_s'] / 1e12:6.3f} TB/s "
              f"{g['peak_flops'] / 1e12:7.1f} TFLOP/s")


def _show_log_check(r: dict) -> None:
    print(f"the planner against real start-up logs (KV tokens within ±{r['tolerance']:.0%} counts as within):")
    for c in r["logs"]:
        cells = []
        for t in c["terms"]:
            logged = "?" if t["logged"] is None else f"{t['logged']:,.2f}"
            diff = "" if t["logged"] in (None, 0) else f" ({(t['predicted'] - t['logged']) / t['logged']:+.1%})"
            cells.append(f"{t['name']} {logged} → {t['predicted']:,.2f}{diff}")
        verdict = "within" if c["kv_within"] else "outside"
        named = "flags named" if c["flags_named"] else "flags not all named"
        fmt = f"; weights {c['weight_format']} from the {c['weight_source']}" if c.get("weight_format") else ""
        print(f"{c['id']} [{c['engine']} {c['version']}, {named}; KV {verdict}{fmt}]: " + "; ".join(cells))


def _show_sglang(r: dict) -> None:
    print(f"{r['model']} on {r['tp']} GPU(s) with SGLang; per GPU:")
    if r.get("weights"):
        print(weights_line(r["weights"]))
    print(f"  free at start {r['free_at_start_bytes'] / GIB:.2f} GiB (total {r['device_total_bytes'] / GIB:.2f}"
          f" − {r['reserve_terms']['in_use_at_start'] / GIB:.2f} in use), after loading "
          f"{r['free_after_load_bytes'] / GIB:.2f} GiB")
    print(f"  mem_fraction_static {r['mem_fraction_static']} ({r['mem_fraction_source']}): pool = "
          f"{r['free_after_load_bytes'] / GIB:.2f} − {r['free_at_start_bytes'] / GIB:.2f} × (1 − "
          f"{r['mem_fraction_static']}) = {r['kv_budget_bytes'] / GIB:.2f} GiB")
    lo, hi = r["kv_cache_tokens_range"]
    print(f"  {r['kv_cache_tokens']:,} tokens ({lo:,} – {hi:,}) at {r['kv_bytes_per_token']:,} B per token; "
          f"{r['max_concurrency']:.2f} requests of {r['context_len']:,} tokens")


def format_source(source: str) -> str:
    """Where the weight format came from, as the CLI says it (the page's words, --weight-dtype for the flag)."""
    from kvviz.i18n import t

    return "--weight-dtype" if source == "flag" else t(f"weights.source_{source}", "en")


def weights_line(w: dict) -> str:
    """Where the weights' bytes come from: read from the headers or estimated, the format and its source."""
    f = w["format"]
    how = f"read from {w['files']} safetensors file(s)" if w["read"] else "estimated"
    source = format_source("config" if w["read"] else w["source"])  # a read checkpoint: its config names it
    parts = ""
    if f["method"] != "none":
        parts = (f": {format_binary(w['quantized_bytes'])} quantized + {format_binary(w['scale_bytes'])} scales"
                 + (f" + {format_binary(w['zero_point_bytes'])} zero points" if w["zero_point_bytes"] else "")
                 + f" + {format_binary(w['unquantized_bytes'])} in {w['model_dtype']} (all GPUs)")
    rng = ""
    if w.get("per_gpu_range") and w["total_bytes"] is not None:
        lo, hi = w["per_gpu_range"]
        rng = f"; {lo / GIB:.2f} – {hi / GIB:.2f} GiB per GPU over the expert kernels' padding ({w['backend']} counted)"
    one = ""
    if w.get("one_dtype_per_gpu_bytes"):
        one = (f"\n  per GPU {w['per_gpu_bytes'] / GIB:.2f} GiB; every parameter at {f['bits']:g} bits would be "
               f"{w['one_dtype_per_gpu_bytes'] / GIB:.2f} GiB")
    return f"  weights {how}, format {f['label']} (from {source}){parts}{rng}{one}"


def _show_vllm(r: dict) -> None:
    print(f"{r['model']} on {r['tp']} GPU(s); per GPU, as vLLM computes it at start-up:")
    if r.get("weights"):
        print(weights_line(r["weights"]))
    print(f"  total {r['device_total_bytes'] / GIB:.2f} GiB × gpu_memory_utilization {r['gpu_memory_utilization']} "
          f"= {r['requested_bytes'] / GIB:.2f} GiB")
    print(f"  − weights {r['weights_bytes'] / GIB:.2f} GiB − reserve {r['reserve_bytes'] / GIB:.2f} GiB"
          f"{' (predicted)' if r['reserve_estimated'] else ' (as given)'} = "
          f"KV budget {r['kv_budget_bytes'] / GIB:.2f} GiB")
    if r.get("reserve_terms"):
        t, launch = r["reserve_terms"], r["launch"]
        print(f"  reserve = max(activation {t['activation'] / GIB:.2f}, sampler {t['sampler'] / GIB:.2f}) + non-torch "
              f"{t['non_torch'] / GIB:.2f} + CUDA graphs {t['cudagraph'] / GIB:.2f} GiB")
        print(f"  likely launch: vLLM {launch['vllm_line']}, {launch['engine']}, {launch['entry']}, "
              f"{launch['max_num_batched_tokens']:,} batched tokens, {launch['max_num_seqs']} sequences, "
              f"{launch['sampler']} sampler ({launch['batch_source']})")
        if not launch.get("activation_checked", True):
            print("  the activation of a mixture of experts / MLA is modelled from the config, not yet checked "
                  "against a log: read the range below")
    print(f"  {r['num_blocks']:,} blocks of {r['block_size']} tokens: GPU KV cache size {r['kv_cache_tokens']:,} "
          f"tokens ({r['kv_bytes_per_token']:,} B per token, {r['kv_dtype']})")
    if r.get("kv_cache_groups") and (len(r["kv_cache_groups"]) > 1 or r["kv_cache_groups"][0][0] == "sliding"):
        groups = " + ".join(f"{blocks} ({kind})" for kind, blocks in r["kv_cache_groups"])
        padding = f", {r['padding_layers']} padding layers" if r.get("padding_layers") else ""
        print(f"  {len(r['kv_cache_groups'])} KV-cache group(s){padding}: a request takes {groups} = "
              f"{r['blocks_per_request']:,} blocks")
    d = r.get("derived")
    if d:
        for g in d["groups"]:
            pad = f" + {g['padding_layers']} padding" if g["padding_layers"] else ""
            print(f"    group {g['kind']}: {g['layers']} layers{pad}, {g['blocks_per_request']:,} blocks per request "
                  f"({g['share']:.0%} of a request's blocks)")
        print(f"  GPU KV cache size {d['kv_cache_tokens']:,} tokens is derived: {d['tokens_formula']} "
              f"({d['num_blocks']:,} blocks in the pool)")
    if r.get("sliding_as_full"):
        print(f"  this release counts the sliding-window layers as full attention ({r['kv_rule']})")
    print(f"  maximum concurrency for {r['max_model_len']:,} tokens per request: {r['max_concurrency']:.2f}x")
    if r.get("kv_cache_tokens_range"):
        lo, hi = r["kv_cache_tokens_range"]
        print(f"  with the flags not given: {lo:,} – {hi:,} tokens"
              + (f"; --{r['narrowing_flag'].replace('_', '-')} narrows it most" if r.get("narrowing_flag") else ""))
    if not r["weights_fit"]:
        print("  the weights and the reserve do not fit in the memory the engine may use")
