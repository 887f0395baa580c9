"""Speculative decoding on the real cache: n-gram lookup as vLLM, greedy output identical to plain decoding for
every draft and k on both models, the sampled distribution equal to the target's (chi-square), every cache cropped
in place with its bytes equal to the formula, the paged pool keeping its blocks as vLLM does."""
import json

import pytest
import torch
from scipy.stats import chisquare

from kvviz.cli import main
from kvviz.engine.backends.native import NativeBackend
from kvviz.engine.config import DecoderConfig
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend, random_backend
from kvviz.engine.model import Decoder
from kvviz.engine.paged.scheduler import PagedEngine
from kvviz.engine.spec import ngram, sampling
from kvviz.engine.spec.decoding import SpecStats, SpeculativeGeneration
from kvviz.engine.spec.drafts import EarlyExitDraft, ModelDraft, NgramDraft, first_layers_draft, load_draft
from kvviz.engine.spec.measure import gpu_prediction
from kvviz.engine.timing import torch_threads
from kvviz.engine.tolerance import agreement, magnitude
from kvviz.errors import InputError
from kvviz.kv.formula import kv_footprint
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.roofline import Roofline

KS = (1, 2, 4, 8)
ALPHA = 0.01  # the chi-square tests' significance: a correct sampler fails one 1% of the time (seeds are fixed)
REPETITIVE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
PLAIN = "The history of the city began"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Small passes on one thread: on a loaded 2-core machine two OpenMP threads spin-wait on each other (the app
    server runs one thread for the same reason, kvviz/app/models.py)."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny() -> NativeBackend:
    return load_backend("tiny", device="cpu")


def drafts_for(backend: NativeBackend, m: int | None = None, random_draft: bool = True) -> dict:
    """Every draft: n-gram (a short n so it drafts often), early exit after m layers, a separate model (the first m
    layers with a cache of their own), and a random-weight model sharing the tokenizer (mechanics only)."""
    m = m or max(1, 3 * backend.spec.n_layers // 4)
    out = {"ngram": lambda: NgramDraft(ngram.NgramConfig(1, 3)), "early-exit": lambda: EarlyExitDraft(m),
           "draft": lambda: first_layers_draft(backend, m)}
    if random_draft:
        rnd = load_draft("random", backend, seed=1).backend
        out["random-draft"] = lambda: ModelDraft(rnd)
    return out


def plain_tokens(backend: NativeBackend, prompt: str, n: int) -> list[int]:
    gen = Generation(backend, max_new_tokens=n, stop_at_eos=False)
    gen.run(prompt)
    return gen.generated[0]


def check_run(gen: SpeculativeGeneration) -> None:
    """The cache after every rollback: the bytes of the positions kept, by the formula; the bookkeeping adds up."""
    for e in gen.events:
        assert e.live_bytes == e.formula_bytes  # read off the tensors == kv_footprint() of the positions kept
        assert set(e.cache_lengths) == {e.position + len(e.emitted)} or e.phase == "prefill"
        assert e.draft_live_bytes == e.draft_formula_bytes
        if e.phase == "verify":
            assert set(e.verify_lengths) == {e.position + len(e.drafted) + 1}  # one pass over k + 1 positions
            assert e.rolled_back == len(e.drafted) + 1 - len(e.emitted)
            assert e.peak_live_bytes > e.live_bytes or e.rolled_back == 0
    assert gen.cache.length == len(gen.token_ids) - 1  # every token but the newest, as plain decoding
    # Each pass emits its accepted drafts and one token of its own; the last may be cut at max_new_tokens, its
    # drafts not (vLLM trims drafts only at max_model_len; check_stop drops the tokens past max_tokens).
    *passes, last = gen.events
    assert all(len(e.emitted) == e.accepted + 1 for e in passes)
    assert len(last.emitted) <= last.accepted + 1 and gen.n_generated == sum(len(e.emitted) for e in gen.events)


@pytest.mark.parametrize("prompt", [REPETITIVE, PLAIN])
def test_greedy_is_plain_decoding_for_every_draft_and_k_tiny(tiny, prompt):
    ref = plain_tokens(tiny, prompt, 16)
    rolled = 0
    for name, make in drafts_for(tiny).items():
        for k in KS:
            gen = SpeculativeGeneration(tiny, make(), k=k, max_new_tokens=16, stop_at_eos=False)
            gen.run(prompt)
            assert gen.generated == ref, (name, k)
            check_run(gen)
            rolled += gen.rollback_tokens
    assert rolled > 0  # rejections happened and were rolled back


def test_greedy_is_plain_decoding_for_every_draft_and_k_smollm2(smollm2):
    """The real pretrained model: the same, on a prompt with repetition (fewer tokens, and drafts of 4 of its 30
    layers: each full pass is 135M parameters on a CPU)."""
    prompt = "1. apple\n2. banana\n3. cherry\n4. apple\n5. banana\n6."
    ref = plain_tokens(smollm2, prompt, 8)
    accepted = 0
    for name, make in drafts_for(smollm2, m=4, random_draft=False).items():
        for k in KS:
            gen = SpeculativeGeneration(smollm2, make(), k=k, max_new_tokens=8, stop_at_eos=False)
            gen.run(prompt)
            assert gen.generated == ref, (name, k)
            check_run(gen)
            accepted += gen.stats.num_accepted_tokens
    assert accepted > 0


def test_cache_after_speculation_equals_plain_decoding(tiny):
    """K/V kept after the rollbacks equal those plain decoding wrote, in every layer (up to rounding): the early
    exit's shared layers hold the target's own values."""
    for name, make in drafts_for(tiny).items():
        plain = Generation(tiny, max_new_tokens=20, stop_at_eos=False)
        plain.run(REPETITIVE)
        gen = SpeculativeGeneration(tiny, make(), k=4, max_new_tokens=20, stop_at_eos=False)
        gen.run(REPETITIVE)
        assert gen.cache.lengths == plain.cache.lengths[:]
        for layer in range(tiny.spec.n_layers):
            for a, b in ((gen.cache.keys(layer), plain.cache.keys(layer)),
                         (gen.cache.values(layer), plain.cache.values(layer))):
                diff = float((a - b).abs().max())
                assert agreement(diff, torch.float32, magnitude(a, b), tiny.spec.d_model).within, (name, layer, diff)


def test_crop_is_in_place_and_matches_transformers(tiny):
    """KVCache.crop sets the counters back: same storage, no copy; the K/V left equal DynamicCache.crop's."""
    from transformers.cache_utils import DynamicCache

    cache = tiny.new_cache(1, 32)
    ptrs = [k.data_ptr() for k in cache.k]
    with torch.inference_mode():
        tiny.model(torch.tensor([tiny.tokenizer.encode(PLAIN)]), cache)
    n = cache.length
    hf = DynamicCache()
    for layer in range(cache.n_layers):
        hf.update(cache.keys(layer).clone(), cache.values(layer).clone(), layer)
    assert cache.crop(n - 3) == 3 * cache.n_layers
    hf.crop(-3)  # transformers 5: remove 3 tokens
    assert [k.data_ptr() for k in cache.k] == ptrs and cache.lengths == [n - 3] * cache.n_layers
    for layer in range(cache.n_layers):
        assert torch.equal(cache.keys(layer), hf.layers[layer].keys)
        assert torch.equal(cache.values(layer), hf.layers[layer].values)
    with pytest.raises(ValueError):
        cache.crop(n)  # never grows


# ---- n-gram: vLLM's cases (tests/v1/spec_decode/test_ngram.py), expected values as vLLM's tests state them ----
@pytest.mark.parametrize(("tokens", "low", "high", "k", "expected"), [
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 2, [4, 1]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),  # the first match
    ([1, 2, 3, 4, 5], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 4, 4, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),  # the 4-gram wins, not [5, 1]
    ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
    ([1, 2, 3, 4, 2, 3], 2, 3, 4, [4, 2, 3]),  # the proposer's docstring: fewer than k follow the match
])
def test_ngram_proposer_as_vllm(tokens, low, high, k, expected):
    assert ngram.propose(tokens, k, ngram.NgramConfig(low, high), max_model_len=1024) == expected


def test_ngram_defaults_and_limits_as_vllm():
    assert ngram.NgramConfig.from_bounds(None, None) == ngram.NgramConfig(5, 5)
    assert ngram.NgramConfig.from_bounds(None, 3) == ngram.NgramConfig(3, 3)
    assert ngram.NgramConfig.from_bounds(2, None) == ngram.NgramConfig(2, 2)
    with pytest.raises(InputError):
        ngram.NgramConfig(4, 2)
    assert ngram.propose([1, 2, 1, 2, 1], 4, ngram.NgramConfig(1, 2), max_model_len=7) == [2, 1]  # context cap


# ---- sampling: lossless in distribution -----------------------------------------------------------------------
class _Ids:
    """A tokenizer for a model of a few token ids: prompts are given as ids, nothing is read as text."""

    vocab_size, eos_id = 8, None

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 8 for c in text]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def token_text(self, token_id: int) -> str:
        return str(token_id)


def _small(seed: int, n_layers: int = 2) -> NativeBackend:
    cfg = DecoderConfig(n_layers=n_layers, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=8, max_seq_len=64)
    return NativeBackend(Decoder(cfg).init_weights(seed, std=0.4), _Ids(), f"small {seed}")


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value, cells expected under 5 merged into one."""
    probs = probs.double() / probs.double().sum()  # float32 softmax sums to 1 only within rounding
    counts = counts.double()
    expected = probs * counts.sum()
    keep = expected >= 5
    obs = [*counts[keep].tolist(), float(counts[~keep].sum())]
    exp = [*expected[keep].tolist(), float(expected[~keep].sum())]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("method", ["draft", "early-exit", "ngram"])
def test_first_sampled_token_follows_the_target_softmax(method):
    """800 seeded runs on an 8-token model at temperature 1: the first token a speculative step emits is
    distributed as the target's softmax (chi-square at α = 0.01), and not as the draft's (the test can fail)."""
    target, other = _small(1, n_layers=3), _small(2)
    prompt = [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]  # every id occurs: prompt lookup always finds the newest token
    make = {"draft": lambda: ModelDraft(other), "early-exit": lambda: EarlyExitDraft(1),
            "ngram": lambda: NgramDraft(ngram.NgramConfig(1, 2))}[method]
    counts, draft_counts, n_runs = torch.zeros(8), torch.zeros(8), 800
    for run in range(n_runs):
        gen = SpeculativeGeneration(target, make(), k=3, max_new_tokens=6, temperature=1.0, seed=0)
        gen.prefill(prompt)  # the same first token in every run (seed 0)
        gen.rng.manual_seed(10_000 + run)  # the step draws from its own seed
        event = gen.step()
        assert event.drafted  # something was drafted, so acceptance decided the token
        counts[event.emitted[0]] += 1
        draft_counts[event.drafted[0]] += 1
    with torch.inference_mode():
        logits = target.model(torch.tensor([prompt + gen.generated[:1]])).logits[0, -1]
    p = logits.softmax(-1)
    p_value, p_draft = _chi2(counts, p), _chi2(draft_counts, p)
    print(f"chi-square, {method}: p = {p_value:.3f} for the emitted tokens, {p_draft:.2e} for the draft's own")  # -s
    assert p_value > ALPHA
    if method != "ngram":  # a draft model's own tokens are not the target's distribution: rejected
        assert p_draft < ALPHA


def test_speculative_sample_emits_the_target_distribution_at_every_position():
    """The sampler alone (Leviathan et al., Algorithm 1) on fixed p and q: the first emitted token ~ p_1 and, when
    the first draft was kept, the second ~ p_2 (chi-square at α = 0.01)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[.5, .2, .2, .1], [.1, .1, .3, .5], [.25, .25, .25, .25]])
    q = torch.tensor([[.1, .6, .2, .1], [.4, .4, .1, .1]])
    first, second = torch.zeros(4), torch.zeros(4)
    for _ in range(6000):
        drafted = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        verdict = sampling.speculative_sample(drafted, q, p, gen)
        out = verdict.emitted(drafted)
        first[out[0]] += 1
        if verdict.n_accepted >= 1:
            second[out[1]] += 1
    assert _chi2(first, p[0]) > ALPHA and _chi2(second, p[1]) > ALPHA
    assert _chi2(first, q[0]) < ALPHA


def test_acceptance_metrics_as_vllm():
    """vLLM's SpecDecodingStats / SpecDecodingLogging: drafting steps only, 1 + accepted / drafts, per position."""
    s = SpecStats(4)
    for drafted, accepted in ((4, 4), (4, 1), (2, 0), (3, 3)):
        s.observe_draft(drafted, accepted)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (4, 13, 8)
    assert s.mean_acceptance_length == 1 + 8 / 4
    assert s.acceptance_rate_per_pos == [3 / 4, 2 / 4, 2 / 4, 1 / 4]
    assert s.draft_acceptance_rate == 8 / 13
    assert SpecStats(2).mean_acceptance_length == 1  # compute_acceptance_len with no drafts


def test_draft_model_cache_is_its_own_and_cropped(tiny):
    draft = first_layers_draft(tiny, 2)
    gen = SpeculativeGeneration(tiny, draft, k=4, max_new_tokens=16, stop_at_eos=False)
    gen.run(REPETITIVE)
    assert draft.cache is not gen.cache and draft.cache.n_layers == 2
    assert sum(e.draft_rolled_back for e in gen.events) > 0
    for e in gen.events[1:]:
        # it may lag the target by one token (after a step that kept every draft), never lead it
        assert e.cache_lengths[0] - 1 <= e.draft_lengths[0] <= e.cache_lengths[0]
    early = SpeculativeGeneration(tiny, EarlyExitDraft(2), k=4, max_new_tokens=16, stop_at_eos=False)
    early.run(REPETITIVE)
    assert all(e.draft_formula_bytes == 0 for e in early.events)  # shares the target's cache: nothing of its own
    assert max(e.draft_formula_bytes for e in gen.events) > 0
    # The draft's most bytes are held right after drafting: the rollback then frees its rejected positions.
    per_token = kv_footprint(draft.backend.spec, 1, 1, str(draft.backend.dtype)).total
    for e in gen.events[1:]:
        # draft_rolled_back counts positions over all its layers; per_token is one position in every layer
        assert (e.draft_peak_formula_bytes - e.draft_formula_bytes) * draft.cache.n_layers == (
            e.draft_rolled_back * per_token)
    assert any(e.draft_peak_formula_bytes > e.draft_formula_bytes for e in gen.events)


def test_bad_drafts_are_refused(tiny, smollm2):
    with pytest.raises(InputError) as err:
        SpeculativeGeneration(tiny, ModelDraft(smollm2), k=2).prefill(PLAIN)
    assert err.value.key == "spec.tokenizer_mismatch"
    with pytest.raises(InputError):
        SpeculativeGeneration(tiny, EarlyExitDraft(tiny.spec.n_layers), k=2).prefill(PLAIN)
    with pytest.raises(InputError):
        SpeculativeGeneration(tiny, NgramDraft(), k=0)
    other = random_backend(DecoderConfig(vocab_size=300, max_seq_len=64))
    with pytest.raises(InputError):
        SpeculativeGeneration(tiny, ModelDraft(other), k=2).prefill(PLAIN)


# ---- the paged pool: vLLM keeps a request's blocks when its drafts are rejected --------------------------------
def test_paged_speculation_keeps_blocks_and_hashes_verified_tokens_only(tiny):
    prompts = [tiny.tokenizer.encode(p) for p in (REPETITIVE, PLAIN)]
    plain = PagedEngine(tiny.model, 64, 16)
    spec = PagedEngine(tiny.model, 64, 16, num_speculative_tokens=4, ngram_config=ngram.NgramConfig(1, 3))
    for eng in (plain, spec):
        for p in prompts:
            eng.add(p, 24)
    tables_kept = 0
    while not spec.idle:
        before = {r.request_id: list(r.block_table) for r in spec.running}
        spec.step()
        for r in spec.running:
            if r.request_id in before:
                assert r.block_table[: len(before[r.request_id])] == before[r.request_id]  # nothing freed
                tables_kept += len(r.block_table) * 16 > r.n_computed + 16 - 1  # a block held past the verified
            # a hashed block holds verified tokens only
            for j, b in enumerate(r.block_table):
                if spec.pool.blocks[b].hash is not None:
                    assert (j + 1) * 16 <= r.n_computed
    plain.run()
    assert [r.output_ids for r in spec.requests] == [r.output_ids for r in plain.requests]
    assert spec.spec_stats.num_drafts > 0 and sum(r.rolled_back for r in spec.requests) > 0
    assert spec.n_steps < plain.n_steps and spec.pool.n_in_use() == 0


def test_the_last_step_drafts_k_and_counts_them_as_vllm(tiny):
    """vLLM drafts k even when fewer tokens are left: Scheduler.schedule cuts a running request's new tokens only
    by the token budget and max_model_len − num_computed_tokens − 1, update_from_output counts every draft
    verified (SpecDecodingStats), and check_stop drops the tokens past max_tokens. A draft that agrees with the
    target every time (the target itself, with a cache of its own), k = 4: the prefill emits 1 token, six passes 5
    each, the seventh has 3 left: 28 of 28 drafts accepted, mean acceptance length 5.0 (main drafted 2 there:
    1 + 26/7 = 4.71)."""
    ref = plain_tokens(tiny, REPETITIVE, 34)
    gen = SpeculativeGeneration(tiny, ModelDraft(tiny), k=4, max_new_tokens=34, stop_at_eos=False)
    gen.run(REPETITIVE)
    assert gen.generated == ref
    assert [len(e.drafted) for e in gen.events[1:]] == [4] * 7
    assert [len(e.emitted) for e in gen.events] == [1] + [5] * 6 + [3]
    assert (gen.stats.num_drafts, gen.stats.num_draft_tokens, gen.stats.num_accepted_tokens) == (7, 28, 28)
    assert gen.stats.mean_acceptance_length == 5.0
    assert gen.cache.length == len(gen.token_ids) - 1  # the 2 accepted tokens past max_new were cropped
    check_run(gen)


def test_paged_speculation_drafts_past_max_new_tokens_as_vllm(tiny):
    """The paged engine's proposer too: a request with 2 new tokens drafts k = 4 at its one decode step (main
    drafted min(k, max_new − n − 1) = 0), allocates slots for all 5, and emits only its 2 tokens, equal to
    plain decoding."""
    prompt = tiny.tokenizer.encode(REPETITIVE)
    plain = PagedEngine(tiny.model, 16, 16)
    spec = PagedEngine(tiny.model, 16, 16, num_speculative_tokens=4, ngram_config=ngram.NgramConfig(1, 3))
    for eng in (plain, spec):
        eng.add(prompt, 2)
    spec.step()  # the prefill: its first token
    req = spec.requests[0]
    spec.step()  # one decode step: the newest token and 4 drafts in one forward
    plain.run()
    assert spec.idle and req.output_ids == plain.requests[0].output_ids
    assert (spec.spec_stats.num_drafts, spec.spec_stats.num_draft_tokens) == (1, 4)
    assert req.n_computed == len(req.all_ids) - 1  # rolled back to the tokens kept (check_stop's trim)


# ---- measurements ---------------------------------------------------------------------------------------------
def test_verify_bound_is_decode_and_prefill_at_the_ends(tiny):
    roof = Roofline(tiny.spec, HARDWARE["H100 SXM"])
    assert roof.verify_bound(n_past=99, n_new=1) == roof.decode_bound(batch=1, n_context=100)
    assert roof.verify_bound(n_past=0, n_new=64) == roof.prefill_bound(n_prompt=64)
    # memory-bound: k + 1 = 5 positions cost about one decode step (within 1%), not five
    assert roof.verify_bound(n_past=99, n_new=5).seconds < 1.01 * roof.decode_bound(batch=1, n_context=100).seconds


def test_gpu_prediction_counts_the_same_passes(tiny):
    gen = SpeculativeGeneration(tiny, EarlyExitDraft(2), k=4, max_new_tokens=16, stop_at_eos=False)
    gen.run(REPETITIVE)
    pred = gpu_prediction(gen, HARDWARE["H100 SXM"])
    roof = Roofline(tiny.spec, HARDWARE["H100 SXM"])
    n = len(gen.prompt_ids)
    assert pred.plain_s == pytest.approx(sum(roof.decode_bound(batch=1, n_context=n + i + 1).seconds
                                             for i in range(gen.n_generated - 1)))
    assert pred.spec_s > sum(roof.verify_bound(n_past=e.position, n_new=len(e.drafted) + 1).seconds
                             for e in gen.events[1:])  # plus the draft's passes


def test_speculate_cli_json_keys(capsys):
    assert main(["speculate", "--method", "early-exit", "--k", "2", "--prompt", REPETITIVE, "--max-new-tokens", "12",
                 "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert tuple(out) == ("token_ids", "text", "tokens_equal_plain", "acceptance_length_mean",
                          "accepted_per_position", "target_passes", "plain_passes", "rollback_tokens",
                          "draft_kv_bytes", "tpot_s", "tpot_plain_s")
    assert out["tokens_equal_plain"] is True and len(out["token_ids"]) == 12 and len(out["accepted_per_position"]) == 2
    assert out["target_passes"] <= out["plain_passes"] == 12 and out["draft_kv_bytes"] == 0


@pytest.mark.parametrize("argv", [
    ["--method", "draft"],
    ["--method", "ngram", "--draft", "random"],
    ["--method", "early-exit", "--exit-layer", "4"],
    ["--method", "ngram", "--prompt-lookup-min", "4", "--prompt-lookup-max", "2"],
    ["--method", "draft", "--draft", "layers:x"],
    ["--k", "40"],
    ["--gpu", "nope"],
])
def test_speculate_cli_bad_input(argv, capsys):
    assert main(["speculate", "--prompt", PLAIN, "--max-new-tokens", "4", "--repeats", "1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvviz: error:") and "\n" not in err


def test_step_strip_escapes_every_text(tiny):
    """The page sets the strip's HTML as it is (kvviz.app.widgets.own_html, no sanitizer): every token, drafted
    token and the legend are escaped where the strip is built."""
    from kvviz.lessons import decode_view, spec_view

    gen = SpeculativeGeneration(tiny, NgramDraft(ngram.NgramConfig(1, 3)), k=2, max_new_tokens=3, stop_at_eos=False)
    gen.run("a <b> & <i>")
    texts = decode_view.token_texts(tiny.tokenizer, gen.token_ids)
    texts[0] = "<img/src=x/onerror=alert(1)>"  # a token text as a hostile vocabulary could hold
    names = {i: "<script>" for i in gen.token_ids}
    strip = spec_view.step_strip_html(texts, len(gen.prompt_ids), gen.events[-1], names, "kept <all> & more")
    assert "<img" not in strip and "<script>" not in strip and "<b>" not in strip
    assert "&lt;img/src=x/onerror=alert(1)&gt;" in strip and "kept &lt;all&gt; &amp; more" in strip


def test_korean_on_smollm2_shows_characters_not_bytes_in_the_step_strip(smollm2):
    """Issue 29.7: SmolLM2's byte-level vocabulary splits a Hangul syllable over up to three tokens; the step strip
    drew each as its own `<0xEC>` chip (Korean lecture mode ran 890 px). Now a run of byte tokens is one chip of the
    characters it forms, as on the decode page, and the chips' token counts add up to every token."""
    import re

    from kvviz.lessons import decode_view, spec_view

    gen = SpeculativeGeneration(smollm2, NgramDraft(ngram.NgramConfig(1, 3)), k=2, max_new_tokens=3,
                                stop_at_eos=False)
    gen.run("옛날 옛적에 작은 마을이 있었습니다.")
    texts = decode_view.token_texts(smollm2.tokenizer, gen.token_ids)
    names = {i: decode_view.token_texts(smollm2.tokenizer, [i])[0] for i in gen.token_ids}
    strip = spec_view.step_strip_html(texts, len(gen.prompt_ids), gen.events[-1], names, "legend")
    chips = re.findall(r'class="kv-chip (\w+)"[^>]*data-tokens="(\d+)">([^<]*)</span>', strip)
    shown = [c for c in chips if c[0] != "rej"]
    assert sum(int(n) for _, n, _ in shown) == len(texts)
    prompt_chips = [text for kind, _, text in shown if kind == "prompt"]
    assert sum("<0x" in t for t in texts[:len(gen.prompt_ids)]) > 10  # the vocabulary really splits the syllables
    assert "".join(prompt_chips).replace("␣", " ") == "옛날 옛적에 작은 마을이 있었습니다."
