"""The paged KV cache: batched, shared, preempted requests give the logits of each request alone in a
contiguous cache; prefix hits follow vLLM's rules (full blocks, last prompt token computed, stop at a miss)."""
import contextlib
import json

import pytest
import torch

from kvviz.charts.paged import saving_text
from kvviz.cli import main
from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import load_backend
from kvviz.engine.model import Decoder
from kvviz.engine.paged.blocks import BlockPool, max_cacheable_tokens, prompt_block_hashes
from kvviz.engine.paged.demo import HitSaving, measure_hit_saving, suffix_ids
from kvviz.engine.paged.scheduler import FINISHED, PagedEngine, snapshot
from kvviz.engine.tolerance import agreement, magnitude
from kvviz.errors import InputError
from kvviz.i18n import t


@pytest.fixture(scope="module")
def tiny() -> Decoder:
    return load_backend("tiny", device="cpu").model


@pytest.fixture(scope="module")
def small() -> Decoder:
    cfg = DecoderConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=300, max_seq_len=256)
    return Decoder(cfg).init_weights(3).eval().fuse()


def ids(model: Decoder, n: int, index: int) -> list[int]:
    return suffix_ids(model.cfg.vocab_size, n, index)


@torch.inference_mode()
def alone(model: Decoder, prompt: list[int], outputs: list[int]) -> list[torch.Tensor]:
    """The request by itself in a contiguous cache: prefill, then one decode step per output token."""
    cache = model.new_cache(1, len(prompt) + len(outputs))
    logits = [model(torch.tensor([prompt]), cache, all_logits=False).logits[0, -1]]
    for tok in outputs[:-1]:
        logits.append(model(torch.tensor([[tok]]), cache, all_logits=False).logits[0, -1])
    return logits


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def rounding_only(a: list[torch.Tensor], b: list[torch.Tensor], model: Decoder) -> bool:
    """Equal up to float32 rounding, as the app's one tolerance (kvviz.engine.tolerance) judges it."""
    return agreement(max_diff(a, b), torch.float32, magnitude(*a, *b), model.cfg.d_model).within


def check_alone(model: Decoder, engine: PagedEngine) -> None:
    for req in engine.requests:
        assert req.status == FINISHED and len(req.output_ids) == req.max_new_tokens
        ref = alone(model, req.prompt_ids, req.output_ids)
        assert rounding_only(ref, req.logits, model), (req.request_id, max_diff(ref, req.logits))
        assert [int(x.argmax()) for x in ref] == req.output_ids


def test_batched_shared_paged_logits_equal_each_request_alone(tiny):
    system = ids(tiny, 40, 99)
    engine = PagedEngine(tiny, 64, 16, record_logits=True)
    for i, n in enumerate((5, 17, 30, 2)):  # different lengths, one shared system prompt
        engine.add(system + ids(tiny, n, i), 6 + i)
    engine.add(ids(tiny, 23, 7), 5)  # and one that shares nothing
    engine.step()
    late = [engine.add(system + ids(tiny, 9, 8), 7), engine.add(system + ids(tiny, 3, 9), 4)]  # arrive while decoding
    batch_sizes = []
    while not engine.idle:
        batch_sizes.append(len(engine.step().scheduled))
    assert max(batch_sizes) >= 5  # several requests of different lengths in one forward
    assert [r.cached_tokens for r in late] == [32, 32]  # ⌊40/16⌋·16 of the system prompt
    check_alone(tiny, engine)


def test_preempted_request_is_recomputed_exactly(tiny):
    system = ids(tiny, 20, 50)
    engine = PagedEngine(tiny, 12, 8, record_logits=True)  # too small for four requests of 40+ tokens
    for i in range(4):
        engine.add(system + ids(tiny, 3 + i, i), 20)
    engine.run()
    assert sum(r.n_preemptions for r in engine.requests) >= 1
    assert any(s.preempted for s in engine.history)
    check_alone(tiny, engine)
    assert engine.pool.n_in_use() == 0  # every block came back


def test_reused_prefix_equals_computed_prefix(tiny):
    prompts = [ids(tiny, 70, 1) + ids(tiny, 12, 2 + i) for i in range(3)]
    runs = {}
    for caching in (True, False):
        engine = PagedEngine(tiny, 40, 16, prefix_caching=caching, record_logits=True)
        for p in prompts:
            req = engine.add(p, 5)
            while req.first_token_s is None:
                engine.step()
        engine.run()
        runs[caching] = engine.requests
    assert [r.cached_tokens for r in runs[True]] == [0, 64, 64]
    assert [r.cached_tokens for r in runs[False]] == [0, 0, 0]
    for hit, computed in zip(runs[True], runs[False], strict=True):
        assert rounding_only(hit.logits, computed.logits, tiny), max_diff(hit.logits, computed.logits)
        assert hit.output_ids == computed.output_ids


def test_same_step_requests_hit_blocks_hashed_at_allocation(tiny):
    """vLLM caches a full block when it is allocated, before the forward (KVCacheManager.allocate_slots →
    cache_blocks), "so that the block can be reused by other requests in the same batch": three requests admitted
    in one step share the first one's system-prompt blocks (main gave [0, 0, 0], each computing its own copy)."""
    system = ids(tiny, 48, 99)
    engine = PagedEngine(tiny, 40, 16, record_logits=True)
    reqs = [engine.add(system + ids(tiny, 20, i), 4) for i in range(3)]
    report = engine.step()
    assert report.admitted == [0, 1, 2]
    assert [r.cached_tokens for r in reqs] == [0, 48, 48]
    assert engine.hit_rate() == pytest.approx(96 / (3 * 68))
    assert sorted(engine.sharing().values()).count(3) == 3  # the three system-prompt blocks, held by all three
    assert engine.pool.n_in_use() == 3 + 3 * 2  # shared blocks once, then ⌈(68 − 48)/16⌉ = 2 own blocks each
    engine.run()
    check_alone(tiny, engine)  # the hits read K/V written by the same forward: logits as each request alone


def test_a_duplicate_full_block_stays_findable_after_the_first_copy_is_evicted():
    """vLLM keeps every block id under its hash (BlockHashToBlockMap.insert) and evicts one copy at a time
    (pop(key, block_id)); main kept only the first copy, so the duplicate could never be hit again."""
    pool = BlockPool(4, 2)  # blocks 1, 2, 3 (0 is the null block)
    h = prompt_block_hashes([5, 6, 7], 2)
    a, b = pool.allocate(2)
    pool.register(a, h[0])
    pool.register(b, h[0])  # a second request filled an equal block: cached too, not de-duplicated
    assert pool.lookup(h, 3) == [a]  # the first copy, as get_one_block
    pool.release([a])
    pool.release([b])
    assert pool.allocate(2) == [3, a]  # the never-used block, then a (freed first): a's copy is evicted
    assert pool.lookup(h, 3) == [b]  # the surviving copy is still a hit
    pool.take_cached([b])
    assert pool.n_free == 0


def test_identical_requests_cache_both_copies_of_a_decoded_block(small):
    """docs/design/prefix_caching.md, "Duplicated blocks": block size 4, prompt ABCDEF, 3 tokens decoded, sent
    twice; the second request's EFGH block is a new block (tables are append-only) and is cached beside the
    first one's ("Cache Blocks: 0, 1, 3")."""
    prompt = ids(small, 6, 0)
    engine = PagedEngine(small, 8, 4)
    first = engine.add(prompt, 3)
    engine.run()
    second = engine.add(prompt, 3)
    engine.run()
    assert first.output_ids == second.output_ids and second.cached_tokens == 4  # ABCD hit; EF computed again
    h = prompt_block_hashes(first.all_ids, 4)
    assert len(engine.pool.cached[h[0]]) == 1 and len(engine.pool.cached[h[1]]) == 2


def test_a_finished_request_releases_its_block_table(small):
    """vLLM's free() drops a finished request's blocks: the page must not show its old block ids, which other
    requests may hold by then."""
    engine = PagedEngine(small, 4, 4)  # room for one request of 9 + 2 computed tokens (3 blocks and the null one)
    a = engine.add(ids(small, 9, 0), 3)
    engine.run()
    b = engine.add(ids(small, 9, 1), 3)
    engine.step()
    _, views = snapshot(engine)
    assert sorted(b.block_table) == [1, 2, 3]  # every block a released now belongs to b
    assert views[0].status == FINISHED and views[0].block_table == () and views[0].n_released == 3 == a.n_released


def test_a_waiting_request_that_fits_is_admitted_in_the_next_step(small):
    """vLLM admits waiting requests in the schedule right after a request finishes (its blocks were freed in
    update_from_output); no step may pass with the head of the queue fitting and not admitted, except one that
    preempted (vLLM's scheduler admits nothing then either). 20 seeded random workloads on a small pool."""
    import random

    rng = random.Random(0)
    checked = 0
    for _ in range(20):
        engine = PagedEngine(small, rng.randint(3, 10), rng.choice([2, 4, 8]))
        for k in range(rng.randint(2, 4)):
            with contextlib.suppress(InputError):  # a request too big for this pool is refused, not queued
                engine.add(ids(small, rng.randint(1, 12), k), rng.randint(1, 8),
                           at_step=rng.choice([None, rng.randint(0, 5)]))
        while not engine.idle:
            engine._arrive()
            head = engine.waiting[0] if engine.waiting else None
            running_need = sum(engine._blocks_for(r.n_computed + 1) - len(r.block_table) for r in engine.running)
            fits = head is not None and engine._blocks_for(len(head.all_ids)) <= engine.pool.n_free - running_need
            report = engine.step()
            if fits and not report.preempted:
                assert head.request_id in report.admitted, report
                checked += 1
    assert checked > 15


@pytest.mark.parametrize("block_size", [4, 8, 16])
@pytest.mark.parametrize("n", [1, 5, 16, 17, 33, 64, 65])
def test_identical_prompt_reuses_floor_n_minus_1(small, block_size, n):
    prompt = ids(small, n, 0)
    engine = PagedEngine(small, 64, block_size)
    first = engine.add(prompt, 2)
    engine.run()
    second = engine.add(prompt, 2)  # the first one's blocks are free now, but still hashed
    engine.run()
    assert first.cached_tokens == 0
    assert second.cached_tokens == (n - 1) // block_size * block_size == max_cacheable_tokens(n, block_size)


@pytest.mark.parametrize("block_size", [4, 8, 16])
@pytest.mark.parametrize("p, n", [(3, 20), (8, 9), (16, 40), (17, 40), (31, 32), (47, 90)])
def test_shared_prefix_reuses_floor_p(small, block_size, p, n):
    prefix = ids(small, p, 100)
    a = prefix + ids(small, n - p, 1)
    b = prefix + ids(small, n - p, 2)  # differs from a at position p
    assert a[p] != b[p]
    engine = PagedEngine(small, 64, block_size)
    engine.add(a, 3)
    engine.step()  # a is prefilled and still running: its full blocks are shared, not just cached
    req = engine.add(b, 3)
    engine.step()
    assert req.cached_tokens == p // block_size * block_size
    shared = sum(1 for c in engine.sharing().values() if c == 2)
    assert shared == p // block_size
    engine.run()


def test_lookup_stops_at_first_miss_and_lru_eviction():
    pool = BlockPool(5, 2)  # block 0 is the null block: 4 to hand out
    tokens = [1, 2, 3, 4, 5, 6, 7]
    hashes = prompt_block_hashes(tokens, 2)
    assert len(hashes) == 3  # full blocks only
    blocks = pool.allocate(3)
    pool.register(blocks[0], hashes[0])
    pool.register(blocks[2], hashes[2])  # block 1 missing: block 2 must not be found
    assert pool.lookup(hashes, len(tokens)) == [blocks[0]]
    pool.register(blocks[1], hashes[1])
    assert pool.lookup(hashes, len(tokens)) == blocks  # ⌊6/2⌋ = 3 blocks
    assert pool.lookup(hashes, 6) == blocks[:2]  # n = 6: the last token stays computed, ⌊5/2⌋·2 = 4
    pool.release(blocks)
    assert pool.n_cached_free() == 3 and pool.n_free == 4
    assert pool.lookup(hashes, len(tokens)) == blocks  # freed, still hashable
    # Allocation takes the never-used block first, then the request's last block (freed first): LRU order.
    first = pool.allocate(2)
    assert first == [4, blocks[2]]
    assert pool.lookup(hashes, len(tokens)) == blocks[:2]
    assert pool.evictions == 1
    pool.take_cached(blocks[:2])
    assert pool.n_free == 0
    with pytest.raises(InputError):
        pool.allocate(1)


def test_block_zero_is_the_null_block_as_vllm(small):
    """vLLM's BlockPool.__init__ takes block 0 off the free queue as the null_block and get_usage divides by
    num_gpu_blocks − 1: a 4-block pool hands out 3 (main handed out all 4)."""
    pool = BlockPool(4, 16)
    assert (pool.n_usable, pool.n_free, pool.usage()) == (3, 3, 0.0)
    assert pool.allocate(3) == [1, 2, 3] and pool.usage() == 1.0 and pool.state(0) == "null"
    with pytest.raises(InputError):
        pool.allocate(1)
    # So preemption starts one block earlier than main's: two 4-token requests, 4 blocks of 4 tokens; each needs
    # its second block for its 5th token, and only one is left (tests/engine/paged/test_vllm_reference.py: the same
    # step in vLLM's KVCacheManager).
    engine = PagedEngine(small, 4, 4)
    a, b = engine.add(ids(small, 4, 0), 4), engine.add(ids(small, 4, 1), 4)
    assert engine.step().admitted == [a.request_id, b.request_id]
    assert engine.step().preempted == [b.request_id]
    with pytest.raises(InputError, match="needs 4 blocks"):
        engine.add(ids(small, 12, 2), 4)  # 16 tokens: 4 blocks, one more than the pool hands out


def test_a_freed_block_without_a_hash_is_reused_first_as_vllm(small):
    """vLLM's BlockPool.free_blocks puts freed blocks without a hash at the FRONT of the free queue (prepend_n,
    "LIFO reuse of non-cached blocks") and hashed ones at the tail. Blocks of 16, 4 to hand out: A (32 tokens),
    then 17 other tokens (its partial second block has no hash), then 10: they take that partial block, so A's
    blocks survive and A + 1 token hits 32 tokens (main appended every block: the 10 took A's, a 16-token hit)."""
    engine = PagedEngine(small, 5, 16)
    a = ids(small, 32, 0)
    for prompt in (a, ids(small, 17, 1), ids(small, 10, 2)):
        engine.add(prompt, 1)
        engine.run()
    assert list(engine.pool.free)[:1] == [4]  # the 17-token request's partial block, freed first, in front
    again = engine.add(a + ids(small, 1, 3), 1)
    engine.run()
    assert again.cached_tokens == 32 and engine.pool.evictions == 0


def test_too_big_or_empty_request_is_refused(small):
    engine = PagedEngine(small, 4, 8)
    with pytest.raises(InputError, match="needs 5 blocks"):
        engine.add(ids(small, 30, 0), 10)
    with pytest.raises(InputError):
        engine.add([], 3)
    with pytest.raises(InputError):
        engine.add(ids(small, 250, 0), 10)  # past the context


def test_hit_saving_is_measured(small):
    hit = measure_hit_saving(small, ids(small, 40, 0), 32, repeats=3)
    assert hit.full_s > 0 and hit.with_hit_s > 0 and hit.noise_s >= 0 and hit.repeats == 3
    assert hit.saved_s == hit.full_s - hit.with_hit_s
    assert hit.measurable == (hit.saved_s > hit.noise_s)


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_a_saving_within_noise_has_no_sign(lang):
    """The page showed "saved -0.1 ms" for a small hit: a difference within the timing noise is said so instead."""
    labels = {k: t(f"paged.c_{k}", lang) for k in ("saved", "saved_noise")}
    assert saving_text(HitSaving(2.0e-3, 2.1e-3, 0.3e-3, 5), labels) == labels["saved_noise"].format(noise="0.3")
    assert saving_text(HitSaving(2.0e-3, 1.8e-3, 0.3e-3, 5), labels) == labels["saved_noise"].format(noise="0.3")
    assert saving_text(HitSaving(2.0e-3, 0.5e-3, 0.3e-3, 5), labels) == labels["saved"].format(ms="1.5")


def test_prefix_demo_cli(capsys):
    assert main(["prefix-demo", "--requests", "3", "--shared-prefix", "40", "--suffix", "9", "--block-size", "8",
                 "--new-tokens", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["prompt_tokens"] for r in out["requests"]] == [49] * 3
    assert [r["cached_tokens"] for r in out["requests"]] == [0, 40, 40]
    assert out["hit_rate"] == pytest.approx(80 / 147)
    assert all(r["ttft_s"] > 0 for r in out["requests"])
    assert out["blocks_shared"] == 5  # the 40-token system prompt: 5 blocks of 8
    # 3 requests of 49 + 1..3 decoded tokens: 7 blocks each without sharing; 5 shared + 2 own each with it
    assert out["blocks_used_without_sharing"] == 21 and out["blocks_used"] == 5 + 3 * 2
    assert out["logits_equal_up_to_rounding"] and out["same_tokens_vs_no_sharing"]
    assert out["max_abs_logit_diff_vs_no_sharing"] <= out["logit_rounding_tolerance"]


def test_prefix_demo_same_step_cli(capsys):
    """`--same-step` admits every request in one scheduler step: the later ones hit the first one's blocks."""
    assert main(["prefix-demo", "--same-step", "--requests", "3", "--shared-prefix", "48", "--suffix", "20",
                 "--block-size", "16", "--new-tokens", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["same_step"] and [r["cached_tokens"] for r in out["requests"]] == [0, 48, 48]
    # the hits got their first token in the same forward: one timing, so no verdict on the TTFT difference
    assert out["ttft_cached"]["n"] == 1 and out["ttft_saving"]["samples"] == 1
    assert not out["ttft_saving"]["measurable"]


def test_prefix_demo_reports_spread_and_noise(capsys):
    """A TTFT median over 3 samples was printed as "5.14×": the CLI now gives each side's range and the page's
    verdict (a difference within the timings' own spread is "within noise")."""
    assert main(["prefix-demo", "--requests", "3", "--shared-prefix", "40", "--suffix", "9", "--block-size", "8",
                 "--new-tokens", "4"]) == 0
    text = capsys.readouterr().out
    assert "×" not in text and "range" in text
    assert "saved" in text or "within noise" in text
    for line in text.splitlines():
        if line.startswith("TTFT of the"):
            assert "2 requests that hit (2 distinct timings)" in line


def test_prefix_demo_cli_bad_input(capsys):
    assert main(["prefix-demo", "--shared-prefix", "5000"]) == 2
    assert "context" in capsys.readouterr().err
    assert main(["prefix-demo", "--block-size", "0"]) == 2


def test_fragmentation_bytes(small):
    from kvviz.engine.paged.scheduler import fragmentation
    from kvviz.kv.formula import KVSpec, kv_footprint

    c = small.cfg
    engine = PagedEngine(small, 32, 8)
    system = ids(small, 20, 5)
    engine.add(system + ids(small, 5, 1), 4)
    engine.step()
    engine.add(system + ids(small, 9, 2), 4)
    engine.step()  # request 0 holds 26 tokens, request 1 has 29 (16 of them in request 0's two full blocks)
    frag = fragmentation(engine)
    per_token = kv_footprint(KVSpec(c.n_layers, c.n_heads, c.n_kv_heads, c.d_head), 1, 1, "float32").per_token
    assert frag.bytes_per_token == per_token
    assert frag.live_bytes == (26 + 29 - 16) * per_token
    assert frag.paged_bytes == (4 + 2) * 8 * per_token  # ⌈26/8⌉ + ⌈29/8⌉ − 2 shared
    assert frag.paged_unshared_bytes == (4 + 4) * 8 * per_token
    assert frag.contiguous_bytes == 2 * c.max_seq_len * per_token


def test_replay_reaches_the_same_pool_at_the_same_step():
    """"Explore from here" on Paged Blocks: the requests added at their steps, replayed into another engine and
    stepped to the same step, give the same blocks, tables, hits and tokens (a preemption included)."""
    import dataclasses

    from kvviz.engine.paged.demo import add_request, replay

    backend = load_backend("tiny", device="cpu")
    first = PagedEngine(backend.model, 10, 8)  # a pool too small for all four: the last one is preempted
    added = [add_request(first, backend.tokenizer, True, 24, 6, 10) for _ in range(2)]
    first.step()
    first.step()
    added += [add_request(first, backend.tokenizer, True, 24, 6, 10), add_request(first, backend.tokenizer, False,
                                                                                   24, 9, 10)]
    for _ in range(6):
        first.step()
    assert first.n_steps == 8 and [a[0] for a in added] == [0, 0, 2, 2]
    assert [r.n_preemptions for r in first.requests] == [0, 0, 0, 1]

    second = PagedEngine(backend.model, 10, 8)
    assert list(replay(second, backend.tokenizer, added, 8, backend.spec.max_context)) == added
    assert second.n_steps == 8

    def state(e: PagedEngine) -> tuple:  # the time to a first token is the one figure that differs
        blocks, requests = snapshot(e)
        return blocks, [dataclasses.replace(r, ttft_s=None) for r in requests]

    assert state(second) == state(first) and first.pool.hits == second.pool.hits > 0
    assert [r.output_ids for r in second.requests] == [r.output_ids for r in first.requests]
    # a record's lengths are held to the page's boxes' range: a length of 10**9 asks for max_len - 2 tokens
    third = PagedEngine(backend.model, 10, 8)
    with pytest.raises(InputError):  # too many for this pool: refused, as a click's would be
        list(replay(third, backend.tokenizer, [[0, False, 1, 10**9, 1]], 1, backend.spec.max_context))
