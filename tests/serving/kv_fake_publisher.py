"""A stand-in for a server's KV event publisher on a loopback port, for the faults vLLM's own publisher will not
make on demand (a batch lost, a schema kvviz does not know, a flood, silence): the same frames as vLLM's
ZmqEventPublisher (topic, 8-byte big-endian sequence number, msgpack payload) and the same replay protocol (a
ROUTER answering a start sequence number with the batches it holds, then -1 and an empty payload). The agreement
with vLLM's own publisher is tests/serving/test_kv_events_vllm.py's; tests, the bench and the screenshots use this."""
from __future__ import annotations

import threading
import time

import zmq

from kvviz.serving.kv_events import encode_batch
from kvviz.serving.llamacpp import free_port


class FakePublisher:
    def __init__(self, replay: bool = True, port: int | None = None, replay_port: int | None = None) -> None:
        self.ctx = zmq.Context()
        self.port = port or free_port()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 0)  # a flood is kept, not dropped, by the sender
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.replay_endpoint = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        if replay:
            self.replay_port = replay_port or free_port()
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
            self.replay_endpoint = f"tcp://127.0.0.1:{self.replay_port}"
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            frames = self.router.recv_multipart()
            client, start = frames[0], int.from_bytes(frames[-1], "big", signed=True)
            with self._lock:
                held = [(s, p) for s, p in self.buffer if s >= start]
            for s, p in held:
                self.router.send_multipart([client, b"", s.to_bytes(8, "big"), p])
            self.router.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def payload(self, seq_payload: bytes) -> None:
        """Send a raw payload as the next batch (a schema kvviz may not know)."""
        with self._lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, seq_payload))
        self.pub.send_multipart([b"", seq.to_bytes(8, "big"), seq_payload])

    def send(self, events: list, ts: float | None = None, layout: str = "map", lose: bool = False) -> int:
        """One batch; `lose`: counted and kept for replay but never sent (a subscriber misses it)."""
        body = encode_batch(time.time() if ts is None else ts, events, layout)
        with self._lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, body))
        if not lose:
            self.pub.send_multipart([b"", seq.to_bytes(8, "big"), body])
        return seq

    def forget(self) -> None:
        """The replay buffer emptied (its buffer_steps overrun): a missed batch cannot be fetched."""
        with self._lock:
            self.buffer.clear()

    def close(self) -> None:
        self._stop.set()
        if self.replay_endpoint:
            self._thread.join(timeout=2)
            self.router.close(linger=0)
        self.pub.close(linger=0)
        self.ctx.term()
