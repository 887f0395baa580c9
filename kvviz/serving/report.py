"""What the CLI and the page's worker run against a server, and what they know about it: its engine, its
model's KV shape where kvviz knows it, the load run and the prefix experiment, each as one dict."""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.serving import client as api
from kvviz.serving.bench import BenchPlan, BenchRun, Limits, check_plan
from kvviz.serving.prefix import PrefixResult, run_prefix_experiment
from kvviz.serving.prom import MetricsSnapshot, scrape

OWNERS = {"vllm": "vllm", "llamacpp": "llama.cpp", "sglang": "sglang"}


def detect_engine(models: list[dict], server: api.Server,
                  snap: MetricsSnapshot | None = None) -> tuple[str | None, int | None]:
    """(engine, vLLM block size) from /metrics names, else from /v1/models' owned_by; (None, None) if neither."""
    if snap is None:
        try:
            snap = scrape(server)
        except InputError:
            pass
    if snap is not None:
        return snap.engine, snap.block_size
    owners = {str(m.get("owned_by", "")).lower() for m in models}
    return next((e for k, e in OWNERS.items() if k in owners), None), None


def known_shape(model_id: str) -> tuple[str, KVSpec] | None:
    """The KV shape kvviz knows for a served model id: a preset's Hugging Face repo, or kvviz's own model."""
    from kvviz.kv.presets import HF_REPOS, PRESETS

    wanted = model_id.strip().lower().rstrip("/")
    # An instruction-tuned variant keeps its base model's shape (Llama-3.1-8B-Instruct is Llama-3.1-8B's).
    bases = {wanted, *(wanted.removesuffix(s) for s in ("-instruct", "-chat", "-it", "-hf"))}
    for name, repo in HF_REPOS.items():
        r = repo.lower()
        if any(b == r or b.endswith("/" + r) or b == name.lower() or b == r.removesuffix("-hf") for b in bases):
            return name, PRESETS[name]
    if Path(model_id, "config.json").is_file():  # a server on this machine, serving a local directory
        from kvviz.kv.reader import load_hf_config

        try:
            spec = load_hf_config(model_id)
            return spec.name, spec
        except (InputError, ValueError, OSError):
            return None
    base = wanted.rsplit("/", 1)[-1].removesuffix(".gguf")
    from kvviz.engine.fetch import MODELS, is_fetched

    for m in MODELS.values():  # a model kvviz fetched (e.g. SmolLM2), served by its name or its repository's
        names = {m.name, m.title.lower(), m.homepage.lower().removeprefix("https://huggingface.co/")}
        if (wanted in names or base in names) and is_fetched(m.name):
            from kvviz.engine.shape import fetched_spec

            return m.title, fetched_spec(m.name)
    if base in ("kvviz-tiny", "tiny"):
        from kvviz.engine.shape import shipped_spec

        spec = shipped_spec()
        return spec.name, spec
    return None


def kv_per_token(model_id: str, kv_dtype: str | None) -> dict:
    """KV bytes per token by kvviz's formula, where both the shape and the KV dtype are known."""
    found = known_shape(model_id)
    if found is None or kv_dtype is None:
        return {"shape_name": None if found is None else found[0], "kv_bytes_per_token": None, "kv_dtype": kv_dtype}
    name, shape = found
    per_token = kv_footprint(shape, 1, 1, kv_dtype).per_token
    return {"shape_name": name, "kv_bytes_per_token": per_token, "kv_dtype": kv_dtype}


def server_kv_dtype(snap: MetricsSnapshot | None) -> str | None:
    """The KV cache's dtype as the server reports it, in kvviz's names; None where it does not say.

    vLLM labels vllm:cache_config_info with cache_dtype (its --kv-cache-dtype: "auto" follows the model's own
    dtype, which /metrics does not give, so it stays unknown). llama.cpp's /props and /slots carry no KV type in
    the build kvviz tests against (tools/server/server-context.cpp get_res_props): unknown; its default is f16
    (common/common.h cache_type_k) unless the server was started with -ctk/-ctv, which a client cannot see.
    """
    name = (snap.cache_dtype or "").lower() if snap is not None else ""
    if name.startswith("fp8"):
        return "fp8"
    return {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32",
            "float": "float32"}.get(name)


def describe_server(server: api.Server, model: str = "") -> dict:
    """What a run needs to know first: the served model, the engine, vLLM's block size, the KV dtype reported."""
    models = api.list_models(server)
    model = api.check_model(models, model)
    try:
        snap = scrape(server)
    except InputError:
        snap = None
    engine, block = detect_engine(models, server, snap)
    return {"model": model, "models": [m["id"] for m in models], "engine": engine, "block_size": block,
            "kv_dtype": server_kv_dtype(snap)}


def run_bench(plan: BenchPlan, api_key: str | None = None, *, limits: Limits | None = None,
              on_update: Callable[[dict], None] | None = None, cancel: threading.Event | None = None) -> dict:
    """The load run of `serve-bench` (and of the page's worker process): checks the plan, finds the server and
    model, runs every point, and returns the run's picture (kvviz.serving.bench.BenchRun.snapshot) with the KV
    shape kvviz knows for the model."""
    check_plan(plan, limits or Limits())
    server = api.Server(plan.url, api_key, plan.timeout_s)
    info = describe_server(server, plan.model)
    run = BenchRun(plan, server, model=info["model"], engine=info["engine"], on_update=on_update, cancel=cancel)
    run.run()
    out = run.snapshot()
    ok = [p for p in out["points"] if p["completed"]]
    return {**out, "block_size": info["block_size"], "server_kv_dtype": info["kv_dtype"],
            "tokens_from_usage": all(p["tokens_from_usage"] for p in ok) if ok else None,
            "tokens_from": sorted({s for p in ok for s in p.get("tokens_from", [])}),
            **kv_per_token(info["model"], info["kv_dtype"])}


def run_prefix(url: str, api_key: str | None = None, *, model: str = "", timeout_s: float = 60.0,
               prefix_tokens: int, repeats: int = 5, block_size: int | None = None,
               on_trial: Callable[[PrefixResult], None] | None = None,
               cancel: Callable[[], bool] | None = None) -> dict:
    """The prefix experiment of `serve-bench --prefix-tokens` (and of the page's worker process)."""
    server = api.Server(url, api_key, timeout_s)
    info = describe_server(server, model)
    result = run_prefix_experiment(server, info["model"], prefix_tokens=prefix_tokens, repeats=repeats,
                                   engine=info["engine"], block_size=block_size or info["block_size"],
                                   on_trial=on_trial, cancel=cancel)
    return result.to_dict()
