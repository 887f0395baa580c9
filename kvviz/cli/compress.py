"""`compress`: compress the KV cache (evict positions, quantize K/V, pool KV heads) in the real decode loop and
report the bytes saved against the quality lost (perplexity, KL, top-1 agreement with the full cache).

The methods are kvviz.compression and the measurement kvviz.compression.quality.quality_report; this module
checks the flags against each other and the model's context, and prints the table.
"""
from __future__ import annotations

import argparse

from kvviz.cli.common import (
    CliError,
    add_command,
    add_json,
    add_model,
    add_run_options,
    add_shape_flags,
    positive_int,
    shape,
)
from kvviz.kv.formats import STORED_DTYPES


def method_list(text: str) -> list[str]:
    from kvviz.compression.runner import METHODS

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in METHODS or n == "full"]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown method {bad[0] if bad else text!r}: use {', '.join(m for m in METHODS if m != 'full')}")
    return names


def register(sub: argparse._SubParsersAction) -> None:
    c = add_command(sub, "compress", compress, show_compress,
                    help="compress the KV cache (evict, quantize, pool heads): bytes vs quality")
    c.add_argument("--method", required=True, type=method_list,
                   help="eviction (window, streaming, h2o, snapkv), a stored KV format "
                        f"({', '.join(STORED_DTYPES)}), or head pooling (gqa, mqa); several, comma-separated")
    c.add_argument("--budget", type=positive_int, help="eviction: cached positions kept per layer")
    add_model(c)
    c.add_argument("--text", help="a UTF-8 text file to measure on (default: the shipped model's held-out split)")
    c.add_argument("--tokens", type=positive_int, default=2048,
                   help="tokens of text evaluated, in whole chunks of --seq-len (at least one chunk)")
    c.add_argument("--seq-len", type=positive_int,
                   help="chunk length, within the model's context (default: the context, at most 512)")
    c.add_argument("--sinks", type=int, default=4, help="streaming: attention-sink tokens kept (paper: 4)")
    c.add_argument("--group", type=positive_int,
                   help="KIVI's formats (int8, int4, kivi2): group size G (default: 32 where it divides d_head)")
    c.add_argument("--residual", type=positive_int,
                   help="KIVI's formats: residual R, a multiple of G: keys quantized R at a time, the last R values "
                        "kept in full precision (default: the format's R, 32, or 128 for kivi2, rounded up to a "
                        "multiple of G)")
    c.add_argument("--calculate-kv-scales", action="store_true",
                   help="fp8: scales |K|max/200, |V|max/100 from the first pass, as vLLM's flag (default: 1.0, "
                        "vLLM's scale when the checkpoint has none)")
    c.add_argument("--kv-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="the deployment's KV dtype that savings are counted against (default: bfloat16)")
    c.add_argument("--pool-kv-heads", type=positive_int, help="gqa: KV heads after pooling (default: half)")
    add_run_options(c, device="cpu")
    c.add_argument("--threads", type=positive_int, default=1, help="CPU threads (a small model runs best on 1)")
    add_json(c)
    add_shape_flags(c)


def compress(args: argparse.Namespace) -> dict:
    import torch

    from kvviz.compression.eviction import EVICTION
    from kvviz.compression.quality import quality_report, read_text
    from kvviz.compression.runner import Method
    from kvviz.engine.loading import load_backend

    torch.set_num_threads(args.threads)
    if args.budget is None and any(m in EVICTION for m in args.method):
        raise CliError(f"--method {','.join(args.method)} needs --budget N (cached positions kept per layer)")
    text = read_text(args.text) if args.text else None
    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=shape(args), seed=args.seed)
    max_len = backend.spec.max_context
    seq_len = args.seq_len or min(512, max_len)
    if seq_len > max_len:  # checked before any text runs: the lengths reported are the lengths that ran
        raise CliError(f"--seq-len {seq_len} is longer than {backend.spec.name}'s context of {max_len} tokens")
    if seq_len < 2:
        raise CliError(f"--seq-len {seq_len} is too short: a chunk needs at least 2 tokens (half prefilled, the rest "
                       "decoded)")
    if args.tokens < seq_len:
        raise CliError(f"--tokens {args.tokens} is less than one chunk of --seq-len {seq_len}: give --tokens of at "
                       f"least {seq_len}")
    methods = [Method(m, budget=args.budget if m in EVICTION else None, sinks=args.sinks, group=args.group,
                      residual=args.residual, kv_heads=args.pool_kv_heads,
                      kv_scale="calculate" if args.calculate_kv_scales else "default") for m in args.method]
    return quality_report(backend, methods, text, text_name=args.text, seq_len=seq_len, n_tokens=args.tokens,
                          kv_dtype=args.kv_dtype)


def show_compress(r: dict) -> None:
    rows = r["results"]
    first = rows[0]
    d = first["kv_dtype"]
    print(f"[{first['model']} ({first['kind']}), {first['text']}: {first['n_chunks']} chunk(s) of {first['seq_len']} "
          f"tokens, prompt {first['n_prompt']}, {first['n_predicted']} tokens predicted, run in {first['dtype']}; "
          f"savings counted as a {d} cache]")
    print(f"{'method':>28} {'ppl':>9} {'KL':>9} {'top-1':>7} {'kept':>5} {'KV B, ' + first['dtype']:>15} "
          f"{'KV B, ' + d:>15} {'saved vs ' + d:>17}")
    print(f"{'full':>28} {first['full_perplexity']:9.3f} {0:9.4f} {1:7.3f} {first['full_n_cached']:>5} "
          f"{first['full_kv_bytes']:15d} {first['full_kv_bytes_at_kv_dtype']:15d} {0:17.1%}")
    for x in rows:
        print(f"{x['label']:>28} {x['perplexity']:9.3f} {x['kl_divergence']:9.4f} {x['top1_agreement']:7.3f} "
              f"{x['n_cached']:>5} {x['kv_bytes']:15d} {x['kv_bytes_at_kv_dtype']:15d} {x['memory_saved']:17.1%}")
    for x in rows:
        if x["left_whole"]:
            print(f"note: {x['label']} dropped no position (SnapKV compresses only a prompt longer than its budget "
                  "and keeps every decoded token)")
        if x["kv_scale"]:  # a format scaled per layer tensor (fp8)
            print(f"note: {x['label']}: {x['fp8_clipped']} values clipped at ±448·scale")
        if x["group"]:
            print(f"note: {x['label']}: KIVI G = {x['group']}, R = {x['residual']}")
