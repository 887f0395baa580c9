"""The methods as rows of one batch (a shared prefill, then one decode pass for all rows, each with its own
compressed cache): every method's numbers are bit for bit those of its run alone with the full cache, and against
the engine's own one-row forward within the rounding tolerance of kvviz.engine.tolerance. A Cancel keeps the
chunks finished."""
import math

import pytest
import torch

from kvviz.compression import quality
from kvviz.compression.runner import QUANT, Method, batchable, drain, rows_passes, run_method
from kvviz.engine.sweeps import SweepRun
from kvviz.engine.tolerance import magnitude, rounding_tolerance

TEXT = ("The cache keeps the keys and values of every past token, so each decode step reads them back instead of "
        "computing them again. A budget keeps fewer of them; quantization stores each in fewer bits. ") * 8
SEQ = 96  # prompt 48: budgets below it evict, SnapKV's window of 32 fits


METHODS = [Method("full"), *(Method(n, budget=40) for n in ("window", "streaming", "h2o", "snapkv")),
           Method("int8"), Method("int4"), Method("kivi2", residual=24), Method("fp8"),
           Method("fp8", kv_scale="calculate")]  # KIVI-2 at R = 24: its R of 128 (144 at G = 24) outlasts a chunk


@pytest.fixture(scope="module")
def pieces(tiny):
    return quality.chunks(tiny, TEXT, SEQ, 2 * SEQ)


def same_trace(a, b) -> bool:
    """Bit-identical logits, the same kept positions at every recorded step, the same bytes and counts."""
    return (torch.equal(a.logits, b.logits) and a.views.keys() == b.views.keys()
            and all(torch.equal(torch.as_tensor(x), torch.as_tensor(y))
                    for s in a.views for x, y in zip(a.views[s].kept, b.views[s].kept, strict=True))
            and (a.kv_bytes, a.formula_bytes, a.n_cached, a.evicted, a.fp8_clipped, a.bytes_at)
            == (b.kv_bytes, b.formula_bytes, b.n_cached, b.evicted, b.fp8_clipped, b.bytes_at))


def test_every_method_equals_its_run_alone(tiny, pieces):
    """Among all methods, each method's row is bit for bit its run with the full cache alone: the same logits,
    so the same perplexity, KL and top-1, and the same positions kept at every recorded step."""
    n_prompt, steps = SEQ // 2, frozenset({0, 1, 20, SEQ // 2 - 1})
    for ids in pieces:
        rows = drain(rows_passes(tiny, ids, n_prompt, METHODS, steps))
        target = [torch.tensor(ids[n_prompt:])]
        for m, row in zip(METHODS[1:], rows[1:], strict=True):
            full, alone = drain(rows_passes(tiny, ids, n_prompt, [METHODS[0], m], steps))
            assert same_trace(row, alone) and same_trace(rows[0], full), m.label()
            assert quality.compare([rows[0]], [row], target) == quality.compare([full], [alone], target)


def test_batched_rows_equal_the_engines_forward_within_rounding(tiny, pieces):
    """Against run_method (the engine's own forward, one row): the batched products add in another order, so logits
    agree within the rounding tolerance, kept positions exactly; perplexity, KL and top-1 within what that
    tolerance allows. The prefill is shared, so the first prediction is bit-identical for every method. Quantizing
    methods are held to the prefill only: a value that rounding moves across a grid boundary is stored one
    quantization step apart, which no rounding tolerance covers."""
    n_prompt, steps = SEQ // 2, (0, 1, 20, SEQ // 2 - 1)
    d_model = tiny.model.cfg.d_model
    for ids in pieces:
        rows = drain(rows_passes(tiny, ids, n_prompt, METHODS, frozenset(steps)))
        alone = [run_method(tiny, ids, n_prompt, m, view_steps=steps) for m in METHODS]
        target = torch.tensor(ids[n_prompt:])
        tol = max(rounding_tolerance(torch.float32, magnitude(a.logits), d_model) for a in alone)
        for row, a in zip(rows, alone, strict=True):
            label = a.method.label()
            assert torch.equal(row.logits[0], a.logits[0]), label
            if a.method.name in QUANT:
                continue
            assert (row.logits - a.logits).abs().max().item() <= tol, label
            for s in steps:  # what each cache held, position by position
                for kept_row, kept_alone in zip(row.views[s].kept, a.views[s].kept, strict=True):
                    assert (kept_row == kept_alone).all(), (label, s)
            assert (row.kv_bytes, row.n_cached, row.evicted, row.bytes_at) == (
                a.kv_bytes, a.n_cached, a.evicted, a.bytes_at), label
            # Each log-probability moves by at most 2·tol (a logit by tol, the log-sum-exp by tol): ln(perplexity)
            # by 2·tol; KL by 4·tol plus the probabilities' change (a factor within e^{±4·tol}) times the largest
            # |log p_full − log p_comp|.
            ppl_r, _, kl_r, top_r = quality.compare([rows[0]], [row], [target])
            ppl_a, _, kl_a, top_a = quality.compare([alone[0]], [a], [target])
            assert abs(math.log(ppl_r) - math.log(ppl_a)) <= 2 * tol, label
            spread = (alone[0].logits.log_softmax(-1) - a.logits.log_softmax(-1)).abs().max().item()
            assert abs(kl_r - kl_a) <= 4 * tol + (math.exp(4 * tol) - 1) * (spread + 4 * tol), label
            # top-1 exactly, but where the two best logits of either run are within 2·tol of each other
            close = [(lg.topk(2).values.diff().abs() <= 2 * tol).squeeze(-1) for lg in (a.logits, alone[0].logits)]
            assert abs(top_r - top_a) * len(target) <= int((close[0] | close[1]).sum()), label


def test_evaluate_batches_the_methods_that_keep_the_weights(tiny):
    pooled = Method("gqa", kv_heads=1)  # head pooling changes the K/V weights: it runs alone
    assert all(batchable(tiny, m) for m in METHODS) and not batchable(tiny, pooled)
    batched = quality.evaluation(tiny, [*METHODS, pooled], TEXT, seq_len=SEQ, n_tokens=2 * SEQ)
    alone = quality.evaluation(tiny, [*METHODS, pooled], TEXT, seq_len=SEQ, n_tokens=2 * SEQ, batched=False)
    passes = SEQ - SEQ // 2
    assert batched.total == 2 * passes * 2  # per chunk: the batch, then gqa
    assert alone.total == 2 * passes * len(METHODS + [pooled])
    rows_b, rows_a = list(batched.runs), list(alone.runs)
    assert len(rows_b) == batched.total and len(rows_a) == alone.total  # one yield per forward pass
    for b, a in zip(rows_b[-1], rows_a[-1], strict=True):
        assert (b.label, b.n_predicted, b.n_cached, b.kv_bytes, b.evicted) == (
            a.label, a.n_predicted, a.n_cached, a.kv_bytes, a.evicted)
        if b.method == "gqa":  # alone in both: the very same computation (its KL is against the batched full row)
            assert b.perplexity == a.perplexity


def test_cancel_keeps_the_chunks_finished(tiny):
    """Cancelled after the first chunk's batch: every batched method's row is the one a run over that chunk alone
    gives, and gqa, not started, has none."""
    methods = [*METHODS, Method("gqa", kv_heads=1)]
    run = SweepRun(quality.evaluation(tiny, methods, TEXT, seq_len=SEQ, n_tokens=2 * SEQ))
    assert run.time_left is None
    passes = SEQ - SEQ // 2
    while run.done < passes + 3:  # the first chunk's batch and three passes of gqa
        run.advance()
    assert run.time_left == pytest.approx(run.seconds / run.done * (run.sweep.total - run.done))
    run.cancel()
    assert run.cancelled and run.finished
    one_chunk = quality.evaluate(tiny, METHODS, TEXT, seq_len=SEQ, n_tokens=SEQ)
    assert [r.label for r in run.rows] == [m.label() for m in METHODS]
    for kept, whole in zip(run.rows, one_chunk, strict=True):
        assert kept.n_predicted == passes
        assert (kept.perplexity, kept.kl_divergence, kept.top1_agreement, kept.kv_bytes) == (
            whole.perplexity, whole.kl_divergence, whole.top1_agreement, whole.kv_bytes)
