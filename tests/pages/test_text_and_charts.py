"""Issue 29 #8: the text and charts faults a full pass found (those outside pages 2 and 4), each checked here.
Home's raw `compression.summary` key is tests/app/test_navigation.py's; the chart geometry a browser draws (a
legend on an axis title, heatmap labels on each other) is also measured in tests/browser/test_text_charts_browser.py."""
import json
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from kvviz.app.widgets import number_text
from kvviz.charts import decode as decode_charts
from kvviz.charts.base import LABEL_LINE
from kvviz.charts.compression import tradeoff_figure
from kvviz.charts.memory import allocation_figure
from kvviz.charts.paged import pool_usage
from kvviz.compression.runner import method_family
from kvviz.i18n import LANGS, t
from kvviz.lessons import quiz
from kvviz.units import format_exact
from tests.pages.pagetest import open_page as _open

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
OTHERS = {"prefill", "latency"}  # pages 2 and 4: their text is issue 29 part A's
PLURAL_NOUNS = ("tokens", "steps", "requests", "positions", "layers", "blocks", "heads", "chunks", "passes", "runs",
                "points", "values", "parameters", "GPUs", "settings", "slots")
# "{n} tokens" with no {n|token|tokens}: "1 tokens" when n is 1 ("{a}/{b} heads" and rates per second excepted).
BARE_COUNT = re.compile(r"(?<!}/)\{(\w+)\}\s+(?:(?:decode|new|prompt|KV|query|token|physical|logical|free|cached|"
                        r"shared)\s+)?(" + "|".join(PLURAL_NOUNS) + r")\b(?!/s)")


# ---- plurals -----------------------------------------------------------------------------------------------
def test_no_english_count_without_its_singular():
    bare = []
    for path in sorted((ROOT / "kvviz" / "locales" / "en").glob("*.toml")):
        if path.stem in OTHERS:
            continue
        for key, text in tomllib.loads(path.read_text()).items():
            bare += [f"{path.stem}.{key}: {m.group(0)}" for m in BARE_COUNT.finditer(str(text))]
    assert bare == []


def test_one_of_each_reads_singular():
    status = t("reuse.status", n_prompt=1, n_steps=1, n_gen=1, n_cached=1, ttft_ms="2.0", step_ms="1.0")
    assert status.startswith("1 prompt token prefilled · 1 decode step · 1 token generated · 1 position cached")
    assert "2 decode steps · 2 tokens" in t("reuse.status", n_prompt=5, n_steps=2, n_gen=2, n_cached=6,
                                             ttft_ms="2", step_ms="1")
    assert "only 1 new token fits after" in t("reuse.clamped", n_new=1, max_len=128)
    assert "only 3 new tokens fit after" in t("reuse.clamped", n_new=3, max_len=128)
    assert "1 request length above the context was capped" in t("memory.lengths_capped", n=1, max_len="4,096")


def test_memory_table_says_one_request():
    at = _open("pages/3_Memory_Footprint.py")  # the default scenario: one request
    table = next(m.value for m in at.markdown if "|---|" in m.value)  # the factor-by-factor table
    assert "· 1 request |" in table and "· 1 requests" not in table


# ---- the Training page's layer numbers ---------------------------------------------------------------------
@pytest.mark.parametrize("lang, label", [("en", "Largest change in layers ≥ 1"), ("ko", "레이어 1 이상의 최대 변화")])
def test_training_names_the_layers_it_measures(lang, label):
    at = _open("pages/5_Training_Prefill_Decode.py", lang=lang)
    assert label in [m.label for m in at.metric]  # layers count from 0: the code takes every layer from index 1
    explain = t("check.reuse_condition_explain", lang)
    assert "layer 2" not in explain and "레이어 2" not in explain


# ---- charts ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("allocated, unit", [([3 * 2**30, 5 * 2**30], "GiB"), ([2 * 2**50, 3 * 2**50], "PiB"),
                                             ([900, 1000], "B"), ([5 * 2**20, 7 * 2**20], "MiB")])
def test_allocation_axis_names_the_unit_of_its_numbers(allocated, unit):
    fig = allocation_figure(["contiguous", "paged"], allocated[0] // 2, allocated, title="t", live_label="live",
                            waste_label="waste", y_title="K/V memory ({unit})")
    assert fig.layout.yaxis.title.text == f"K/V memory ({unit})"
    tops = [a + b for a, b in zip(fig.data[0].y, fig.data[1].y, strict=True)]
    assert 1 <= max(tops) < 1024  # numbers of the named unit, never "2.5B" of MiB
    assert fig.layout.yaxis.exponentformat == "none"


def test_memory_page_allocation_axis():
    at = _open("pages/3_Memory_Footprint.py")
    chart = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "memory_alloc_chart" in c.proto.id)
    assert chart["layout"]["yaxis"]["title"]["text"] == "K/V memory (GiB)"


@pytest.mark.parametrize("lecture", [False, True])
def test_cached_values_labels_never_overlap(lecture):
    """At 13 positions the heatmap drew 13 labels 10 px apart; now they are a line of text apart or thinned."""
    for n in range(1, 300):
        fig = decode_charts.kv_values_figure(np.zeros((n, 8)), [f"t{i}" for i in range(n)], title="K", x_title="d",
                                             lecture=lecture)
        plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        ticks = fig.layout.yaxis.tickvals
        spacing = plot_px / n * (ticks[1] - ticks[0] if len(ticks) > 1 else n)
        assert spacing >= LABEL_LINE * fig.layout.font.size, (n, spacing)


def test_legends_below_sit_under_the_axis_title():
    """The Work tab's legend was placed against the plot at −0.22 of its height, on the x-axis title: now it sits
    at the figure's bottom edge with a margin that holds ticks, title and legend (measured in the browser test)."""
    from kvviz.lessons.work import CumulativeWork

    for lecture in (False, True):
        fig = decode_charts.cumulative_work_figure(CumulativeWork([3, 4], [9, 13], [9, 25]), [3, 4], [9, 13], [9, 25],
                                                   title="t", x_title="n", y_title="s", names=("a", "b", "c", "d"),
                                                   lecture=lecture)
        if lecture:  # a short figure on a projector: the legend in the plot's empty top left, never under the axis
            assert fig.layout.legend.y > 0.5 and fig.layout.legend.yanchor == "top"
        else:
            assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0
            assert fig.layout.margin.b >= 8 * fig.layout.font.size


def test_pool_chart_shows_its_first_step():
    from types import SimpleNamespace

    fig = pool_usage([SimpleNamespace(step=1, used=3, cached_free=0, free=17, preempted=[])],
                     {k: k for k in ("used", "cached", "free", "preempted", "step", "blocks", "usage_title")})
    assert [(tr.type, list(tr.y)) for tr in fig.data] == [("bar", [3]), ("bar", [0]), ("bar", [17])]


def test_compression_legend_is_never_scrolled():
    """13 methods and 3 family titles in a 440 px figure: the legend scrolled in a clipped box (measured 347 px of
    entries in 295 px); the figure now grows to hold them (Chromium: 16 rows at 12 px take ≤ 330 px)."""
    methods = ["window", "streaming", "h2o", "snapkv"] * 2 + ["int8", "int4", "fp8", "gqa", "mqa"]
    rows = [dict(method=m, family=method_family(m), label=m, memory_saved=0.5, kl_divergence=0.1, top1_agreement=0.9,
                 perplexity=3.0, kv_bytes=1, n_cached=8) for m in methods]
    for lecture in (False, True):
        fig = tradeoff_figure(rows, metric="kl", family_names={"evict": "e", "quantize": "q", "share": "s"},
                              x_title="x", y_title="y", title="t", lecture=lecture)
        room = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        assert room >= 1.65 * fig.layout.legend.font.size * (len(rows) + 3), lecture


# ---- bytes, tables and the Serving page ----------------------------------------------------------------------
def test_exact_bytes_are_not_repeated():
    assert format_exact(768) == "768 B"  # was "768 B (768 B)"
    assert format_exact(12_288) == "12,288 B (12.00 KiB)"


def test_serving_page_says_768_bytes_once():
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["serving_conn"] = {"url": "http://127.0.0.1:8080", "models": ["kvviz-tiny"], "engine": "llama.cpp",
                                   "block_size": None}
    at.switch_page("pages/7_Serving_Engine.py").run()
    at.selectbox(key="serving_kv_dtype_kvviz-tiny").set_value("bfloat16").run()  # llama-server does not report it
    assert not at.exception
    caption = next(c.value for c in at.caption if "per token" in c.value)
    assert "**768 B per token**" in caption and "(768 B)" not in caption


def test_gpu_memory_source_is_one_short_line_and_the_rest_folded():
    at = _open("pages/3_Memory_Footprint.py")
    line = t("memory.gpu_said_cuda")
    assert line in [c.value for c in at.caption] and len(line) < 120 and "github" not in line
    expander = next(e for e in at.expander if e.label == t("memory.gpu_source_title"))
    assert any("vLLM" in c.value or "deviceQuery" in c.value for c in expander.caption)


# ---- the Check page ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("lang", LANGS)
def test_the_right_answer_is_not_the_longest_option(lang):
    for q in quiz.QUESTIONS:
        if q.kind is not quiz.Kind.CHOICE:
            continue
        lengths = {o: len(t(f"check.{q.id}_opt_{o}", lang)) for o in q.options}
        assert lengths[q.answer] <= max(v for o, v in lengths.items() if o != q.answer), (q.id, lengths)
        assert max(lengths.values()) <= 1.25 * min(lengths.values()), (q.id, lengths)  # parallel in length


def test_a_huge_estimate_is_refused_in_a_few_digits():
    assert number_text(1e99) == "1e+99"
    at = _open("pages/6_Check.py")
    at.number_input(key="predict_cache_size").set_value(1e99).run()
    message = at.error[0].value
    assert "1e+99" in message and len(message) < 150
