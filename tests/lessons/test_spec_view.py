"""What the Speculative Decoding page draws, from a real speculative generation on the shipped model: the strip's
legend, the grid's kinds, the speed table's per-token figures."""
import pytest

from kvviz.engine.loading import load_backend
from kvviz.engine.metrics import Spread
from kvviz.engine.spec import drafts
from kvviz.engine.spec.decoding import SpeculativeGeneration
from kvviz.engine.spec.measure import gpu_prediction
from kvviz.engine.spec.ngram import NgramConfig
from kvviz.kv.hardware import HARDWARE
from kvviz.lessons import spec_view

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


@pytest.fixture(scope="module")
def gen():
    g = SpeculativeGeneration(load_backend("tiny"), drafts.NgramDraft(NgramConfig(2, 5)), k=4, max_new_tokens=24)
    g.prefill(PROMPT)
    return g


def test_strip_legend_and_grid_kinds(gen):
    assert spec_view.strip_legend(gen.events[0]) == "strip_prefill"
    while not gen.done:
        gen.step()
    steps = gen.events[1:]
    assert any(e.drafted for e in steps)  # code repeats itself: prompt lookup finds drafts
    for e in steps:
        assert spec_view.strip_legend(e) == ("strip_legend" if e.drafted else "strip_nodraft")
    assert spec_view.grid_legend(0) == ("prefill", "step", "newest", "rejected")
    assert spec_view.grid_legend(3) == ("prefill", "step", "draft", "newest", "rejected")
    kinds = {k for row in spec_view.cache_grid(gen.events, 0).kinds for k in row}
    assert kinds <= set(spec_view.grid_legend(0))  # every kind the grid draws has its legend entry


def test_speed_table_figures(gen):
    while not gen.done:
        gen.step()
    pred = gpu_prediction(gen, next(h for h in HARDWARE.values() if h.memory_kind != "given"))
    plain_us, spec_us = spec_view.per_token_us(pred, gen.n_generated)
    assert plain_us == pytest.approx(pred.plain_s / (gen.n_generated - 1) * 1e6)
    assert spec_us == pytest.approx(pred.spec_s / (gen.n_generated - 1) * 1e6)
    assert plain_us / spec_us == pytest.approx(pred.speedup)
    assert spec_view.spread_ms(Spread(0.01234, 0.01, 0.015, 3)) == "12.34 ms (10.00–15.00)"
