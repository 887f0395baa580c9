"""serve-bench counts as `vllm bench serve` counts (vllm/benchmarks/serve.py @009e6d4a calculate_metrics,
benchmark(), main_async; lib/endpoint_request_func.py @02cfb534 async_request_openai_completions): input tokens
from usage else the request's own prompt_len, output tokens from usage else the generated text tokenized, a stream
that ends after a token message a success, warm-ups the first request again (default 0), percentiles 99, and a
result file vLLM's own readers load key for key."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from kvviz.cli import main
from kvviz.serving import client as api
from kvviz.serving.bench import PERCENTILES, BenchPlan, Point, calculate_metrics, vllm_result
from kvviz.serving.client import RequestResult


def _result(times, *, completion_tokens=None, prompt_tokens=None, expected_prompt_len=None, text_tokens=None):
    r = RequestResult(start_s=0.0, completion_tokens=completion_tokens, prompt_tokens=prompt_tokens,
                      expected_prompt_len=expected_prompt_len, text_tokens=text_tokens)
    r.chunk_times_s, r.n_chunks, r.finish_reason = list(times), len(times), "length"
    return r


def test_without_usage_input_is_the_requests_own_and_output_the_text_tokenized():
    """calculate_metrics: total_input += outputs[i].prompt_len (usage's prompt_tokens, else the dataset's);
    output_len = usage's completion_tokens, else len(tokenizer(generated_text, add_special_tokens=False))."""
    no_usage = [_result([0.1, 0.2, 0.3], expected_prompt_len=32, text_tokens=7),  # 3 messages, 7 tokens of text
                _result([0.1, 0.5], expected_prompt_len=40, text_tokens=2)]
    m = calculate_metrics(no_usage, 1.0)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (72, 9)
    assert no_usage[0].tpot_s == pytest.approx(0.2 / 6) and no_usage[0].tokens_from == "tokenizer"
    with_usage = _result([0.1, 0.2], completion_tokens=5, prompt_tokens=33, expected_prompt_len=32, text_tokens=9)
    assert (with_usage.input_len, with_usage.n_tokens, with_usage.tokens_from) == (33, 5, "usage")
    zero = _result([0.1, 0.2], completion_tokens=0, text_tokens=4)  # vLLM: `if not output_len` → the tokenizer
    assert zero.n_tokens == 4
    counted = _result([0.1, 0.2, 0.3])  # no usage, no /tokenize: kvviz counts messages (vLLM without one: 1)
    assert (counted.n_tokens, counted.tokens_from) == (3, "messages")


def test_defaults_are_vllms():
    """--metric-percentiles "99" and --num-warmups 0 (serve.py add_cli_args)."""
    assert PERCENTILES == (99.0,) and BenchPlan("http://h").num_warmups == 0
    assert BenchPlan.from_dict({"url": "http://h", "points": [{"request_rate": "inf"}], "num_prompts": 1}) \
        .num_warmups == 0


def test_help_says_where_kvviz_differs(capsys):
    with pytest.raises(SystemExit):
        main(["serve-bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "first request sent this many times" in text and "default 0" in text
    assert "default 99" in text and "E2E too" in text


def _vllm_readers(result: dict) -> dict:
    """What vLLM's own code reads from a result file: main_async's timeline rows (per_request_data),
    save_to_pytorch_benchmark_format's metrics and ignored keys, and the --save-detailed lists."""
    rows = []
    for i in range(len(result["start_times"])):
        latency = result["ttfts"][i] + sum(result["itls"][i]) if result["itls"][i] else result["ttfts"][i]
        rows.append({"start_time": result["start_times"][i], "ttft": result["ttfts"][i], "latency": latency,
                     "prompt_len": result["input_lens"][i], "output_tokens": result["output_lens"][i]})
    metrics = {k: [result[k]] for k in ("median_ttft_ms", "mean_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
                                        "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
                                        "median_itl_ms", "mean_itl_ms", "std_itl_ms", "p99_itl_ms")}
    ignored = ("ttfts", "itls", "generated_texts", "errors")
    extra = {k: result[k] for k in result if k not in metrics and k not in ignored}
    return {"rows": rows, "metrics": metrics, "extra": extra}


# benchmark()'s result keys for a generation run, in its order, and main_async's setup keys
VLLM_KEYS = ("date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
             "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
             "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
             "queue_times", "generated_texts", "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
             "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
             "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms")


def test_result_file_loads_in_vllms_readers_key_for_key():
    ok = _result([0.1, 0.3, 0.6], completion_tokens=3, prompt_tokens=12)
    ok.text = "abc"
    failed = RequestResult(start_s=0.2, expected_prompt_len=12, error=api.InputError("serving.http_error",
                                                                                     status=500, detail="x"))
    results = [ok, failed]
    start = 1234.5  # the point's perf_counter() at its clock zero
    point = {**Point(2.0, None).to_dict(), "burstiness": 1.0, "num_prompts": 2, "sent": 2,
             **calculate_metrics(results, 1.0), "server": None, "server_timings": {}, "tokens_from_usage": True,
             "tokens_from": ["usage"], "start_perf_counter_s": start, "cancelled": False, "gauges": [],
             "requests": [{**r.to_dict(), "queue_s": 0.0} for r in results]}
    run = {"plan": BenchPlan("http://h").to_dict(), "model": "org/m", "url": "http://h", "engine": None}
    out = json.loads(json.dumps(vllm_result(run, point, "D")))
    assert [k for k in VLLM_KEYS if k not in out] == []
    assert out["generated_texts"] == ["abc", ""] and out["rtfx"] == 0.0 and out["errors"][0] == ""
    assert out["start_times"] == [pytest.approx(start), pytest.approx(start + 0.2)]  # perf_counter(), as vLLM's
    assert out["input_lens"] == [12, 12] and out["output_lens"] == [3, 0]
    assert out["ttfts"] == [pytest.approx(0.1), 0.0] and out["latencies"] == [pytest.approx(0.6), 0.0]
    read = _vllm_readers(out)
    assert read["rows"][0]["latency"] == pytest.approx(0.6) and read["rows"][1]["latency"] == 0.0
    assert read["metrics"]["p99_ttft_ms"] == [pytest.approx(100.0)]
    assert np.isfinite([r["start_time"] for r in read["rows"]]).all()


class _Cut(BaseHTTPRequestHandler):
    """A server that streams one token message, then ends the response: cleanly (chunked terminator, no
    [DONE]) or by closing the connection mid-body."""

    protocol_version = "HTTP/1.1"
    clean = True

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        body = b'data: {"choices": [{"index": 0, "text": "Hi"}]}\n\n'
        self.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
        self.wfile.flush()
        if self.clean:
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def log_message(self, *args):  # noqa: ANN002
        pass


@pytest.mark.parametrize("clean", [True, False])
def test_a_stream_cut_after_its_first_chunk(clean):
    """vLLM: success = first_chunk_received when the body ends; an exception (a broken connection) fails it."""
    handler = type("H", (_Cut,), {"clean": clean})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = api.stream_request(api.Server(f"http://127.0.0.1:{server.server_port}"), "m", "x", 8, prompt_len=1)
    finally:
        server.shutdown()
    assert r.n_chunks == 1 and r.text == "Hi"
    if clean:
        assert r.ok and r.stream_cut and r.error is None and r.input_len == 1
        assert calculate_metrics([r], 1.0)["completed"] == 1
    else:
        assert not r.ok and r.error.key == "serving.stream_cut"
        assert calculate_metrics([r], 1.0)["failed"] == 1
