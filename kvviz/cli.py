"""`python -m kvviz ...`: the engine and formulas from a shell. A bad argument exits 2 with one line."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kvviz.engine.config import DecoderConfig
from kvviz.kv.formula import KV_DTYPE_BYTES, dtype_bytes, format_binary, kv_memory


class CliError(Exception):
    """A user mistake: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print the whole usage block
        raise CliError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _add_shape_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("custom shape (with --model random)")
    g.add_argument("--layers", type=_positive_int, default=4)
    g.add_argument("--heads", type=_positive_int, default=8)
    g.add_argument("--kv-heads", type=_positive_int, default=2)
    g.add_argument("--d-head", type=_positive_int, default=None)
    g.add_argument("--d-model", type=_positive_int, default=256)
    g.add_argument("--d-ff", type=_positive_int, default=688)
    g.add_argument("--vocab-size", type=_positive_int, default=4096)
    g.add_argument("--max-seq-len", type=_positive_int, default=1024)


def _int_list(text: str) -> list[int]:
    try:
        return [_positive_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers, got {text!r} ({exc})") from None


def _dtype_list(text: str) -> list[str]:
    names = text.split(",")
    bad = [n for n in names if n not in ("float32", "bfloat16", "float16")]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype {bad[0]!r}: use float32, bfloat16, float16")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvviz", description="See and measure the KV cache of a real decoder.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="prefill a prompt and decode, reporting TTFT, TPOT and cache bytes")
    g.add_argument("--prompt", required=True)
    g.add_argument("--model", default="tiny",
                   help="tiny (shipped), random (custom shape), or a Hugging Face directory or hub id")
    g.add_argument("--max-new-tokens", type=_positive_int, default=32)
    g.add_argument("--no-cache", action="store_true", help="recompute the whole prefix every step")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--batch", type=_positive_int, default=1)
    g.add_argument("--json", action="store_true")
    g.add_argument("--no-warm-up", action="store_true",
                   help="time the process's first passes too (by default an untimed warm-up pass runs first)")
    _add_shape_flags(g)

    w = sub.add_parser("sweep", help="latency sweeps on the real engine: prompt-length, cache, batch, dtype")
    w.add_argument("kind", choices=["prompt-length", "cache", "batch", "dtype"])
    w.add_argument("--model", default="tiny", help="tiny (shipped), random (custom shape), or a directory")
    w.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    w.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--lengths", type=_int_list, help="prompt-length: prompt lengths, e.g. 16,64,256")
    w.add_argument("--contexts", type=_int_list, help="cache: context lengths to time a step at, e.g. 8,64,1024")
    w.add_argument("--batches", type=_int_list, default=[1, 2, 4, 8], help="batch: batch sizes")
    w.add_argument("--dtypes", type=_dtype_list, default=["float32", "bfloat16", "float16"], help="dtype: dtypes")
    w.add_argument("--prompt-tokens", type=_positive_int, default=64, help="batch, dtype: prompt length")
    w.add_argument("--new-tokens", type=_positive_int, default=16, help="tokens generated per run")
    w.add_argument("--repeats", type=_positive_int, default=3, help="runs (steps for cache) per setting; the fastest is kept")
    w.add_argument("--json", action="store_true")
    _add_shape_flags(w)

    m = sub.add_parser("memory", help="KV-cache bytes, M = 2·B·L·n·H_kv·d_head·bytes, with every intermediate")
    m.add_argument("--preset", help="a model preset (see `kvviz presets`)")
    m.add_argument("--config", help="a Hugging Face config.json (or its directory)")
    m.add_argument("--weight-dtype", default="bfloat16", choices=list(KV_DTYPE_BYTES))
    m.add_argument("--layers", type=_positive_int)
    m.add_argument("--kv-heads", type=_positive_int)
    m.add_argument("--head-dim", type=_positive_int)
    m.add_argument("--tokens", type=_positive_int, default=4096)
    m.add_argument("--batch", type=_positive_int, default=1)
    m.add_argument("--kv-dtype", default="bfloat16", choices=list(KV_DTYPE_BYTES))
    m.add_argument("--json", action="store_true")

    pr = sub.add_parser("presets", help="the model presets: KV shape, bytes per token, parameters")
    pr.add_argument("--json", action="store_true")

    x = sub.add_parser("export-hf", help="write the shipped model as a transformers Llama directory")
    x.add_argument("--out", required=True, help="directory to write (created if missing)")
    x.add_argument("--model", default="tiny", help="tiny (shipped) or a kvviz model directory")
    x.add_argument("--json", action="store_true")
    return parser


def _shape(args: argparse.Namespace) -> DecoderConfig | None:
    if args.model != "random":
        return None
    return DecoderConfig(
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        d_head=args.d_head or 0,
        d_ff=args.d_ff,
        vocab_size=args.vocab_size,
        max_seq_len=args.max_seq_len,
    )


def cmd_generate(args: argparse.Namespace) -> dict:
    from kvviz.engine.generation import Generation
    from kvviz.engine.loading import load_backend
    from kvviz.engine.sweeps import warm_up

    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=_shape(args), seed=args.seed)
    if not args.no_warm_up:
        # A fresh process's first passes pay one-off costs (allocator growth, kernel choice, lazy init):
        # an untimed warm-up pass first, so TTFT and TPOT are the steady state, as benchmark tools report.
        warm_up(backend)
    gen = Generation(
        backend,
        max_new_tokens=args.max_new_tokens,
        use_cache=not args.no_cache,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        batch_size=args.batch,
    )
    events = gen.run(args.prompt)
    last = events[-1]
    return {
        "model": backend.arch.name,
        "device": str(backend.device),
        "dtype": args.dtype,
        "use_cache": gen.use_cache,
        "warm_up": not args.no_warm_up,
        "prompt_tokens": len(gen.prompt_ids),
        "token_ids": gen.generated[0],
        "text": gen.text,
        "ttft_s": gen.ttft_s,
        "tpot_s": gen.tpot_s,
        "step_seconds": [e.seconds for e in events],
        "cache_live_bytes": last.live_bytes,
        "cache_allocated_bytes": last.allocated_bytes,
        "formula_bytes": last.formula_bytes,
    }


def cmd_sweep(args: argparse.Namespace) -> dict:
    from kvviz.engine import sweeps
    from kvviz.engine.loading import load_backend

    shape = _shape(args)

    def load(dtype: str):  # noqa: ANN202 - a Backend
        return load_backend(args.model, dtype=dtype, device=args.device, shape=shape, seed=args.seed)

    backend = load(args.dtype)
    max_len = backend.arch.max_seq_len
    if args.kind == "prompt-length":
        lengths = args.lengths or sweeps.default_prompt_lengths(max_len, args.new_tokens)
        sweep = sweeps.prompt_length_sweep(backend, lengths, n_new=args.new_tokens, repeats=args.repeats)
    elif args.kind == "cache":
        contexts = args.contexts or sweeps.default_contexts(max_len, args.repeats)
        sweep = sweeps.cache_sweep(backend, contexts, repeats=args.repeats)
    elif args.kind == "batch":
        sweep = sweeps.batch_sweep(backend, args.batches, n_prompt=args.prompt_tokens, n_new=args.new_tokens)
    else:
        sweep = sweeps.dtype_sweep(load, args.dtypes, n_prompt=args.prompt_tokens, n_new=args.new_tokens)
    rows = sweeps.SweepRun(sweep).run()
    return {"sweep": args.kind, "model": backend.arch.name, "device": str(backend.device), "dtype": args.dtype,
            "columns": list(sweeps.COLUMNS[args.kind]), "rows": rows, "summary": sweeps.summary(args.kind, rows)}


def cmd_memory(args: argparse.Namespace) -> dict:
    from kvviz.kv.formula import KVShape, kv_footprint, weight_bytes
    from kvviz.kv.hf_config import load_hf_config
    from kvviz.kv.presets import get_preset

    shape_flags = [args.layers, args.kv_heads, args.head_dim]
    if sum(x is not None for x in (args.preset, args.config)) + any(f is not None for f in shape_flags) > 1:
        raise CliError("memory takes one of --preset, --config, or --layers/--kv-heads/--head-dim")
    if args.preset or args.config:
        spec = get_preset(args.preset) if args.preset else load_hf_config(args.config)
        fp = kv_footprint(spec.shape, args.tokens, args.batch, args.kv_dtype)
        out = {"model": spec.name, **fp.to_dict()}
        if spec.shape.is_mla:
            out |= {"kv_lora_rank": spec.shape.kv_lora_rank, "qk_rope_head_dim": spec.shape.qk_rope_head_dim}
        if spec.n_params:
            out |= {"n_params": spec.n_params, "params_estimated": spec.params_estimated,
                    "weight_dtype": args.weight_dtype, "weight_bytes": weight_bytes(spec.n_params, args.weight_dtype)}
        return out
    missing = [f"--{n.replace('_', '-')}" for n in ("layers", "kv_heads", "head_dim") if getattr(args, n) is None]
    if missing:
        raise CliError(f"memory needs {', '.join(missing)} (the model's shape), or --preset / --config")
    mem = kv_memory(args.batch, args.layers, args.tokens, args.kv_heads, args.head_dim, dtype_bytes(args.kv_dtype))
    # The same figures through the general formula, which also states quantization scales.
    fp = kv_footprint(KVShape(args.layers, args.kv_heads, args.kv_heads, args.head_dim), args.tokens, args.batch,
                      args.kv_dtype)
    return {"kv_dtype": args.kv_dtype, **mem.to_dict(), **{k: v for k, v in fp.to_dict().items() if k != "kind"}}


def cmd_presets(args: argparse.Namespace) -> dict:
    from kvviz.kv.formula import kv_footprint
    from kvviz.kv.presets import HF_REPOS, PRESETS

    rows = []
    for name, spec in PRESETS.items():
        s = spec.shape
        rows.append({"name": name, "hf_repo": HF_REPOS[name], "kind": s.attention_kind, "n_layers": s.n_layers,
                     "n_heads": s.n_heads, "n_kv_heads": s.n_kv_heads, "d_head": s.d_head, "d_model": spec.d_model,
                     "kv_lora_rank": s.kv_lora_rank, "qk_rope_head_dim": s.qk_rope_head_dim,
                     "sliding_window": s.sliding_window, "n_sliding_layers": s.n_sliding_layers,
                     "max_context": spec.max_context, "n_params": spec.n_params,
                     "bf16_bytes_per_token": kv_footprint(s, 1).per_token})
    return {"presets": rows}


def cmd_export_hf(args: argparse.Namespace) -> dict:
    from kvviz.engine.export import export_hf
    from kvviz.engine.loading import load_backend

    if args.model == "random":
        raise CliError("export-hf needs a trained model: --model tiny or a model directory")
    backend = load_backend(args.model, device="cpu")
    files = export_hf(backend.model, backend.tokenizer.path, args.out)
    return {"model": backend.arch.name, "out": args.out, "files": [str(f) for f in files]}


def _print_generate(r: dict) -> None:
    print(r["text"])
    tpot = f"{r['tpot_s'] * 1e3:.2f} ms" if r["tpot_s"] is not None else "n/a"
    print(
        f"\n[{r['model']} on {r['device']}, {r['dtype']}, cache {'on' if r['use_cache'] else 'off'}] "
        f"prompt {r['prompt_tokens']} tokens, {len(r['token_ids'])} new; "
        f"TTFT {r['ttft_s'] * 1e3:.2f} ms, TPOT {tpot} "
        f"({'steady state, after an untimed warm-up pass' if r['warm_up'] else 'cold: no warm-up pass'}); "
        f"KV cache {r['cache_live_bytes']} B live (formula {r['formula_bytes']} B), "
        f"{r['cache_allocated_bytes']} B allocated"
    )


def _print_memory(r: dict) -> None:
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
    if "weight_bytes" in r:
        print(f"weights              {r['n_params']} params · {r['weight_dtype']} = {r['weight_bytes']} B "
              f"({format_binary(r['weight_bytes'])}{', estimated' if r['params_estimated'] else ''})")


def _print_sweep(r: dict) -> None:
    print(f"[{r['sweep']} sweep: {r['model']} on {r['device']}, {r['dtype']}]")
    print("  ".join(f"{c:>14}" for c in r["columns"]))
    for row in r["rows"]:
        print("  ".join(f"{_cell(row.get(c)):>14}" for c in r["columns"]))
    for key, value in r["summary"].items():
        print(f"{key}: {value}")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _print_presets(r: dict) -> None:
    for p in r["presets"]:
        extra = (f" MLA {p['kv_lora_rank']}+{p['qk_rope_head_dim']}" if p["kv_lora_rank"] else "") + (
            f" window {p['sliding_window']} on {p['n_sliding_layers']}/{p['n_layers']} layers"
            if p["sliding_window"] else "")
        print(f"{p['name']:14s} {p['kind']:3s} L={p['n_layers']:<3d} H={p['n_heads']:<3d} H_kv={p['n_kv_heads']:<3d} "
              f"d_head={p['d_head']:<3d} {format_binary(p['bf16_bytes_per_token']):>10s}/token (bf16) "
              f"{p['n_params'] / 1e9:7.2f}B params{extra}")


def _print_export(r: dict) -> None:
    print(f"{r['model']} written as a transformers Llama directory: {r['out']}")
    for path in r["files"]:
        print(f"  {path}")


COMMANDS = {
    "generate": (cmd_generate, _print_generate),
    "memory": (cmd_memory, _print_memory),
    "presets": (cmd_presets, _print_presets),
    "export-hf": (cmd_export_hf, _print_export),
    "sweep": (cmd_sweep, _print_sweep),
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        run, show = COMMANDS[args.command]
        result = run(args)
    except (CliError, ValueError, FileNotFoundError) as exc:
        print(f"kvviz: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, whatever was typed
        return 2
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        show(result)
    return 0


def main_entry() -> None:
    """The `kvviz` console script."""
    sys.exit(main())
