"""Against `transformers serve` (offline, CPU) on the `export-hf` directory: a second real OpenAI-compatible
server, one with no /tokenize and no /metrics. Greedy text equals kvviz's engine; serve-bench falls back to
text prompts and still takes N from usage."""
import json
import os
import shutil
import subprocess
import time

import httpx
import pytest
from transformers.utils.import_utils import is_serve_available

from kvviz.cli import main
from kvviz.engine.export import export_hf
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend
from kvviz.serving import client as api
from kvviz.serving.llamacpp import free_port, stop_process

pytestmark = pytest.mark.skipif(not is_serve_available() or shutil.which("transformers") is None,
                                reason="transformers[serving] (fastapi, uvicorn, openai) is not installed")


@pytest.fixture(scope="module")
def backend():
    return load_backend("tiny", device="cpu")


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "tiny-hf"
    export_hf(backend.model, backend.tokenizer, out)
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "wb")
    proc = subprocess.Popen(["transformers", "serve", str(out), "--device", "cpu", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, f"transformers serve exited; see {log.name}"
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "transformers serve did not start"
            time.sleep(0.5)
        yield url, str(out)
    finally:
        stop_process(proc)
        log.close()


def test_greedy_text_equals_kvviz(backend, server):
    url, model = server
    prompt = "The keys"
    r = api.stream_request(api.Server(url, timeout_s=120), model, prompt, 12)
    assert r.error is None and r.completion_tokens == 12 and r.prompt_tokens == len(backend.tokenizer.encode(prompt))
    gen = Generation(backend, max_new_tokens=12, stop_at_eos=False)
    gen.run(prompt)
    assert r.text == gen.text


def test_serve_bench_without_tokenize_or_metrics(server, capsys):
    url, model = server
    assert main(["serve-bench", "--url", url, "--prompt-len", "24", "--max-tokens", "6", "--concurrency", "1,2",
                 "--requests", "2", "--timeout", "120", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == model and out["exact_prompts"] is False and out["tokens_from_usage"] is True
    assert [(p["completed"], p["total_output_tokens"]) for p in out["points"]] == [(2, 12), (2, 12)]
    assert all(p["server"] is None and p["gauges"] == [] for p in out["points"])  # no /metrics: no window
    assert [n["key"] for n in out["notes"]] == ["serving.no_metrics"]  # it answers, but has no metrics
