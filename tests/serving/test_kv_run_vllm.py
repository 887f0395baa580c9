"""The Serving page's load run attributed to cached blocks, against vLLM's own code:
tests/serving/vllm_standin_server.py serves OpenAI-compatible completions whose prefix cache is vLLM's KVCacheManager
(the wheel in build/vllm-ref), publishing with vLLM's ZmqEventPublisher. kvviz's load run
(kvviz.serving.report.run_bench, the code the page's worker runs) sends a scripted dataset one request at a time,
keeping each prompt's ids as the server's /tokenize gives them; kvviz's Watch follows the events;
kvviz.serving.kv_run attributes every request at its send time. The attribution equals the hits vLLM's manager
reported for every request, and the stream has sharing, evictions (a small pool) and a divergence."""
import json
import random

import pytest

from kvviz.engine.loading import shipped_tokenizer
from kvviz.serving.bench import BenchPlan, closed_loop
from kvviz.serving.kv_run import run_rates
from kvviz.serving.kv_watch import Watch
from kvviz.serving.report import run_bench
from kvviz.serving.workload import Workload
from tests.serving.standin import INSTALLED, caught_up, standin_server, wake

pytestmark = pytest.mark.skipif(
    not INSTALLED, reason="vLLM reference not installed here: run scripts/install_vllm_ref.sh (.ci/run does)")

A = ("The keys and values of earlier tokens never change under a causal mask, so a serving engine keeps them in "
     "a paged cache and each new token only computes its own.")
B = ("A block of the cache holds a fixed number of tokens; a prompt that shares its first blocks with an earlier "
     "one finds them by the hash of their tokens and the hash of the block before.")
C = ("When the pool is full the engine evicts the blocks nobody uses, the least recently freed first, and a later "
     "prompt that needed them computes them again.")


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


def test_load_run_attribution_equals_vllm_managers_hits(tmp_path):
    with standin_server(block_size=4, num_blocks=24) as (url, endpoint, replay):
        watch = Watch(endpoint, replay)
        try:
            wake(url, watch)
            run, server, view = _run(url, watch, tmp_path)
        finally:
            watch.close()
    _check(run, server, view, watch)


def _run(url: str, watch: Watch, tmp_path, endpoint: str = "completions") -> tuple[dict, dict, dict]:  # noqa: ANN001
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in scripted(0)), encoding="utf-8")
    plan = BenchPlan(url=url, points=closed_loop((1,)), num_prompts=7, endpoint=endpoint,
                     workload=Workload(output_len=3, dataset_path=str(dataset), seed=0), keep_cache_ids=True)
    run = run_bench(plan)
    assert run["error"] is None and run["completed"] == 7
    server = caught_up(url, watch)
    return run, server, watch.run_view(run, algo="sha256", seed=None)


def test_chat_prompts_attributed_through_the_servers_chat_template(tmp_path):
    """The chat endpoint: each prompt's ids are the server's own rendering of the one-message chat (its /tokenize
    with `messages`, TokenizeChatRequest's add_generation_prompt), the ids its manager looked up; the attribution
    equals the manager's hits, the template's own first tokens shared by every request."""
    with standin_server(block_size=4, num_blocks=24) as (url, endpoint, replay):
        watch = Watch(endpoint, replay)
        try:
            wake(url, watch)
            run, server, view = _run(url, watch, tmp_path, endpoint="chat")
        finally:
            watch.close()
    rows, hits = view["rows"], server["hits"]
    assert [r["ids_from"] for r in rows] == ["chat"] * 7 and view["unknown"] == {}
    assert [r["tokens"] for r in rows] == [len(h["tokens"]) for h in hits]
    assert [r["hit_tokens"] for r in rows] == [h["hits"] for h in hits]
    print(f"\nchat: hit tokens {[h['hits'] for h in hits]} (vLLM) = {[r['hit_tokens'] for r in rows]} (kvviz); "
          f"first misses {[r['reason'] for r in rows]}")
    assert rows[0]["reason"] == "never" and rows[1]["reason"] is None and rows[1]["hit_blocks"] > 3
    assert all(r["hit_blocks"] >= 1 for r in rows[1:] if r["reason"] != "evicted")  # "<|im_start|>user\n" shared


def _check(run: dict, server: dict, view: dict, watch: Watch) -> None:
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
    assert view["server_agree"] == {"agree": 7, "compared": 7}
    # blocks stored and removed per second on the point's clock: every block the run stored and evicted
    point = run["points"][0]
    rates = run_rates(list(watch.tree.log), point["start_unix_s"], 60.0)
    assert sum(b["stored"] for b in rates) == watch.tree.stored and sum(b["removed"] for b in rates) > 0
    assert sum(b["removed"] for b in rates) == watch.tree.removed

