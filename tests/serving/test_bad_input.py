"""Each bad input the Serving Engine page and `serve-bench` must survive, with its message: a closed port, a
web server that is not OpenAI-compatible, a stream that stops halfway (a real socket server that closes
mid-stream: llama-server cannot be made to do it), no /metrics. Wrong model names and a server without
--metrics are tested on the real llama-server in tests/serving/test_llamacpp.py."""
import json
import threading
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvviz.cli import main
from kvviz.errors import InputError
from kvviz.serving import client as api
from kvviz.serving.llamacpp import free_port
from kvviz.serving.prom import scrape


class _CutStream(BaseHTTPRequestHandler):
    """Lists one model, then streams two completion chunks and drops the connection: no [DONE]."""

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):  # noqa: N802
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in ("Hello", " world"):
            chunk = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True  # gone before finish_reason or [DONE]


class _HeldBackBytes(_CutStream):
    """Streams as an engine holding back the bytes of a character does: a token message with empty text first,
    an SSE comment (a ping), a message with text, the usage summary with empty choices, then [DONE]."""

    def do_POST(self):  # noqa: N802
        import time

        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        events = [{"choices": [{"index": 0, "text": "", "finish_reason": None}]}, ": ping",
                  {"choices": [{"index": 0, "text": "é", "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, "[DONE]"]
        for event in events:
            time.sleep(0.05)
            line = event if event == ": ping" else f"data: {event if event == '[DONE]' else json.dumps(event)}"
            self.wfile.write(f"{line}\n\n".encode())
            self.wfile.flush()


def _serve(handler):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture
def cut_server():
    httpd, url = _serve(_CutStream)
    yield url
    httpd.shutdown()


@pytest.fixture
def plain_web_server(tmp_path):
    (tmp_path / "index.html").write_text("<html>not an API</html>")

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(tmp_path), **kw)

        def log_message(self, *args):
            pass

    httpd, url = _serve(Handler)
    yield url
    httpd.shutdown()


def test_unreachable_url():
    srv = api.Server(f"http://127.0.0.1:{free_port()}", timeout_s=5)
    with pytest.raises(InputError) as e:
        api.list_models(srv)
    assert e.value.key == "serving.unreachable"
    assert "cannot reach http://127.0.0.1" in str(e.value)
    assert "연결할 수 없습니다" in e.value.message("ko")


def test_not_openai_compatible(plain_web_server):
    with pytest.raises(InputError) as e:
        api.list_models(api.Server(plain_web_server))
    assert e.value.key == "serving.not_openai"


def test_missing_metrics(plain_web_server):
    with pytest.raises(InputError) as e:
        scrape(api.Server(plain_web_server))
    assert e.value.key == "serving.no_metrics" and "HTTP 404" in str(e.value)


def test_stream_stopping_halfway_keeps_what_arrived(cut_server):
    """The body ends (HTTP/1.0: the connection closes) with no finish_reason or [DONE]: a success, as vLLM's
    request function counts one once a token message arrived; marked as cut."""
    r = api.stream_request(api.Server(cut_server), "m", "hi", 8)
    assert r.n_chunks == 2 and r.text == "Hello world" and r.ttft_s is not None  # measured, kept
    assert r.ok and r.stream_cut and r.error is None


def test_ttft_counts_a_token_message_with_empty_text():
    """vLLM's definition (endpoint_request_func.py): the first message with non-empty `choices` is the first
    token even when its text is empty; every later one adds an ITL; the usage message (empty choices) times
    nothing; an SSE comment is skipped."""
    httpd, url = _serve(_HeldBackBytes)
    try:
        r = api.stream_request(api.Server(url), "m", "hi", 2)
    finally:
        httpd.shutdown()
    assert r.ok and r.text == "é" and r.n_chunks == 2 and r.completion_tokens == 2
    assert 0.04 <= r.ttft_s < r.e2e_s  # the empty message, not the one with text, set TTFT
    assert len(r.itl_s) == 1 and r.itl_s[0] >= 0.08  # the ping and nothing else in between: one gap of ~0.1 s
    assert r.e2e_s < 0.2  # the usage message after it did not move the end


def test_metrics_warning_names_an_unreachable_server():
    with pytest.raises(InputError) as e:
        scrape(api.Server(f"http://127.0.0.1:{free_port()}", timeout_s=5))
    assert e.value.key == "serving.unreachable"  # not "no metrics": the server is not there at all


def test_api_key_never_in_messages(cut_server):
    srv = api.Server(f"http://127.0.0.1:{free_port()}", api_key="sk-SECRET-123", timeout_s=5)
    assert "SECRET" not in repr(srv)
    with pytest.raises(InputError) as e:
        api.list_models(srv)
    assert "SECRET" not in str(e.value)


@pytest.mark.parametrize("argv,needle", [
    (["--url", "not a url"], "is not a server address"),
    (["--url", "http://127.0.0.1:{port}"], "cannot reach"),
    (["--url", "http://127.0.0.1:1", "--api-key-env", "KVVIZ_NO_SUCH_VAR"], "environment variable is not set"),
    (["--url", "http://127.0.0.1:1", "--concurrency", "1,x"], "comma-separated"),
])
def test_cli_bad_input_is_one_line(argv, needle, capsys):
    argv = [a.replace("{port}", str(free_port())) for a in argv]
    assert main(["serve-bench", *argv, "--timeout", "5"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_not_openai(plain_web_server, capsys):
    assert main(["serve-bench", "--url", plain_web_server, "--timeout", "5"]) == 2
    assert "does not answer like an OpenAI-compatible server" in capsys.readouterr().err
