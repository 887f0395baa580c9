"""How many KV events per second kvviz's subscriber keeps up with on this machine, and its memory after a long run.

A publisher process sends vLLM 0.34.0's frames (tests/serving/kv_fake_publisher.py: topic, sequence number,
msgpack batch as kvviz.serving.kv_events.encode_batch writes it, the events as maps) as fast as it can: each batch
stores --per-batch blocks (a new prompt's chain of blocks under one of a few shared prefixes) and removes as many
old ones, so the cache stays --cached blocks big, as a busy server's does. kvviz's Watch (the subscriber thread the
page and `kv-events` use) folds them into its tree while a reader takes the state once a second, as the page does.
Prints, for each run: events sent and folded, the seconds the subscriber took from the first batch to the last
(events/second folded), batches missed (0: nothing dropped), and the process's resident memory before subscribing,
after --events/4 and after all of them (a bounded tree and history: the last two close).

    python bench/kv_events_rate.py [--events 1000000] [--per-batch 8] [--cached 5000]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz.serving.kv_events import Removed, Stored  # noqa: E402
from kvviz.serving.kv_watch import Watch  # noqa: E402


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def publish(port: int, replay_port: int, n_batches: int, per_batch: int, cached: int, ready, go,  # noqa: ANN001
            sent) -> None:  # noqa: ANN001
    from tests.serving.kv_fake_publisher import FakePublisher

    pub = FakePublisher(port=port, replay_port=replay_port)
    ready.set()
    go.wait()
    size = 16
    live: list[int] = []
    next_hash = 1_000
    prefixes = list(range(1, 9))  # eight shared first blocks, stored once
    pub.send([Stored((h,), None, tuple(range(size)), size, "GPU", 0) for h in prefixes])
    t0, n_events = time.monotonic(), 0
    for b in range(n_batches):
        hashes = tuple(range(next_hash, next_hash + per_batch))
        next_hash += per_batch
        events = [Stored(hashes, prefixes[b % 8], tuple(range(size * per_batch)), size, "GPU", 0)]
        live.extend(hashes)
        if len(live) > cached:
            gone, live = live[:per_batch], live[per_batch:]
            events.append(Removed(tuple(reversed(gone)), "GPU", 0))  # a chain's tail first, as vLLM frees it
        pub.send(events)
        n_events += sum(len(e.hashes) for e in events)
    sent.put((n_events, time.monotonic() - t0))
    time.sleep(30)  # the replay socket stays up while the subscriber catches up
    pub.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="block events (each stored or removed block)")
    ap.add_argument("--per-batch", type=int, default=8)
    ap.add_argument("--cached", type=int, default=5_000)
    args = ap.parse_args()
    from tests.serving.kv_fake_publisher import free_port

    n_batches = args.events // (2 * args.per_batch)
    port, replay_port = free_port(), free_port()
    ctx = mp.get_context("spawn")
    ready, go, sent = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=publish, args=(port, replay_port, n_batches, args.per_batch, args.cached, ready, go,
                                             sent))
    proc.start()
    ready.wait(30)
    before = rss_mib()
    watch = Watch(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}")
    assert watch.wait_connected(10)
    time.sleep(0.5)
    go.set()
    start, quarter_rss, first_at = time.monotonic(), None, None
    while True:
        time.sleep(1.0)  # the page's tick
        state = watch.state()
        s = state["summary"]
        if first_at is None and s["batches"]:
            first_at = time.monotonic()
        if quarter_rss is None and s["batches"] >= n_batches // 4:
            quarter_rss = rss_mib()
        if s["batches"] >= n_batches + 1 or time.monotonic() - start > 1800:
            break
    took = time.monotonic() - (first_at or start) + 1.0  # to the tick that saw the last batch (at most 1 s late)
    after = rss_mib()
    events = s["stored"] + s["removed"] - 8  # less the shared prefixes' first batch
    watch.close()
    n_sent, sent_s = sent.get(timeout=60)
    proc.join(60)
    print(f"sent {n_sent:,} block events in {sent_s:.1f} s ({n_sent / sent_s:,.0f}/s, the publisher's pace); folded "
          f"{events:,} ({s['batches']:,} batches) {took:.1f} s after the first: {events / took:,.0f} events/s "
          f"(the reader ticks once a second: within a second of the last one sent = kept up)")
    print(f"cached at the end: {s['blocks']:,} blocks; missed batches: {len(s['incomplete'])} gaps, "
          f"replayed {s['replayed']}")
    print(f"resident memory: {before:.0f} MiB before subscribing, {quarter_rss:.0f} MiB after a quarter, "
          f"{after:.0f} MiB after all")


if __name__ == "__main__":
    main()
