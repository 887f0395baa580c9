"""`generate` (prefill a prompt and decode it, with TTFT, TPOT and cache bytes) and `sweep` (latency sweeps over
prompt length, cache, batch or dtype) on the real engine.

The decoding itself is kvviz.engine.generation.Generation and the sweeps kvviz.engine.sweeps; this module only
reads flags, refuses what cannot run and prints.
"""
from __future__ import annotations

import argparse

from kvviz.cli.common import (
    CliError,
    RunFailed,
    add_command,
    add_json,
    add_model,
    add_run_options,
    add_shape_flags,
    check_new_tokens_fit,
    dtype_list,
    int_list,
    positive_int,
    shape,
)
from kvviz.engine.device_names import DTYPE_NAMES, WEIGHTS


def register(sub: argparse._SubParsersAction) -> None:
    g = add_command(sub, "generate", generate, show_generate,
                    help="prefill a prompt and decode, reporting TTFT, TPOT and cache bytes")
    g.add_argument("--prompt", required=True)
    add_model(g)
    g.add_argument("--engine", default="auto", choices=["auto", "native", "hf"],
                   help="auto: kvviz's decoder where it implements the architecture, else transformers")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template (one user turn)")
    g.add_argument("--max-new-tokens", type=positive_int, default=32)
    g.add_argument("--no-cache", action="store_true", help="recompute the whole prefix every step")
    add_run_options(g)
    g.add_argument("--weights", default="float", choices=list(WEIGHTS),
                   help="float: the matrices in --dtype; int8: kvviz's decoder with every matrix quantized to int8 per "
                        "output channel (a bfloat16 scale per row; on a CPU kvviz's int8 kernel, built once with the "
                        "machine's C compiler, multiplies them by activations as int16 per block of 256, else "
                        "torch's kernel by activations in bfloat16; results return in --dtype): about a quarter of "
                        "float32's weight bytes per token")
    g.add_argument("--compile", action="store_true",
                   help="kvviz's decoder: the decode step compiled once before the run over a static cache "
                        "written at a position tensor: on a CPU kvviz's C step where it runs the model (batch 1, "
                        "float32 activations, kvviz's kernels), else torch.compile (inductor on CPU, CUDA graphs on "
                        "CUDA); the compile's time is printed, and where it cannot compile the steps run uncompiled "
                        "and say why")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--batch", type=positive_int, default=1)
    add_json(g)
    g.add_argument("--html", metavar="PATH",
                   help="also write the run as one self-contained .html that replays it step by step (offline; "
                        "records the attention rows too)")
    g.add_argument("--html-lang", default="en", choices=["en", "ko"], help="the language of the --html file")
    g.add_argument("--no-warm-up", action="store_true",
                   help="time the process's first passes too (by default an untimed warm-up pass runs first)")
    add_shape_flags(g)

    w = add_command(sub, "sweep", sweep, show_sweep,
                    help="latency sweeps on the real engine: prompt-length, cache, batch, dtype")
    w.add_argument("kind", choices=["prompt-length", "cache", "batch", "dtype"])
    add_model(w)
    add_run_options(w)
    w.add_argument("--lengths", type=int_list, help="prompt-length: prompt lengths, e.g. 16,64,256")
    w.add_argument("--contexts", type=int_list, help="cache: context lengths to time a step at, e.g. 8,64,1024")
    w.add_argument("--batches", type=int_list, default=[1, 2, 4, 8], help="batch: batch sizes")
    w.add_argument("--dtypes", type=dtype_list, default=list(DTYPE_NAMES), help="dtype: dtypes")
    w.add_argument("--prompt-tokens", type=positive_int, default=64, help="batch, dtype: prompt length")
    w.add_argument("--new-tokens", type=positive_int, default=16, help="tokens generated per run")
    w.add_argument("--repeats", type=positive_int, default=3,
                   help="whole runs (steps for cache) per setting, one per round over every setting after a warm-up "
                        "round; the median and range are kept")
    add_json(w)
    add_shape_flags(w)


def generate(args: argparse.Namespace) -> dict:
    from kvviz.engine.generation import Generation
    from kvviz.engine.loading import load_backend
    from kvviz.engine.sweeps import warm_up

    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=shape(args), seed=args.seed,
                           engine=args.engine, weights=args.weights)
    prompt = args.prompt
    if args.chat:
        from kvviz.engine.chat import chat_prompt

        template = getattr(backend.tokenizer, "chat_template", None)
        if not template:
            raise CliError(f"--chat: {backend.spec.name} has no chat template")
        prompt = chat_prompt(template, prompt)
    check_new_tokens_fit(len(backend.tokenizer.encode(prompt)), backend.spec.max_context, args.max_new_tokens)
    if args.html:  # a file too large is refused before the run, not after it
        from kvviz.charts.run_html import check_size, decode_size

        spec = backend.spec
        check_size(*decode_size(spec.n_layers, spec.n_heads, len(backend.tokenizer.encode(prompt)),
                                args.max_new_tokens))
    compiled = compile_step(backend, args) if args.compile else None
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
        capture_attention=bool(args.html),  # the file draws the newest query's attention row per step
    )
    events = gen.run(prompt)
    last = events[-1]
    note = getattr(backend, "native_note", None)
    result = {
        "model": backend.spec.name,
        "engine": backend.kind,  # "native" (kvviz's decoder) or "hf" (transformers)
        "engine_note": note.message("en") if note is not None else None,
        "chat": args.chat,
        "device": str(backend.device),
        "dtype": args.dtype,
        "weights": args.weights,
        "weight_bytes": backend.model.step_weight_bytes() if backend.kind == "native" else None,
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
        "compiled": compiled,
        "int8_kernel": int8_kernel_record(backend) if args.weights == "int8" else None,
    }
    if args.html:
        write_html(gen, args, prompt, result)
    return result


def int8_kernel_record(backend: object) -> dict:
    """Which kernel multiplied the int8 matrices, and why torch's where it was not kvviz's."""
    from kvviz.engine.kernels import int8

    return {"name": int8.name(backend.device), "why_not": int8.why_not(backend.device)}


def compile_step(backend: object, args: argparse.Namespace) -> dict:
    """--compile: the step compiled now, before any timed pass (kvviz.engine.compiled), and what it cost."""
    if getattr(backend, "kind", None) != "native":
        raise CliError("--compile: only kvviz's own decoder has a compiled step (this model runs on transformers)")
    if args.no_cache:
        raise CliError("--compile: the compiled step writes into the cache; drop --no-cache")
    # kvviz's C step runs one row: a batch on a CPU compiles with inductor
    step = backend.compile("inductor" if args.batch > 1 and backend.device.type == "cpu" else None)
    done = step.warm_up(args.batch, capture=bool(args.html))
    return {"mode": step.mode, "first_step_s": done.first_step_s if done else None, "why_not": step.why_not}


def write_html(gen: object, args: argparse.Namespace, prompt: str, result: dict) -> None:
    """The run as one .html (kvviz.charts.run_html). A file that cannot be written loses no run: its result is
    printed, then one line says why (exit 1)."""
    from pathlib import Path

    from kvviz.charts.run_html import run_html
    from kvviz.lessons.run_record import decode_record

    settings = {"prompt": prompt, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                "top_k": args.top_k, "seed": args.seed, "batch": args.batch, "chat": args.chat}
    document = run_html(decode_record(gen, settings), args.html_lang)
    try:
        Path(args.html).write_text(document, encoding="utf-8")
    except OSError as exc:
        raise RunFailed(result, f"--html {args.html}: {exc.strerror or exc}") from None


def sweep(args: argparse.Namespace) -> dict:
    from kvviz.engine.loading import load_backend
    from kvviz.engine.sweeps import run_sweep

    custom = shape(args)

    def load(dtype: str):  # noqa: ANN202 - a Backend
        return load_backend(args.model, dtype=dtype, device=args.device, shape=custom, seed=args.seed)

    return run_sweep(load, args.kind, dtype=args.dtype, lengths=args.lengths, contexts=args.contexts,
                     batches=args.batches, dtypes=args.dtypes, prompt_tokens=args.prompt_tokens,
                     new_tokens=args.new_tokens, repeats=args.repeats)


def show_generate(r: dict) -> None:
    print(r["text"])
    tpot = f"{r['tpot_s'] * 1e3:.2f} ms" if r["tpot_s"] is not None else "n/a"
    print(
        f"\n[{r['model']} on {r['device']} ({'kvviz decoder' if r['engine'] == 'native' else 'transformers'}), "
        f"{r['dtype']}{', int8 weights' if r['weights'] == 'int8' else ''}, cache {'on' if r['use_cache'] else 'off'}] "
        f"prompt {r['prompt_tokens']} tokens, {len(r['token_ids'])} new; "
        f"TTFT {r['ttft_s'] * 1e3:.2f} ms, TPOT {tpot} "
        f"({'steady state, after an untimed warm-up pass' if r['warm_up'] else 'cold: no warm-up pass'}); "
        f"KV cache {r['cache_live_bytes']} B live (formula {r['formula_bytes']} B), "
        f"{r['cache_allocated_bytes']} B allocated"
    )
    if r["engine_note"]:
        print(f"note: transformers runs it because {r['engine_note']}")
    if k := r.get("int8_kernel"):
        print(f"int8 matrices: {k['name']}" + (f" ({k['why_not']})" if k["why_not"] else ""))
    if (c := r.get("compiled")) and c["why_not"] is not None:
        print(f"not compiled ({c['why_not']}): the steps ran uncompiled")
    elif c and c["mode"] == "kernels":
        print(f"compiled step (kernels): first step {c['first_step_s'] * 1e3:.0f} ms, every step one call of "
              "kvviz's C step (built once a machine)")
    elif c:
        print(f"compiled step ({c['mode']}): first step {c['first_step_s']:.1f} s (tracing, compiling, one run), "
              "once; every step above reused it")


def show_sweep(r: dict) -> None:
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
