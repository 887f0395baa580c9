"""kvviz.serving.kv_run on trees built from events kvviz computes the hashes of (kv_attribution.block_hashes): a load
run's requests looked up at their send times (a hit, an eviction before the send, a block stored after it), what
cannot be known said per request, and the blocks per second binned on the point's own clock. The same against vLLM's
own manager is tests/serving/test_kv_run_vllm.py. Also kvviz.serving.client.cache_ids and detokenize against a
server without /tokenize nor /detokenize, and the tree's chains named by a detokenizer (kv_watch.name_chains)."""
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvviz.charts.kv_events import first_tokens
from kvviz.serving import client as api
from kvviz.serving.kv_attribution import block_hashes, external
from kvviz.serving.kv_events import Batch, Removed, Stored
from kvviz.serving.kv_run import MAX_BINS, attribute_run, bin_width_s, point_end_s, run_rates
from kvviz.serving.kv_tree import BlockTree
from kvviz.serving.kv_watch import name_chains

T0 = 1_000_000.25  # the point's start on the wall clock (inside a whole second, as a real start is)
A = list(range(100, 112))  # 3 blocks of 4
B = list(range(200, 212))


def stored(tokens: list[int], ts: float, tree: BlockTree, seq: int) -> list[bytes]:
    hashes = block_hashes(tokens, 4)
    tree.apply(Batch(seq, ts, [Stored(tuple(hashes), None, tuple(tokens[:4 * len(hashes)]), 4, "GPU", 0)], "map"))
    return hashes


def run_of(rows: list[dict], start: float = T0) -> dict:
    return {"points": [{"request_rate": "inf", "max_concurrency": 1, "start_unix_s": start, "requests": rows}]}


def row(i: int, start_s: float, ids: list[int] | None, source: str = "sent", e2e_s: float = 0.1) -> dict:
    return {"request": i, "start_s": start_s, "e2e_s": e2e_s, "cache_ids": ids, "cache_ids_from": source,
            "cached_tokens": None}


def test_each_request_looked_up_at_its_send_time():
    tree = BlockTree()
    a = stored(A, T0 + 0.5, tree, 0)  # A's blocks stored after the first request was sent
    tree.apply(Batch(1, T0 + 1.5, [Removed((a[2],), "GPU", 0)], "map"))  # A's last block evicted
    stored(B, T0 + 2.5, tree, 2)
    run = run_of([row(0, 0.0, A + [1]), row(1, 1.0, A + [2]), row(2, 2.0, A + [3]), row(3, 3.0, B[:8] + [9] * 5)])
    view = attribute_run(tree, run, algo="sha256", seed=None, since_unix=T0 - 1)
    rows = view["rows"]
    assert view["block_size"] == 4 and view["unknown"] == {}
    # sent before A was stored: nothing; then all three of A's blocks; then two, the third evicted at 1.5 s
    assert [r["hit_blocks"] for r in rows] == [0, 3, 2, 2]
    assert [r["reason"] for r in rows] == ["never", None, "evicted", "diverged"]
    assert rows[2]["removed_s"] == pytest.approx(1.5) and rows[2]["first_miss"] == 2
    assert [r["lookup"] for r in rows] == [3, 3, 3, 3] and [r["sent_s"] for r in rows] == [0.0, 1.0, 2.0, 3.0]
    assert view["summary"] == {"requests": 4, "hit_blocks": 7, "lookup_blocks": 12,
                               "first_miss": {"evicted": 1, "reset": 0, "diverged": 1, "never": 1, "unseeded": 0}}


def test_what_cannot_be_known_is_said_per_request():
    tree = BlockTree()
    run = run_of([row(0, 0.0, A + [1]), row(1, 0.5, None, "no_tokenize"),
                  {"request": 2, "start_s": 1.0, "e2e_s": 0.1}])  # a run that kept no prompts
    assert [r["unknown"] for r in attribute_run(tree, run, algo="sha256", seed=None, since_unix=T0)["rows"]] == [
        "no_block_size", "no_tokenize", "no_ids"]  # nothing stored yet: the block size is unknown
    stored(B, T0 + 0.2, tree, 0)
    view = attribute_run(tree, run, algo="sha256", seed=None, since_unix=T0 + 0.1)  # subscribed after the first
    assert [r["unknown"] for r in view["rows"]] == ["before_events", "no_tokenize", "no_ids"]
    assert view["unknown"] == {"before_events": 1, "no_tokenize": 1, "no_ids": 1}
    assert view["summary"]["requests"] == 0 and view["rows"][0]["hit_blocks"] is None
    never = attribute_run(tree, run, algo="sha256", seed=None, since_unix=None)  # not subscribed
    assert never["rows"][0]["unknown"] == "before_events"


def test_another_seed_is_said_not_misread_as_never_stored():
    """64-bit hashes (vLLM 0.34.0's default) of a server under PYTHONHASHSEED=1234: told the seed, kvviz finds A's
    blocks; not told, it says the request's attribution is unknown rather than "never stored"."""
    tree = BlockTree()
    hashes = tuple(external(h, True) for h in block_hashes(A, 4, seed="1234"))
    tree.apply(Batch(0, T0 + 0.1, [Stored(hashes, None, tuple(A), 4, "GPU", 0)], "map"))
    run = run_of([row(0, 1.0, A + [1]), row(1, 1.0, B + [1])])
    told = attribute_run(tree, run, algo="sha256", seed="1234", since_unix=T0)["rows"]
    assert [(r["hit_blocks"], r["unknown"]) for r in told] == [(3, None), (0, None)]
    untold = attribute_run(tree, run, algo="sha256", seed=None, since_unix=T0)["rows"]
    assert [(r["hit_blocks"], r["unknown"]) for r in untold] == [(None, "other_seed"), (0, None)]
    assert untold[1]["reason"] == "never"  # B's first block's tokens were never stored, whatever the seed


def test_blocks_per_second_on_the_points_clock():
    log = [(T0 - 0.1, 0, 5), (T0 + 0.2, 0, 3), (T0 + 0.9, 1, 2), (T0 + 1.1, 0, 4), (T0 + 3.7, 1, 1), (T0 + 9, 0, 8)]
    bins = run_rates(log, T0, 3.2)
    # four one-second bins from the start (the last holds 3.2 s): before the start and after the end left out
    assert [(b["t_s"], b["stored"], b["removed"]) for b in bins] == [(0.5, 3, 2), (1.5, 4, 0), (2.5, 0, 0),
                                                                      (3.5, 0, 1)]
    assert point_end_s({"requests": [row(0, 0.0, A, e2e_s=1.0), row(1, 2.0, A, e2e_s=1.2)]}) == pytest.approx(3.2)
    assert point_end_s({"requests": []}) == 0.0
    # a point of 25 ms in bins of 10 ms (rates still per second), one of 100 s in 5 s bins
    assert [bin_width_s(s) for s in (0.025, 0.4, 3.2, 100.0, 10_000.0)] == [0.01, 0.01, 0.1, 5.0, 60.0]
    assert all(s / bin_width_s(s) <= MAX_BINS for s in (0.01, 0.4, 0.41, 39.9, 2400.0))
    fine = run_rates(log, T0, 0.5, bin_width_s(0.5))  # 0.02 s bins: 3 blocks in 20 ms are 150 blocks per second
    assert len(fine) == 25 and max(b["stored"] for b in fine) == pytest.approx(150.0)
    assert sum(b["stored"] for b in fine) * 0.02 == pytest.approx(3)
    assert sum(b["removed"] for b in fine) == 0  # the removal at 0.9 s is after this point's end


class _NoTokenize(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_cache_ids_from_the_prompt_or_the_server_and_never_guessed():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NoTokenize)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = api.Server(f"http://127.0.0.1:{httpd.server_address[1]}")
        assert api.cache_ids(server, "m", "completions", [5, 6, 7]) == ([5, 6, 7], "sent")  # as vLLM takes ids
        assert api.cache_ids(server, "m", "completions", "some text") == (None, "no_tokenize")
        assert api.cache_ids(server, "m", "chat", "some text") == (None, "no_tokenize")
        assert api.detokenize(server, "m", [1, 2]) is None
    finally:
        httpd.shutdown()


def test_chains_named_by_the_servers_detokenizer_ids_where_it_cannot():
    chains = [{"first_tokens": [1, 2]}, {"first_tokens": [3]}, {"first_tokens": [1, 2]}, {"first_tokens": [9]}]
    asked = []

    def fetch(ids: list[int]) -> str | None:
        asked.append(ids)
        return None if ids == [9] else "<b>" + "ab" * ids[0] + "\n"

    texts: dict = {}
    name_chains(chains, texts, fetch, limit=2)  # two asked this look, the rest the next
    assert asked == [[1, 2], [3]] and [c["first_text"] for c in chains] == ["<b>ab\n", "<b>ababab\n", "<b>ab\n", None]
    name_chains(chains, texts, fetch, limit=2)
    assert asked[2:] == [[9]] and chains[3]["first_text"] is None  # asked once: the server could not say
    name_chains(chains, texts, fetch)
    assert len(asked) == 3
    # the hover: text quoted, escaped (Plotly reads tags), line breaks shown; ids where unknown
    assert first_tokens(chains[0]) == "“&lt;b&gt;ab↵”" and first_tokens(chains[3]) == "9"
    assert first_tokens({"first_tokens": [1], "first_text": "x" * 70}) == "“" + "x" * 60 + "…”"
