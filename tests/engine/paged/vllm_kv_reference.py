"""Runs vLLM's own KVCacheManager (vllm/v1/core/kv_cache_manager.py, block_pool.py) over request streams, with the
scheduling loop of vLLM's Scheduler.schedule / update_from_output transcribed for one full-attention group,
FCFS, no chunked prefill, no speculation. Run by tests/engine/paged/test_vllm_reference.py in a subprocess with
PYTHONPATH=build/vllm-ref (scripts/install_vllm_ref.sh): workloads as JSON on stdin, each step's state as JSON on
stdout. Only xgrammar and llguidance are stubbed: the import names them (structured output) and never calls them.
"""
import json
import sys
import types
from collections import deque


def _stub(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def attr(key: str):
        if key.startswith("__"):
            raise AttributeError(key)
        return type(key, (), {})  # type annotations in vLLM's structured-output backends read these names

    module.__getattr__ = attr
    return module


for _name in ("llguidance", "llguidance.hf", "llguidance.torch", "xgrammar"):
    sys.modules[_name] = _stub(_name)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.distributed.kv_events import BlockRemoved  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402


def run(workload: dict) -> list[dict]:
    size, n_blocks, max_len = workload["block_size"], workload["num_blocks"], workload["max_model_len"]
    spec = FullAttentionSpec(block_size=size, num_kv_heads=1, head_size=8, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=n_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    kvm = KVCacheManager(config, max_model_len=max_len, scheduler_block_size=size, hash_block_size=size,
                         enable_caching=workload.get("prefix_caching", True), enable_kv_cache_events=True)
    init_none_hash(sha256)  # the root of every hash chain, as EngineCore sets it at start-up
    hasher = get_request_block_hasher(size, sha256)
    pending = [(r["arrive"], i, r) for i, r in enumerate(workload["requests"])]
    outputs = {str(i): r["output"] for i, r in enumerate(workload["requests"])}
    waiting: deque = deque()
    running: list = []
    first_hit: dict[str, int] = {}
    evictions = 0
    steps = []
    for step in range(workload["max_steps"]):
        for arrive, i, r in [p for p in pending if p[0] <= step]:
            pending.remove((arrive, i, r))
            waiting.append(Request(str(i), r["prompt"], SamplingParams(max_tokens=len(r["output"])), None,
                                   block_hasher=hasher))
        if not waiting and not running and not pending:
            break
        scheduled, preempted, admitted, hits = [], [], [], {}
        # Scheduler.schedule: running requests first, preempting the last admitted while allocate_slots fails.
        for req in list(running):
            if req not in running:
                continue
            num_new = req.num_tokens - req.num_computed_tokens
            while True:
                blocks = kvm.allocate_slots(req, num_new)
                if blocks is not None:
                    break
                victim = running.pop()
                kvm.free(victim)  # Scheduler._preempt_request
                victim.status = RequestStatus.PREEMPTED
                victim.num_computed_tokens = 0
                victim.num_preemptions += 1
                waiting.appendleft(victim)
                preempted.append(int(victim.request_id))
                if victim is req:
                    break
            if blocks is None:
                break
            scheduled.append((req, num_new))
        # Then the waiting ones, first come first served, none in a step that preempted.
        while waiting and not preempted:
            req = waiting[0]
            computed, n_hit = kvm.get_computed_blocks(req)[:2]
            num_new = req.num_tokens - n_hit
            if kvm.allocate_slots(req, num_new, n_hit, computed) is None:
                break
            waiting.popleft()
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = n_hit
            running.append(req)
            admitted.append(int(req.request_id))
            hits[req.request_id] = n_hit
            first_hit.setdefault(req.request_id, n_hit)
            scheduled.append((req, num_new))
        # The forward, then update_from_output: one new token each, finished requests freed.
        finished = []
        for req, num_new in scheduled:
            req.num_computed_tokens += num_new
            req.append_output_token_ids(outputs[req.request_id][len(req.output_token_ids)])
            if len(req.output_token_ids) >= req.max_tokens:
                kvm.free(req)
                running.remove(req)
                finished.append(int(req.request_id))
        evictions += sum(1 for e in kvm.take_events() if isinstance(e, BlockRemoved))
        pool = kvm.block_pool
        steps.append({
            "step": step, "scheduled": [int(r.request_id) for r, _ in scheduled], "admitted": admitted,
            "preempted": preempted, "finished": finished, "hits": hits,
            "tables": {r.request_id: kvm.get_block_ids(r.request_id)[0] for r in running},
            "free": pool.get_num_free_blocks(), "usage": kvm.usage,
            "free_order": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            "cached": sorted(b.block_id for b in pool.blocks if b.block_hash is not None),
            "evictions": evictions,
        })
    return steps


if __name__ == "__main__":
    workloads = json.load(sys.stdin)
    json.dump({"vllm": vllm.__version__, "runs": [run(w) for w in workloads]}, sys.stdout)
