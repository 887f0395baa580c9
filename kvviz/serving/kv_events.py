"""A serving engine's KV cache events as vLLM publishes them (`--kv-events-config`), read off the wire: the frames
(topic, 8-byte sequence number, msgpack payload) decoded into plain events, and a ZMQ subscriber that asks the
replay socket for what it missed.

The schema is vLLM's `vllm/distributed/kv_events.py` (release 0.34.0, scripts/install_vllm_ref.sh): a batch
(`EventBatch`, array_like: [ts, events, data_parallel_rank]) of tagged events `BlockStored` (block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
kv_cache_spec_sliding_window, then locality, ownership, session_id, lookahead_token_ids), `BlockRemoved`
(block_hashes, medium, group_idx, ...) and `AllBlocksCleared`, encoded with msgspec's msgpack. That release encodes
each event as a map (the tag under "type", defaults left out); earlier releases, and SGLang's copy of the module,
as an array (the tag first, then the fields in order, trailing defaults left out). Both are read (`Batch.layout`);
a field a release added later is ignored where kvviz has no use for it and None where a release lacks it. A payload
neither layout explains is an `UnknownSchema`, named and skipped by the caller, never a crash; an event of a kind
kvviz does not know is named and skipped. Block hashes are 64-bit integers by default in that release
(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), bytes otherwise: both are kept as they come.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

# vLLM's field order (kv_events.py) for the array layout; fields after the first `required` are optional.
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
STORED_REQUIRED = 4  # block_hashes, parent_block_hash, token_ids, block_size (the oldest release's first fields)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
BATCH_FIELDS = ("ts", "events", "data_parallel_rank")
END_SEQ = -1  # ZmqEventPublisher.END_SEQ: the replay socket's last frame
RCVHWM = 100_000  # batches queued before ZMQ drops them: vLLM's publisher's hwm (a burst waits, is not lost)
MEDIUM_GPU = "GPU"  # kv_events.MEDIUM_GPU: what the GPU pool writes (older releases wrote None for it)


class UnknownSchema(ValueError):
    """A payload that is no batch of any layout kvviz reads; `what` names what was found instead."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True, slots=True)
class Stored:
    """BlockStored: consecutive full blocks, the first under `parent` (None: at the prompt's start)."""
    hashes: tuple
    parent: object
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    group: int | None = None
    spec_kind: str | None = None
    sliding_window: int | None = None
    lora_name: str | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    """BlockRemoved: blocks evicted (or moved out) of one medium."""
    hashes: tuple
    medium: str | None = None
    group: int | None = None


@dataclass(frozen=True, slots=True)
class Cleared:
    """AllBlocksCleared: the prefix cache reset (vLLM's reset_prefix_cache)."""


@dataclass(slots=True)
class Batch:
    """One published batch: its sequence number, the publisher's time, its events, the layout it came in."""
    seq: int
    ts: float
    events: list
    layout: str  # the events': "map" (vLLM 0.34.0), "array" (older vLLM, SGLang), "empty" (no events)
    dp_rank: int | None = None
    unknown_events: list[str] = field(default_factory=list)  # tags of events skipped (a later release's kinds)


def _fields(raw: object, names: tuple[str, ...], required: int) -> dict | None:
    """A tagged struct's fields by name, from either layout; None if it has fewer than `required`."""
    if isinstance(raw, dict):
        return raw
    values = raw[1:len(names) + 1]  # a later release's fields after these: not misread as these
    return dict(zip(names, values, strict=False)) if len(values) >= required else None


def _tuple(value: object, what: str) -> tuple:
    if not isinstance(value, list | tuple):
        raise UnknownSchema(f"{what} is {type(value).__name__}, not a list")
    return tuple(value)


def decode_event(raw: object) -> Stored | Removed | Cleared | str:
    """One event; an unknown tag comes back as its name (a kind this reader does not know, skipped)."""
    tag = raw.get("type") if isinstance(raw, dict) else raw[0] if isinstance(raw, list | tuple) and raw else None
    if tag == "BlockStored":
        f = _fields(raw, STORED_FIELDS, STORED_REQUIRED)
        if f is None:
            raise UnknownSchema(f"BlockStored with {len(raw) - 1} fields")
        hashes, tokens = _tuple(f.get("block_hashes"), "block_hashes"), _tuple(f.get("token_ids"), "token_ids")
        size = f.get("block_size")
        if not isinstance(size, int) or size <= 0 or len(tokens) != size * len(hashes):
            raise UnknownSchema(f"BlockStored of {len(hashes)} blocks, {len(tokens)} tokens, block size {size!r}")
        return Stored(hashes, f.get("parent_block_hash"), tokens, size, f.get("medium"), f.get("group_idx"),
                      f.get("kv_cache_spec_kind"), f.get("kv_cache_spec_sliding_window"), f.get("lora_name"))
    if tag == "BlockRemoved":
        f = _fields(raw, REMOVED_FIELDS, 1)
        if f is None:
            raise UnknownSchema("BlockRemoved without fields")
        return Removed(_tuple(f.get("block_hashes"), "block_hashes"), f.get("medium"), f.get("group_idx"))
    if tag == "AllBlocksCleared":
        return Cleared()
    if isinstance(tag, str):
        return tag
    raise UnknownSchema(f"an event of {type(raw).__name__}")


def decode_payload(payload: bytes, seq: int) -> Batch:
    """A msgpack payload as a Batch; UnknownSchema if it is not one."""
    import msgspec

    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise UnknownSchema(f"not msgpack ({exc})") from None
    if isinstance(raw, dict) and isinstance(raw.get("events"), list):  # a batch not array_like
        ts, events, rank = raw.get("ts"), raw["events"], raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) >= 2 and isinstance(raw[1], list):
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    else:
        raise UnknownSchema(f"a {type(raw).__name__} with no events list")
    if not isinstance(ts, int | float):
        raise UnknownSchema(f"a batch whose time is {type(ts).__name__}")
    layout = "empty" if not events else "map" if isinstance(events[0], dict) else "array"
    batch = Batch(seq, float(ts), [], layout, rank)
    for raw_event in events:
        event = decode_event(raw_event)
        if isinstance(event, str):
            batch.unknown_events.append(event)
        else:
            batch.events.append(event)
    return batch


def decode_frames(frames: list[bytes]) -> Batch:
    """[topic, seq, payload] as ZmqEventPublisher sends them (the replay socket's [seq, payload] too)."""
    if len(frames) == 3:
        frames = frames[1:]
    if len(frames) != 2 or len(frames[0]) != 8:
        raise UnknownSchema(f"{len(frames)} frames, not topic, 8-byte sequence number and payload")
    return decode_payload(frames[1], int.from_bytes(frames[0], "big", signed=True))


def encode_batch(ts: float, events: list, layout: str = "map") -> bytes:
    """A batch as vLLM 0.34.0 (events as maps) or an older release / SGLang (events as arrays) would publish it:
    the inverse of decode_payload, for tests and the bench's flood (the agreement test uses vLLM's own encoder)."""
    import msgspec

    def one(e: Stored | Removed | Cleared) -> object:
        if isinstance(e, Stored):
            vals = {"block_hashes": list(e.hashes), "parent_block_hash": e.parent, "token_ids": list(e.token_ids),
                    "block_size": e.block_size, "lora_id": None, "medium": e.medium, "lora_name": e.lora_name,
                    "extra_keys": None, "group_idx": e.group, "kv_cache_spec_kind": e.spec_kind,
                    "kv_cache_spec_sliding_window": e.sliding_window}
            tag, names = "BlockStored", STORED_FIELDS
        elif isinstance(e, Removed):
            vals, tag, names = {"block_hashes": list(e.hashes), "medium": e.medium, "group_idx": e.group}, \
                "BlockRemoved", REMOVED_FIELDS
        else:
            vals, tag, names = {}, "AllBlocksCleared", ()
        if layout == "map":
            return {"type": tag, **vals}
        return [tag, *(vals[n] for n in names)]

    return msgspec.msgpack.encode([ts, [one(e) for e in events]])


# ---- the subscriber ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Fault:
    """Something the subscriber saw that is not a batch: `kind` is a locale key's last part, `detail` its numbers."""
    kind: str  # "unknown_schema", "gap", "gap_filled", "restart"
    detail: dict


class Subscriber:
    """A SUB socket on the publisher's endpoint (topic `topic`, "" for all), and, when given, a DEALER on its replay
    socket: a sequence number that skips ahead asks the replay for the missed batches from the last one seen
    (vLLM's examples/online_serving/kv_events_subscriber.py uses the same protocol), else reports the gap; one that
    goes back is a restarted publisher. `poll()` returns what arrived, in order: Batches and Faults."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 replay_timeout_s: float = 1.0, from_start: bool = True) -> None:
        import zmq

        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, RCVHWM)
        self._sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self._replay = None
        self.replay_timeout_s = replay_timeout_s
        # the TCP connection's state, from the socket's monitor: reachable or not, before any event arrives
        self._monitor = self._sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
                                                     | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CLOSED)
        self.connected = False
        self.retries = 0  # failed tries to connect (refused, unreachable) since the last connection
        try:
            self._sub.connect(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.DEALER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.connect(replay_endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"{exc}") from None
        # -1: every batch from the publisher's first is expected (the replay socket is asked for those sent before
        # this subscriber connected); None: from whichever arrives first
        self.last_seq: int | None = -1 if from_start else None
        self.started = time.monotonic()
        self.received = 0  # frames read, batches or not
        self._caught_up: tuple[int, int] | None = None  # the sequence numbers catch_up() read last

    def _watch(self) -> None:
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
            if event == zmq.EVENT_CONNECTED:
                self.connected, self.retries = True, 0
            elif event == zmq.EVENT_CONNECT_RETRIED:
                self.retries += 1
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self.connected = False

    def wait_connected(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.connected and time.monotonic() < deadline:
            self._monitor.poll(50)
            self._watch()
        return self.connected

    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[Batch | Fault]:
        """What arrives within `timeout_s` (at most `max_frames` frames: the caller draws at its own rate)."""
        import zmq

        out: list[Batch | Fault] = []
        self._watch()
        if not self._sub.poll(int(timeout_s * 1000)):
            self._watch()
            return out
        while len(out) < max_frames:
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.received += 1
            self._take(frames, out)
        return out

    def _take(self, frames: list[bytes], out: list) -> None:
        try:
            batch = decode_frames(frames)
        except UnknownSchema as exc:
            seq = int.from_bytes(frames[-2], "big", signed=True) if len(frames) >= 2 and len(frames[-2]) == 8 else None
            out.append(Fault("unknown_schema", {"what": exc.what, "seq": seq}))
            if seq is not None:
                self.last_seq = seq  # skipped, not missed
            return
        window = self._caught_up
        if window is not None:
            if window[0] <= batch.seq <= window[1]:
                return  # sent while the replay was read: already folded in
            self._caught_up = None
        last = self.last_seq
        if last is not None and batch.seq <= last:
            # vLLM's sequence starts at 0 for each publisher: going back means a new one (a restarted server)
            out.append(Fault("restart", {"last": last, "seq": batch.seq}))
            last = -1
        if last is not None and batch.seq > last + 1:
            out.extend(self._fill(last, batch.seq))
        self.last_seq = batch.seq
        out.append(batch)

    def _replay_from(self, start: int) -> list[Batch | Fault]:
        """What the replay socket holds from sequence number `start` on, in its order."""
        import zmq

        got: list[Batch | Fault] = []
        try:
            self._replay.send_multipart([b"", start.to_bytes(8, "big", signed=True)], zmq.NOBLOCK)
        except zmq.Again:
            return got
        while self._replay.poll(int(self.replay_timeout_s * 1e3)):  # until the end marker, or silence
            frames = self._replay.recv_multipart(zmq.NOBLOCK)
            while len(frames) > 2 and frames[0] == b"":  # the envelope's empty delimiter(s)
                frames = frames[1:]
            if len(frames) == 2 and int.from_bytes(frames[0], "big", signed=True) == END_SEQ:
                break
            try:
                got.append(decode_frames(frames))
            except UnknownSchema as exc:
                got.append(Fault("unknown_schema", {"what": exc.what, "seq": None}))
        return got

    def _fill(self, last: int, seq: int) -> list[Batch | Fault]:
        """The batches between `last` and `seq` from the replay socket; a Fault("gap") for any it no longer holds."""
        missed = list(range(last + 1, seq))
        got: list[Batch | Fault] = []
        if self._replay is not None:
            got = [b for b in self._replay_from(last + 1) if not isinstance(b, Batch) or last < b.seq < seq]
        have = {b.seq for b in got if isinstance(b, Batch)}
        still = [s for s in missed if s not in have]
        if have:
            got.append(Fault("gap_filled", {"first": missed[0], "last": missed[-1], "n": len(have)}))
        if still:
            got.insert(0, Fault("gap", {"first": still[0], "last": still[-1], "n": len(still)}))
        return got

    def catch_up(self) -> list[Batch | Fault]:
        """Everything the replay socket still holds after the last batch seen (at the start: the server's every
        batch, if its buffer reaches back to the first): a tree of what was cached before kvviz subscribed, without
        waiting for the server's next batch. A Fault("gap") for the first ones it no longer holds."""
        if self._replay is None or self.last_seq is None:
            return []
        start = self.last_seq + 1
        got = [b for b in self._replay_from(start) if not isinstance(b, Batch) or b.seq >= start]
        batches = [b for b in got if isinstance(b, Batch)]
        out: list[Batch | Fault] = [f for f in got if not isinstance(f, Batch)]
        if batches and batches[0].seq > start:
            out.append(Fault("gap", {"first": start, "last": batches[0].seq - 1, "n": batches[0].seq - start,
                                     "before": True}))
        for b in batches:
            if b.seq > self.last_seq:
                out.append(b)
                self.last_seq = b.seq
        self.received += len(batches)
        if batches:
            self._caught_up = (batches[0].seq, batches[-1].seq)
            out.append(Fault("gap_filled", {"first": batches[0].seq, "last": batches[-1].seq, "n": len(batches)}))
        return out

    def close(self) -> None:
        self._sub.disable_monitor()
        for sock in (self._monitor, self._sub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()
