"""An OpenAI-compatible streaming client that times every chunk (httpx; no server-specific code).

Times follow `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py,
async_request_openai_completions / _chat_completions, read at vllm-project/vllm@02cfb534): the clock starts
just before the request is sent; TTFT is the arrival of the first SSE message whose `choices` is non-empty,
even when its text is empty (held-back UTF-8 bytes, a special token); every later such message adds one
inter-token latency (a message may hold several tokens) and moves the request's end (E2E); a message with
empty `choices` (the usage summary) times nothing. N comes from the `usage` the server reports (asked for
with `stream_options.include_usage`), else from the generated text's tokens (serve.py calculate_metrics
tokenizes it; kvviz asks the server's /tokenize, set by the caller as `text_tokens`), else from counting those
messages, which the result says. The prompt's length likewise: usage's prompt_tokens, else the request's own
count (RequestFuncOutput.prompt_len). A stream that ends without [DONE] after a token message succeeded, as
vLLM's loop ends with success once a chunk arrived (it is marked `stream_cut`); a connection that breaks
mid-stream failed, as vLLM's `except` branch fails it.
llama.cpp's own clock for the request (its `timings`: prompt_ms, predicted_per_token_ms) is kept beside.

The API key goes only into the Authorization header, and credentials written into the URL
(http://user:pass@host) only into basic auth: neither into a shown URL, a message or a log.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import httpx

from kvviz.errors import InputError

DEFAULT_TIMEOUT_S = 30.0


def _without_userinfo(parts: SplitResult) -> str:
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else (parts.hostname or "")
    return host + (f":{parts.port}" if parts.port is not None else "")


def normalize_base_url(url: str) -> str:
    """`http://host:8000`, `http://host:8000/` and `http://host:8000/v1` all name the same server. Credentials
    in the URL are dropped: the result is what may be shown (`url_credentials` reads them for basic auth)."""
    text = (url or "").strip()
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise InputError("serving.bad_url", url=_without_userinfo_text(text)) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("serving.bad_url", url=_without_userinfo_text(text) or "—")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((parts.scheme, _without_userinfo(parts), path, "", ""))


def _without_userinfo_text(text: str) -> str:
    """A URL as typed, with anything before an '@' in its authority removed (for messages about a bad URL)."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text.rpartition("@")[2] if "@" in text.split("/", 1)[0] else text
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


def url_credentials(url: str) -> tuple[str, str] | None:
    """(user, password) written into a URL as http://user:pass@host, else None."""
    parts = urlsplit((url or "").strip())
    if parts.username is None:
        return None
    return unquote(parts.username), unquote(parts.password or "")


@dataclass(frozen=True)
class Server:
    """Where to send requests: a base URL (without /v1), an optional API key, and a timeout per request."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)  # never printed
    timeout_s: float = DEFAULT_TIMEOUT_S
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)  # from http://user:pass@host, never shown

    def __post_init__(self) -> None:
        creds = url_credentials(self.base_url)
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))
        if creds is not None and self.basic_auth is None:
            object.__setattr__(self, "basic_auth", creds)
        if not 0 < self.timeout_s <= 3600:
            raise InputError("serving.bad_timeout", value=self.timeout_s)

    def url(self, path: str) -> str:
        return self.base_url + path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, max_connections: int = 100) -> httpx.Client:
        auth = httpx.BasicAuth(*self.basic_auth) if self.basic_auth and not self.api_key else None
        return httpx.Client(headers=self.headers(), auth=auth, timeout=httpx.Timeout(self.timeout_s),
                            limits=httpx.Limits(max_connections=max_connections), follow_redirects=False)


def transport_error(server: Server, exc: httpx.HTTPError) -> InputError:
    """An httpx failure as the message a user can act on (no headers, so no key, in it)."""
    if isinstance(exc, httpx.TimeoutException):
        return InputError("serving.timeout", url=server.base_url, seconds=f"{server.timeout_s:g}")
    if isinstance(exc, (httpx.ConnectError, httpx.UnsupportedProtocol)):
        return InputError("serving.unreachable", url=server.base_url, reason=type(exc).__name__)
    if isinstance(exc, httpx.RemoteProtocolError):
        return InputError("serving.stream_cut", url=server.base_url, n_chunks="?")
    return InputError("serving.unreachable", url=server.base_url, reason=type(exc).__name__)


def status_error(server: Server, response: httpx.Response, model: str | None = None) -> InputError:
    body = ""
    try:
        body = response.read().decode("utf-8", "replace")[:2000]
    except httpx.HTTPError:
        pass
    if response.status_code in (401, 403):
        return InputError("serving.auth", url=server.base_url, status=response.status_code)
    lowered = body.lower()
    if model is not None and response.status_code in (400, 404) and "model" in lowered:
        return InputError("serving.unknown_model", model=model, available="?")
    if response.status_code == 404:
        return InputError("serving.not_openai", url=server.base_url, detail=f"HTTP 404 {response.request.url.path}")
    return InputError("serving.http_error", status=response.status_code, detail=_server_message(body))


def _server_message(body: str) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}, or {"message": ...}), else the
    body itself, on one line."""
    try:
        data = json.loads(body)
        inner = data.get("error", data) if isinstance(data, dict) else None
        message = inner.get("message") if isinstance(inner, dict) else inner if isinstance(inner, str) else None
        if isinstance(message, str) and message.strip():
            body = message
    except ValueError:
        pass
    return " ".join(body.split())[:200]


def get(server: Server, path: str, client: httpx.Client | None = None) -> httpx.Response:
    """GET a path of the server, on the client given or a short-lived one; a transport failure is an InputError
    that says the server cannot be reached."""
    own = client is None
    client = client or server.client()
    try:
        return client.get(server.url(path))
    except httpx.HTTPError as exc:
        raise transport_error(server, exc) from None
    finally:
        if own:
            client.close()


def list_models(server: Server, client: httpx.Client | None = None) -> list[dict]:
    """GET /v1/models: the served models (id, owned_by, max_model_len where given)."""
    response = get(server, "/v1/models", client)
    if response.status_code != 200:
        raise status_error(server, response)
    try:
        data = response.json()["data"]
        if not isinstance(data, list):
            raise TypeError
        return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, KeyError, TypeError):
        raise InputError("serving.not_openai", url=server.base_url,
                         detail=f"/v1/models: {' '.join(response.text.split())[:120]}") from None


def check_model(models: list[dict], model: str) -> str:
    """The model to use: the given name if the server lists it, else the only one listed."""
    ids = [m["id"] for m in models]
    if not model:
        if not ids:
            raise InputError("serving.no_models")
        return ids[0]
    if model not in ids:
        raise InputError("serving.unknown_model", model=model, available=", ".join(ids) or "—")
    return model


def _post_json(server: Server, path: str, body: dict, client: httpx.Client | None = None) -> object | None:
    """POST a JSON body to a path of the server, on the client given or a short-lived one: the answer's JSON, or
    None where the server has no such path, refuses it, cannot be reached or answers no JSON (an optional
    endpoint: /tokenize, /detokenize)."""
    own = client is None
    client = client or server.client()
    try:
        response = client.post(server.url(path), json=body)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    finally:
        if own:
            client.close()


def _token_ids(answer: object) -> list[int] | None:
    """The `tokens` of a /tokenize answer, if it is a list of ids."""
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    return tokens if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) else None


def tokenize(server: Server, model: str, text: str, client: httpx.Client | None = None, *,
             add_special: bool = False) -> list[int] | None:
    """Token ids from the server's own tokenizer (llama.cpp, vLLM and SGLang serve POST /tokenize); None if absent.

    add_special: with the tokens the server adds to a prompt itself (a BOS for Llama-family models), i.e. the
    ids its cache sees; without them, the ids to send as a prompt.
    """
    return _token_ids(_post_json(server, "/tokenize", {"content": text, "prompt": text, "model": model,
                                                       "add_special": add_special,
                                                       "add_special_tokens": add_special}, client))


def tokenize_chat(server: Server, model: str, text: str, client: httpx.Client | None = None) -> list[int] | None:
    """The ids of a one-message chat as the server's chat endpoint builds them: its chat template applied, with the
    generation prompt (vLLM 0.34.0's TokenizeChatRequest, vllm/entrypoints/serve/tokenize/protocol.py:
    `messages`, add_generation_prompt default True and add_special_tokens default False, as ChatCompletionRequest's
    own defaults); None where the server cannot (llama-server's /tokenize reads `content` only, and answers an
    empty list)."""
    tokens = _token_ids(_post_json(server, "/tokenize", {
        "model": model, "messages": [{"role": "user", "content": text}], "add_generation_prompt": True}, client))
    return tokens or None


def detokenize(server: Server, model: str, ids: Sequence[int], client: httpx.Client | None = None) -> str | None:
    """Token ids as text by the server's own tokenizer: POST /detokenize with `tokens` (vLLM 0.34.0's
    DetokenizeRequest answers `prompt`, llama-server `content`); None where the server has none."""
    answer = _post_json(server, "/detokenize", {"model": model, "tokens": list(ids)}, client)
    text = answer.get("prompt", answer.get("content")) if isinstance(answer, dict) else None
    return text if isinstance(text, str) else None


def cache_ids(server: Server, model: str, endpoint: str, prompt: str | list[int],
              client: httpx.Client | None = None) -> tuple[list[int] | None, str]:
    """A prompt's token ids as the server's prefix cache sees them, and where they came from: "sent" (a completion
    sent as token ids: vLLM takes them as they are), "tokenize" (text, by the server's /tokenize with the special
    tokens it adds itself: TokenizeCompletionRequest's add_special_tokens default True, as a completion's), "chat"
    (the chat template applied, tokenize_chat); (None, "no_tokenize") where the server cannot say: never guessed."""
    if endpoint == "chat":
        text = prompt if isinstance(prompt, str) else str(prompt)  # as _payload sends it
        ids = tokenize_chat(server, model, text, client)
        return (ids, "chat") if ids is not None else (None, "no_tokenize")
    if isinstance(prompt, list):
        return list(prompt), "sent"
    ids = tokenize(server, model, prompt, client, add_special=True)
    return (ids, "tokenize") if ids else (None, "no_tokenize")


@dataclass
class RequestResult:
    """One streamed request, timed as vllm bench serve times it. Times in seconds."""

    start_s: float  # when it was sent, on the caller's clock (perf_counter − the run's start)
    prompt_tokens: int | None = None  # from usage
    expected_prompt_len: int | None = None  # the request's own count of its prompt (the dataset's prompt_len)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where reported
    completion_tokens: int | None = None  # N from usage; None when the server gave none
    n_chunks: int = 0  # SSE messages with non-empty choices (vLLM's token messages)
    chunk_times_s: list[float] = field(default_factory=list)  # since start, one per such message
    text: str = ""
    finish_reason: str | None = None
    error: InputError | None = None
    cancelled: bool = False
    refused: list[str] = field(default_factory=list)  # optional request fields the server refused
    server_timings: dict | None = None  # llama.cpp's own `timings` for this request, where it sends them
    text_tokens: int | None = None  # the generated text's tokens by the server's tokenizer (set after the run)
    stream_cut: bool = False  # ended without [DONE] or a finish_reason, after at least one token message

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cancelled and self.n_chunks > 0

    @property
    def n_tokens(self) -> int:
        """N for TPOT: the server's usage count; without one (or 0, as vLLM's `if not output_len`) the generated
        text's tokens, else the token messages counted."""
        if self.completion_tokens:
            return self.completion_tokens
        return self.text_tokens if self.text_tokens is not None else self.n_chunks

    @property
    def tokens_from(self) -> str:
        """Where N came from: "usage", "tokenizer" (the generated text tokenized) or "messages" (counted)."""
        if self.completion_tokens:
            return "usage"
        return "tokenizer" if self.text_tokens is not None else "messages"

    @property
    def tokens_from_usage(self) -> bool:
        return self.tokens_from == "usage"

    @property
    def input_len(self) -> int | None:
        """The prompt's tokens as vLLM counts them: usage's prompt_tokens, else the request's own count."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.expected_prompt_len

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def e2e_s(self) -> float | None:
        return self.chunk_times_s[-1] if self.chunk_times_s else None

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latency per message after the first (a message may carry several tokens)."""
        from kvviz.engine.metrics import inter_token_latencies

        return inter_token_latencies(self.chunk_times_s) if len(self.chunk_times_s) > 1 else []

    @property
    def tpot_s(self) -> float | None:
        """(E2E − TTFT) / (N − 1), N from usage where reported."""
        from kvviz.engine.metrics import tpot

        if self.ttft_s is None or self.e2e_s is None:
            return None
        return tpot(self.ttft_s, self.e2e_s, self.n_tokens)

    @property
    def server_prefill_s(self) -> float | None:
        """The server's own prompt-processing time for this request (llama.cpp timings.prompt_ms)."""
        ms = (self.server_timings or {}).get("prompt_ms")
        return ms / 1e3 if isinstance(ms, (int, float)) else None

    @property
    def server_tpot_s(self) -> float | None:
        """The server's own time per output token after the first (llama.cpp timings.predicted_per_token_ms)."""
        ms = (self.server_timings or {}).get("predicted_per_token_ms")
        return ms / 1e3 if isinstance(ms, (int, float)) and ms > 0 else None

    def to_dict(self) -> dict:
        return {"start_s": self.start_s, "ok": self.ok, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "e2e_s": self.e2e_s, "itl_s": self.itl_s, "n_tokens": self.n_tokens,
                "tokens_from_usage": self.tokens_from_usage, "tokens_from": self.tokens_from,
                "input_len": self.input_len, "text": self.text, "stream_cut": self.stream_cut,
                "n_chunks": self.n_chunks, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "server_prefill_s": self.server_prefill_s, "server_tpot_s": self.server_tpot_s,
                "finish_reason": self.finish_reason, "error": str(self.error) if self.error else None,
                "error_key": self.error.key if self.error else None}


OPTIONAL_FIELDS = ("stream_options", "ignore_eos")  # extensions a strict server may refuse (HTTP 400/422)


def _payload(endpoint: str, model: str, prompt: str | list[int], max_tokens: int, include_usage: bool,
             ignore_eos: bool = True, extra: dict | None = None) -> dict:
    body: dict = {**(extra or {}), "model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    if ignore_eos:
        body["ignore_eos"] = True  # generate exactly max_tokens, as vllm bench serve does
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt if isinstance(prompt, str) else str(prompt)}]
    else:
        body["prompt"] = prompt
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


def _content(chunk: dict, endpoint: str) -> str | None:
    """The text of a token message ("" when it carries none); None for a message with empty `choices`."""
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    first = choices[0]
    if endpoint == "chat":
        delta = first.get("delta") or {}
        return delta.get("content") or delta.get("reasoning_content") or ""
    return first.get("text") or ""


def stream_request(
    server: Server,
    model: str,
    prompt: str | list[int],
    max_tokens: int,
    *,
    endpoint: str = "completions",
    include_usage: bool = True,
    client: httpx.Client | None = None,
    cancel: threading.Event | None = None,
    clock_zero: float = 0.0,
    on_chunk: Callable[[RequestResult], None] | None = None,
    extra_body: dict | None = None,
    ignore_eos: bool = True,
    prompt_len: int | None = None,
) -> RequestResult:
    """Send one streamed request and time its chunks. Never raises: a failure is the result's `error`.

    A server that refuses an optional extension (stream_options, ignore_eos) with HTTP 400/422 naming it is
    asked again without it; `refused` lists what was dropped (so N may come from counted chunks).
    """
    refused: list[str] = []
    while True:
        result = _stream_once(server, model, prompt, max_tokens, endpoint=endpoint, include_usage=include_usage,
                              ignore_eos=ignore_eos, client=client, cancel=cancel, clock_zero=clock_zero,
                              on_chunk=on_chunk, extra_body=extra_body)
        detail = str(result.error.params.get("detail", "")) if result.error is not None else ""
        field_ = next((f for f in OPTIONAL_FIELDS if f in detail and f not in refused), None)
        if result.error is None or result.error.key != "serving.http_error" or field_ is None:
            result.refused, result.expected_prompt_len = refused, prompt_len
            return result
        refused.append(field_)
        include_usage = include_usage and field_ != "stream_options"
        ignore_eos = ignore_eos and field_ != "ignore_eos"


def _stream_once(
    server: Server,
    model: str,
    prompt: str | list[int],
    max_tokens: int,
    *,
    endpoint: str,
    include_usage: bool,
    ignore_eos: bool,
    client: httpx.Client | None,
    cancel: threading.Event | None,
    clock_zero: float,
    on_chunk: Callable[[RequestResult], None] | None,
    extra_body: dict | None,
) -> RequestResult:
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    own = client is None
    client = client or server.client()
    t0 = time.perf_counter()
    result = RequestResult(start_s=t0 - clock_zero)
    done = False
    try:
        with client.stream("POST", server.url(path), json=_payload(endpoint, model, prompt, max_tokens,
                                                                    include_usage, ignore_eos, extra_body)) as response:
            if response.status_code != 200:
                result.error = status_error(server, response, model)
                return result
            for line in response.iter_lines():
                if cancel is not None and cancel.is_set():
                    result.cancelled = True
                    return result
                if not line.startswith("data:"):
                    continue  # blank separators and SSE comments (": ping")
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter() - t0
                try:
                    chunk = json.loads(data)
                    if not isinstance(chunk, dict):
                        raise ValueError(data)
                except ValueError:
                    result.error = InputError("serving.not_openai", url=server.base_url,
                                              detail=f"{path}: {data[:80]}")
                    return result
                if "error" in chunk:
                    result.error = InputError("serving.http_error", status=200,
                                              detail=_server_message(json.dumps({"error": chunk["error"]})))
                    return result
                text = _content(chunk, endpoint)
                if text is not None:
                    result.chunk_times_s.append(now)
                    result.n_chunks += 1
                    result.text += text
                    if on_chunk is not None:
                        on_chunk(result)
                for choice in chunk.get("choices") or []:
                    if isinstance(choice, dict) and choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                if isinstance(chunk.get("timings"), dict):
                    result.server_timings = chunk["timings"]
                usage = chunk.get("usage")
                if isinstance(usage, dict):
                    result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
                    result.completion_tokens = usage.get("completion_tokens", result.completion_tokens)
                    details = usage.get("prompt_tokens_details") or {}
                    if isinstance(details, dict) and details.get("cached_tokens") is not None:
                        result.cached_tokens = details["cached_tokens"]
    except httpx.HTTPError as exc:
        # The connection broke: failed, as vLLM's request function fails any exception, chunks or not.
        result.error = (transport_error(server, exc) if not result.n_chunks else
                        InputError("serving.stream_cut", url=server.base_url, n_chunks=result.n_chunks))
        return result
    finally:
        if own:
            client.close()
    if not done and result.finish_reason is None and not result.cancelled:
        # The stream ended without [DONE] or a finish_reason. vLLM counts it a success once a token message came
        # (endpoint_request_func.py: success = first_chunk_received); without one it failed.
        result.stream_cut = True
        if not result.n_chunks:
            result.error = InputError("serving.stream_cut", url=server.base_url, n_chunks=0)
    return result
