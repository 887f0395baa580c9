"""vLLM's own KVCacheManager and BlockPool with their KV events on, published by vLLM's own ZmqEventPublisher on a
loopback port, under the scheduling loop of tests/engine/paged/vllm_kv_reference.py. Run by
tests/serving/test_kv_events_vllm.py in a subprocess with PYTHONPATH=build/vllm-ref (scripts/install_vllm_ref.sh).

The first line on stdin is the plan (ports, hash algorithm, streams of workload segments); then, after every call
that can change the pool (allocate_slots, free, reset_prefix_cache) and every lookup (get_computed_blocks), the
events the pool queued are published as one KVEventBatch (as Scheduler.update_from_output publishes each step's,
vllm/v1/core/sched/scheduler.py), and a checkpoint goes to stdout as a JSON line: the last sequence number
published, the pool's cached blocks (hash -> blocks holding it, group 0) and each one's parent, and for a lookup
the request's tokens, its block hashes and the hits the manager reported. The runner waits for a line on stdin (the
test's tree has caught up and was compared) before it goes on. Segments of one stream share one pool (hits across
them, evictions); a segment may end with a reset of the prefix cache; every stream ends with one (AllBlocksCleared),
except, when the plan asks for a restart, the one before the last: then the publisher is shut down with blocks
still cached, and a new one started on the same ports (sequence numbers from 0 again) for the last stream, on a new
pool: a restarted server. With "auto" nothing is compared: the batches go out as vLLM's scheduler would send them
(a pause between them), the last stream's blocks stay cached ("keep_last"), and the publisher stays up for
"linger_s" seconds, its replay socket holding every batch (the screenshots' server).
"""
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine" / "paged"))
import vllm_kv_reference as ref  # noqa: E402  (stubs xgrammar and llguidance, then imports vLLM)
from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id  # noqa: E402

PLAN = json.loads(sys.stdin.readline())
PUB = f"tcp://*:{PLAN['port']}"
REPLAY = f"tcp://*:{PLAN['replay_port']}"
STATE = {"publisher": ZmqEventPublisher(0, endpoint=PUB, replay_endpoint=REPLAY), "seq": -1, "manager": None,
         "reuse": False, "parents": {}, "checkpoints": 0, "epoch": 0}


def checkpoint(kvm, kind: str, lookup: dict | None = None) -> None:
    events = Manager.take_events(kvm)
    if events:
        STATE["publisher"].publish(KVEventBatch(ts=time.time(), events=events))
        STATE["seq"] += 1
    cached = Counter()
    for block in kvm.block_pool.blocks:
        if block.block_hash is not None:
            assert get_group_id(block.block_hash) == 0
            cached[get_block_hash(block.block_hash).hex()] += 1
    parents = STATE["parents"]
    if PLAN.get("auto"):  # nobody compares: a server publishing as it runs (the screenshots' subscriber)
        time.sleep(PLAN.get("pause_s", 0.0))
        return
    line = {"epoch": STATE["epoch"], "seq": STATE["seq"], "kind": kind, "block_size": STATE["block_size"],
            "cached": cached,
            "parents": {h: parents[h] for h in cached}, "lookup": lookup, "n_events": len(events)}
    print(json.dumps(line), flush=True)
    STATE["checkpoints"] += 1
    assert sys.stdin.readline().strip() == "ok"


def wake() -> None:
    """Empty batches until the test's subscriber has one: ZMQ's PUB reads a new subscription only as it sends
    (libzmq's xpub), so what it sends just after a subscriber (re)connects can miss it (the subscriber gets a missed
    batch from the replay socket once a later one arrives)."""
    while True:
        STATE["publisher"].publish(KVEventBatch(ts=time.time(), events=[]))
        STATE["seq"] += 1
        print(json.dumps({"wake": STATE["seq"], "epoch": STATE["epoch"]}), flush=True)
        if sys.stdin.readline().strip() == "go":
            return


def note_chain(request) -> None:
    """Each of the request's block hashes under the one before it: the parents the pool's blocks have."""
    prev = None
    for h in request.block_hashes:
        STATE["parents"][h.hex()] = prev
        prev = h.hex()


Manager = ref.KVCacheManager


class PublishingManager(Manager):
    """vLLM's KVCacheManager; after each call the events it queued go out on the wire, and the test compares."""

    def __new__(cls, *args, **kwargs):
        if STATE["reuse"] and STATE["manager"] is not None:
            return STATE["manager"]  # the stream's next segment: the same pool
        return super().__new__(cls)

    def __init__(self, *args, **kwargs) -> None:
        if STATE["reuse"] and STATE["manager"] is self:
            return
        super().__init__(*args, **kwargs)
        STATE["manager"] = self

    def get_computed_blocks(self, request):
        out = super().get_computed_blocks(request)
        note_chain(request)
        checkpoint(self, "lookup", {"tokens": list(request.all_token_ids), "hits": out[1],
                                    "hashes": [h.hex() for h in request.block_hashes]})
        return out

    def allocate_slots(self, request, *args, **kwargs):
        out = super().allocate_slots(request, *args, **kwargs)
        note_chain(request)
        checkpoint(self, "allocate")
        return out

    def free(self, request) -> None:
        super().free(request)
        checkpoint(self, "free")

    def take_events(self):
        return []  # published at each checkpoint already


ref.KVCacheManager = PublishingManager
fn = get_hash_fn_by_name(PLAN["algo"])
ref.sha256 = fn  # the loop's hasher and init_none_hash, as EngineCore sets them for --prefix-caching-hash-algo
rng = random.Random(PLAN["seed"])
if not PLAN.get("auto"):
    print(json.dumps({"ready": True}), flush=True)  # bound: the test's subscriber connects, then says go
    assert sys.stdin.readline().strip() == "go"
    wake()
for index, stream in enumerate(PLAN["streams"]):
    if PLAN.get("restart") and index == len(PLAN["streams"]) - 1:
        # the server restarts: its cache is gone without a word, and a new publisher counts from 0 again
        STATE["publisher"].shutdown()
        time.sleep(0.3)
        STATE["publisher"] = ZmqEventPublisher(0, endpoint=PUB, replay_endpoint=REPLAY)
        STATE["seq"] = -1
        STATE["epoch"] += 1
        STATE["manager"] = None
        print(json.dumps({"ready": True}), flush=True)  # as at the start: the subscriber has reconnected
        assert sys.stdin.readline().strip() == "go"
        wake()
    for s, segment in enumerate(stream):
        STATE["reuse"] = s > 0
        STATE["block_size"] = segment["block_size"]
        for r in segment["requests"]:
            r["output"] = [rng.randrange(segment["vocab"]) for _ in range(r["max_new"])]
        ref.run({**segment, "max_steps": 1000})
        kvm = STATE["manager"]
        before_restart = PLAN.get("restart") and index == len(PLAN["streams"]) - 2
        keep = PLAN.get("keep_last") and index == len(PLAN["streams"]) - 1
        if segment.get("reset_after") or (s == len(stream) - 1 and not before_restart and not keep):
            assert kvm.reset_prefix_cache()
            checkpoint(kvm, "reset")
    STATE["reuse"] = False
print(json.dumps({"done": True, "checkpoints": STATE["checkpoints"], "vllm": ref.vllm.__version__}), flush=True)
time.sleep(PLAN.get("linger_s", 0))  # still publishing's replay socket: a subscriber that comes later gets it all
STATE["publisher"].shutdown()
