"""Where the cache goes besides one request's tensors: `prefix-demo` (requests sharing a system prompt in the paged
block pool), `offload-demo` (stored chunks loaded from CPU-memory and disk tiers instead of recomputed) and
`handoff` (prefill in one process, decode in another, the K/V moved between them; kvviz workers or llama-server).

The runs are kvviz.engine.paged.demo, kvviz.engine.offload and kvviz.serving.handoff, and the bytes and link times
kvviz.kv.transfer; this module picks the model and prompt, refuses what cannot run and prints.
"""
from __future__ import annotations

import argparse
import sys

from kvviz.cli.common import (
    CliError,
    add_command,
    add_dtype,
    add_json,
    add_model,
    add_run_options,
    add_shape_flags,
    ms,
    native_backend,
    non_negative_int,
    positive_int,
    shape,
)
from kvviz.kv.capacity import BLOCK_SIZE


def register(sub: argparse._SubParsersAction) -> None:
    pd = add_command(sub, "prefix-demo", prefix_demo, show_prefix_demo,
                     help="requests sharing a system prompt in the paged KV cache: hits, TTFT, blocks")
    pd.add_argument("--requests", type=positive_int, default=8,
                    help="requests; each arrives after the previous one's prefill (or all at once: --same-step)")
    pd.add_argument("--same-step", action="store_true",
                    help="admit every request in one scheduler step (later ones hit blocks hashed at allocation)")
    pd.add_argument("--shared-prefix", type=non_negative_int, default=256, help="tokens of the shared system prompt")
    pd.add_argument("--suffix", type=positive_int, default=32, help="tokens of each request's own part")
    pd.add_argument("--block-size", type=positive_int, default=BLOCK_SIZE, help="tokens per KV block (vLLM: 16)")
    pd.add_argument("--new-tokens", type=positive_int, default=16, help="tokens each request generates")
    add_model(pd)
    add_run_options(pd)
    add_json(pd)
    add_shape_flags(pd)

    od = add_command(sub, "offload-demo", offload_demo, show_offload_demo,
                     help="KV offload tiers: requests loading stored chunks from CPU memory and disk instead of "
                          "recomputing them, each hit and miss explained")
    add_model(od)
    add_dtype(od)
    od.add_argument("--chunk-size", type=positive_int, default=256, help="tokens per stored chunk (LMCache: 256)")
    od.add_argument("--memory-chunks", type=non_negative_int, default=3, help="CPU-memory tier size, in chunks")
    od.add_argument("--disk-chunks", type=non_negative_int, default=6, help="disk tier size, in chunks")
    od.add_argument("--store-dir", help="an empty or new folder for the disk tier (default: a temporary one)")
    od.add_argument("--repeats", type=positive_int, default=3,
                    help="times each request's recompute is measured (the median is kept)")
    od.add_argument("--tier-repeats", type=non_negative_int, default=5,
                    help="repeats of the per-tier table (2 chunks loaded from memory, from disk, recomputed); 0: skip")
    add_json(od)

    ho = add_command(sub, "handoff", handoff, show_handoff,
                     help="prefill on one process, decode on another, the KV moved between them")
    ho.add_argument("--engine", default="kvviz", choices=["kvviz", "llamacpp"],
                    help="kvviz: two kvviz worker processes over a loopback socket; llamacpp: two llama-server "
                         "processes, slot save → copy → restore")
    add_model(ho, help="tiny, smollm2, or a kvviz directory (llamacpp: or a .gguf file)")
    ho.add_argument("--llama-server", help="the llama-server binary (default: KVVIZ_LLAMA_SERVER, else "
                                           "build/llama.cpp/bin/llama-server)")
    ho.add_argument("--prompt", help="prompt text (default: --prompt-tokens tokens of English text)")
    ho.add_argument("--prompt-tokens", type=positive_int, default=64)
    ho.add_argument("--new-tokens", type=positive_int, default=16)
    add_dtype(ho, help="kvviz engine")
    ho.add_argument("--ctx-size", type=positive_int, default=2048, help="llamacpp: each server's -c")
    ho.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks for the calculator beside it")
    add_json(ho)


def prefix_demo(args: argparse.Namespace) -> dict:
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.loading import load_backend
    from kvviz.engine.paged import demo
    from kvviz.engine.tolerance import agreement

    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=shape(args), seed=args.seed)
    if not isinstance(backend, NativeBackend):
        raise CliError("prefix-demo runs the native decoder's paged cache: use --model tiny, random or a kvviz "
                       "directory (a Hugging Face model keeps one contiguous cache per request here)")
    out = demo.prefix_demo(backend.model, backend.tokenizer, n_requests=args.requests,
                           shared_prefix=args.shared_prefix, suffix=args.suffix, block_size=args.block_size,
                           new_tokens=args.new_tokens, same_step=args.same_step)
    # "Equal" is judged against the app's one rounding tolerance, at the logits' own magnitude.
    rounding = agreement(out["max_abs_logit_diff_vs_no_sharing"], backend.dtype, out["max_abs_logit"],
                         backend.spec.d_model)
    return {**out, "logit_rounding_tolerance": rounding.tolerance, "logits_equal_up_to_rounding": rounding.within,
            "model": backend.spec.name, "device": str(backend.device), "dtype": args.dtype}


def offload_demo(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from kvviz.engine.offload.serve import offload_report

    backend = native_backend(args, "offload-demo")
    if args.store_dir and Path(args.store_dir).exists() and any(Path(args.store_dir).iterdir()):
        raise CliError(f"--store-dir {args.store_dir} is not empty: give a new or empty folder")
    progress = None if args.json else lambda i, n: print(f"request {i}/{n}…", file=sys.stderr)
    return offload_report(backend, args.store_dir, chunk_size=args.chunk_size, memory_chunks=args.memory_chunks,
                          disk_chunks=args.disk_chunks, repeats=args.repeats, tier_repeats=args.tier_repeats,
                          progress=progress)


def _handoff_prompt(args: argparse.Namespace, backend) -> list[int]:  # noqa: ANN001
    from kvviz.engine.paged.demo import shared_prefix_ids

    ids = backend.tokenizer.encode(args.prompt) if args.prompt else shared_prefix_ids(backend.tokenizer,
                                                                                       args.prompt_tokens)
    limit = min(backend.spec.max_context, args.ctx_size if args.engine == "llamacpp" else backend.spec.max_context)
    if len(ids) + args.new_tokens > limit:
        raise CliError(f"the prompt's {len(ids)} tokens and --new-tokens {args.new_tokens} do not fit the "
                       f"{limit}-token context")
    return ids


def handoff(args: argparse.Namespace) -> dict:
    import tempfile

    from kvviz.kv.transfer import handoff_bytes

    if args.engine == "llamacpp":
        from kvviz.engine.loading import load_backend
        from kvviz.serving.handoff import handoff_gguf, llamacpp_handoff
        from kvviz.serving.llamacpp import binary

        if binary(args.llama_server) is None:
            where = args.llama_server or "KVVIZ_LLAMA_SERVER or build/llama.cpp/bin/llama-server"
            raise CliError(f"no llama-server at {where}: give --llama-server PATH or run scripts/build_llama_server.sh")
        backend = load_backend(args.model, device="cpu")
        ids = _handoff_prompt(args, backend)
        with tempfile.TemporaryDirectory(prefix="kvviz-gguf-") as tmp:
            out = llamacpp_handoff(handoff_gguf(args.model, backend, tmp), backend.spec, ids, args.new_tokens,
                                   server=args.llama_server, ctx_size=args.ctx_size)
        kv_dtype = out["kv_dtype"] or "float16"
    else:
        from kvviz.engine.offload.handoff import run_handoff

        backend = native_backend(args, "handoff")
        ids = _handoff_prompt(args, backend)
        out = run_handoff(backend, args.model, ids, args.new_tokens)
        kv_dtype = args.dtype
    calc = handoff_bytes(backend.spec, len(ids), kv_dtype, args.tp)
    out["calculator"] = {**calc.to_dict(), "seconds_per_link": calc.seconds_per_link()}
    return out


def show_prefix_demo(r: dict) -> None:
    def t(s: float | None) -> str:
        return ms(s, unknown="n/a")

    def saving(h: dict) -> str:
        """The page's verdict: a difference smaller than the timings' own spread has no sign."""
        if h["measurable"]:
            return f"saved {t(h['saved_s'])}"
        if h["samples"] < 2:
            return f"one timing each, no noise estimate: no verdict (difference {t(h['saved_s'])})"
        return f"within noise (difference {t(h['saved_s'])}, noise ±{t(h['noise_s'])})"

    arrivals = "all admitted in one step" if r["same_step"] else "each after the previous prefill"
    print(f"[{r['model']} on {r['device']}, {r['dtype']}, blocks of {r['block_size']} tokens, "
          f"pool {r['pool_blocks']} blocks, {r['new_tokens']} new tokens each, {arrivals}]")
    print(f"{'request':>7}  {'prompt':>6}  {'cached':>6}  {'TTFT':>10}  {'TTFT, no prefix cache':>22}")
    for i, q in enumerate(r["requests"]):
        print(f"{i:>7}  {q['prompt_tokens']:>6}  {q['cached_tokens']:>6}  {t(q['ttft_s']):>10}  "
              f"{t(q['ttft_no_prefix_cache_s']):>22}")
    rate = "n/a" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
    print(f"hit rate {rate} (cached / prompt tokens)")
    on, off = r["ttft_cached"], r["ttft_computed"]
    if on is not None:
        n_hit = sum(1 for q in r["requests"] if q["cached_tokens"])
        print(f"TTFT of the {n_hit} requests that hit ({on['n']} distinct timings): median {t(on['median_s'])} "
              f"(range {t(on['low_s'])} – {t(on['high_s'])}); same requests with the prefix cache off: median "
              f"{t(off['median_s'])} (range {t(off['low_s'])} – {t(off['high_s'])}): {saving(r['ttft_saving'])}")
        p = r["prefill_saving"]
        print(f"one hit's prefill measured alone (fastest of {p['samples']}): whole prompt {t(p['full_s'])}, "
              f"after the hit {t(p['with_hit_s'])}: {saving(p)}")
    print(f"blocks in use after the last prefill: {r['blocks_used']} with sharing ({r['blocks_shared']} shared) vs "
          f"{r['blocks_used_without_sharing']} without")
    verdict = "equal up to rounding" if r["logits_equal_up_to_rounding"] else "beyond rounding"
    print(f"logits vs the run without sharing: max |diff| {r['max_abs_logit_diff_vs_no_sharing']:.2e}, {verdict} "
          f"(tolerance {r['logit_rounding_tolerance']:.2e}); same tokens: {r['same_tokens_vs_no_sharing']}")


def show_offload_demo(r: dict) -> None:
    def t(s: float | None) -> str:
        return ms(s, digits=1, unit="")

    print(f"[{r['model']} on {r['device']}, {r['dtype']}; chunks of {r['chunk_size']} tokens = {r['chunk_bytes']:,} B; "
          f"memory tier {r['memory_chunks']} chunks, disk tier {r['disk_chunks']} chunks at {r['directory']}]")
    print(f"{'req':>3} {'what':>9} {'prompt':>6} {'memory':>6} {'disk':>5} {'comp.':>5} {'load ms':>8} "
          f"{'recomp ms':>9} {'TTFT ms':>8} {'recomp TTFT':>11}  why the rest was computed")
    for q in r["requests"]:
        n, m = q["tokens_by_tier"], q["miss_reason"]
        changed = f" (changed at token {m['changed_at']}, its chunk computed whole)" if "changed_at" in m else ""
        why = f"{m['reason']} at token {m['token']}{changed}" + (f" ({m['tier']}" + (f", by request {m['request']}"
                                                                            if m["request"] else "") + ")"
                                                        if m["tier"] else "")
        load = sum(q["load_s"].values())
        print(f"{q['request']:>3} {q['kind']:>9} {q['prompt_tokens']:>6} {n['memory']:>6} {n['disk']:>5} "
              f"{n['computed']:>5} {t(load):>8} {t(q['recompute_s']):>9} {t(q['ttft_s']):>8} "
              f"{t(q['ttft_recompute_s']):>11}  {why}")
    bad = [q["request"] for q in r["requests"] if not q["logits_equal_up_to_rounding"]]
    print("logits after every load equal a full recompute within rounding" if not bad
          else f"logits beyond rounding for requests {bad}")
    for row in r["tiers"]:
        print(f"{row['tier']:>6}: {row['tokens']} tokens, {row['bytes']:,} B"
              + (f" ({row['file_bytes']:,} B on disk)" if row["file_bytes"] else "")
              + f": load {t(row['load_s']['median'])} ms vs recompute {t(row['recompute_s']['median'])} ms "
              f"(medians of {row['load_s']['n']}; load/recompute {row['load_over_recompute']:.3f})")


def show_handoff(r: dict) -> None:
    print(f"[{r['engine']}: {r['model']}, prompt {r['prompt_tokens']} tokens, {r['new_tokens']} new]")
    print(f"bytes moved {r['bytes']:,}: K/V {r['kv_bytes']:,} (kvviz's formula: {r['formula_bytes']:,}) + "
          f"header {r['header_bytes']:,}")
    if "file_parts" in r:
        for part, n in r["file_parts"].items():
            print(f"  {part:36s} {n:>10,} B")
    print(f"prefill {ms(r['prefill_s'])}, save {ms(r['save_s'])}, transfer {ms(r['transfer_s'])}, "
          f"restore {ms(r['restore_s'])}")
    print(f"tokens equal to one process doing it all: {r['tokens_equal_single']}")
    calc = r["calculator"]
    print(f"calculator, tp={calc['tp']}: {calc['per_rank']:,} B per rank, {calc['total']:,} B in all")
    for name, row in calc["seconds_per_link"].items():
        print(f"  {name:26s} {row['per_rank_s'] * 1e3:10.4f} ms per rank"
              + (f", {row['shared_link_s'] * 1e3:.4f} ms on one shared link" if calc["tp"] > 1 else ""))
