"""What the CLI and the page show about a server: its engine, its model's KV shape where kvviz knows it,
the concurrency sweep and the prefix experiment, as one dict."""
from __future__ import annotations

from pathlib import Path

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.serving import client as api
from kvviz.serving.bench import Limits, SweepJob, check_plan
from kvviz.serving.prefix import run_prefix_experiment
from kvviz.serving.prom import scrape

OWNERS = {"vllm": "vllm", "llamacpp": "llama.cpp", "sglang": "sglang"}


def detect_engine(models: list[dict], server: api.Server) -> tuple[str | None, int | None]:
    """(engine, vLLM block size) from /metrics names, else from /v1/models' owned_by; (None, None) if neither."""
    try:
        snap = scrape(server)
        return snap.engine, snap.block_size
    except InputError:
        pass
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
    if base in ("kvviz-tiny", "tiny"):
        from kvviz.engine.shape import shipped_spec

        spec = shipped_spec()
        return spec.name, spec
    return None


def kv_per_token(model_id: str, kv_dtype: str) -> dict:
    found = known_shape(model_id)
    if found is None:
        return {"shape_name": None, "kv_bytes_per_token": None, "kv_dtype": kv_dtype}
    name, shape = found
    per_token = kv_footprint(shape, 1, 1, kv_dtype).per_token
    return {"shape_name": name, "kv_bytes_per_token": per_token, "kv_dtype": kv_dtype}


def serve_bench(url: str, *, model: str = "", api_key: str | None = None, prompt_tokens: int = 128,
                max_tokens: int = 64, concurrency: list[int] | None = None, requests: int | None = None,
                endpoint: str = "completions", timeout_s: float = 60.0, prefix_tokens: int | None = None,
                prefix_repeats: int = 3, block_size: int | None = None, kv_dtype: str = "bfloat16",
                limits: Limits | None = None) -> dict:
    limits = limits or Limits()
    concurrency = concurrency or [1, 2, 4]
    requests = requests or max(4, 2 * max(concurrency))
    check_plan(concurrency, requests, max_tokens, prompt_tokens, limits)
    server = api.Server(url, api_key, timeout_s)
    models = api.list_models(server)
    model = api.check_model(models, model)
    engine, metrics_block = detect_engine(models, server)
    job = SweepJob(server, model, concurrency, requests, prompt_tokens, max_tokens, endpoint=endpoint).start().wait()
    if job.error is not None and not job.rows():
        raise job.error
    rows = job.rows()
    notes = [str(e) for e in job.errors()]
    if job.metrics_error is not None:
        notes.append(str(job.metrics_error))
    if job.usage_fallback:
        notes.append(str(InputError("serving.usage_fallback")))
    if job.eos_may_stop:
        notes.append(str(InputError("serving.eos_may_stop")))
    out = {"url": server.base_url, "model": model, "engine": engine, "endpoint": endpoint,
           "prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "exact_prompts": job.exact_prompts,
           "rows": rows, "tokens_from_usage": all(r["tokens_from_usage"] for r in rows if r["ok"]),
           "metrics": [m.to_dict() for m in job.metrics], "notes": notes, **kv_per_token(model, kv_dtype)}
    if prefix_tokens:
        result = run_prefix_experiment(server, model, prefix_tokens=prefix_tokens, repeats=prefix_repeats,
                                       engine=engine, block_size=block_size or metrics_block)
        out["prefix"] = {"prefix_tokens": prefix_tokens, "engine": engine, "block_size": result.block_size,
                         "rows": result.rows(), "summary": result.summary()}
    return out
