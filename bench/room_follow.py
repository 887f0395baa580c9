"""The room store alone: --followers simulated followers each reading the room once a second, while the lecturer
publishes a Reusing Past K/V view every --publish-every seconds; in-process and on Redis (a redis-server this
script starts on a free loopback port and stops). Prints each store's read latency (median, p99) and publish
latency (median) from one run. Goal: p99 read <= 10 ms with 500 followers.

Not measured here yet: the lecturer's click -> a follower's screen redrawn in Chromium tabs.

    python bench/room_follow.py [--followers 500] [--seconds 10] [--threads 8] [--publish-every 0.5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz.room.store import MemoryStore, RedisStore, RoomStore  # noqa: E402


def reuse_view(n_tokens: int = 64, n_layers: int = 30, n_heads: int = 9) -> dict:
    """A view the size a SmolLM2-sized run publishes: 30 layers' grid, nine heads' attention row, 64 tokens."""
    return {"page": "reuse", "path": "pages/1_Reusing_Past_KV.py", "n_prompt": 16, "n_steps": n_tokens - 16,
            "texts": [f"tok{i}" for i in range(n_tokens)], "top_k": [["a", 0.5]] * 5,
            "written_at": [[max(0, i - 15) for i in range(n_tokens)] for _ in range(n_layers)],
            "attention": {"layer": 0, "rows": [[round(1 / n_tokens, 5)] * n_tokens for _ in range(n_heads)]},
            "series": {k: list(range(n_tokens - 15)) for k in ("index", "live", "allocated", "formula")}}


def run(store: RoomStore, followers: int, seconds: float, threads: int, publish_every: float) -> dict:
    room = store.create()
    view = reuse_view()
    store.publish(room.id, room.secret, view)
    reads: list[float] = []
    publishes: list[float] = []
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def follower_pool(k: int) -> None:
        # followers k, k+threads, ... each read once a second, spread evenly over the second
        mine = list(range(k, followers, threads))
        start = time.monotonic()
        n = 0
        while True:
            due = start + n / max(1, len(mine))
            if due >= stop:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            t0 = time.perf_counter()
            store.read(room.id)
            dt = time.perf_counter() - t0
            with lock:
                reads.append(dt)
            n += 1

    def lecturer() -> None:
        step = 0
        while time.monotonic() < stop:
            step += 1
            t0 = time.perf_counter()
            store.publish(room.id, room.secret, {**view, "n_steps": step})
            publishes.append(time.perf_counter() - t0)
            time.sleep(publish_every)

    workers = [threading.Thread(target=follower_pool, args=(k,)) for k in range(threads)]
    workers.append(threading.Thread(target=lecturer))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    store.end(room.id, room.secret)
    reads.sort()
    return {"reads": len(reads), "reads_per_s": round(len(reads) / seconds, 1),
            "read_median_ms": round(statistics.median(reads) * 1e3, 3),
            "read_p99_ms": round(reads[int(0.99 * (len(reads) - 1))] * 1e3, 3),
            "publish_median_ms": round(statistics.median(publishes) * 1e3, 3),
            "view_bytes": len(json.dumps(view, separators=(",", ":")))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--followers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--publish-every", type=float, default=0.5)
    args = parser.parse_args()
    out = {"memory": run(MemoryStore(), args.followers, args.seconds, args.threads, args.publish_every)}
    from tests.room.conftest import redis_server  # the tests' own: a redis-server on a free port, no disk

    with redis_server() as (url, _):
        out["redis"] = run(RedisStore(url), args.followers, args.seconds, args.threads, args.publish_every)
    print(json.dumps({"followers": args.followers, "seconds": args.seconds, **out}, indent=2))


if __name__ == "__main__":
    main()
