"""A server's KV events followed live: a Subscriber (kvviz.serving.kv_events) folding into a BlockTree
(kvviz.serving.kv_tree) on a background thread, and its state read as plain data at the reader's own rate (a page
ticking once a second, the CLI printing a line): however fast events arrive, the reader draws the latest tree and
counts the batches folded in since its last look. Says, after a few seconds, what is wrong when nothing arrives:
the endpoint refuses or cannot be reached, or it is reached and publishes nothing (the server was started without
`--kv-events-config`)."""
from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable

from kvviz.errors import InputError
from kvviz.serving.kv_events import Batch, Subscriber
from kvviz.serving.kv_tree import BlockTree

QUIET_AFTER_S = 5.0  # seconds without a connection, or without an event once connected, before saying so
# A watch nobody has read for this long ends itself: a page's reader is a browser tab that can close without a word
# (Streamlit runs no code when a session ends), and its thread and sockets would otherwise live as long as the server.
# Two minutes: Chromium reads a hidden tab's timers once a minute at most (its intensive throttling).
UNREAD_AFTER_S = 120.0
# What a vLLM server needs to publish its events (vLLM's KVEventsConfig; prefix caching on, its default)
SERVER_FLAG = ('--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq", '
               '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\'')
_TCP = re.compile(r"^tcp://(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\[\]]+):(?P<port>\d+)$")


def check_endpoint(endpoint: str, what: str = "endpoint") -> str:
    """A ZMQ endpoint a subscriber can connect to: tcp://HOST:PORT (a name that resolves) or ipc://PATH."""
    endpoint = endpoint.strip()
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return endpoint
    m = _TCP.match(endpoint)
    if m is None or not 0 < int(m["port"]) < 65536 or m["host"] == "*":
        raise InputError("kv_events.bad_endpoint", endpoint=endpoint, what=what)
    try:
        socket.getaddrinfo(m["host"].strip("[]"), int(m["port"]))
    except (socket.gaierror, UnicodeError):
        raise InputError("kv_events.unknown_host", host=m["host"], endpoint=endpoint) from None
    return endpoint


TEXTS_PER_LOOK = 20  # chains' first tokens detokenized per look at most (each is a request to the server)


def name_chains(chains: list[dict], texts: dict[tuple, str | None],
                fetch: Callable[[list[int]], str | None] | None, limit: int = TEXTS_PER_LOOK) -> None:
    """Each chain's first tokens as text (`first_text`: the server's own detokenization, None while unknown), from
    `texts` (ids -> text, or None where the server could not say), asking `fetch` (the server's /detokenize) for at
    most `limit` ids not asked before and keeping its answers in `texts`."""
    if len(texts) > 10_000:  # a long run's distinct chains: forgotten, asked again when drawn
        texts.clear()
    asked = 0
    for c in chains:
        ids = tuple(c["first_tokens"])
        if ids not in texts and fetch is not None and asked < limit:
            texts[ids] = fetch(list(ids))
            asked += 1
        c["first_text"] = texts.get(ids)


class Watch:
    """Subscribe on a thread; `state()` is what a reader draws. `close()` ends the thread and the sockets."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, quiet_after_s: float = QUIET_AFTER_S,
                 max_frames: int = 2_000, unread_after_s: float | None = None) -> None:
        self.endpoint = check_endpoint(endpoint)
        self.replay_endpoint = check_endpoint(replay_endpoint, "replay") if replay_endpoint else None
        self.quiet_after_s, self.max_frames = quiet_after_s, max_frames
        self.unread_after_s = unread_after_s  # None: read by a loop that closes it (the CLI); a page passes one
        self.read_at = time.monotonic()
        self.ended_unread = False  # it ended itself, unread for unread_after_s
        self.tree = BlockTree()
        self.lock = threading.Lock()
        self.sub = Subscriber(self.endpoint, self.replay_endpoint)
        self.started = time.monotonic()
        self.first_event_at: float | None = None
        self.connected_unix: float | None = None  # when the subscription began, on this machine's wall clock
        self.folded = 0  # batches folded in since the last state()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kvviz-kv-events")
        self._thread.start()

    def _run(self) -> None:
        caught_up = False
        while not self._stop.is_set():
            if self.unread_after_s is not None and time.monotonic() - self.read_at > self.unread_after_s:
                self.ended_unread = True
                break
            if not caught_up and self.sub.connected:  # what the server sent before: from its replay socket
                caught_up = True
                self.connected_unix = time.time()
                items = self.sub.catch_up()
            else:
                items = self.sub.poll(0.1, self.max_frames)
            if not items:
                continue
            with self.lock:
                self.tree.take(items)
                self.folded += sum(1 for i in items if isinstance(i, Batch))
                if self.first_event_at is None:
                    self.first_event_at = time.monotonic()
        self.sub.close()  # on this thread: a ZMQ socket is used by one thread only

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait_connected(self, timeout_s: float) -> bool:
        """Whether the subscriber's socket connected within `timeout_s` (read from this watch's thread: a ZMQ
        socket is used by one thread only)."""
        deadline = time.monotonic() + timeout_s
        while not self.sub.connected and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.sub.connected

    def status(self) -> str:
        """"receiving", "waiting" (the first seconds), "unreachable" (no connection: refused, no route),
        "silent" (connected, nothing published: the server's events are off)."""
        if self.sub.received:
            return "receiving"
        if time.monotonic() - self.started < self.quiet_after_s:
            return "waiting"
        return "silent" if self.sub.connected else "unreachable"

    def state(self) -> dict:
        """The tree's numbers, its drawable chains and rates, this watch's status, and what was folded since the
        last call (at most `limit` chains drawn: kvviz.serving.kv_tree.BlockTree.chains)."""
        self.read_at = time.monotonic()
        with self.lock:
            folded, self.folded = self.folded, 0
            return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint, "status": self.status(),
                    "retries": self.sub.retries, "summary": self.tree.summary(), "chains": self.tree.chains(),
                    "rates": self.tree.rate_rows(), "folded": folded, "frames": self.sub.received,
                    "elapsed_s": time.monotonic() - self.started}

    def run_view(self, run: dict, *, algo: str, seed: str | None) -> dict:
        """A load run's requests attributed to this tree's blocks (kvviz.serving.kv_run.attribute_run)."""
        from kvviz.serving.kv_run import attribute_run

        with self.lock:
            return attribute_run(self.tree, run, algo=algo, seed=seed, since_unix=self.connected_unix)

    def run_rates(self, start_unix: float, end_s: float) -> list[dict]:
        """Blocks stored and removed per second on a load run's point's own clock (kvviz.serving.kv_run)."""
        from kvviz.serving.kv_run import bin_width_s, run_rates

        with self.lock:
            log = list(self.tree.log)
        return run_rates(log, start_unix, end_s, bin_width_s(end_s))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
