"""The room store's contract, the same tests on both stores (in-process and a real redis-server)."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvviz.errors import InputError
from kvviz.room.store import (
    FOLLOWER_GONE_S,
    LECTURER_GONE_S,
    ROOM_TTL_S,
    MemoryStore,
    RedisStore,
    store_from_env,
)
from kvviz.serving.llamacpp import free_port

OPTIONS = ("append", "rebuild", "logits", "last_layer")


def _error(fn, *args) -> str:
    with pytest.raises(InputError) as e:
        fn(*args)
    return e.value.locale_key


def test_room_ids_and_secrets_are_unguessable_and_separate(store):
    rooms = [store.create() for _ in range(20)]
    for room in rooms:
        # token_urlsafe(16): 16 random bytes, 22 base64url characters, at least 96 bits as asked
        assert len(room.id) == 22 and len(room.secret) == 43
        assert room.secret not in room.id and room.id not in room.secret
    assert len({r.id for r in rooms}) == 20 and len({r.secret for r in rooms}) == 20


def test_publish_and_read_versions(store):
    room = store.create()
    assert store.read(room.id) == (0, None)
    snap = {"step": 3, "tokens": ["The", " cat"], "row": [0.25, 0.75], "bytes": 4096}
    assert store.publish(room.id, room.secret, snap) == 1
    assert store.read(room.id) == (1, snap)
    assert store.publish(room.id, room.secret, {**snap, "step": 4}) == 2
    assert store.read(room.id) == (2, {**snap, "step": 4})
    assert store.status(room.id) == (2, False)  # a poll's question: the version alone, no snapshot


def test_wrong_secret_is_refused(store):
    room, other = store.create(), store.create()
    store.publish(room.id, room.secret, {"step": 1})
    for fn, args in ((store.publish, (room.id, other.secret, {"step": 9})), (store.end, (room.id, "")),
                     (store.open_question, (room.id, room.id, "q", OPTIONS)), (store.reveal, (room.id, other.secret))):
        assert _error(fn, *args) == "room.not_lecturer"
    assert store.read(room.id) == (1, {"step": 1})  # nothing changed


def test_unknown_room_is_gone(store):
    assert _error(store.read, "no-such-room") == "room.gone"
    assert _error(store.status, "no-such-room") == "room.gone"
    assert _error(store.answer, "no-such-room", "q", "f", "append") == "room.gone"


def test_a_snapshot_is_plain_json(store):
    room = store.create()
    assert _error(store.publish, room.id, room.secret, {"x": object()}) == "room.bad_snapshot"
    assert _error(store.publish, room.id, room.secret, {"x": float("nan")}) == "room.bad_snapshot"
    assert store.read(room.id) == (0, None)


def test_one_answer_per_follower_changeable_until_reveal(store):
    room = store.create()
    assert store.tally(room.id) is None
    assert _error(store.answer, room.id, "cache_update", "f1", "append") == "room.question_closed"
    store.open_question(room.id, room.secret, "cache_update", OPTIONS)
    store.answer(room.id, "cache_update", "f1", "append")
    store.answer(room.id, "cache_update", "f2", "rebuild")
    store.answer(room.id, "cache_update", "f2", "append")  # f2 changes their mind: still one answer
    store.answer(room.id, "cache_update", "f3", "logits")
    poll = store.tally(room.id)
    assert poll.counts == {"append": 2, "rebuild": 0, "logits": 1, "last_layer": 0}
    assert (poll.total, poll.revealed) == (3, False)
    assert _error(store.answer, room.id, "cache_update", "f4", "nonsense") == "room.bad_option"
    assert _error(store.answer, room.id, "why_kv", "f4", "append") == "room.question_closed"
    revealed = store.reveal(room.id, room.secret)
    assert revealed.revealed and revealed.counts == poll.counts
    assert _error(store.answer, room.id, "cache_update", "f1", "logits") == "room.revealed"
    assert store.tally(room.id) == revealed
    # the next question starts from zero
    store.open_question(room.id, room.secret, "m_optional", ("true", "false"))
    store.answer(room.id, "m_optional", "f1", "false")
    assert store.tally(room.id).counts == {"true": 0, "false": 1}
    assert not store.tally(room.id).revealed


def test_answers_from_many_sessions_at_once_are_all_counted(store):
    room = store.create()
    store.open_question(room.id, room.secret, "q", OPTIONS)

    def answer(i: int) -> None:  # followers answer at once, from as many threads as the app server would use
        store.answer(room.id, "q", f"follower-{i}", OPTIONS[i % 4])
        store.answer(room.id, "q", f"follower-{i}", OPTIONS[(i + 1) % 4])  # and change their minds

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(answer, range(60)))
    assert store.reveal(room.id, room.secret).counts == {"append": 15, "rebuild": 15, "logits": 15, "last_layer": 15}


def test_counts_only_nothing_after_end(store):
    room = store.create()
    store.publish(room.id, room.secret, {"step": 1})
    store.open_question(room.id, room.secret, "q", OPTIONS)
    store.answer(room.id, "q", "follower-session-1", "append")
    store.reveal(room.id, room.secret)
    if isinstance(store, RedisStore):  # after the reveal Redis holds counts, not who picked what
        dump = " ".join(f"{k}={store._redis.hgetall(k) if store._redis.type(k) == 'hash' else ''}"
                        for k in store._redis.keys("*"))
        assert "follower-session-1" not in dump
    else:
        assert store._rooms[room.id].answers == {}
    store.end(room.id, room.secret)
    assert _error(store.read, room.id) == "room.gone"
    assert _error(store.tally, room.id) == "room.gone"
    if isinstance(store, RedisStore):
        assert store._redis.keys("*") == []
    else:
        assert store._rooms == {}


def test_expires_two_hours_after_the_last_change(store, clock):
    room = store.create()
    store.publish(room.id, room.secret, {"step": 1})
    clock.now += ROOM_TTL_S - 1
    assert store.read(room.id) == (1, {"step": 1})  # reading is not a change
    store.publish(room.id, room.secret, {"step": 2})  # a change: two more hours
    clock.now += ROOM_TTL_S - 1
    store.open_question(room.id, room.secret, "q", OPTIONS)
    clock.now += ROOM_TTL_S - 1
    store.answer(room.id, "q", "f", "append")  # an answer is a change too
    clock.now += ROOM_TTL_S - 1
    assert store.read(room.id)[0] == 2
    clock.now += 2
    assert _error(store.read, room.id) == "room.gone"
    assert _error(store.status, room.id) == "room.gone"  # two hours after the last change, as read() says
    assert _error(store.publish, room.id, room.secret, {"step": 3}) == "room.gone"


def test_the_lecturer_left_when_no_sign_for_a_while(store, clock):
    room = store.create()
    assert store.status(room.id) == (0, False)  # the poll's version and "left" together
    clock.now += LECTURER_GONE_S + 1
    assert store.status(room.id) == (0, True)
    store.beat(room.id, room.secret)
    assert store.status(room.id) == (0, False)
    clock.now += LECTURER_GONE_S + 1
    store.publish(room.id, room.secret, {"step": 1})  # a publish is a sign too
    assert store.status(room.id) == (1, False)
    assert _error(store.beat, room.id, "not-the-secret") == "room.not_lecturer"
    # a beat is not a change: the room still ends two hours after its last change
    clock.now += ROOM_TTL_S - 1
    store.beat(room.id, room.secret)
    clock.now += 2
    assert _error(store.read, room.id) == "room.gone"


def test_a_polls_status_says_the_lecturer_left_and_the_version_kept(store, clock):
    room = store.create()
    store.publish(room.id, room.secret, {"step": 1})
    clock.now += LECTURER_GONE_S + 1
    assert store.status(room.id) == (1, True)
    store.beat(room.id, room.secret)
    assert store.status(room.id) == (1, False)


def test_rooms_per_server_cap(store, clock):
    store.max_rooms = 2
    a, b = store.create(), store.create()
    with pytest.raises(InputError) as e:
        store.create()
    assert e.value.locale_key == "room.too_many_rooms" and "2 open rooms" in str(e.value)
    store.end(a.id, a.secret)  # an ended room frees its place
    c = store.create()
    clock.now += ROOM_TTL_S / 2
    store.publish(c.id, c.secret, {"step": 1})  # c changed since; b did not
    clock.now += ROOM_TTL_S / 2 + 1
    store.create()  # b expired: its place is free (in Redis as in memory)
    assert _error(store.create) == "room.too_many_rooms"
    assert _error(store.read, b.id) == "room.gone"


def test_followers_per_room_cap(store, clock):
    store.max_followers = 3
    room, other = store.create(), store.create()
    assert [store.hold_seat(room.id, f"f{i}") for i in range(3)] == [1, 2, 3]
    with pytest.raises(InputError) as e:
        store.hold_seat(room.id, "f3")
    assert e.value.locale_key == "room.full" and "3 followers" in str(e.value)
    assert store.hold_seat(room.id, "f1") == 3  # a follower already in keeps its seat at every poll
    assert store.hold_seat(other.id, "f3") == 1  # the cap is per room
    clock.now += FOLLOWER_GONE_S - 1
    store.hold_seat(room.id, "f0")
    store.hold_seat(room.id, "f1")
    clock.now += 2  # f2 has not polled for FOLLOWER_GONE_S + 1: a closed tab, its seat is free
    assert store.hold_seat(room.id, "f3") == 3
    assert _error(store.hold_seat, room.id, "f2") == "room.full"
    store.max_followers = None  # not hosted: no cap
    assert store.hold_seat(room.id, "f4") == 4
    store.end(room.id, room.secret)
    assert _error(store.hold_seat, room.id, "f0") == "room.gone"


def test_followers_from_many_sessions_at_once_never_pass_the_cap(store):
    store.max_followers = 10
    room = store.create()

    def seat(i: int) -> str:
        try:
            store.hold_seat(room.id, f"follower-{i}")
            return "in"
        except InputError as e:
            return e.locale_key

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(seat, range(40)))
    assert got.count("in") == 10 and got.count("room.full") == 30


def test_redis_keys_carry_the_ttl(redis_url, clock):
    store = RedisStore(redis_url, clock)
    room = store.create()
    store.open_question(room.id, room.secret, "q", OPTIONS)
    store.answer(room.id, "q", "f", "append")
    store.hold_seat(room.id, "f")
    for key in (*store._keys(room.id), store._followers_key(room.id)):
        assert 0 < store._redis.ttl(key) <= ROOM_TTL_S


def test_redis_unreachable_is_a_clear_error(clock):
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", clock)  # nothing listens there
    with pytest.raises(InputError) as e:
        store.create()
    assert e.value.locale_key == "room.store_down" and "sharing with the room stopped" in str(e.value).lower()


def test_store_from_env(redis_url):
    assert isinstance(store_from_env({}), MemoryStore)
    assert isinstance(store_from_env({"KVVIZ_ROOM_STORE": "memory"}), MemoryStore)
    assert isinstance(store_from_env({"KVVIZ_ROOM_STORE": redis_url}), RedisStore)
    with pytest.raises(InputError) as e:
        store_from_env({"KVVIZ_ROOM_STORE": "postgres://x"})
    assert e.value.locale_key == "room.bad_store" and "postgres://x" in str(e.value)


def test_the_tally_is_hidden_unless_the_lecturer_shows_it(store):
    room = store.create()
    store.open_question(room.id, room.secret, "q", OPTIONS)
    assert store.tally(room.id).show_tally is False  # the default: hidden until the reveal
    store.answer(room.id, "q", "f1", "append")
    assert store.reveal(room.id, room.secret).show_tally is False
    store.open_question(room.id, room.secret, "q2", OPTIONS, show_tally=True)
    assert store.tally(room.id).show_tally is True
    assert _error(store.open_question, room.id, room.secret, "q3", OPTIONS, "no-such-option") == "room.bad_options"


def test_results_keep_every_question_asked_until_the_room_ends(store, clock):
    room = store.create()
    assert store.results(room.id, room.secret) == []
    store.open_question(room.id, room.secret, "q1", OPTIONS, answer="append")
    opened = clock.now
    for i, option in enumerate(("append", "append", "rebuild")):
        store.answer(room.id, "q1", f"f{i}", option)
    clock.now += 40
    store.reveal(room.id, room.secret)
    store.reveal(room.id, room.secret)  # a second reveal is not a second question
    clock.now += 20
    store.open_question(room.id, room.secret, "q2", ("true", "false"), answer="false")
    store.answer(room.id, "q2", "f0", "true")
    clock.now += 5
    store.open_question(room.id, room.secret, "q3", ("true", "false"))  # q2 replaced before its reveal
    store.answer(room.id, "q3", "f0", "false")
    results = store.results(room.id, room.secret)
    assert [(a.question, a.counts, a.answer) for a in results] == [
        ("q1", {"append": 2, "rebuild": 1, "logits": 0, "last_layer": 0}, "append"),
        ("q2", {"true": 1, "false": 0}, "false"),
        ("q3", {"true": 0, "false": 1}, None),  # still open: its counts so far
    ]
    assert (results[0].opened, results[0].revealed) == (opened, opened + 40)
    assert results[1].revealed is None and results[2].revealed is None
    assert _error(store.results, room.id, "") == "room.not_lecturer"
    store.end(room.id, room.secret)
    assert _error(store.results, room.id, room.secret) == "room.gone"
    if isinstance(store, RedisStore):  # nothing of the room is left in Redis
        assert not store._redis.exists(store._results_key(room.id))
