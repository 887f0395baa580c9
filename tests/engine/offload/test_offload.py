"""Offload tiers in kvviz's engine (issue 25): chunks keyed by chained hashes, the longest stored prefix loaded from
CPU memory or disk, logits after a load equal to a full recompute, every miss explained, a store that survives a
restart and never uses a damaged file."""
import os

import pytest
import torch

from kvviz.engine.loading import load_backend
from kvviz.engine.offload import serde
from kvviz.engine.offload.serve import SCRIPT, OffloadDemo, serve, tier_costs
from kvviz.engine.offload.store import TieredStore, namespace
from kvviz.engine.paged.blocks import prompt_block_hashes
from kvviz.engine.paged.demo import shared_prefix_ids, suffix_ids
from kvviz.kv.formula import kv_footprint

C = 16  # small chunks: the rules are the same at LMCache's 256, the tests a lot faster


@pytest.fixture(scope="module")
def tiny():
    return load_backend("tiny", device="cpu")


def _store(backend, path, *, memory_chunks=8, disk_chunks=8, chunk=C):
    dtype = str(backend.dtype).removeprefix("torch.")
    per = kv_footprint(backend.spec, chunk, 1, dtype).total
    return TieredStore(path, namespace(backend.spec, dtype), chunk_size=chunk, memory_bytes=memory_chunks * per,
                       disk_bytes=disk_chunks * per + per // 2)


def test_chunk_keys_are_the_paged_cache_chain(tiny, tmp_path):
    store = _store(tiny, tmp_path)
    ids = shared_prefix_ids(tiny.tokenizer, 3 * C + 5)
    infos = store.chunk_infos(ids)
    assert [i.key for i in infos] == [h.hex() for h in prompt_block_hashes(ids, C, root=store.root_key)]
    assert [i.parent for i in infos] == [store.root_key.hex(), infos[0].key, infos[1].key]
    assert [(i.start, len(i.tokens)) for i in infos] == [(0, C), (C, C), (2 * C, C)]  # the partial tail is no chunk
    changed = list(ids)
    changed[C + 3] += 1
    other = store.chunk_infos(changed)
    assert other[0].key == infos[0].key and other[1].key != infos[1].key and other[2].key != infos[2].key
    # Another dtype (or model) is another namespace: the same tokens never find its chunks.
    bf16 = TieredStore(tmp_path / "b", namespace(tiny.spec, "bfloat16"), chunk_size=C, memory_bytes=1, disk_bytes=1)
    assert bf16.chunk_infos(ids)[0].key != infos[0].key


@pytest.mark.parametrize("model", ["tiny", "tiny-bfloat16", "smollm2"])
def test_logits_after_a_load_equal_a_full_recompute(model, tiny, request, tmp_path):
    if model == "tiny":
        backend = tiny
    elif model == "tiny-bfloat16":  # K/V stored and loaded in bfloat16: the tolerance is bfloat16's
        backend = load_backend("tiny", dtype="bfloat16", device="cpu")
    else:
        backend = request.getfixturevalue("smollm2")
    store = _store(backend, tmp_path)
    system = shared_prefix_ids(backend.tokenizer, 3 * C)
    first = serve(backend, store, system + suffix_ids(backend.spec.vocab_size, 5, 1), repeats=1)
    assert first.loaded.n_tokens == 0 and first.loaded.miss.reason == "never_stored"
    assert first.saved.n_chunks == 3
    second = serve(backend, store, system + suffix_ids(backend.spec.vocab_size, 7, 2), repeats=1)
    assert second.loaded.tokens_by_tier == {"memory": 3 * C, "disk": 0}
    assert second.loaded.miss.reason == "chunk_boundary" and second.loaded.miss.token == 3 * C
    assert second.logits.within and second.same_first_token, (second.logits.diff, second.logits.tolerance)
    # The bytes moved are the formula's, to the byte.
    dtype = str(backend.dtype).removeprefix("torch.")
    assert second.loaded.bytes_by_tier["memory"] == kv_footprint(backend.spec, 3 * C, 1, dtype).total
    assert second.recompute_s is not None and second.recompute_s.n == 1


def test_loaded_kv_equals_the_kv_a_prefill_computes(tiny, tmp_path):
    """The K/V copied into the cache are the stored ones, and those equal a fresh prefill's within rounding."""
    from kvviz.engine.generation import Generation
    from kvviz.engine.tolerance import agreement, magnitude

    store = _store(tiny, tmp_path)
    ids = shared_prefix_ids(tiny.tokenizer, 2 * C + 3)
    serve(tiny, store, ids, repeats=1)
    cache = tiny.new_cache(1, len(ids) + 1)
    store.load_prefix(ids, cache)
    fresh = Generation(tiny, max_new_tokens=1, stop_at_eos=False)
    fresh.prefill(ids)
    for layer in range(tiny.spec.n_layers):
        for got, want in ((cache.keys(layer), fresh.cache.keys(layer)[:, :, : 2 * C]),
                          (cache.values(layer), fresh.cache.values(layer)[:, :, : 2 * C])):
            assert got.shape == want.shape
            assert agreement(float((got - want).abs().max()), tiny.dtype, magnitude(got, want),
                             tiny.spec.d_model).within


def test_a_whole_prompt_hit_still_computes_its_last_token(tiny, tmp_path):
    """LMCache's vLLM adapter: 'In full-prompt-hit case, we need to recompute the last token'."""
    store = _store(tiny, tmp_path)
    ids = shared_prefix_ids(tiny.tokenizer, 2 * C)
    serve(tiny, store, ids, repeats=1)
    again = serve(tiny, store, ids, repeats=1)
    assert again.loaded.n_tokens == 2 * C - 1
    assert again.loaded.miss.reason == "last_token" and again.loaded.miss.token == 2 * C - 1
    assert again.logits.within


def test_the_demonstration_explains_every_request(tiny, tmp_path):
    demo = OffloadDemo(tiny, tmp_path / "store", chunk_size=C, repeats=1)
    out = demo.run()
    rows = {r["kind"]: r for r in out["requests"]}
    assert [r["kind"] for r in out["requests"]] == [s[0] for s in SCRIPT]
    tiers = {k: (r["tokens_by_tier"]["memory"], r["tokens_by_tier"]["disk"]) for k, r in rows.items()}
    assert tiers == {"first": (0, 0), "shared": (2 * C, 0), "changed": (C, 0), "other": (0, 0),
                     "from_disk": (0, 2 * C), "third": (0, 0), "evicted": (0, C), "restart": (0, 2 * C),
                     "corrupt": (0, 0)}
    reasons = {k: r["miss_reason"] for k, r in rows.items()}
    assert reasons["first"] == {"reason": "never_stored", "token": 0, "tier": None, "request": None}
    assert reasons["shared"]["reason"] == "chunk_boundary" and reasons["shared"]["token"] == 2 * C
    # the change at C + C/2 falls in the second chunk, computed whole from C
    assert reasons["changed"] == {"reason": "prompt_changed", "token": C, "tier": None, "request": None,
                                  "changed_at": C + C // 2}
    assert reasons["evicted"] == {"reason": "evicted", "token": C, "tier": "disk", "request": 6}
    assert reasons["restart"]["reason"] == "chunk_boundary"
    assert reasons["corrupt"] == {"reason": "corrupt", "token": 0, "tier": "disk", "request": None}
    assert rows["corrupt"]["event"] == {"corrupted": "C1"} and rows["restart"]["event"] == {"restart": 6}
    assert all(r["logits_equal_up_to_rounding"] and r["same_first_token"] for r in out["requests"])
    # Bounded tiers: never more than their capacity, and the LRU order the script relies on.
    assert rows["third"]["after"] == {"memory": ["A2", "C1", "C2"], "disk": ["B1", "B2", "A1", "A2", "C1", "C2"]}
    assert "A*2" in rows["third"]["evicted"]["disk"]
    assert demo.store.memory.used_bytes <= demo.memory_bytes and demo.store.disk.used_bytes <= demo.disk_bytes


def test_disk_tier_survives_a_restart_and_never_uses_a_damaged_file(tiny, tmp_path):
    store = _store(tiny, tmp_path)
    ids = shared_prefix_ids(tiny.tokenizer, 3 * C + 1)
    serve(tiny, store, ids, repeats=1)
    keys = [i.key for i in store.chunk_infos(ids)]
    last = store.disk.path(keys[2]).read_bytes()
    store.disk.path(keys[2]).write_bytes(last[: len(last) // 2])  # a file cut off: its header still reads
    later = store.reopen()
    assert later.memory.chunks == {} and set(later.disk.files) == set(keys)
    served = serve(tiny, later, ids, repeats=1)
    assert served.loaded.tokens_by_tier == {"memory": 0, "disk": 2 * C}
    assert served.loaded.miss.reason == "corrupt" and served.loaded.miss.token == 2 * C
    assert served.logits.within
    assert keys[2] in later.disk.files  # recomputed and stored again, whole
    # A header cut off: the scan at start-up removes it rather than indexing it.
    store.disk.path(keys[1]).write_bytes(last[:5])
    again = later.reopen()
    assert keys[1] not in again.disk.files and again.disk.removed_at_start == [keys[1] + ".safetensors"]
    # The file holds the formula's K/V bytes plus its safetensors header with the checksum.
    chunk = again.disk.get(keys[0])
    assert chunk.nbytes == kv_footprint(tiny.spec, C, 1, "float32").total
    assert again.disk.files[keys[0]] > chunk.nbytes


def test_serde_refuses_any_altered_byte():
    k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    blob = serde.pack(k, v, {"x": "1"})
    k2, v2, meta = serde.unpack(blob)
    assert torch.equal(k, k2) and torch.equal(v, v2) and meta["x"] == "1"
    for at in (len(blob) - 1, len(blob) // 2, 3):
        bad = bytearray(blob)
        bad[at] ^= 1
        with pytest.raises(serde.CorruptChunk):
            serde.unpack(bytes(bad))
    with pytest.raises(serde.CorruptChunk):
        serde.unpack(blob[:-4])
    bf = serde.pack(k.bfloat16(), v.bfloat16(), {})  # bfloat16 bytes hash too
    assert torch.equal(serde.unpack(bf)[0], k.bfloat16())


def test_memory_tier_is_lru_and_bounded(tiny, tmp_path):
    store = _store(tiny, tmp_path, memory_chunks=2, disk_chunks=0)
    docs = [suffix_ids(tiny.spec.vocab_size, C + 1, i) for i in range(3)]
    for d in docs:
        serve(tiny, store, d, repeats=1)
    assert [i.tokens[0] for i in store.memory.infos()] == [docs[1][0], docs[2][0]]
    assert store.disk.files == {}  # a disk tier of 0 bytes keeps nothing
    gone = serve(tiny, store, docs[0], repeats=1)
    assert gone.loaded.miss.reason == "evicted" and gone.loaded.miss.tier == "memory"


def test_a_store_writes_only_under_its_own_directory(tiny, tmp_path):
    """Hosted mode gives each session one directory: nothing is written beside it."""
    root = tmp_path / "session"
    before = set(os.listdir(tmp_path))
    demo = OffloadDemo(tiny, root, chunk_size=C, repeats=1)
    for _ in range(3):
        demo.advance()
    assert set(os.listdir(tmp_path)) - before == {"session"}
    written = [p for p in root.rglob("*") if p.is_file()]
    assert written and all(p.suffix == ".safetensors" for p in written)


def test_tier_costs_measure_both_tiers_and_the_recompute(tiny, tmp_path):
    rows = tier_costs(tiny, tmp_path, n_chunks=2, chunk_size=C, repeats=2)
    assert [r.tier for r in rows] == ["memory", "disk"]
    assert all(r.bytes == kv_footprint(tiny.spec, 2 * C, 1, "float32").total for r in rows)
    assert rows[1].file_bytes > rows[1].bytes and rows[0].file_bytes is None
    assert all(r.load_s.n == 2 and r.recompute_s.n == 2 and r.load_s.median > 0 for r in rows)


def test_offload_demo_cli_json(capsys, tmp_path):
    from kvviz.cli import main

    store = tmp_path / "store"
    assert main(["offload-demo", "--chunk-size", str(C), "--repeats", "1", "--tier-repeats", "1", "--store-dir",
                 str(store), "--json"]) == 0
    out = __import__("json").loads(capsys.readouterr().out)
    assert len(out["requests"]) == len(SCRIPT) and out["chunk_size"] == C and out["store_kept"]
    for r in out["requests"]:
        assert {"tokens_by_tier", "bytes_loaded", "load_s", "recompute_s", "ttft_s", "miss_reason"} <= set(r)
        assert sum(r["tokens_by_tier"].values()) == r["prompt_tokens"]
    assert [t["tier"] for t in out["tiers"]] == ["memory", "disk"]
    assert any(store.rglob("*.safetensors"))  # kept, for a later run to read back
    # The folder now holds a store: a second demo there would not start from nothing, so it is refused.
    assert main(["offload-demo", "--store-dir", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err
    assert main(["offload-demo", "--chunk-size", "4096"]) == 2
    assert "chunk size 4096" in capsys.readouterr().err
