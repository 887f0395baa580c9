"""Issue 51 #3: every chart's text alternative is computed from the figure's own numbers (charts.alt_text), and the
cache grid, token strip and paged pool say what their colours say (WCAG 1.1.1, 1.4.1)."""
import re

import numpy as np
import pytest

from kvviz.charts import decode, paged
from kvviz.charts.alt_text import MAX_CELLS, alt_html, describe
from kvviz.i18n import t
from kvviz.lessons.decode_view import TopToken, token_strip_html


def _bytes_figure():
    return decode.cache_bytes_figure([0, 1, 2], [1536, 1792, 2048], [4096, 4096, 4096], [1536, 1792, 2048],
                                     title="KV cache bytes after each pass", x_title="pass", y_title="bytes",
                                     names=("live", "allocated", "formula"))


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_lines_table_is_the_figures_data(lang):
    alt = describe(_bytes_figure(), lang)
    assert alt.name == "KV cache bytes after each pass"
    # one x column, a column per series, in the figure's trace order
    assert alt.header == ["pass", "allocated", "live", "formula"]
    assert alt.rows == [["0", "4,096", "1,536", "1,536"], ["1", "4,096", "1,792", "1,792"],
                        ["2", "4,096", "2,048", "2,048"]]
    assert "2,048" in alt.summary and "1,536" in alt.summary  # first and last of the live series
    assert alt.summary.startswith(t("a11y.lines_head", lang, n=3, x="pass"))


def test_a_pages_own_summary_replaces_the_generic_one():
    assert describe(_bytes_figure(), "en", "KV cache after 3 passes: 2.00 KiB").summary == \
        "KV cache after 3 passes: 2.00 KiB"


def test_heatmap_rows_are_named_by_their_tick_labels_and_the_largest_is_said():
    rows = np.array([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1]])
    fig = decode.attention_figure(rows, ["0 A", "1 list", "2 is"], ["q0 → kv0", "q1 → kv0"], [0, 0],
                                  title="Layer 0", x_title="position")
    alt = describe(fig, "en")
    assert alt.header[1:] == ["0 A", "1 list", "2 is"]
    assert [r[0] for r in alt.rows] == ["q0 → kv0", "q1 → kv0"]
    assert alt.rows[1][2] == "0.8"
    assert "0.8" in alt.summary and "q1 → kv0" in alt.summary and "1 list" in alt.summary


def test_a_large_table_is_cut_and_says_so():
    values = np.arange(200 * 64, dtype=float).reshape(200, 64)
    fig = decode.kv_values_figure(values, [str(i) for i in range(200)], title="K", x_title="d")
    alt = describe(fig, "en")
    assert len(alt.rows) * len(alt.header) <= MAX_CELLS and alt.cut == 200 - len(alt.rows)
    assert t("a11y.cut", "en", n=alt.cut) in alt_html(fig, "k", "en")


def test_alt_html_names_and_describes_by_id_and_escapes():
    html = alt_html(_bytes_figure().update_layout(title_text="a <b>&</b> b"), "reuse bytes", "ko")
    assert 'data-chart="kv-alt-reuse_bytes"' in html
    assert '<p id="kv-alt-reuse_bytes-name">a &amp; b</p>' in html
    assert 'id="kv-alt-reuse_bytes-summary"' in html and "<caption>" in html and html.count("<tr>") == 4


def test_cache_grid_says_its_runs_in_order_and_hides_its_cells():
    hover = "{row} · position {position} · pass {pass_}"
    html = decode.cache_grid_html([[0, 0, 0, 1, 2], [0, 0, 0, 1, 2]], list("abcde"), title="grid", x_title="pos",
                                  legend=("prefill", "steps", "newest"), hover=hover)
    said = re.search(r'<ul class="kv-grid-text"[^>]*>(.*?)</ul>', html).group(1)
    assert said == ("<li>L0 K … L1 V (4) · position 0–2 · pass 0 (prefill); position 3 · pass 1 (steps); "
                    "position 4 · pass 2 (newest)</li>")
    assert '<div aria-hidden="true"><div class="kv-row"' in html


def test_token_strip_said_as_text_and_prompt_marked_without_colour():
    html = token_strip_html(["A", " list", " is"], 2, [TopToken(1, " is", 0.5)], "top", names=("Prompt", "Generated"))
    assert "Prompt: A list — Generated: is" in html
    assert 'class="kv-strip" aria-hidden="true"' in html
    assert ".kv-chip.prompt{border-style:dashed}" in html  # prompt chips: a dashed border; generated: solid


def test_paged_pool_marks_sharing_in_text():
    class Block:
        def __init__(self, block_id, state, ref_count):
            self.block_id, self.state, self.ref_count, self.n_filled, self.owners = block_id, state, ref_count, 4, []

    labels = {k: k for k in paged.FIGURE_LABELS} | {"pool_title": "pool", "hover_block": "{block}"}
    fig = paged.pool_grid([Block(0, "null", 0), Block(1, "used", 2), Block(2, "cached", 0), Block(3, "used", 1)],
                          4, labels)
    cells = fig.data[0].text[0]
    assert cells[1] == "1 ×2" and cells[2] == "2 ↺" and cells[3] == "3"
    assert "shared2 ×2" in [tr.name for tr in fig.data]
