"""Against a real llama.cpp server (built by scripts/build_llama_server.sh, started here on a loopback port with
the shipped model exported as GGUF): greedy parity with kvviz's engine, the streaming client's numbers,
serve-bench closed and open loop, the server's counters over a run's window, the prefix cache with its spread,
the page's numbers beside serve-bench's, and the failures a real server can produce."""
import json
import re
import threading
import time

import pytest

from kvviz.cli import main
from kvviz.engine.export import export_gguf
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend
from kvviz.errors import InputError
from kvviz.serving import client as api
from kvviz.serving.bench import BenchPlan, BenchRun, calculate_metrics, closed_loop
from kvviz.serving.llamacpp import LlamaServer, complete_ids
from kvviz.serving.prefix import ORDERS, VERDICTS, run_prefix_experiment
from kvviz.serving.prom import scrape
from kvviz.serving.report import detect_engine
from kvviz.serving.workload import Workload

pytestmark = pytest.mark.llama_server  # waits for a build in progress, else skips (tests/conftest.py)

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
    assert 1 <= r.n_chunks <= 17 and len(r.chunk_times_s) == r.n_chunks  # 16 tokens, and the final message
    assert 0 < r.ttft_s <= r.e2e_s
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 15)
    # llama.cpp's own clock for the request: its prefill and decode, without the queue or HTTP
    t = r.server_timings
    assert t["predicted_n"] == 16 and t["prompt_n"] + t["cache_n"] == len(ids)
    assert 0 < r.server_prefill_s <= r.ttft_s
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
                 "--concurrency", "1,2", "--requests", "4", "--num-warmups", "2", "--metric-percentiles", "90,99",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "llama.cpp" and out["exact_prompts"] is True and out["tokens_from_usage"] is True
    assert [p["max_concurrency"] for p in out["points"]] == [1, 2]
    for p in out["points"]:
        assert (p["completed"], p["failed"], p["total_output_tokens"], p["total_input_tokens"]) == (4, 0, 32, 128)
        assert 0 < p["median_ttft_ms"] <= p["p90_ttft_ms"] <= p["p99_ttft_ms"] and p["median_tpot_ms"] > 0
        assert p["output_throughput"] == pytest.approx(32 / p["duration"])
        assert p["request_throughput"] == pytest.approx(4 / p["duration"])
        assert p["max_concurrent_requests"] <= p["max_concurrency"]
        # The server's counters over this point only: the two warm-ups and earlier tests are not in it.
        w = p["server"]
        assert (w["prompt_tokens"], w["generation_tokens"]) == (4 * 32, 4 * 8)
        # The warm-ups sent the first request twice, as vLLM's do: its prompt (less the token llama.cpp always
        # computes again) is cached when it is measured. No two prompts of a point share a first token, but one
        # drawn afresh may begin as the prompt a slot held from the point before did (a chance of about one in the
        # lead tokens' pool; CI met it once): at most one such token for each of the other three, never a prompt.
        assert 0 < w["cached_tokens"] <= 31 + 3 and w["prefix_cache_hit_rate"] > 0
        # Its own clock beside the client's: prefill alone is part of TTFT (which adds queue and HTTP).
        x = p["server_timings"]
        assert x["n_with_server_timings"] == 4 and 0 < x["server_mean_prefill_ms"] <= x["client_mean_ttft_ms"]
        assert x["server_mean_tpot_ms"] > 0 and x["tpot_agree"] is True  # the client's TPOT is the server's own
    # kvviz's formula for the shipped shape: llama-server does not report its KV dtype, so the bytes stay unknown
    assert out["shape_name"] == "kvviz-tiny" and out["server_kv_dtype"] is None and out["kv_bytes_per_token"] is None
    assert out["points"][0]["gauges"] and "running" in out["points"][0]["gauges"][0]["gauges"]


def test_open_loop_at_three_rates(server, tmp_path, capsys):
    """--request-rate as vllm bench serve: Poisson arrivals, percentiles, goodput, one vLLM-format file per rate."""
    assert main(["serve-bench", "--url", server.base_url, "--prompt-len", "24", "--max-tokens", "6",
                 "--request-rate", "4,8,16", "--requests", "6", "--goodput", "ttft:60000", "tpot:60000",
                 "--random-range-ratio", "0.5", "--result-dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["request_rate"] for p in out["points"]] == [4.0, 8.0, 16.0]
    for p in out["points"]:
        assert p["completed"] == 6 and p["max_concurrency"] is None and p["burstiness"] == 1.0
        assert p["request_goodput"] == pytest.approx(p["request_throughput"])  # SLOs of a minute: all good
        arrivals = [r["arrival_s"] for r in p["requests"]]
        assert max(arrivals) == pytest.approx(6 / p["request_rate"])  # vLLM rescales the last arrival to n / rate
        lens = [r["n_tokens"] for r in p["requests"]]
        assert min(lens) >= 3 and max(lens) <= 9 and p["total_output_tokens"] == sum(lens)  # drawn in [3, 9]
        assert p["server"]["generation_tokens"] == sum(lens)
    files = sorted(tmp_path.glob("*.json"))
    assert [f.name.split("qps")[0] for f in files] == ["openai-16.0", "openai-4.0", "openai-8.0"]
    saved = json.loads(files[1].read_text())
    assert saved["request_rate"] == 4.0 and saved["completed"] == 6 and len(saved["ttfts"]) == 6
    assert saved["p99_ttft_ms"] == out["points"][0]["p99_ttft_ms"]


def test_sharegpt_dataset(server, tmp_path, capsys):
    """Prompts from a ShareGPT file as vLLM reads one: the first turn the prompt, the reply's token count the output
    length, pairs outside vLLM's bounds skipped, oversampled (with the seed) to the requests asked for."""
    convs = [("What does a KV cache store for each token?", "Its keys and values, one pair per layer and head."),
             ("Why is decode memory-bound?", "Each step reads every weight and the whole cache to make one token."),
             ("Hi", "A prompt of one token is skipped by vLLM's rule.")]
    data = [{"id": str(i), "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
            for i, (q, a) in enumerate(convs)]
    (tmp_path / "share.json").write_text(json.dumps(data))
    assert main(["serve-bench", "--url", server.base_url, "--dataset-path", str(tmp_path / "share.json"),
                 "--concurrency", "2", "--requests", "4", "--num-warmups", "0", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["points"][0]
    srv = api.Server(server.base_url)
    counts = {len(api.tokenize(srv, "kvviz-tiny", q, add_special=True)): len(api.tokenize(srv, "kvviz-tiny", a,
                                                                                         add_special=True))
              for q, a in convs[:2]}
    assert p["completed"] == 4
    for r in p["requests"]:
        assert counts[r["prompt_tokens"]] == r["n_tokens"] == r["expected_output_len"]  # its reply's length


def test_metrics_of_the_real_server(backend, server):
    srv = api.Server(server.base_url)
    before = scrape(srv)
    assert before.engine == "llama.cpp"
    assert {"llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:prompt_tokens_total",
            "llamacpp:tokens_predicted_total", "llamacpp:prompt_seconds_total"} <= set(before.recognized)
    ids = backend.tokenizer.encode(PROMPTS[2])
    api.stream_request(srv, "kvviz-tiny", ids, 5)
    after = scrape(srv)
    assert after.counters["generation_tokens"] - before.counters["generation_tokens"] == 5
    assert after.running == 0 and after.waiting == 0


def test_prefix_cache_matches_prediction(server):
    result = run_prefix_experiment(api.Server(server.base_url), "kvviz-tiny", prefix_tokens=96, repeats=3,
                                   engine="llama.cpp")
    assert [t.order for t in result.trials] == list(ORDERS)  # each kind in each place it can take
    for row in result.rows():
        assert row["error"] is None and row["server_prefill_s"] is not None  # llama.cpp's own prompt time
        if row["request"] == "warm":
            assert row["shared_tokens"] > 90
            assert row["cached_tokens"] == row["predicted_cached_tokens"] == min(row["shared_tokens"],
                                                                                 row["prompt_tokens"] - 1)
        else:
            # Only what an earlier trial's prompt happens to share ("Session 1234…"): at most that, and
            # llama.cpp may place the request on another of its 4 slots and reuse none of it.
            assert 0 <= row["cached_tokens"] <= row["predicted_cached_tokens"] <= 12
    s = result.summary()
    for key in ("saving", "server_saving"):
        v = s[key]
        assert v["n"] == 3 and v["low_s"] <= v["median_s"] <= v["high_s"] and v["verdict"] in VERDICTS


@pytest.fixture(scope="module")
def bos_server(backend, tmp_path_factory):
    """The shipped model marked to get a BOS token prepended, as Llama models do; one slot, no --metrics."""
    gguf = export_gguf(backend.model, backend.tokenizer, tmp_path_factory.mktemp("bos") / "kvviz-bos.gguf",
                       name="kvviz-tiny", add_bos=True)
    with LlamaServer(gguf, metrics=False, n_parallel=1, ctx_size=512) as srv:
        yield srv


def test_prefix_prediction_counts_the_bos(bos_server):
    """The server's cache holds the BOS it prepends: counted in the shared prefix, the prediction is exact."""
    srv = api.Server(bos_server.base_url)
    text = "The keys and values"
    assert len(api.tokenize(srv, "kvviz-tiny", text, add_special=True)) == len(api.tokenize(srv, "kvviz-tiny",
                                                                                             text)) + 1
    result = run_prefix_experiment(srv, "kvviz-tiny", prefix_tokens=48, repeats=2, engine="llama.cpp")
    warm = [r for r in result.rows() if r["request"] == "warm"]
    for row in warm:
        assert row["cached_tokens"] == row["predicted_cached_tokens"] == min(row["shared_tokens"],
                                                                             row["prompt_tokens"] - 1)


def test_server_without_metrics(bos_server, capsys):
    with pytest.raises(InputError) as e:
        scrape(api.Server(bos_server.base_url))
    assert e.value.key == "serving.no_metrics_flag"  # HTTP 501: started without --metrics, and said so
    assert main(["serve-bench", "--url", bos_server.base_url, "--prompt-len", "16", "--max-tokens", "4",
                 "--concurrency", "1", "--requests", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"][0]["completed"] == 2 and out["points"][0]["server"] is None
    assert [n["key"] for n in out["notes"]] == ["serving.no_metrics_flag"]


def test_every_request_failing_stops_and_exits_nonzero(bos_server, capsys):
    """A prompt over the context: llama-server answers HTTP 400 with its reason; the run stops at that point and
    serve-bench exits 1 with the server's message."""
    assert main(["serve-bench", "--url", bos_server.base_url, "--prompt-len", "600", "--max-tokens", "4",
                 "--concurrency", "1,2", "--requests", "2", "--num-warmups", "0", "--json"]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert len(out["points"]) == 1 and out["points"][0]["completed"] == 0  # the second point was never sent
    assert out["error"]["key"] == "serving.http_error" and out["error"]["params"]["status"] == 400
    assert "no request succeeded" in captured.err and "context" in captured.err.lower()


def _run_until(url: str, plan: BenchPlan, n_done: int, then, timeout_s: float = 10.0) -> BenchRun:  # noqa: ANN001
    """Run the plan in a thread; once n_done requests are measured, call then() and let the run finish."""
    run = BenchRun(plan, api.Server(url, timeout_s=timeout_s), model="kvviz-tiny")
    thread = threading.Thread(target=run.run)
    thread.start()
    deadline = time.monotonic() + 120
    while run.done < n_done and time.monotonic() < deadline:
        time.sleep(0.02)
    then(run)
    thread.join(60)
    return run


def test_cancel_keeps_measured_requests(server):
    plan = BenchPlan(server.base_url, "kvviz-tiny", closed_loop((1, 2)), 40, Workload(16, 24), num_warmups=0)
    run = _run_until(server.base_url, plan, 2, lambda r: r.cancel(), timeout_s=60)
    assert run.status == "cancelled" and len(run.points) == 1
    p = run.points[0]
    assert 2 <= p["completed"] == p["sent"] < 40 and p["cancelled"]  # what was measured before Cancel is kept
    assert p["failed"] == 0  # a request cut by Cancel is neither completed nor failed


def test_a_server_killed_mid_run_stops_the_run(backend, gguf_file):
    with LlamaServer(gguf_file, n_parallel=1, ctx_size=512) as srv:
        plan = BenchPlan(srv.base_url, "kvviz-tiny", closed_loop((1, 1)), 30, Workload(8, 16), num_warmups=0)
        # killed, not asked to stop (stop(): SIGTERM, SIGKILL 10 s later): on a loaded machine the client's own 10 s
        # timeout once ended the run first, and the run said "timeout", not the dead connection
        run = _run_until(srv.base_url, plan, 3, lambda r: (srv.proc.kill(), srv.proc.wait()))
    assert len(run.points) == 1  # the next point was never sent to a dead server
    p = run.points[0]
    assert p["completed"] >= 3 and p["sent"] < 30  # and neither was the rest of this one
    assert run.error is not None and run.error.key in ("serving.unreachable", "serving.stream_cut")


def _bench_requests(url: str, capsys, *flags: str) -> list[dict]:  # noqa: ANN001
    assert main(["serve-bench", "--url", url, *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["points"][0]["requests"]


def test_page_numbers_agree_with_serve_bench(server, capsys):
    """The page measures in a worker process: for one workload on one server, its TTFT and TPOT agree with
    serve-bench's within their measured spread, the larger of each run's range and how far two serve-bench runs,
    one before the page and one after, moved (kvviz.engine.metrics.within_spread)."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from kvviz.engine.metrics import spread, within_spread

    flags = ("--prompt-len", "32", "--max-tokens", "12", "--concurrency", "2", "--requests", "6")
    before = _bench_requests(server.base_url, capsys, *flags)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=60)
    at.run()
    at = at.switch_page("pages/7_Serving_Engine.py")
    at.run()
    at.text_input(key="serving_url").set_value(server.base_url).run()
    at.button[0].click().run()  # Connect
    for key, value in (("serving_requests", 6), ("serving_prompt", 32), ("serving_max_tokens", 12)):
        at.number_input(key=key).set_value(value).run()
    at.text_input(key="serving_conc").set_value("2").run()
    at.button(key="serving_start").click().run()
    deadline = time.monotonic() + 180
    while at.session_state["serving_worker"] is not None and time.monotonic() < deadline:
        time.sleep(1.0)
        at.run()
    assert not at.exception
    page = at.session_state["serving_state"].result["points"][0]["requests"]  # a WorkerState
    after = _bench_requests(server.base_url, capsys, *flags)
    assert len(page) == len(before) == len(after) == 6
    for key in ("ttft_s", "tpot_s"):
        runs = [[r[key] for r in rs] for rs in (before, after)]
        moved = abs(spread(runs[0]).median - spread(runs[1]).median)
        assert within_spread([r[key] for r in page], runs[0] + runs[1], moved), key
    # The same results in Korean: every table's headers translated (no snake_case key, no missing string).
    at.radio(key="_w_kv_lang").set_value("ko").run()
    assert not at.exception
    headers = [c for df in at.dataframe for c in df.value.columns]
    assert any(re.search("[가-힣]", h) for h in headers), headers
    assert not [h for h in headers if re.fullmatch(r"[a-z0-9_]+", h) or h.startswith("serving.")], headers


def test_without_usage_counts_as_vllm(server):
    """Without usage, input tokens are the prompts' own counts and output tokens the generated text tokenized
    (vLLM's calculate_metrics), here by the server's /tokenize. llama-server always sends usage, so its
    counts are dropped from the real streams and the server's own say what the others must equal."""
    srv = api.Server(server.base_url)
    plan = BenchPlan(server.base_url, "kvviz-tiny", closed_loop((1,)), 3, Workload(32, 8))
    run = BenchRun(plan, srv, model="kvviz-tiny")
    with srv.client() as http:
        reqs = run._requests(http, 0, 3)
        results = [run._send(http, r) for r in reqs]
        assert all(r.ok and r.tokens_from == "usage" for r in results)
        usage = calculate_metrics(results, 1.0)
        for r in results:
            r.completion_tokens = r.prompt_tokens = None  # what a server without usage leaves
        assert calculate_metrics(results, 1.0)["total_output_tokens"] == sum(r.n_chunks for r in results)
        run._count_text_tokens(http, results)
    counted = calculate_metrics(results, 1.0)
    assert [r.tokens_from for r in results] == ["tokenizer"] * 3
    assert counted["total_input_tokens"] == usage["total_input_tokens"] == 3 * 32  # 0 before: no usage, no count
    assert counted["total_output_tokens"] == sum(len(api.tokenize(srv, "kvviz-tiny", r.text)) for r in results)
    assert usage["total_output_tokens"] == 3 * 8


def test_no_warmup_by_default_caches_nothing(gguf_file, capsys):
    """--num-warmups defaults to 0, as vLLM's: no request is sent twice, so nothing is served from the cache.
    On a server of its own: llama-server keeps earlier prompts in its prompt cache, and a prompt another test sent
    may begin with the same two lead tokens (CI met one, 32 tokens cached)."""
    with LlamaServer(gguf_file) as server:
        assert main(["serve-bench", "--url", server.base_url, "--prompt-len", "32", "--max-tokens", "4",
                     "--concurrency", "1", "--requests", "3", "--json"]) == 0
    point = json.loads(capsys.readouterr().out)["points"][0]
    assert point["server"]["cached_tokens"] == 0 and "p99_ttft_ms" in point and "p90_ttft_ms" not in point
