"""KV events without a server: vLLM 0.34.0's wire format and an older one decoded, the tree's rules (copies,
parents, orphans, resets, history), the attribution's reasons on a hand-made tree, and the faults over a loopback
socket (tests/serving/kv_fake_publisher.py): a missed batch fetched from the replay socket or marked, an unknown
schema named and skipped, a restarted publisher, a flood folded at the reader's rate, an endpoint that refuses, one
that stays silent; the `kv-events` command's output and one-line errors; the charts on a phone."""
import json
import time

import msgspec
import pytest

from kvviz.cli import main
from kvviz.serving.kv_attribution import attribute, block_hashes, external
from kvviz.serving.kv_events import Batch, Cleared, Removed, Stored, Subscriber, UnknownSchema, decode_payload
from kvviz.serving.kv_tree import BlockTree
from kvviz.serving.kv_watch import Watch
from tests.serving.kv_fake_publisher import FakePublisher, free_port


def stored(hashes, parent, size=2, medium="GPU", start=0):
    return Stored(tuple(hashes), parent, tuple(range(start, start + size * len(hashes))), size, medium, 0)


def test_vllm_0_34_layout_and_the_older_one_decode_alike():
    # vLLM 0.34.0: the batch an array, each event a map with its tag under "type", defaults left out, fields a
    # later release adds (session_id) ignored
    raw = msgspec.msgpack.encode([12.5, [
        {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None, "token_ids": [1, 2, 3, 4],
         "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0,
         "session_id": "s1"},
        {"type": "BlockRemoved", "block_hashes": [8], "medium": "GPU"}, {"type": "AllBlocksCleared"},
        {"type": "BlockPinned", "block_hashes": [7]}], 0])
    batch = decode_payload(raw, 3)
    assert (batch.seq, batch.ts, batch.layout, batch.dp_rank) == (3, 12.5, "map", 0)
    assert batch.events == [Stored((7, 8), None, (1, 2, 3, 4), 2, "GPU", 0), Removed((8,), "GPU"), Cleared()]
    assert batch.unknown_events == ["BlockPinned"]
    # an older release (and SGLang): events as arrays, the tag first, trailing defaults left out
    old = msgspec.msgpack.encode([1.0, [["BlockStored", [b"\x01"], None, [5, 6], 2, None, None],
                                        ["BlockRemoved", [b"\x01"], None]]])
    batch = decode_payload(old, 0)
    assert batch.layout == "array" and batch.events[0].hashes == (b"\x01",) and batch.events[0].medium is None
    assert batch.events[1] == Removed((b"\x01",), None, None)


@pytest.mark.parametrize("payload, what", [
    (b"\xc1not msgpack", "not msgpack"),
    (msgspec.msgpack.encode({"version": 2, "blocks": []}), "no events list"),
    (msgspec.msgpack.encode(["yesterday", []]), "time is str"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                    "token_ids": [1, 2, 3], "block_size": 2, "lora_id": None, "medium": None,
                                    "lora_name": None}]]), "1 blocks, 3 tokens"),
])
def test_a_payload_of_no_known_schema_is_named(payload, what):
    with pytest.raises(UnknownSchema) as exc:
        decode_payload(payload, 0)
    assert what in exc.value.what


def test_tree_copies_parents_orphans_and_reset():
    tree = BlockTree()
    tree.apply(Batch(0, 1.0, [stored([1, 2, 3], None)], "map"))
    tree.apply(Batch(1, 2.0, [stored([4], 2, start=4), stored([2], 1, start=2)], "map"))  # a branch; a copy of 2
    assert tree.cached() == {(0, 1): 1, (0, 2): 2, (0, 3): 1, (0, 4): 1}
    assert tree.parents()[(0, 4)] == 2 and {b.key for b in tree.children_of(0, 2)} == {(0, 3), (0, 4)}
    chains = tree.chains()
    # 1 and 2 one chain (2 is 1's only child), then the branch: 3 and 4 under it
    assert [(c["blocks"], c["leaves"], c["parent"]) for c in chains["chains"]] == [
        (2, 2, "g0"), (1, 1, "0:1"), (1, 1, "0:1")]
    # the parent goes first (a duplicate's last copy): its children hang under "?" until it is stored again
    tree.apply(Batch(2, 3.0, [Removed((2, 2), "GPU", 0)], "map"))
    assert (0, 2) not in tree.blocks and tree.orphans() == 2
    assert {c["parent"] for c in tree.chains()["chains"] if c["depth"] is None} == {"?0"}
    tree.apply(Batch(3, 4.0, [stored([2], 1, start=2)], "map"))
    assert tree.orphans() == 0 and len(tree.children_of(0, 2)) == 2
    tree.apply(Batch(4, 5.0, [Removed((9,), "GPU", 0)], "map"))
    assert tree.unknown_removed == 1
    tree.mark_incomplete("gap", first=5, last=5, n=1)
    tree.apply(Batch(5, 6.0, [Cleared()], "map"))
    assert tree.cached() == {} and tree.incomplete == [] and tree.cleared == 1
    # the history: block 2 was cached at 2.5, gone at 3.5 (evicted), back at 4.5, then reset at 6
    h = tree.history
    assert h.present_at((0, 2), 2.5) and not h.present_at((0, 2), 3.5) and h.present_at((0, 2), 4.5)
    assert h.last_removed_before((0, 2), 3.5) == (3.0, False) and h.last_removed_before((0, 2), 7) == (6.0, True)


def test_attribution_reasons_on_a_tree_built_from_vllm_hashes():
    prompt_a = list(range(100, 112))  # 3 blocks of 4
    ha = [external(h, True) for h in block_hashes(prompt_a, 4)]
    tree = BlockTree()
    tree.apply(Batch(0, 1.0, [Stored(tuple(ha), None, tuple(prompt_a), 4, "GPU", 0)], "map"))
    # A again: 3 full blocks, the last holds the last token (vLLM computes it): 2 hit, 1 beyond the lookup
    again = attribute(tree, prompt_a, 4).as_dict()
    assert again["hit_blocks"] == 2 and again["reasons"] == ["hit", "hit", "last_token"]
    # A's first 8 tokens, then others: diverged at block 2
    other = attribute(tree, prompt_a[:8] + [1, 2, 3, 4, 5], 4).as_dict()
    assert other["hit_tokens"] == 8 and other["reason"] == "diverged" and other["first_miss"] == 2
    assert attribute(tree, [9] * 9, 4).as_dict()["reasons"] == ["never", "after_miss"]
    tree.apply(Batch(1, 2.0, [Removed((ha[0],), "GPU", 0)], "map"))
    gone = attribute(tree, prompt_a + [1], 4).as_dict()
    assert gone["reason"] == "evicted" and gone["removed_ts"] == 2.0 and gone["hit_blocks"] == 0
    # at 1.5 (the history), before the eviction: 3 hits
    assert attribute(tree, prompt_a + [1], 4, at=1.5).hits == 3


def loopback(pub: FakePublisher, **kw) -> Subscriber:
    sub = Subscriber(pub.endpoint, pub.replay_endpoint, **kw)
    assert sub.wait_connected(5)
    time.sleep(0.2)
    return sub


def collect(sub: Subscriber, tree: BlockTree, until, timeout: float = 5.0) -> list:
    got = []
    deadline = time.monotonic() + timeout
    while not until(tree) and time.monotonic() < deadline:
        items = sub.poll(0.05)
        tree.take(items)
        got += items
    return got


def test_a_missed_batch_comes_from_the_replay_socket():
    pub = FakePublisher()
    sub, tree = loopback(pub), BlockTree()
    try:
        pub.send([stored([1], None)])
        pub.send([stored([2], 1, start=2)], lose=True)  # never reaches the subscriber
        pub.send([stored([3], 2, start=4)])
        got = collect(sub, tree, lambda t: t.batches == 3)
        assert tree.cached() == {(0, 1): 1, (0, 2): 1, (0, 3): 1} and tree.incomplete == []
        assert tree.replayed == 1 and any(getattr(i, "kind", "") == "gap_filled" for i in got)
    finally:
        sub.close()
        pub.close()


def test_a_gap_the_replay_cannot_fill_marks_the_tree_until_a_reset():
    pub = FakePublisher(replay=False)
    sub, tree = loopback(pub, replay_timeout_s=0.2), BlockTree()
    try:
        pub.send([stored([1], None)])
        pub.send([stored([2], 1, start=2)], lose=True)
        pub.send([stored([3], 2, start=4)])
        collect(sub, tree, lambda t: t.batches == 2)
        assert tree.incomplete == [{"reason": "gap", "first": 1, "last": 1, "n": 1}] and tree.orphans() == 1
        pub.send([Cleared()])
        collect(sub, tree, lambda t: t.cleared == 1)
        assert tree.incomplete == [] and tree.cached() == {}
    finally:
        sub.close()
        pub.close()


def test_unknown_schema_is_skipped_and_named_then_events_go_on():
    pub = FakePublisher()
    sub, tree = loopback(pub), BlockTree()
    try:
        pub.payload(msgspec.msgpack.encode({"schema": 9, "blocks": [1, 2]}))
        pub.send([stored([1], None)])
        collect(sub, tree, lambda t: t.batches == 1)
        assert tree.skipped == {"a dict with no events list": 1} and tree.cached() == {(0, 1): 1}
        assert tree.incomplete == []  # skipped, not missed: no gap
    finally:
        sub.close()
        pub.close()


def test_a_restarted_publisher_empties_the_tree():
    port, replay_port = free_port(), free_port()
    pub = FakePublisher(port=port, replay_port=replay_port)
    sub, tree = loopback(pub), BlockTree()
    try:
        for i in range(3):
            pub.send([stored([10 + i], None if i == 0 else 9 + i, start=2 * i)])
        collect(sub, tree, lambda t: t.batches == 3)
        pub.close()
        pub = FakePublisher(port=port, replay_port=replay_port)  # the server again: its sequence from 0
        # libzmq's PUB may drop what it sends before the subscriber has reconnected: a new block every 0.2 s until
        # one arrives; those missed come from the replay socket
        sent = 0
        while tree.restarts == 0 and sent < 30:
            pub.send([stored([20 + sent], None if sent == 0 else 19 + sent, start=2 * sent)])
            sent += 1
            collect(sub, tree, lambda t: t.restarts == 1, timeout=0.2)
        collect(sub, tree, lambda t: len(t.blocks) == sent)
        assert tree.restarts == 1 and set(tree.cached()) == {(0, 20 + i) for i in range(sent)}
        assert tree.incomplete == []
    finally:
        sub.close()
        pub.close()


def test_a_flood_is_folded_and_drawn_at_the_readers_rate():
    pub = FakePublisher()
    watch = Watch(pub.endpoint, pub.replay_endpoint)
    try:
        assert watch.wait_connected(5)
        time.sleep(0.5)
        n = 20_000
        for i in range(n):  # one block stored and the one before it removed, per batch
            pub.send([stored([i + 1], i or None, start=2 * i)] + ([Removed((i,), "GPU", 0)] if i else []))
        deadline, folded, looks = time.monotonic() + 60, 0, 0
        while time.monotonic() < deadline:
            time.sleep(0.25)
            state = watch.state()
            folded += state["folded"]
            looks += 1
            if state["summary"]["batches"] == n:
                break
        assert state["summary"]["batches"] == n == folded and looks < n / 100  # many batches per drawing
        assert state["summary"]["blocks"] == 1 and state["summary"]["stored"] == n and state["status"] == "receiving"
    finally:
        watch.close()
        pub.close()


def test_unreachable_and_silent_endpoints_say_so():
    closed = Watch(f"tcp://127.0.0.1:{free_port()}", quiet_after_s=0.5)
    pub = FakePublisher(replay=False)
    silent = Watch(pub.endpoint, quiet_after_s=0.5)
    try:
        assert closed.state()["status"] == "waiting"
        time.sleep(1.0)
        assert closed.state()["status"] == "unreachable" and silent.state()["status"] == "silent"
    finally:
        closed.close()
        silent.close()
        pub.close()


def test_a_watch_nobody_reads_ends_itself_and_frees_its_sockets():
    """A page's reader is a browser tab that can close without a word: the watch's thread ends once unread for
    `unread_after_s`, closing its sockets; a watch that is read keeps going."""
    pub = FakePublisher()
    unread, read = (Watch(pub.endpoint, unread_after_s=0.6) for _ in range(2))
    try:
        for _ in range(8):
            time.sleep(0.2)
            read.state()
        unread._thread.join(timeout=5)
        assert not unread.alive and unread.ended_unread and unread.sub._sub.closed
        assert read.alive and not read.ended_unread
    finally:
        unread.close()
        read.close()
        pub.close()


def test_cli_json_lines_then_the_summary(capsys):
    pub = FakePublisher()
    try:
        import threading

        def later():
            time.sleep(1.0)
            pub.send([stored([1, 2], None, size=4)])
            pub.send([Removed((2,), "GPU", 0)])

        threading.Thread(target=later, daemon=True).start()
        assert main(["kv-events", "--endpoint", pub.endpoint, "--replay-endpoint", pub.replay_endpoint,
                     "--seconds", "2.5", "--every", "0.5", "--preset", "Llama-3.1-8B", "--json"]) == 0
    finally:
        pub.close()
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    summary = lines[-1]
    assert summary["blocks"] == 1 and summary["tokens"] == 4 and summary["stored"] == 2 and summary["removed"] == 1
    # Llama 3.1 8B in bfloat16: 2 (K, V) · 32 layers · 8 KV heads · 128 · 2 bytes per token
    assert summary["bytes_per_token"] == 131_072 and summary["bytes"] == 4 * 131_072
    assert all(set(x) >= {"t_s", "blocks", "folded"} for x in lines[:-1]) and len(lines) >= 4


@pytest.mark.parametrize("argv, words", [
    (["kv-events", "--endpoint", "localhost:5557"], "tcp://HOST:PORT"),
    (["kv-events", "--endpoint", "tcp://*:5557"], "tcp://HOST:PORT"),
    (["kv-events", "--endpoint", "tcp://no-such-host.invalid:5557"], "has no address"),
    (["kv-events", "--endpoint", "tcp://127.0.0.1:5557", "--replay-endpoint", "5558"], "replay"),
])
def test_cli_bad_endpoint_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and err.startswith("kvviz: error:")


def test_cli_silent_server_names_the_flag(capsys):
    pub = FakePublisher(replay=False)
    try:
        assert main(["kv-events", "--endpoint", pub.endpoint, "--seconds", "1.5", "--quiet-after", "0.5"]) == 1
    finally:
        pub.close()
    assert "--kv-events-config" in capsys.readouterr().err


def test_charts_draw_the_tree_and_rates_on_a_phone():
    from kvviz.charts.base import phone_layout
    from kvviz.charts.kv_events import rates_chart, tree_chart
    from kvviz.i18n import t

    tree = BlockTree()
    tree.apply(Batch(0, 1.0, [stored([1, 2, 3], None), stored([4], 2, medium="CPU", start=6)], "map"))
    chains = tree.chains()
    labels = {k: t(f"kv_events.{k}", "ko") for k in ("root", "unknown_parent", "box", "hover")} | {"title": "트리"}
    fig = tree_chart(chains["chains"], chains["groups"], labels)
    icicle = fig.data[0]
    assert list(icicle.parents) == ["", "g0", icicle.ids[1], icicle.ids[1]]  # the prompt's start, then the chains
    assert list(icicle.values) == [2, 2, 1, 1] and "CPU" in icicle.text[-1] and "×2" in icicle.text[1]
    assert icicle.text[0] == "프롬프트 시작 · 그룹 0"
    rates = rates_chart(tree.rate_rows(), {"title": "r", "stored": "s", "removed": "d", "x": "x", "y": "y"})
    assert list(rates.data[0].y) == [4] and list(rates.data[1].y) == [0]
    assert phone_layout(fig).layout.height >= fig.layout.height


def test_what_was_sent_before_subscribing_comes_from_the_replay():
    pub = FakePublisher()
    try:
        for i in range(4):
            pub.send([stored([i + 1], i or None, start=2 * i)])
        del pub.buffer[:1]  # the replay buffer has dropped the first batch (vLLM keeps the last buffer_steps)
        watch = Watch(pub.endpoint, pub.replay_endpoint)
        try:
            deadline = time.monotonic() + 10
            while watch.state()["summary"]["batches"] < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            pub.send([stored([5], 4, start=8)])  # then live, on the publisher's socket
            while watch.state()["summary"]["batches"] < 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            s = watch.state()["summary"]
        finally:
            watch.close()
    finally:
        pub.close()
    assert s["blocks"] == 4 and s["orphans"] == 1 and s["restarts"] == 0  # block 2 under the unseen block 1
    assert s["incomplete"] == [{"reason": "gap", "first": 0, "last": 0, "n": 1, "before": True}]


def test_cli_attributes_a_load_runs_prompts(tmp_path, capsys):
    a = list(range(200, 216))  # four blocks of 4
    ha = [external(h, True) for h in block_hashes(a, 4)]  # vLLM 0.34.0's default: sha256, 64-bit integers
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in (
        {"prompt_token_ids": a + [1]}, a[:8] + [9, 9, 9, 9, 9], [5] * 9, a)))
    pub = FakePublisher()
    try:
        import threading

        def later():
            time.sleep(0.8)
            pub.send([Stored(tuple(ha), None, tuple(a), 4, "GPU", 0)])
            pub.send([Removed((ha[3],), "GPU", 0)])

        threading.Thread(target=later, daemon=True).start()
        assert main(["kv-events", "--endpoint", pub.endpoint, "--replay-endpoint", pub.replay_endpoint,
                     "--seconds", "2", "--every", "1", "--prompts", str(prompts), "--block-size", "4",
                     "--json"]) == 0
    finally:
        pub.close()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = out["attribution"]
    assert [(r["hit_blocks"], r["reason"], r["first_miss"]) for r in rows] == [
        (3, "evicted", 3), (2, "diverged", 2), (0, "never", 0), (3, None, None)]
    assert out["attribution_summary"]["first_miss"] == {"evicted": 1, "reset": 0, "diverged": 1, "never": 1,
                                                         "unseeded": 0}
