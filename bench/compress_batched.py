"""Compressing the Cache: every method alone, one after another (as before), against the methods as rows of one
batch with a shared prefill (kvviz.compression.runner.rows_passes), in one process on the same chunks. Prints the
time of each and their ratio, the passes each ran, and the largest difference between the two's perplexities.
Ratios, never asserted.

    python bench/compress_batched.py [--model smollm2] [--budgets 64] [--tokens 512] [--seq-len 256] [--threads 1]
        [--methods window,streaming,h2o,snapkv,int8,int4,fp8,gqa,mqa] [--page] [--batched-only]

--page: the page's default comparison instead (two budgets, fp8 with both scale settings, GQA/MQA where the model's
KV heads allow: quality.all_methods).
--batched-only: time only the batched way (what the page runs), e.g. the page's default comparison as the page runs
it: `--page --budgets 64,128`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from kvviz.compression import quality  # noqa: E402
from kvviz.compression.eviction import EVICTION  # noqa: E402
from kvviz.compression.runner import Method  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--methods", default="window,streaming,h2o,snapkv,int8,int4,fp8,gqa,mqa")
    ap.add_argument("--budgets", default="64")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--page", action="store_true")
    ap.add_argument("--batched-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    backend = load_backend(args.model, device="cpu")
    budgets = [int(b) for b in args.budgets.split(",")]
    if args.page:
        methods = quality.all_methods(budgets, native=True, n_kv_heads=backend.spec.n_kv_heads)
    else:
        methods = [Method(n, budget=b) for b in budgets for n in args.methods.split(",") if n in EVICTION]
        methods += [Method(n) for n in args.methods.split(",") if n not in EVICTION]
    text = quality.held_out_text()
    times, rows, passes = {}, {}, {}
    for batched in (True,) if args.batched_only else (False, True):
        sweep = quality.evaluation(backend, [Method("full"), *methods], text, seq_len=args.seq_len,
                                   n_tokens=args.tokens, batched=batched)
        start = time.perf_counter()
        for rows[batched] in sweep.runs:
            pass
        times[batched], passes[batched] = time.perf_counter() - start, sweep.total
    if args.batched_only:
        print(f"{backend.spec.name}, {len(methods)} methods + full, {args.tokens} tokens in chunks of {args.seq_len}, "
              f"{args.threads} thread(s); rows of one batch: {times[True]:.1f} s ({passes[True]} forward passes)")
        return
    diff, worst = max((abs(a.perplexity / b.perplexity - 1), a.label) for a, b in zip(rows[False], rows[True],
                                                                                       strict=True))
    print(f"{backend.spec.name}, {len(methods)} methods + full, {args.tokens} tokens in chunks of {args.seq_len}, "
          f"{args.threads} thread(s)")
    print(f"alone, one after another: {times[False]:8.1f} s  ({passes[False]} forward passes)")
    print(f"rows of one batch:        {times[True]:8.1f} s  ({passes[True]} forward passes)")
    print(f"ratio alone / batched:    {times[False] / times[True]:8.2f}")
    print(f"largest perplexity difference between the two: {diff:.2e} (relative, {worst})")
    for a, b in zip(rows[False], rows[True], strict=True):
        print(f"  {a.label:>28} ppl {a.perplexity:9.3f} alone {b.perplexity:9.3f} batched")


if __name__ == "__main__":
    main()
