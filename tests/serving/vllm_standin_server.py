"""A test-only OpenAI-compatible server whose prefix cache is vLLM's own KVCacheManager and BlockPool (the wheel in
build/vllm-ref, scripts/install_vllm_ref.sh), with its KV events on and published by vLLM's own ZmqEventPublisher
on loopback ports. No model runs: the "forward" is vLLM's scheduling loop for one request (as
tests/engine/paged/vllm_kv_reference.py transcribes Scheduler.schedule / update_from_output), so the cache's hits,
stores and evictions are vLLM's own; the text is the shipped model's tokenizer's.

Run by tests/serving/standin.py in a subprocess with PYTHONPATH=build/vllm-ref and the checkout:
`python vllm_standin_server.py CONFIG_JSON` (port, events_port, replay_port, block_size, num_blocks, algo).
Serves GET /v1/models; GET /metrics (vLLM's names, from the manager's state and counts); POST /v1/completions and
/v1/chat/completions (streamed as vLLM streams them: token messages, a usage message with
prompt_tokens_details.cached_tokens, [DONE]; chat through TEMPLATE); POST /tokenize (vLLM's
TokenizeCompletionRequest, `prompt`, and TokenizeChatRequest, `messages` through TEMPLATE; returns `tokens`); POST
/detokenize (`tokens` -> `prompt`); and for the tests GET /standin/hits (each request's prompt ids and the hits
vLLM's manager reported, in the order they were looked up; the last sequence number published) and POST
/standin/wake (an empty batch: ZMQ's PUB reads a new subscription only as it sends). Requests are served one at a
time (a lock): each one's lookup and allocation in the manager, then its decode steps, each step's events published
as one KVEventBatch (as Scheduler.update_from_output publishes a step's), then freed.
"""
import importlib
import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "engine" / "paged"))
importlib.import_module("vllm_kv_reference")  # stubs xgrammar and llguidance, then imports vLLM
import torch  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402
from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from kvviz.engine.chat import render_chat  # noqa: E402
from kvviz.engine.loading import shipped_tokenizer  # noqa: E402

CFG = json.loads(sys.argv[1])
MODEL, MAX_LEN = "kvviz-standin", 2048
# the chat template (ChatML's layout; the shipped tokenizer has none), applied as vLLM's chat endpoint and its
# TokenizeChatRequest apply a model's: add_generation_prompt default True
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SIZE = CFG["block_size"]
TOK = shipped_tokenizer()
spec = FullAttentionSpec(block_size=SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
kvm = KVCacheManager(KVCacheConfig(num_blocks=CFG["num_blocks"], kv_cache_tensors=[],
                                   kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)]),
                     max_model_len=MAX_LEN, scheduler_block_size=SIZE, hash_block_size=SIZE, enable_caching=True,
                     enable_kv_cache_events=True)
hash_fn = get_hash_fn_by_name(CFG.get("algo", "sha256"))
init_none_hash(hash_fn)  # as EngineCore does at start-up for --prefix-caching-hash-algo
hasher = get_request_block_hasher(SIZE, hash_fn)
publisher = ZmqEventPublisher(0, endpoint=f"tcp://*:{CFG['events_port']}",
                              replay_endpoint=f"tcp://*:{CFG['replay_port']}")
LOCK = threading.Lock()
STATE = {"seq": -1, "hits": [], "n": 0, "running": 0, "prompt_tokens": 0, "generation_tokens": 0, "queries": 0}
app = FastAPI()


def publish() -> None:
    events = kvm.take_events()
    if events:
        publisher.publish(KVEventBatch(ts=time.time(), events=events))
        STATE["seq"] += 1


def serve(ids: list[int], max_tokens: int) -> tuple[int, list[int]] | None:
    """One request through vLLM's manager: (the hits it reported, the output ids); None if the pool cannot hold it."""
    STATE["n"] += 1
    req = Request(str(STATE["n"]), ids, SamplingParams(max_tokens=max_tokens), None, block_hasher=hasher)
    computed, n_hit = kvm.get_computed_blocks(req)[:2]
    num_new = req.num_tokens - n_hit
    if kvm.allocate_slots(req, num_new, n_hit, computed) is None:
        publish()
        return None
    STATE["hits"].append({"tokens": ids, "hits": n_hit, "ts": time.time()})
    STATE["queries"] += req.num_tokens  # vLLM's PrefixCacheStats: the prompt's tokens queried, the hit ones
    STATE["prompt_tokens"] += len(ids)
    STATE["generation_tokens"] += max_tokens
    req.status, req.num_computed_tokens = RequestStatus.RUNNING, n_hit
    out: list[int] = []
    while True:  # update_from_output: one new token per step; the next step's slots; freed when done
        req.num_computed_tokens += num_new
        out.append((sum(ids) + 7919 * len(out)) % TOK.vocab_size)
        req.append_output_token_ids(out[-1])
        if len(out) >= max_tokens:
            kvm.free(req)
            publish()
            return n_hit, out
        publish()
        num_new = req.num_tokens - req.num_computed_tokens
        if kvm.allocate_slots(req, num_new) is None:
            kvm.free(req)
            publish()
            return None


@app.get("/v1/models")
def models() -> dict:
    return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm",
                                        "max_model_len": MAX_LEN}]}


@app.get("/metrics")
def metrics() -> PlainTextResponse:
    """vLLM's Prometheus names (vllm/v1/metrics/loggers.py), from this manager's own state and counts."""
    with LOCK:
        hits = sum(h["hits"] for h in STATE["hits"])
        lines = [f'vllm:cache_config_info{{block_size="{SIZE}",cache_dtype="auto"}} 1.0',
                 f'vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} {kvm.usage}',
                 f'vllm:num_requests_running{{model_name="{MODEL}"}} {STATE["running"]}',
                 f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0',
                 f'vllm:prefix_cache_queries_total{{model_name="{MODEL}"}} {STATE["queries"]}',
                 f'vllm:prefix_cache_hits_total{{model_name="{MODEL}"}} {hits}',
                 f'vllm:prompt_tokens_total{{model_name="{MODEL}"}} {STATE["prompt_tokens"]}',
                 f'vllm:generation_tokens_total{{model_name="{MODEL}"}} {STATE["generation_tokens"]}']
    return PlainTextResponse("\n".join(lines) + "\n")


def chat_ids(body: dict) -> list[int]:
    return TOK.encode(render_chat(TEMPLATE, body["messages"],
                                  add_generation_prompt=body.get("add_generation_prompt", True)))


@app.post("/tokenize")
def tokenize(body: dict) -> JSONResponse:
    if isinstance(body.get("messages"), list):
        ids = chat_ids(body)
    elif isinstance(body.get("prompt"), str):
        ids = TOK.encode(body["prompt"])
    else:
        return JSONResponse({"error": {"message": "prompt or messages", "code": 400}}, status_code=400)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": MAX_LEN})


@app.post("/detokenize")
def detokenize(body: dict) -> dict:
    return {"prompt": TOK.decode(list(body["tokens"]))}  # vLLM's DetokenizeResponse


@app.post("/v1/completions")
def completions(body: dict):  # noqa: ANN201 - a streamed or a JSON response
    prompt = body.get("prompt")
    return complete(body, list(prompt) if isinstance(prompt, list) else TOK.encode(str(prompt)), chat=False)


@app.post("/v1/chat/completions")
def chat_completions(body: dict):  # noqa: ANN201 - a streamed or a JSON response
    return complete(body, chat_ids(body), chat=True)


def complete(body: dict, ids: list[int], *, chat: bool):  # noqa: ANN201 - a streamed or a JSON response
    with LOCK:
        STATE["running"] = 1
        done = serve(ids, int(body.get("max_tokens") or 16))
        STATE["running"] = 0
    if done is None:
        return JSONResponse({"error": {"message": "the KV cache cannot hold this request", "code": 400}},
                            status_code=400)
    n_hit, out = done
    kind = "chat.completion.chunk" if chat else "text_completion"

    def stream():
        for k, t in enumerate(out):
            text = TOK.decode([t]) or " "
            choice = {"index": 0, "finish_reason": "length" if k == len(out) - 1 else None,
                      **({"delta": {"content": text}} if chat else {"text": text})}
            yield f"data: {json.dumps({'id': 'standin', 'object': kind, 'model': MODEL, 'choices': [choice]})}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(out), "total_tokens": len(ids) + len(out),
                     "prompt_tokens_details": {"cached_tokens": n_hit}}
            yield f"data: {json.dumps({'id': 'standin', 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


@app.get("/standin/hits")
def hits() -> dict:
    with LOCK:
        return {"hits": STATE["hits"], "seq": STATE["seq"]}


@app.post("/standin/wake")
def wake() -> dict:
    with LOCK:
        publisher.publish(KVEventBatch(ts=time.time(), events=[]))
        STATE["seq"] += 1
        return {"seq": STATE["seq"]}


if __name__ == "__main__":
    try:
        uvicorn.run(app, host="127.0.0.1", port=CFG["port"], log_level="warning")
    finally:
        publisher.shutdown()
