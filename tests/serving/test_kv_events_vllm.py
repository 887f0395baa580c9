"""kvviz's KV-event tree against vLLM's own pool. tests/serving/vllm_kv_events_publisher.py runs vLLM's KVCacheManager
and BlockPool (the wheel in build/vllm-ref, scripts/install_vllm_ref.sh) with events on, and publishes them with
vLLM's own ZmqEventPublisher on a loopback port; kvviz's Subscriber reads them into a BlockTree. After every call
that can change the pool, and at every lookup, the tree equals the pool's cached blocks (hashes, copies, parents),
and kvviz's attribution of the request equals the hits vLLM's manager reported, with the block hashes vLLM computed.
Streams: scripted (sharing, eviction, preemption, reset_prefix_cache) and seeded random ones; sha256 with vLLM's
default seed, sha256_cbor with a PYTHONHASHSEED kvviz is told, and one it is not told (the chain learned from the
events); a restarted publisher."""
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from kvviz.serving.kv_attribution import attribute, block_hashes, external
from kvviz.serving.kv_events import Batch, Subscriber
from kvviz.serving.kv_tree import BlockTree
from kvviz.serving.llamacpp import free_port

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "build" / "vllm-ref"
RUNNER = Path(__file__).with_name("vllm_kv_events_publisher.py")
VERSION = "0.34.0"  # scripts/install_vllm_ref.sh
VOCAB, MAX_LEN = 300, 256

pytestmark = pytest.mark.skipif(
    not (REF / f".installed-{VERSION}").exists(),
    reason="vLLM reference not installed here: run scripts/install_vllm_ref.sh (.ci/run does)")


def segment(size: int, n_blocks: int, requests: list[tuple[list[int], int, int]], reset: bool = False) -> dict:
    return {"block_size": size, "num_blocks": n_blocks, "max_model_len": MAX_LEN, "vocab": VOCAB,
            "reset_after": reset,
            "requests": [{"prompt": p, "max_new": m, "arrive": a} for p, m, a in requests]}


def scripted() -> list[list[dict]]:
    rng = random.Random(3)
    a = [rng.randrange(VOCAB) for _ in range(16)]
    b = [rng.randrange(VOCAB) for _ in range(12)]
    return [
        # sharing: A, then A with a new tail (a 4-block hit), then A again (the last block recomputed)
        [segment(4, 16, [(a, 2, 0)]), segment(4, 16, [(a + [7, 8, 9, 10, 11], 2, 0), (a, 1, 3)])],
        # eviction: A, then B and C fill a 6-block pool and evict A; A again: evicted
        [segment(4, 7, [(a, 1, 0)]), segment(4, 7, [(b + [1, 2, 3, 4], 2, 0), (b + [5, 6, 7, 8], 2, 3)]),
         segment(4, 7, [(a, 1, 0)])],
        # preemption: two requests growing by decoding in a pool too small for both
        [segment(4, 6, [(a[:8], 8, 0), (b[:8], 8, 0)])],
        # reset_prefix_cache between two segments: A's blocks cleared, A again misses (removed by the reset)
        [segment(4, 12, [(a, 1, 0)], reset=True), segment(4, 12, [(a, 1, 0)])],
    ]


def random_streams(n: int, seed: int) -> list[list[dict]]:
    """Seeded streams of 1–3 segments on one pool: two shared prefixes, own suffixes, repeats, growth by decoding,
    pools from roomy to preempting, a reset of the prefix cache now and then."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        size, n_blocks = rng.choice([2, 4, 8, 16]), rng.randint(4, 16)
        prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randint(0, 3 * size))] for _ in range(2)]
        seen: list[list[int]] = []
        stream = []
        for _ in range(rng.randint(1, 3)):
            reqs = []
            for _ in range(rng.randint(1, 6)):
                if seen and rng.random() < 0.25:
                    prompt = list(rng.choice(seen))
                else:
                    prompt = rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 2 * size))]
                max_new = rng.randint(1, 3 * size)
                if -(-(len(prompt) + max_new) // size) <= n_blocks - 1:  # one that can never run is left out
                    reqs.append((prompt, max_new, rng.choice([0, 0, 1, 2, 3, 5])))
                    seen.append(prompt)
            if reqs:
                stream.append(segment(size, n_blocks, reqs, reset=rng.random() < 0.2))
        if stream:
            out.append(stream)
    return out


def ext(hex_hash: str) -> bytes | int:
    """A hash as the events carry it (vLLM 0.34.0 sends 64-bit integers unless told otherwise)."""
    return external(bytes.fromhex(hex_hash), INT_HASHES)


INT_HASHES = True


def drive(streams: list[list[dict]], *, algo: str = "sha256", env_seed: str | None = None,
          told: tuple[str | None, ...] = (None,), restart: bool = False, int_hashes: bool = True) -> dict:
    """Run the streams on vLLM's pool, hold kvviz's tree to it at every checkpoint; the figures compared."""
    global INT_HASHES
    INT_HASHES = int_hashes
    port, replay_port = free_port(), free_port()
    plan = {"port": port, "replay_port": replay_port, "algo": algo, "seed": 0, "streams": streams,
            "restart": restart}
    env = dict(os.environ, PYTHONPATH=str(REF), VLLM_LOGGING_LEVEL="ERROR")
    env.pop("PYTHONHASHSEED", None)
    env["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = str(int(int_hashes))
    if env_seed is not None:
        env["PYTHONHASHSEED"] = env_seed
    sub = Subscriber(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}", replay_timeout_s=2.0)
    proc = subprocess.Popen([sys.executable, str(RUNNER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    tree = BlockTree()
    stats = Counter()
    reasons: Counter = Counter()
    diffs: list = []
    applied, epoch = -1, 0
    lookups: list[dict] = []
    try:
        proc.stdin.write(json.dumps(plan) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line and json.loads(line)["ready"], proc.stderr.read()[-3000:]
        assert sub.wait_connected(10)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        while True:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            cp = json.loads(line)
            if cp.get("ready"):  # a restarted publisher: the subscriber's socket reconnects by itself
                proc.stdin.write("go\n")
                proc.stdin.flush()
                continue
            if "wake" in cp:  # an empty batch: go on once one of this publisher's has arrived
                items = sub.poll(0.2)
                tree.take(items)
                seen = [i.seq for i in items if isinstance(i, Batch)]
                new = seen and (cp["epoch"] == 0 or tree.restarts == cp["epoch"])
                if new:
                    epoch, applied = cp["epoch"], seen[-1]
                proc.stdin.write("go\n" if new else "more\n")
                proc.stdin.flush()
                continue
            if cp.get("done"):
                stats["vllm"] = cp["vllm"]
                break
            deadline = time.monotonic() + 15
            while applied != cp["seq"] and time.monotonic() < deadline:
                items = sub.poll(0.05)
                tree.take(items)
                for item in items:
                    if isinstance(item, Batch):
                        applied = item.seq
            assert applied == cp["seq"], (cp["kind"], cp["epoch"], cp["seq"], applied, sub.received, sub.last_seq)
            stats["checkpoints"] += 1
            if tree.restarts < epoch:  # the restarted server has published nothing yet: kvviz cannot know
                stats["before_first_batch"] += 1
            else:
                theirs = {ext(h): n for h, n in cp["cached"].items()}
                their_parents = {ext(h): (None if p is None else ext(p)) for h, p in cp["parents"].items()}
                mine = {h: n for (g, h), n in tree.cached().items()}
                if mine != theirs or tree.parents() != {(0, h): p for h, p in their_parents.items()}:
                    diffs.append((cp["kind"], cp["seq"], mine, cp["cached"]))
                stats["compared"] += 1
                stats["blocks"] += sum(cp["cached"].values())
            if cp["lookup"] is not None:
                lk = cp["lookup"]
                stats["lookups"] += 1
                stats["hit_tokens"] += lk["hits"]
                stats["hashed"] += bool(lk["hashes"])  # lookups of at least one full block
                for i, seed in enumerate(told):  # kvviz told the server's seed, or not
                    att = attribute(tree, lk["tokens"], cp["block_size"], algo=algo, seed=seed)
                    computed = [h.hex() for h in block_hashes(lk["tokens"], cp["block_size"], algo, seed)]
                    stats[f"hashes_equal_{i}"] += bool(lk["hashes"]) and computed == lk["hashes"]
                    if att.hit_tokens != lk["hits"]:
                        diffs.append(("lookup", seed, cp["seq"], att.as_dict(), lk["hits"]))
                    stats[f"learned_{i}"] += att.learned
                    if i == 0:
                        reasons.update([att.as_dict()["reason"] or "all_hit"])
                        lookups.append(att.as_dict())
            proc.stdin.write("ok\n")
            proc.stdin.flush()
        assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        sub.close()
    return {"stats": stats, "reasons": reasons, "diffs": diffs, "tree": tree, "lookups": lookups}


def figures(run: dict) -> str:
    s = run["stats"]
    return (f"{s['checkpoints']} checkpoints, {s['compared']} compared, {s['blocks']} blocks, {s['lookups']} lookups, "
            f"{s['hit_tokens']} hit tokens, differences {len(run['diffs'])}, first misses {dict(run['reasons'])}")


def test_tree_and_hits_equal_vllm_pool_at_every_step():
    """The scripted streams, 30 random ones, then a restarted server (sha256, vLLM's default seed, 64-bit
    integer hashes as vLLM 0.34.0 sends them by default)."""
    streams = scripted() + random_streams(30, seed=0) + random_streams(1, seed=9)
    run = drive(streams, restart=True)
    s = run["stats"]
    print(f"\nvLLM {s['vllm']}, {len(streams)} streams (sha256, default seed): {figures(run)}")
    assert s["vllm"] == VERSION
    assert run["diffs"] == []
    assert s["hashes_equal_0"] == s["hashed"] > 100  # kvviz's hash of every request equals vLLM's
    assert s["compared"] + s["before_first_batch"] == s["checkpoints"] > 1000 and s["blocks"] > 5000
    tree = run["tree"]
    assert tree.cleared >= len(streams) - 1 and tree.removed > 100 and tree.incomplete == [] and not tree.skipped
    assert tree.restarts == 1  # the last stream's server: a new publisher, its blocks alone in the tree
    # every reason of a first miss happened, against hits the manager reported
    assert {"evicted", "reset", "diverged", "never", "all_hit"} <= set(run["reasons"]) and s["hit_tokens"] > 500
    # the scripted streams' lookups, in order
    look = run["lookups"]
    # sharing: A's 16 tokens: 3 blocks looked up (the 4th holds the last token); A + tail hits all 4 of A's
    assert look[0]["reason"] == "never" and look[1]["hit_blocks"] == 4 and look[1]["reason"] == "diverged"
    assert look[1]["first_miss"] == 4
    assert look[2]["hit_blocks"] == 3 and look[2]["reasons"][-1] == "last_token"
    # eviction: A (removed by the reset that ended the last stream), B + 4 tokens, B + 4 others (all 3 blocks it
    # looks up hit: B's), then A again: its blocks stored, then evicted by B's
    assert [x["reason"] for x in look[3:7]] == ["reset", "never", None, "evicted"]
    assert look[5]["hit_blocks"] == 3 and look[6]["removed_ts"] > look[3]["removed_ts"]


def test_cbor_with_the_servers_seed_and_without_it():
    """sha256_cbor under PYTHONHASHSEED=1234, hashes as bytes: kvviz told the seed computes vLLM's hashes; not told,
    every hash it computes is wrong, but the first block's hash from the events restarts the chain, and the hits
    are vLLM's all the same."""
    streams = scripted() + random_streams(8, seed=1)
    run = drive(streams, algo="sha256_cbor", env_seed="1234", told=("1234", None), int_hashes=False)
    s = run["stats"]
    print(f"\nsha256_cbor, seed told and not: {figures(run)}")
    assert run["diffs"] == []
    assert s["hashes_equal_0"] == s["hashed"] > 30 and s["learned_0"] == 0
    assert s["hashes_equal_1"] == 0 and s["learned_1"] > 0
    # reset: the scripted stream's last lookup of A misses, its blocks removed by the reset (AllBlocksCleared)
    reset_lookups = run["lookups"][-0:]
    assert any(x["reason"] == "reset" and x["hit_blocks"] == 0 for x in reset_lookups)
