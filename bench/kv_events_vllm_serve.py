"""kvviz's KV-event tree and attribution against a real `vllm serve` on a GPU host (the CPU test,
tests/serving/test_kv_events_vllm.py, runs vLLM's KVCacheManager and publisher in-process; this runs the whole
server). Start the server with its events, the prompt-token details (cached_tokens in each response's usage) and,
for the reset, the dev endpoints:

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --enable-prompt-tokens-details --kv-events-config \\
      '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", \\
        "replay_endpoint": "tcp://*:5558"}'
    python bench/kv_events_vllm_serve.py --url http://HOST:8000 --endpoint tcp://HOST:5557 \\
      --replay-endpoint tcp://HOST:5558 [--block-size 16] [--requests 60] [--reset]

It sends --requests prompts of token ids one at a time (a few shared system prompts, each with its own questions,
some repeated; /v1/completions takes token ids as the prompt), and before each one, once the events of the one
before have arrived (the stream quiet for --quiet seconds), computes from kvviz's tree the hits vLLM's lookup will
find (kvviz.serving.kv_attribution, vLLM's hash) and each miss's reason; then compares them with the cached_tokens
the server reports. With --reset it calls /reset_prefix_cache half-way (AllBlocksCleared). Prints requests compared,
hit tokens predicted and reported, differences (the goal: 0), the first misses by reason, and the tree's numbers.
Not run where this was written (no GPU there).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from kvviz.serving.kv_attribution import HASH_ALGOS, attribute  # noqa: E402
from kvviz.serving.kv_watch import Watch  # noqa: E402


def quiet(watch: Watch, seconds: float, timeout: float = 30.0) -> None:
    """Until no batch has arrived for `seconds` (the last request's frees published)."""
    deadline = time.monotonic() + timeout
    last = watch.state()["summary"]["batches"]
    calm = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = watch.state()["summary"]["batches"]
        if now != last:
            last, calm = now, time.monotonic()
        elif time.monotonic() - calm >= seconds:
            return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--replay-endpoint", default=None)
    ap.add_argument("--model", default=None, help="default: the server's first model")
    ap.add_argument("--block-size", type=int, default=16, help="the server's --block-size (vLLM's default 16)")
    ap.add_argument("--hash-algo", choices=HASH_ALGOS, default="sha256")
    ap.add_argument("--hash-seed", default=None, help="the server's PYTHONHASHSEED, if it sets one")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--vocab", type=int, default=5000, help="token ids drawn from [100, vocab)")
    ap.add_argument("--quiet", type=float, default=0.3)
    ap.add_argument("--reset", action="store_true")
    args = ap.parse_args()
    http = httpx.Client(base_url=args.url.rstrip("/"), timeout=120)
    model = args.model or http.get("/v1/models").json()["data"][0]["id"]
    watch = Watch(args.endpoint, args.replay_endpoint)
    rng = random.Random(0)
    bs = args.block_size
    systems = [[rng.randrange(100, args.vocab) for _ in range(bs * k + rng.randrange(bs))] for k in (2, 4, 8)]
    sent: list[list[int]] = []
    rows, diffs, reasons = [], [], Counter()
    try:
        for i in range(args.requests):
            if args.reset and i == args.requests // 2:
                quiet(watch, args.quiet)
                http.post("/reset_prefix_cache").raise_for_status()
            if sent and rng.random() < 0.2:
                prompt = list(rng.choice(sent))
            else:
                prompt = rng.choice(systems) + [rng.randrange(100, args.vocab) for _ in range(rng.randint(1, 3 * bs))]
            sent.append(prompt)
            quiet(watch, args.quiet)
            with watch.lock:
                predicted = attribute(watch.tree, prompt, bs, algo=args.hash_algo, seed=args.hash_seed).as_dict()
            r = http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4,
                                                    "temperature": 0})
            r.raise_for_status()
            details = (r.json().get("usage") or {}).get("prompt_tokens_details") or {}
            reported = details.get("cached_tokens")
            if reported is None:
                sys.exit("the server reports no cached_tokens: start it with --enable-prompt-tokens-details")
            rows.append((predicted["hit_tokens"], reported))
            reasons[predicted["reason"] or "all_hit"] += 1
            if predicted["hit_tokens"] != reported:
                diffs.append((i, predicted, reported))
        quiet(watch, args.quiet)
        s = watch.state()["summary"]
    finally:
        watch.close()
    print(f"{len(rows)} requests: hit tokens predicted {sum(p for p, _ in rows):,}, reported "
          f"{sum(r for _, r in rows):,}; differences {len(diffs)}")
    print(f"first misses: {dict(reasons)}")
    print(f"tree: {s['blocks']:,} blocks, {s['tokens']:,} tokens, stored {s['stored']:,}, removed {s['removed']:,}, "
          f"resets {s['cleared']}, gaps {len(s['incomplete'])}, skipped {s['skipped']}")
    for i, predicted, reported in diffs[:10]:
        print(f"  request {i}: kvviz {predicted['hit_tokens']} ({predicted['reasons']}), server {reported}")


if __name__ == "__main__":
    main()
