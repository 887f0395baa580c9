"""Lecture rooms: where a lecturer's run is published and the room's live answers are counted.

Lives here: Room (an id for the link, a secret for the lecturer), Tally (a live question's counts), Asked (a question's
result, kept for the room's results until the room ends), RoomStore (the one
interface, with a hosted demo's caps: rooms open at once, followers per room), MemoryStore (one app server:
in-process), RedisStore (replicas behind a load balancer: Redis), store_from_env() (KVVIZ_ROOM_STORE picks one).
Does not: import streamlit or torch, or keep anything about a follower but an opaque session id until the reveal.

A snapshot is plain JSON data (small lists and numbers, never tensors): both stores keep it as a JSON string, so a
follower gets a copy and a value JSON cannot carry fails on publish, the same way in both.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvviz.errors import InputError

# A room ends two hours after its last change: longer than a lecture with its break (so a room never ends under a
# lecturer who is talking), short enough that a forgotten room's run and counts do not outlive the day.
ROOM_TTL_S = 2 * 60 * 60
ROOM_ID_BYTES = 16  # 128 random bits in the link (at least 96 asked: unguessable by trying)
SECRET_BYTES = 32  # the lecturer's right to drive: 256 bits, held only in the lecturer's session
LECTURER_BEAT_S = 5  # the lecturer's page says "still here" this often (any page, while a room is open)
LECTURER_GONE_S = 15  # three beats missed: the lecturer's browser has closed (followers keep the last state)
FOLLOWER_GONE_S = 10  # a follower polls every 0.5-1 s: 10 s unseen and its seat is free (a closed tab, exploring)
MAX_SNAPSHOT_BYTES = 512 * 1024  # what a view draws is small arrays and numbers; a larger one is a mistake
STORE_ENV = "KVVIZ_ROOM_STORE"  # unset or "memory": in-process; "redis://…" or "rediss://…": Redis


@dataclass(frozen=True)
class Room:
    id: str  # goes into the followers' link
    secret: str  # never does: the lecturer's session alone holds it


@dataclass(frozen=True)
class Tally:
    """A question open to the room: counts per option (in the question's order), no names."""

    question: str
    counts: dict[str, int]
    revealed: bool
    # The lecturer's choice: the counts shown on followers' screens (and the projector's bars) while answers come in;
    # False (the default): only how many answered, until the reveal, so the room does not follow the first answers.
    show_tally: bool = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class Asked:
    """One question the room was asked: its counts per option (in the question's order), the answer the lecturer
    gave it (None: none given), when it was opened and revealed (Unix seconds; None: never revealed, the counts as
    they stood when the next question replaced it or when the results were read)."""

    question: str
    counts: dict[str, int]
    answer: str | None
    opened: float
    revealed: float | None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Asked:
        return cls(**json.loads(text))


def _meta(answer: str | None, show_tally: bool, opened: float) -> str:
    # What a question carries beside its options, one JSON field in both stores.
    return json.dumps({"answer": answer, "show_tally": show_tally, "opened": opened})


def _digest(secret: str) -> str:
    # Stores keep the secret's hash only: a copy of the store (a Redis dump) does not hand out the right to drive.
    return hashlib.sha256(secret.encode()).hexdigest()


def _encode(snapshot: Mapping[str, Any]) -> str:
    try:
        text = json.dumps(snapshot, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InputError("room.bad_snapshot", reason=str(e)) from None
    if len(text) > MAX_SNAPSHOT_BYTES:
        raise InputError("room.snapshot_too_large", size=len(text), limit=MAX_SNAPSHOT_BYTES)
    return text


class RoomStore(ABC):
    """One interface over where rooms live. Every write by the lecturer needs the room's secret; a follower can only
    read and answer. An unknown, ended or expired room raises InputError("room.gone")."""

    def __init__(self, clock: Callable[[], float] = time.time, *, max_rooms: int | None = None,
                 max_followers: int | None = None) -> None:
        self.clock = clock  # injected by tests, so expiry is tested without sleeping
        # A hosted demo's caps (None: none): rooms open at once in this store (with Redis, for every replica
        # together) and followers per room, each refused with a clear message rather than slowing every room.
        self.max_rooms, self.max_followers = max_rooms, max_followers

    def create(self) -> Room:
        """Open a room; InputError("room.too_many_rooms") when max_rooms are open already."""
        room = Room(secrets.token_urlsafe(ROOM_ID_BYTES), secrets.token_urlsafe(SECRET_BYTES))
        if not self._create(room.id, _digest(room.secret), self.max_rooms):
            raise InputError("room.too_many_rooms", limit=self.max_rooms)
        return room

    def hold_seat(self, room_id: str, follower_id: str) -> int:
        """A follower's re-read: it holds a seat for FOLLOWER_GONE_S; InputError("room.full") when a new follower
        finds max_followers seats taken. Returns the followers in the room now."""
        n = self._hold_seat(room_id, follower_id, self.clock(), self.max_followers)
        if n is None:
            raise InputError("room.full", limit=self.max_followers)
        return n

    def publish(self, room_id: str, secret: str, snapshot: Mapping[str, Any]) -> int:
        """Replace what the room sees; returns the new version (1, 2, …), so a follower redraws only on a change."""
        text = _encode(snapshot)
        self._check(room_id, secret)
        return self._publish(room_id, text)

    def read(self, room_id: str) -> tuple[int, dict[str, Any] | None]:
        """(version, snapshot); (0, None) before the lecturer's first publish."""
        version, text = self._read(room_id)
        return version, (json.loads(text) if text else None)

    def beat(self, room_id: str, secret: str) -> None:
        """The lecturer is still here (not a change: the room's two hours do not start again)."""
        self._check(room_id, secret)
        self._beat(room_id, self.clock())

    def status(self, room_id: str) -> tuple[int, bool]:
        """(version, whether the lecturer left): what a follower's poll asks, without the snapshot (read only once
        the version changed). The lecturer left: no sign (a beat or a publish) for LECTURER_GONE_S."""
        version, seen = self._status(room_id)
        return version, self.clock() - seen > LECTURER_GONE_S

    def open_question(self, room_id: str, secret: str, question: str, options: Sequence[str],
                      answer: str | None = None, show_tally: bool = False) -> None:
        """Open a question to the room (`answer`: its right option, kept for the results; `show_tally`: the counts
        shown while answers come in). The one before it, if never revealed, goes into the results as it stood; its
        answers are dropped."""
        if not options or len(set(options)) != len(options) or (answer is not None and answer not in options):
            raise InputError("room.bad_options")
        self._check(room_id, secret)
        before = self._asked_now(room_id)
        if before is not None and before.revealed is None:
            self._record(room_id, before)
        self._open(room_id, question, list(options), _meta(answer, show_tally, self.clock()))

    def answer(self, room_id: str, question: str, follower_id: str, option: str) -> None:
        """A follower's answer: one per follower session (a later one replaces it), refused once revealed."""
        state = self._question(room_id)
        if state is None or state[0] != question:
            raise InputError("room.question_closed")
        if option not in state[1]:
            raise InputError("room.bad_option", option=option)
        if state[2]:
            raise InputError("room.revealed")
        self._answer(room_id, follower_id, option)

    def tally(self, room_id: str) -> Tally | None:
        """The open question's counts per option, or None when no question is open."""
        return self._tally(room_id)

    def reveal(self, room_id: str, secret: str) -> Tally:
        """Close the answers: the counts stay (and go into the room's results), which follower picked what is
        forgotten."""
        self._check(room_id, secret)
        state = self._question(room_id)
        if state is None:
            raise InputError("room.question_closed")
        tally = self._reveal(room_id)
        if not state[2]:  # revealed now, not before: one entry per question asked
            meta = json.loads(self._meta(room_id) or "{}")
            self._record(room_id, Asked(tally.question, tally.counts, meta.get("answer"),
                                        meta.get("opened", self.clock()), self.clock()))
        return tally

    def results(self, room_id: str, secret: str) -> list[Asked]:
        """Every question asked in this room, in order: revealed ones, replaced ones as they stood, and the open one
        with its counts so far (the lecturer's, for the CSV and the summary when the room ends)."""
        self._check(room_id, secret)
        out = [Asked.from_json(text) for text in self._results(room_id)]
        now = self._asked_now(room_id)
        return out + ([now] if now is not None and now.revealed is None else [])

    def _asked_now(self, room_id: str) -> Asked | None:
        """The open question as a result (its revealed time None: it is not revealed)."""
        tally = self._tally(room_id)
        if tally is None:
            return None
        meta = json.loads(self._meta(room_id) or "{}")
        return Asked(tally.question, tally.counts, meta.get("answer"), meta.get("opened", self.clock()),
                     self.clock() if tally.revealed else None)

    def end(self, room_id: str, secret: str) -> None:
        """The lecturer ends the room: everything it held is deleted."""
        self._check(room_id, secret)
        self._delete(room_id)

    def _check(self, room_id: str, secret: str) -> None:
        if not hmac.compare_digest(self._secret_digest(room_id), _digest(secret)):
            raise InputError("room.not_lecturer")

    # What a store implements. Each raises InputError("room.gone") for an unknown or expired room, and each write
    # counts as a change (the two hours start again).
    @abstractmethod
    def _create(self, room_id: str, digest: str, max_rooms: int | None) -> bool: ...  # False: max_rooms open
    @abstractmethod
    def _hold_seat(self, room_id: str, follower_id: str, now: float, limit: int | None) -> int | None: ...  # None: full
    @abstractmethod
    def _secret_digest(self, room_id: str) -> str: ...
    @abstractmethod
    def _publish(self, room_id: str, text: str) -> int: ...
    @abstractmethod
    def _read(self, room_id: str) -> tuple[int, str | None]: ...
    @abstractmethod
    def _open(self, room_id: str, question: str, options: list[str], meta: str) -> None: ...
    @abstractmethod
    def _meta(self, room_id: str) -> str | None: ...  # the open question's _meta() JSON
    @abstractmethod
    def _record(self, room_id: str, asked: Asked) -> None: ...  # one question into the room's results
    @abstractmethod
    def _results(self, room_id: str) -> list[str]: ...  # the results so far, each Asked.to_json()
    @abstractmethod
    def _question(self, room_id: str) -> tuple[str, list[str], bool] | None: ...
    @abstractmethod
    def _answer(self, room_id: str, follower_id: str, option: str) -> None: ...
    @abstractmethod
    def _tally(self, room_id: str) -> Tally | None: ...
    @abstractmethod
    def _reveal(self, room_id: str) -> Tally: ...
    @abstractmethod
    def _delete(self, room_id: str) -> None: ...
    @abstractmethod
    def _beat(self, room_id: str, now: float) -> None: ...
    @abstractmethod
    def _status(self, room_id: str) -> tuple[int, float]: ...  # (version, when the lecturer was last seen)


@dataclass
class _MemoryRoom:
    digest: str
    touched: float
    version: int = 0
    snapshot: str | None = None
    question: str | None = None
    options: list[str] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)  # follower session id -> option, until the reveal
    counts: dict[str, int] | None = None  # set at the reveal, when `answers` is dropped
    seen: float = 0.0  # the lecturer's last beat or publish
    followers: dict[str, float] = field(default_factory=dict)  # follower session id -> its last poll
    meta: str | None = None  # the open question's answer, tally choice and opening time (_meta)
    results: list[str] = field(default_factory=list)  # the questions asked, as Asked.to_json()


def _tally_of(question: str, options: Sequence[str], answers: Mapping[str, str], counts: Mapping[str, int] | None,
          meta: str | None = None) -> Tally:
    show = bool(json.loads(meta).get("show_tally")) if meta else False
    if counts is not None:
        return Tally(question, {o: int(counts.get(o, 0)) for o in options}, True, show)
    picked = list(answers.values())
    return Tally(question, {o: picked.count(o) for o in options}, False, show)


class MemoryStore(RoomStore):
    """One app server: rooms in this process, behind one lock (Streamlit runs each session in its own thread)."""

    def __init__(self, clock: Callable[[], float] = time.time, **caps: int | None) -> None:
        super().__init__(clock, **caps)
        self._rooms: dict[str, _MemoryRoom] = {}
        self._lock = threading.Lock()

    def _get(self, room_id: str, touch: bool = False) -> _MemoryRoom:
        now = self.clock()
        room = self._rooms.get(room_id)
        if room is None or now - room.touched > ROOM_TTL_S:
            self._rooms.pop(room_id, None)
            raise InputError("room.gone")
        if touch:
            room.touched = now
        return room

    def _sweep(self) -> None:  # expired rooms go when the next one opens, as Redis expires keys on its own
        now = self.clock()
        for room_id in [r for r, room in self._rooms.items() if now - room.touched > ROOM_TTL_S]:
            del self._rooms[room_id]

    def _create(self, room_id: str, digest: str, max_rooms: int | None) -> bool:
        with self._lock:
            self._sweep()
            if max_rooms is not None and len(self._rooms) >= max_rooms:
                return False
            now = self.clock()
            self._rooms[room_id] = _MemoryRoom(digest, now, seen=now)
            return True

    def _hold_seat(self, room_id: str, follower_id: str, now: float, limit: int | None) -> int | None:
        with self._lock:
            seats = self._get(room_id).followers
            for gone in [f for f, t in seats.items() if now - t > FOLLOWER_GONE_S]:
                del seats[gone]
            if limit is not None and follower_id not in seats and len(seats) >= limit:
                return None
            seats[follower_id] = now
            return len(seats)

    def _secret_digest(self, room_id: str) -> str:
        with self._lock:
            return self._get(room_id).digest

    def _publish(self, room_id: str, text: str) -> int:
        with self._lock:
            room = self._get(room_id, touch=True)
            room.version += 1
            room.snapshot, room.seen = text, room.touched
            return room.version

    def _read(self, room_id: str) -> tuple[int, str | None]:
        with self._lock:
            room = self._get(room_id)
            return room.version, room.snapshot

    def _open(self, room_id: str, question: str, options: list[str], meta: str) -> None:
        with self._lock:
            room = self._get(room_id, touch=True)
            room.question, room.options, room.answers, room.counts, room.meta = question, options, {}, None, meta

    def _meta(self, room_id: str) -> str | None:
        with self._lock:
            return self._get(room_id).meta

    def _record(self, room_id: str, asked: Asked) -> None:
        with self._lock:
            self._get(room_id, touch=True).results.append(asked.to_json())

    def _results(self, room_id: str) -> list[str]:
        with self._lock:
            return list(self._get(room_id).results)

    def _question(self, room_id: str) -> tuple[str, list[str], bool] | None:
        with self._lock:
            room = self._get(room_id)
            return None if room.question is None else (room.question, list(room.options), room.counts is not None)

    def _answer(self, room_id: str, follower_id: str, option: str) -> None:
        with self._lock:
            room = self._get(room_id, touch=True)
            if room.counts is not None:  # revealed between the check and now
                raise InputError("room.revealed")
            room.answers[follower_id] = option

    def _tally(self, room_id: str) -> Tally | None:
        with self._lock:
            room = self._get(room_id)
            if room.question is None:
                return None
            return _tally_of(room.question, room.options, room.answers, room.counts, room.meta)

    def _reveal(self, room_id: str) -> Tally:
        with self._lock:
            room = self._get(room_id, touch=True)
            tally = _tally_of(room.question or "", room.options, room.answers, room.counts, room.meta)
            room.counts, room.answers = tally.counts, {}
            return dataclasses.replace(tally, revealed=True)

    def _delete(self, room_id: str) -> None:
        with self._lock:
            self._rooms.pop(room_id, None)

    def _beat(self, room_id: str, now: float) -> None:
        with self._lock:
            self._get(room_id).seen = now

    def _status(self, room_id: str) -> tuple[int, float]:
        with self._lock:
            room = self._get(room_id)
            return room.version, room.seen


class RedisStore(RoomStore):
    """Several replicas: rooms in Redis, one hash per room and one for its answers, each with a TTL of ROOM_TTL_S
    renewed on every change (Redis deletes a forgotten room on its own). The clock is also kept in the hash, so a
    room expires at the same moment for every replica and for a test's injected clock."""

    PREFIX = "kvviz:room:"
    ROOMS = "kvviz:rooms"  # a sorted set: room id -> its last change, to count the open rooms (max_rooms)

    def __init__(self, url: str, clock: Callable[[], float] = time.time, **caps: int | None) -> None:
        import redis  # only a deployment that asks for Redis needs the client

        super().__init__(clock, **caps)
        self._errors = (redis.RedisError,)
        self._watch_error = redis.WatchError
        self._redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.url = url

    def _keys(self, room_id: str) -> tuple[str, str]:
        return f"{self.PREFIX}{room_id}", f"{self.PREFIX}{room_id}:answers"

    def _results_key(self, room_id: str) -> str:  # a list: the questions asked, as Asked.to_json()
        return f"{self.PREFIX}{room_id}:results"

    def _followers_key(self, room_id: str) -> str:  # a sorted set: follower session id -> its last poll
        return f"{self.PREFIX}{room_id}:followers"

    def _watched(self, key: str, fn: Callable[[Any], Any]) -> Any:
        """fn(pipe) under WATCH `key`, run again if another replica changed `key` meanwhile (so a cap is never
        passed by two replicas admitting at once)."""
        def run() -> Any:
            with self._redis.pipeline(transaction=True) as p:
                while True:
                    try:
                        p.watch(key)
                        return fn(p)
                    except self._watch_error:
                        continue

        return self._call(run)

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._errors as e:  # unreachable, timed out, refused: the app says sharing stopped, and why
            raise InputError("room.store_down", reason=str(e) or type(e).__name__) from None

    def _fields(self, room_id: str, *names: str) -> dict[str, str]:
        """The room's hash (only `names` when given: a poll reads two numbers, not the snapshot); room.gone when it
        is missing or past its two hours."""
        room, answers = self._keys(room_id)
        if names:
            values = self._call(lambda: self._redis.hmget(room, ["touched", *names]))
            fields = {k: v for k, v in zip(["touched", *names], values, strict=True) if v is not None}
        else:
            fields = self._call(lambda: self._redis.hgetall(room))
        if not fields or self.clock() - float(fields["touched"]) > ROOM_TTL_S:
            if fields:
                self._delete(room_id)
            raise InputError("room.gone")
        return fields

    def _write(self, room_id: str, mapping: Mapping[str, Any], *, bump: bool = False,
               answer: tuple[str, str] | None = None, drop_answers: bool = False, drop: tuple[str, ...] = ()) -> int:
        """One transaction: the fields (less `drop`), the version (`bump`), an answer; the clock and both keys' TTL
        renewed."""
        room, answers = self._keys(room_id)

        def run() -> int:
            with self._redis.pipeline(transaction=True) as p:
                if drop:
                    p.hdel(room, *drop)
                now = self.clock()
                p.hset(room, mapping={**mapping, "touched": repr(now)})
                if bump:
                    p.hincrby(room, "version", 1)
                if answer is not None:
                    p.hset(answers, answer[0], answer[1])
                if drop_answers:
                    p.delete(answers)
                p.expire(room, ROOM_TTL_S)
                p.expire(answers, ROOM_TTL_S)
                p.expire(self._results_key(room_id), ROOM_TTL_S)  # the results go with the room
                p.zadd(self.ROOMS, {room_id: now})
                out = p.execute()
            return int(out[1 + bool(drop)]) if bump else 0

        return self._call(run)

    def _create(self, room_id: str, digest: str, max_rooms: int | None) -> bool:
        now = self.clock()

        def create(p: Any) -> bool:
            # Reads before MULTI, writes after it (a write of our own to a watched key would abort the EXEC).
            if max_rooms is not None and p.zcount(self.ROOMS, now - ROOM_TTL_S, "+inf") >= max_rooms:
                return False
            room = self._keys(room_id)[0]
            p.multi()
            p.zremrangebyscore(self.ROOMS, "-inf", f"({now - ROOM_TTL_S!r}")  # rooms Redis has expired on its own
            p.hset(room, mapping={"digest": digest, "version": 0, "seen": repr(now), "touched": repr(now)})
            p.expire(room, ROOM_TTL_S)
            p.zadd(self.ROOMS, {room_id: now})
            p.execute()
            return True

        return self._watched(self.ROOMS, create)

    def _hold_seat(self, room_id: str, follower_id: str, now: float, limit: int | None) -> int | None:
        self._fields(room_id, "version")  # the room is open (its clock alone read, not the snapshot)
        key = self._followers_key(room_id)

        def seat(p: Any) -> int | None:
            n = p.zcount(key, now - FOLLOWER_GONE_S, "+inf")
            last = p.zscore(key, follower_id)
            new = last is None or last < now - FOLLOWER_GONE_S
            if limit is not None and new and n >= limit:
                return None
            p.multi()
            p.zremrangebyscore(key, "-inf", f"({now - FOLLOWER_GONE_S!r}")
            p.zadd(key, {follower_id: now})
            p.expire(key, ROOM_TTL_S)
            p.execute()
            return n + new

        return self._watched(key, seat)

    def _secret_digest(self, room_id: str) -> str:
        return self._fields(room_id, "digest")["digest"]

    def _publish(self, room_id: str, text: str) -> int:
        return self._write(room_id, {"snapshot": text, "seen": repr(self.clock())}, bump=True)

    def _read(self, room_id: str) -> tuple[int, str | None]:
        fields = self._fields(room_id)
        return int(fields.get("version", 0)), fields.get("snapshot")

    def _open(self, room_id: str, question: str, options: list[str], meta: str) -> None:
        self._fields(room_id)
        self._write(room_id, {"question": question, "options": json.dumps(options), "meta": meta},
                    drop_answers=True, drop=("counts",))

    def _meta(self, room_id: str) -> str | None:
        return self._fields(room_id, "meta").get("meta")

    def _record(self, room_id: str, asked: Asked) -> None:
        self._fields(room_id, "version")
        key = self._results_key(room_id)

        def run() -> None:
            with self._redis.pipeline(transaction=True) as p:
                p.rpush(key, asked.to_json())
                p.expire(key, ROOM_TTL_S)
                p.execute()

        self._call(run)

    def _results(self, room_id: str) -> list[str]:
        self._fields(room_id, "version")
        return self._call(lambda: self._redis.lrange(self._results_key(room_id), 0, -1))

    def _question(self, room_id: str) -> tuple[str, list[str], bool] | None:
        fields = self._fields(room_id)
        if "question" not in fields:
            return None
        return fields["question"], json.loads(fields["options"]), "counts" in fields

    def _answer(self, room_id: str, follower_id: str, option: str) -> None:
        self._fields(room_id)
        self._write(room_id, {}, answer=(follower_id, option))

    def _tally(self, room_id: str) -> Tally | None:
        fields = self._fields(room_id)
        if "question" not in fields:
            return None
        counts = json.loads(fields["counts"]) if "counts" in fields else None
        answers = {} if counts is not None else self._call(lambda: self._redis.hgetall(self._keys(room_id)[1]))
        return _tally_of(fields["question"], json.loads(fields["options"]), answers, counts, fields.get("meta"))

    def _reveal(self, room_id: str) -> Tally:
        fields = self._fields(room_id)
        options = json.loads(fields["options"])
        if "counts" in fields:
            return _tally_of(fields["question"], options, {}, json.loads(fields["counts"]), fields.get("meta"))
        room, answers = self._keys(room_id)

        def run() -> Tally:
            # WATCH: an answer that lands between reading the answers and writing the counts makes the transaction
            # fail and run again, so no answer is lost to a reveal on another replica.
            with self._redis.pipeline(transaction=True) as p:
                while True:
                    try:
                        p.watch(answers)
                        tally = _tally_of(fields["question"], options, p.hgetall(answers), None, fields.get("meta"))
                        p.multi()
                        p.hset(room, mapping={"counts": json.dumps(tally.counts), "touched": repr(self.clock())})
                        p.delete(answers)
                        p.expire(room, ROOM_TTL_S)
                        p.execute()
                        return dataclasses.replace(tally, revealed=True)
                    except self._watch_error:
                        continue

        return self._call(run)

    def _delete(self, room_id: str) -> None:
        def delete() -> None:
            with self._redis.pipeline(transaction=True) as p:
                p.delete(*self._keys(room_id), self._followers_key(room_id), self._results_key(room_id))
                p.zrem(self.ROOMS, room_id)
                p.execute()

        self._call(delete)

    def _beat(self, room_id: str, now: float) -> None:
        self._call(lambda: self._redis.hset(self._keys(room_id)[0], "seen", repr(now)))  # HSET keeps the TTL

    def _status(self, room_id: str) -> tuple[int, float]:
        fields = self._fields(room_id, "version", "seen")
        return int(fields.get("version", 0)), float(fields["seen"])


def store_from_env(env: Mapping[str, str] | None = None, clock: Callable[[], float] = time.time,
                   **caps: int | None) -> RoomStore:
    """The store KVVIZ_ROOM_STORE names: unset, empty or "memory" → in-process; "redis://…" → Redis; `caps`:
    max_rooms, max_followers (a hosted demo's)."""
    value = (os.environ if env is None else env).get(STORE_ENV, "").strip()
    if value in ("", "memory"):
        return MemoryStore(clock, **caps)
    if value.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(value, clock, **caps)
    raise InputError("room.bad_store", value=value, name=STORE_ENV)
