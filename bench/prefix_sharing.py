"""Prefix sharing on the paged engine: TTFT of requests whose system prompt is cached vs the same requests with
the prefix cache off (same arrivals, one run), for several system-prompt lengths. Ratios, never asserted.

    python bench/prefix_sharing.py [--prefixes 64,128,256,448] [--suffix 32] [--requests 8] [--block-size 16]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.paged.demo import prefix_demo  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefixes", default="64,128,256,448")
    ap.add_argument("--suffix", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--model", default="tiny")
    args = ap.parse_args()
    backend = load_backend(args.model, device="cpu")
    print(f"{backend.spec.name}: {args.requests} requests, own part {args.suffix} tokens, blocks of {args.block_size}")
    print(f"{'prefix':>6} {'hit rate':>8} {'TTFT hit ms (range)':>22} {'TTFT computed ms (range)':>25} "
          f"{'prefill saved ms (±noise)':>26} {'blocks with/without sharing':>27} {'max |Δlogit|':>12}")
    for p in (int(x) for x in args.prefixes.split(",")):
        limit = backend.spec.max_context - args.suffix - args.new_tokens
        if p > limit:
            print(f"{p:>6} skipped: past the context ({backend.spec.max_context})")
            continue
        r = prefix_demo(backend.model, backend.tokenizer, n_requests=args.requests, shared_prefix=p,
                        suffix=args.suffix, block_size=args.block_size, new_tokens=args.new_tokens)
        on, off, saved = r["ttft_cached"], r["ttft_computed"], r["prefill_saving"]
        if on is None:
            print(f"{p:>6} no hit (the shared prefix is shorter than a block)")
            continue

        def span(x: dict) -> str:
            return f"{x['median_s'] * 1e3:.1f} ({x['low_s'] * 1e3:.1f}–{x['high_s'] * 1e3:.1f})"

        verdict = f"{saved['saved_s'] * 1e3:.1f} (±{saved['noise_s'] * 1e3:.1f})"
        print(f"{p:>6} {r['hit_rate']:>8.1%} {span(on):>22} {span(off):>25} {verdict:>26} "
              f"{r['blocks_used']:>15}/{r['blocks_used_without_sharing']:<11} "
              f"{r['max_abs_logit_diff_vs_no_sharing']:>12.2e}")


if __name__ == "__main__":
    main()
