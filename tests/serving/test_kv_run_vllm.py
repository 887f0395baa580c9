"""The Serving page's load run attributed to cached blocks, against vLLM's own code:
tests/serving/vllm_standin_server.py serves OpenAI-compatible completions whose prefix cache is vLLM's KVCacheManager
(the wheel in build/vllm-ref), publishing with vLLM's ZmqEventPublisher. kvviz's load run
(kvviz.serving.report.run_bench, the code the page's worker runs) sends a scripted dataset one request at a time,
keeping each prompt's ids as the server's /tokenize gives them; kvviz's Watch follows the events;
kvviz.serving.kv_run attributes every request at its send time. The attribution equals the hits vLLM's manager
reported for every request, and the stream has sharing, evictions (a small pool) and a divergence."""
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvviz.engine.loading import shipped_tokenizer
from kvviz.serving.bench import BenchPlan, closed_loop
from kvviz.serving.kv_run import run_rates
from kvviz.serving.kv_watch import Watch
from kvviz.serving.report import run_bench
from kvviz.serving.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "build" / "vllm-ref"
SERVER = Path(__file__).with_name("vllm_standin_server.py")
VERSION = "0.34.0"  # scripts/install_vllm_ref.sh

pytestmark = pytest.mark.skipif(
    not (REF / f".installed-{VERSION}").exists(),
    reason="vLLM reference not installed here: run scripts/install_vllm_ref.sh (.ci/run does)")

A = ("The keys and values of earlier tokens never change under a causal mask, so a serving engine keeps them in "
     "a paged cache and each new token only computes its own.")
B = ("A block of the cache holds a fixed number of tokens; a prompt that shares its first blocks with an earlier "
     "one finds them by the hash of their tokens and the hash of the block before.")
C = ("When the pool is full the engine evicts the blocks nobody uses, the least recently freed first, and a later "
     "prompt that needed them computes them again.")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scripted_stream() -> list[str]:
    """The requests in the order they are sent: A (never stored), A again (hits), A's first half with a new ending
    (diverged), B and C (a small pool: blocks evicted), A again and B again (their first blocks hit, then evicted
    ones)."""
    return [A, A, " ".join(A.split()[:12]) + " and nothing else is kept here at all.", B, C, A, B]


def scripted(seed: int) -> list[str]:
    """The dataset's lines in the order that run_bench's dataset_requests shuffles into scripted_stream()."""
    stream = scripted_stream()
    order = list(range(len(stream)))
    random.Random(seed).shuffle(order)  # dataset_requests: random.Random(seed).shuffle(pairs)
    lines = [""] * len(stream)
    for i, k in enumerate(order):
        lines[k] = stream[i]
    return lines


@pytest.fixture
def standin(tmp_path):
    ports = {"port": free_port(), "events_port": free_port(), "replay_port": free_port()}
    cfg = {**ports, "block_size": 4, "num_blocks": 24, "algo": "sha256"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REF), str(ROOT)]), VLLM_LOGGING_LEVEL="ERROR")
    env.pop("PYTHONHASHSEED", None)  # vLLM's own seed for sha256
    proc = subprocess.Popen([sys.executable, str(SERVER), json.dumps(cfg)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{cfg['port']}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            try:
                if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the stand-in server did not start"
            time.sleep(0.3)
        yield url, cfg
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_load_run_attribution_equals_vllm_managers_hits(standin, tmp_path):
    url, cfg = standin
    watch = Watch(f"tcp://127.0.0.1:{cfg['events_port']}", f"tcp://127.0.0.1:{cfg['replay_port']}")
    try:
        assert watch.wait_connected(10)
        deadline = time.monotonic() + 10
        while watch.sub.received == 0:  # a batch through: the subscription is live on the publisher's side
            httpx.post(f"{url}/standin/wake")
            time.sleep(0.1)
            assert time.monotonic() < deadline
        dataset = tmp_path / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in scripted(0)), encoding="utf-8")
        plan = BenchPlan(url=url, points=closed_loop((1,)), num_prompts=7,
                         workload=Workload(output_len=3, dataset_path=str(dataset), seed=0), keep_cache_ids=True)
        run = run_bench(plan)
        assert run["error"] is None and run["completed"] == 7
        server = httpx.get(f"{url}/standin/hits").json()
        deadline = time.monotonic() + 10
        while watch.tree.batches < server["seq"] + 1:  # every batch published folded in
            assert time.monotonic() < deadline
            time.sleep(0.05)
        view = watch.run_view(run, algo="sha256", seed=None)
    finally:
        watch.close()
    rows = view["rows"]
    hits = server["hits"]
    tok = shipped_tokenizer()
    assert view["block_size"] == 4 and view["unknown"] == {} and not view["incomplete"]
    assert [r["ids_from"] for r in rows] == ["tokenize"] * 7
    # the ids kvviz attributed are those vLLM's manager looked up, request by request
    assert [h["tokens"] for h in hits] == [tok.encode(p) for p in scripted_stream()]
    assert [r["tokens"] for r in rows] == [len(h["tokens"]) for h in hits]
    # the attribution's hits equal the manager's, for every request
    assert [r["hit_tokens"] for r in rows] == [h["hits"] for h in hits]
    reasons = [r["reason"] for r in rows]
    print(f"\n{len(rows)} requests, hit tokens {[h['hits'] for h in hits]} (vLLM) = "
          f"{[r['hit_tokens'] for r in rows]} (kvviz); first misses {reasons}; summary {view['summary']}")
    assert reasons[0] == "never" and rows[1]["hit_blocks"] == rows[1]["lookup"] > 3  # A, then A hit
    assert reasons[2] == "diverged" and 0 < rows[2]["first_miss"] < rows[1]["lookup"]
    assert reasons[5] == "evicted" and rows[5]["removed_s"] is not None and rows[5]["removed_s"] > rows[3]["sent_s"]
    assert rows[6]["hit_blocks"] > 0 and reasons[6] == "evicted"  # B again: its first blocks survived C
    assert view["summary"]["requests"] == 7
    assert view["summary"]["hit_blocks"] * 4 == sum(h["hits"] for h in hits)
    # the server's own count of cached tokens, in its usage, says the same
    assert [r["server_cached"] for r in rows] == [h["hits"] for h in hits]
    # blocks stored and removed per second on the point's clock: every block the run stored and evicted
    point = run["points"][0]
    rates = run_rates(list(watch.tree.log), point["start_unix_s"], 60.0)
    assert sum(b["stored"] for b in rates) == watch.tree.stored and sum(b["removed"] for b in rates) > 0
    assert sum(b["removed"] for b in rates) == watch.tree.removed

