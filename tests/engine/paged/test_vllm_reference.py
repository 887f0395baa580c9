"""kvviz's paged pool against vLLM's own. scripts/install_vllm_ref.sh puts the vLLM wheel (no dependencies) in
build/vllm-ref, outside the main environment; tests/engine/paged/vllm_kv_reference.py runs its real KVCacheManager
and BlockPool in a subprocess, under vLLM's scheduling loop, over the same request streams as kvviz's PagedEngine
(arrivals, shared prefixes, repeated prompts, growth by decoding, preemption, frees). Every step's scheduled,
admitted, preempted and finished requests, prefix hits, block tables, free blocks (in queue order), usage, cached
blocks and evictions are equal."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kvviz.engine.config import DecoderConfig
from kvviz.engine.model import Decoder
from kvviz.engine.paged.scheduler import PagedEngine

ROOT = Path(__file__).resolve().parents[3]
REF = ROOT / "build" / "vllm-ref"
RUNNER = Path(__file__).with_name("vllm_kv_reference.py")
VERSION = "0.34.0"  # scripts/install_vllm_ref.sh

pytestmark = pytest.mark.skipif(
    not (REF / f".installed-{VERSION}").exists(),
    reason="vLLM reference not installed here: run scripts/install_vllm_ref.sh (.ci/run does)")


@pytest.fixture(scope="module")
def small() -> Decoder:
    cfg = DecoderConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=300, max_seq_len=256)
    return Decoder(cfg).init_weights(3).eval().fuse()


def run_kvviz(model: Decoder, workload: dict) -> tuple[list[dict], list[list[int]]]:
    """kvviz's engine over the workload: each step's state in the reference's terms, and each request's output."""
    eng = PagedEngine(model, workload["num_blocks"], workload["block_size"],
                      prefix_caching=workload.get("prefix_caching", True))
    for r in workload["requests"]:
        eng.add(r["prompt"], r["max_new"], at_step=r["arrive"])
    steps = []
    while not eng.idle:
        recomputed = {r.request_id: r.recompute_cached_tokens for r in eng.requests}
        report = eng.step()
        hits = {}
        for i in report.admitted:
            r = eng.requests[i]
            hits[str(i)] = r.cached_tokens if r.admitted_step == report.step else (
                r.recompute_cached_tokens - recomputed[i])
        pool = eng.pool
        steps.append({
            "step": report.step, "scheduled": report.scheduled, "admitted": report.admitted,
            "preempted": report.preempted, "finished": report.finished, "hits": hits,
            "tables": {str(r.request_id): list(r.block_table) for r in eng.running},
            "free": pool.n_free, "usage": pool.usage(), "free_order": list(pool.free),
            "cached": sorted(b.block_id for b in pool.blocks if b.hash is not None), "evictions": pool.evictions,
        })
    return steps, [r.output_ids for r in eng.requests]


def run_vllm(workloads: list[dict], outputs: list[list[list[int]]]) -> dict:
    """vLLM's KVCacheManager over the same prompts, fed the tokens kvviz's model produced."""
    payload = [{"block_size": w["block_size"], "num_blocks": w["num_blocks"], "max_model_len": w["max_model_len"],
                "prefix_caching": w.get("prefix_caching", True), "max_steps": 1000,
                "requests": [{"prompt": r["prompt"], "output": out, "arrive": r["arrive"]}
                             for r, out in zip(w["requests"], outs, strict=True)]}
               for w, outs in zip(workloads, outputs, strict=True)]
    env = dict(os.environ, PYTHONPATH=str(REF), VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run([sys.executable, str(RUNNER)], input=json.dumps(payload), capture_output=True, text=True,
                          env=env, timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def random_workloads(vocab: int, max_len: int, n: int, seed: int) -> list[dict]:
    """Seeded request streams: two shared prefixes of 0–3 blocks, own suffixes, repeated prompts, 1–3 blocks of
    new tokens, arrivals spread over the first steps, pools from roomy to preempting, caching mostly on."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        size = rng.choice([2, 4, 8, 16])
        n_blocks = rng.randint(3, 14)
        prefixes = [[rng.randrange(vocab) for _ in range(rng.randint(0, 3 * size))] for _ in range(2)]
        requests: list[dict] = []
        for _ in range(rng.randint(2, 7)):
            if requests and rng.random() < 0.25:
                prompt = list(rng.choice(requests)["prompt"])  # the same prompt again: a full hit, last block kept
            else:
                prompt = rng.choice(prefixes) + [rng.randrange(vocab) for _ in range(rng.randint(1, 2 * size))]
            max_new = rng.randint(1, 3 * size)
            if -(-(len(prompt) + max_new) // size) <= n_blocks - 1:  # kvviz refuses one that can never run
                requests.append({"prompt": prompt, "max_new": max_new, "arrive": rng.choice([0, 0, 1, 2, 3, 5, 8])})
        if requests:
            out.append({"block_size": size, "num_blocks": n_blocks, "max_model_len": max_len,
                        "prefix_caching": rng.random() < 0.85, "requests": requests})
    return out


def scenarios(model: Decoder) -> list[dict]:
    """The two rules this reference pinned down, as named streams."""
    vocab, max_len = model.cfg.vocab_size, model.cfg.max_seq_len
    rng = random.Random(7)
    a = [rng.randrange(vocab) for _ in range(32)]
    return [
        # The null block: 4 blocks of 4, two 4-token requests each needing a second block at their 5th token.
        {"block_size": 4, "num_blocks": 4, "max_model_len": max_len, "requests": [
            {"prompt": [1, 2, 3, 4], "max_new": 4, "arrive": 0}, {"prompt": [5, 6, 7, 8], "max_new": 4, "arrive": 0}]},
        # Free order: blocks of 16, 4 to hand out; A (32), 17 other, 10 other, then A + 1 token.
        {"block_size": 16, "num_blocks": 5, "max_model_len": max_len, "requests": [
            {"prompt": a, "max_new": 1, "arrive": 0},
            {"prompt": [rng.randrange(vocab) for _ in range(17)], "max_new": 1, "arrive": 1},
            {"prompt": [rng.randrange(vocab) for _ in range(10)], "max_new": 1, "arrive": 2},
            {"prompt": a + [rng.randrange(vocab)], "max_new": 1, "arrive": 3}]},
    ]


def test_pool_equals_vllm_kv_cache_manager_step_by_step(small):
    named = scenarios(small)
    streams = named + random_workloads(small.cfg.vocab_size, small.cfg.max_seq_len, 40, seed=0)
    ours = [run_kvviz(small, w) for w in streams]
    ref = run_vllm(streams, [outs for _, outs in ours])
    assert ref["vllm"] == VERSION
    for index, ((steps, _), theirs) in enumerate(zip(ours, ref["runs"], strict=True)):
        assert len(steps) == len(theirs), index
        for mine, vllm_step in zip(steps, theirs, strict=True):
            assert mine == vllm_step, (index, mine["step"])
    # The named streams, as vLLM ran them: the preemption at the second step, and A's 32-token hit.
    null_block, free_order = ref["runs"][0], ref["runs"][1]
    assert null_block[1]["preempted"] == [1]
    assert free_order[3]["hits"] == {"3": 32} and free_order[3]["evictions"] == 0
    # The random streams exercised every path.
    flat = [s for run in ref["runs"][2:] for s in run]
    assert sum(len(s["preempted"]) for s in flat) > 10 and sum(v for s in flat for v in s["hits"].values()) > 100
    assert flat[-1]["evictions"] > 0 or any(s["evictions"] for s in flat)
