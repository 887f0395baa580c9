"""Against a real llama.cpp server (built by scripts/build_llama_server.sh, started here on a loopback port with
the shipped model exported as GGUF): greedy parity with kvviz's engine, the streaming client's numbers,
serve-bench, /metrics of a real server, the prefix cache, and the bad inputs a real server can produce."""
import json

import pytest

from kvviz.cli import main
from kvviz.engine.export import export_gguf
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend
from kvviz.errors import InputError
from kvviz.serving import client as api
from kvviz.serving.llamacpp import LlamaServer, binary, complete_ids
from kvviz.serving.prefix import run_prefix_experiment
from kvviz.serving.prom import scrape
from kvviz.serving.report import detect_engine

pytestmark = pytest.mark.skipif(
    binary() is None, reason="llama-server is not built here: run scripts/build_llama_server.sh (.ci/run does)")

PROMPTS = ("def cache(self):\n    \"\"\"Return the", "The keys and values of earlier tokens", "Raise ValueError if")


@pytest.fixture(scope="module")
def backend():
    return load_backend("tiny", device="cpu")


@pytest.fixture(scope="module")
def gguf_file(backend, tmp_path_factory):
    return export_gguf(backend.model, backend.tokenizer, tmp_path_factory.mktemp("gguf") / "kvviz-tiny.gguf",
                       name="kvviz-tiny")


@pytest.fixture(scope="module")
def server(gguf_file, tmp_path_factory):
    with LlamaServer(gguf_file, log=tmp_path_factory.mktemp("log") / "llama-server.log") as srv:
        yield srv


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_kvviz_engine(backend, server, prompt):
    ids = backend.tokenizer.encode(prompt)
    gen = Generation(backend, max_new_tokens=24, stop_at_eos=False)
    gen.run(ids)
    theirs = complete_ids(server.base_url, ids, 24)["tokens"]
    assert theirs == gen.generated[0]


def test_models_and_engine(server):
    srv = api.Server(server.base_url)
    models = api.list_models(srv)
    assert api.check_model(models, "") == "kvviz-tiny"
    assert detect_engine(models, srv) == ("llama.cpp", None)


def test_wrong_model_name(server, capsys):
    with pytest.raises(InputError) as e:
        api.check_model(api.list_models(api.Server(server.base_url)), "gpt-4o")
    assert e.value.key == "serving.unknown_model" and "kvviz-tiny" in str(e.value)
    assert main(["serve-bench", "--url", server.base_url, "--model", "gpt-4o"]) == 2
    assert "does not serve a model named gpt-4o" in capsys.readouterr().err


def test_stream_reports_usage_and_times(backend, server):
    ids = backend.tokenizer.encode(PROMPTS[1])
    r = api.stream_request(api.Server(server.base_url), "kvviz-tiny", ids, 16)
    assert r.ok and r.error is None and r.finish_reason == "length"
    assert r.tokens_from_usage and r.completion_tokens == 16 and r.prompt_tokens == len(ids)
    assert 1 <= r.n_chunks <= 16 and len(r.chunk_times_s) == r.n_chunks
    assert 0 < r.ttft_s <= r.e2e_s
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 15)
    # The streamed text is the engine's greedy continuation.
    gen = Generation(backend, max_new_tokens=16, stop_at_eos=False)
    gen.run(ids)
    assert r.text == backend.tokenizer.decode(gen.generated[0])


def test_chat_endpoint_streams(server):
    r = api.stream_request(api.Server(server.base_url), "kvviz-tiny", "Return the value", 8, endpoint="chat")
    # The shipped model has no chat template of its own: llama-server applies its default one.
    assert r.error is None and r.completion_tokens == 8 and r.n_chunks >= 1


def test_serve_bench_cli(server, capsys):
    assert main(["serve-bench", "--url", server.base_url, "--prompt-len", "32", "--max-tokens", "8",
                 "--concurrency", "1,2", "--requests", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "llama.cpp" and out["exact_prompts"] is True and out["tokens_from_usage"] is True
    assert [r["concurrency"] for r in out["rows"]] == [1, 2]
    for row in out["rows"]:
        assert (row["ok"], row["failed"], row["output_tokens"]) == (4, 0, 32)
        assert row["prompt_tokens_mean"] == 32
        assert 0 < row["ttft_p50_s"] <= row["ttft_p90_s"] and row["tpot_p50_s"] > 0
        assert row["output_tokens_per_s"] == pytest.approx(32 / row["duration_s"])
    # kvviz's formula for the shipped shape: 2 · 2 KV heads · 32 · 4 layers · 2 B (bf16)
    assert out["shape_name"] == "kvviz-tiny" and out["kv_bytes_per_token"] == 2 * 2 * 24 * 4 * 2
    assert out["metrics"] and out["metrics"][0]["engine"] == "llama.cpp"


def test_metrics_of_the_real_server(backend, server):
    srv = api.Server(server.base_url)
    before = scrape(srv)
    assert before.engine == "llama.cpp"
    assert {"llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:prompt_tokens_total",
            "llamacpp:tokens_predicted_total"} <= set(before.recognized)
    ids = backend.tokenizer.encode(PROMPTS[2])
    api.stream_request(srv, "kvviz-tiny", ids, 5)
    after = scrape(srv)
    assert after.generation_tokens - before.generation_tokens == 5
    assert after.running == 0 and after.waiting == 0


def test_prefix_cache_matches_prediction(server):
    result = run_prefix_experiment(api.Server(server.base_url), "kvviz-tiny", prefix_tokens=96, repeats=2,
                                   engine="llama.cpp")
    for row in result.rows():
        assert row["error"] is None
        if row["request"] == "warm":
            assert row["shared_tokens"] > 90
            assert row["cached_tokens"] == row["predicted_cached_tokens"] == min(row["shared_tokens"],
                                                                                 row["prompt_tokens"] - 1)
        else:
            # Only what an earlier trial's prompt happens to share ("Session 1234…"): at most that, and
            # llama.cpp may place the request on another of its 4 slots and reuse none of it.
            assert 0 <= row["cached_tokens"] <= row["predicted_cached_tokens"] <= 12


def test_server_without_metrics(gguf_file):
    with LlamaServer(gguf_file, metrics=False, n_parallel=1, ctx_size=512) as srv:
        with pytest.raises(InputError) as e:
            scrape(api.Server(srv.base_url))
        assert e.value.key == "serving.no_metrics"
        # The sweep still measures, and says why its cache charts are empty.
        job_out = main(["serve-bench", "--url", srv.base_url, "--prompt-len", "16", "--max-tokens", "4",
                        "--concurrency", "1", "--requests", "2"])
        assert job_out == 0


def test_cancel_keeps_measured_requests(server):
    import time

    from kvviz.serving.bench import SweepJob

    job = SweepJob(api.Server(server.base_url), "kvviz-tiny", [1, 2], requests=40, prompt_tokens=32,
                   max_tokens=64).start()
    deadline = time.monotonic() + 120
    while job.done < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    job.cancel()
    job.wait(60)
    assert job.finished and job.cancelled
    measured = [r for rs in job.results.values() for r in rs if r.ok]
    assert len(measured) >= 2 and job.done < job.total
    assert job.rows()[0]["ok"] >= 2  # what was measured before Cancel stays summarized
