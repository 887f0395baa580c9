"""Pure pieces of the decode explorer: work counts, GQA labels, cache-growth data, figures, shape limit."""
import re

import numpy as np
import pytest

from kvviz.charts import decode as charts
from kvviz.engine.config import DecoderConfig
from kvviz.engine.generation import Generation
from kvviz.engine.loading import random_backend
from kvviz.engine.model import Decoder
from kvviz.engine.shape import check_custom_shape, parameter_count
from kvviz.errors import InputError
from kvviz.kv.formula import attention_scores_per_pass
from kvviz.lessons import decode_view, work

CFG = DecoderConfig(n_layers=2, d_model=64, n_heads=6, n_kv_heads=2, d_head=8, d_ff=96, vocab_size=256, max_seq_len=64)


@pytest.fixture(scope="module")
def gen():
    g = Generation(random_backend(CFG), max_new_tokens=8, capture_attention=True)
    g.prefill("abcde")
    for _ in range(4):
        g.step()
    return g


def test_gqa_groups():
    assert decode_view.kv_head_of(6, 2) == [0, 0, 0, 1, 1, 1]
    assert decode_view.kv_head_of(4, 4) == [0, 1, 2, 3]  # MHA
    assert decode_view.kv_head_of(4, 1) == [0, 0, 0, 0]  # MQA
    assert decode_view.head_labels(4, 2) == ["q0 → kv0", "q1 → kv0", "q2 → kv1", "q3 → kv1"]


def test_written_at_reads_the_measured_lengths(gen):
    written = decode_view.written_at(gen.events)
    assert written == [[0] * 5 + [1, 2, 3, 4]] * CFG.n_layers


def test_pass_work_counts(gen):
    arch = gen.backend.spec
    w = work.pass_work(arch, gen.events[-1])  # step 4: the 9th position queries 9 keys
    assert (w.n_keys, w.cached_positions, w.recompute_positions) == (9, 1, 9)
    assert w.cached_qkv == 2 * 1 * (6 + 2 * 2) and w.recompute_qkv == 2 * 9 * (6 + 2 * 2)
    assert w.cached_scores == 2 * 6 * 9
    assert w.recompute_scores == 2 * 6 * 9 * 10 // 2
    prefill = work.pass_work(arch, gen.events[0])
    assert prefill.cached_scores == prefill.recompute_scores == attention_scores_per_pass(arch, 5, 0)
    assert prefill.cached_scores == 2 * 6 * 5 * 6 // 2


def test_cumulative_work_lies_on_the_analytic_sums(gen):
    arch = gen.backend.spec
    cw = work.cumulative_work(arch, gen.events)
    assert cw.n_tokens == [5, 6, 7, 8, 9]
    assert cw.cached == [work.analytic_cached(arch, n) for n in cw.n_tokens]
    assert cw.recompute == [work.analytic_recompute(arch, 5, n) for n in cw.n_tokens]
    assert cw.cached[-1] == 12 * 45 and cw.recompute[-1] == 12 * (15 + 21 + 28 + 36 + 45)


def test_analytic_growth_orders():
    arch = random_backend(CFG).spec
    # Doubling n: cached work ×~4 (n²), recomputation ×~8 (n³).
    assert 3.9 < work.analytic_cached(arch, 2000) / work.analytic_cached(arch, 1000) < 4.1
    assert 7.9 < work.analytic_recompute(arch, 1, 2000) / work.analytic_recompute(arch, 1, 1000) < 8.1


def test_token_texts_show_bytes_of_split_characters():
    from kvviz.engine.tokenizer import ByteTokenizer

    ids = list("가a".encode())
    assert decode_view.token_texts(ByteTokenizer(), ids) == ["<0xEA>", "<0xB0>", "<0x80>", "a"]


def test_token_strip_escapes_and_marks_the_newest(gen):
    top = gen.events[-1].top_k
    html = decode_view.token_strip_html(["<b>", " a", "x"], 2, top, "top-5 & more")
    assert "&lt;b&gt;" in html and "␣a" in html and "top-5 &amp; more" in html
    assert html.count('class="kv-chip newest gen"') == 1 and html.count('class="kv-chip prompt"') == 2
    assert html.count('class="kv-top-item"') == len(top) == 5


def test_cache_grid_data(gen):
    html = charts.cache_grid_html(decode_view.written_at(gen.events), [f"{i} t" for i in range(9)], title="T",
                                  x_title="x", legend=("p", "s", "n"), hover="{row} {position} {pass_}")
    rows = re.findall(r'class="kv-row" data-row="([^"]+)" data-cached="(\d+)"', html)
    assert rows == [("L0 K", "9"), ("L0 V", "9"), ("L1 K", "9"), ("L1 V", "9")]  # every row labelled
    runs = re.findall(r'data-kind="(\w+)" data-from="(\d+)" data-to="(\d+)"', html)
    assert runs == [("prefill", "0", "4"), ("step", "5", "7"), ("newest", "8", "8")] * 4
    assert html.count(">L0 K</div>") == 1 and html.count(">L1 V</div>") == 1


def test_cache_grid_stays_visible_at_600_positions():
    """Issue 19 item 19: at 500+ positions the Plotly heatmap's cells vanished and only axes remained."""
    n_layers, n = 4, 600
    written = [[0] * 100 + list(range(1, n - 99)) for _ in range(n_layers)]
    labels = [f"{i} tok{i}" for i in range(n)]
    html = charts.cache_grid_html(written, labels, title="T", x_title="x", legend=("p", "s", "n"), hover="{row}")
    widths = [float(w) for w in re.findall(r'class="kv-seg"[^>]*width:([\d.]+)%', html)]
    assert len(widths) == 3 * 2 * n_layers  # one block per colour run: prefill, earlier steps, newest
    assert sum(widths) == pytest.approx(2 * n_layers * 100, abs=0.01)  # every row filled, no gaps
    assert min(widths) == pytest.approx(100 / n, abs=1e-4)  # the newest column is one position wide
    assert "repeating-linear-gradient" not in html  # no separators eating sub-pixel columns
    newest = re.search(r'class="kv-newest"[^>]*>([^<]+)<', html).group(1)
    assert newest == "▲ 599 tok599"  # the newest column always keeps its label
    assert len(re.findall(r">L\d [KV]</div>", html)) == 2 * n_layers


def test_cache_grid_of_a_deep_model_fits_its_rows_px():
    """Issue 29.7: SmolLM2's 30 layers drew 60 rows of 24 px (1,440 px) on a 720 px lecture screen. Given rows_px the
    rows thin to fit it, every row still drawn and every k-th labelled a line of text apart; a shallow model's grid
    is the same with or without it."""
    written = [list(range(40))] * 30
    kw = dict(title="T", x_title="x", legend=("p", "s", "n"), hover="{row}", lecture=True)
    html = charts.cache_grid_html(written, [str(i) for i in range(40)], rows_px=200, **kw)
    rows = re.findall(r'class="kv-row"[^>]*height:(\d+)px;margin-bottom:(\d+)px', html)
    assert len(rows) == 60 and sum(int(h) + int(g) for h, g in rows) <= 200
    labelled = re.findall(r">(L\d+ [KV])</div>", html)
    assert labelled[0] == "L0 K" and 1 < len(labelled) < 60
    names = re.findall(r'class="kv-row" data-row="([^"]+)"', html)
    apart = names.index(labelled[1]) - names.index(labelled[0])
    assert apart * (int(rows[0][0]) + int(rows[0][1])) >= 1.2 * 20  # labels a line of 20 px text apart
    shallow = [list(range(40))] * 4
    assert charts.cache_grid_html(shallow, [str(i) for i in range(40)], rows_px=200, **kw) == \
        charts.cache_grid_html(shallow, [str(i) for i in range(40)], **kw)


def test_attention_rows_are_readable(gen):
    rows = gen.events[-1].attention[0]
    h = rows.shape[0]
    fig = charts.attention_figure(rows, [str(i) for i in range(9)], decode_view.head_labels(h, 2),
                                  decode_view.kv_head_of(h, 2), title="A", x_title="x")
    plot_h = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert plot_h / h >= 30  # px per head row (was ~8 px in the two-column layout)


def test_attention_figure_rows_and_group_boxes(gen):
    rows = gen.events[-1].attention[1]
    fig = charts.attention_figure(rows, [str(i) for i in range(9)], decode_view.head_labels(6, 2),
                                  decode_view.kv_head_of(6, 2), title="A", x_title="x")
    z = np.array(fig.data[0].z)
    assert z.shape == (6, 9)
    np.testing.assert_allclose(z.sum(axis=1), 1.0, atol=1e-5)
    assert [(s.y0, s.y1) for s in fig.layout.shapes] == [(-0.5, 2.5), (2.5, 5.5)]  # two KV groups of 3


def test_position_axis_thins_long_labels():
    axis = charts._position_axis([str(i) for i in range(200)])
    assert len(axis["tickvals"]) <= charts.MAX_TICKS and axis["tickvals"][0] == 0


def test_decode_loop_dot_closes_the_loop():
    dot = charts.decode_loop_dot(["a", "b", "c \"q\"", "d", "e", "f"], "again")
    assert 's5 -> s2 [label="again"' in dot and 'c \\"q\\"' in dot
    assert dot.count("->") - dot.count("style=invis") == 6  # five steps and the loop; invisible ones lay out the grid


def test_parameter_count_matches_the_model():
    for cfg in (CFG, DecoderConfig(), DecoderConfig(tie_embeddings=True, n_kv_heads=8),
                DecoderConfig(qkv_bias=True), DecoderConfig(qkv_bias=True, o_bias=True)):  # Qwen2, Llama biases
        assert parameter_count(cfg) == Decoder(cfg).num_parameters()


def test_custom_shape_limit():
    big = DecoderConfig(n_layers=48, d_model=4096, n_heads=32, n_kv_heads=8)
    with pytest.raises(InputError) as exc:
        check_custom_shape(big)
    assert "parameters" in str(exc.value) and "파라미터" in exc.value.message("ko")
    assert check_custom_shape(CFG) is CFG


def test_play_beats_keep_the_schedule():
    p = 0.25
    due, nxt = decode_view.play_beats(None, 10.0, p)  # Play pressed: one step now
    assert (due, nxt) == (1, 10.25)
    assert decode_view.play_beats(nxt, 10.20, p) == (1, 10.5)  # a tick 50 ms early still lands on its beat
    assert decode_view.play_beats(10.5, 10.30, p)[0] == 0  # a rerun between beats (a widget change) steps nothing
    # Issue 29 #6: two ticks merged into one run (the machine is behind) show one new token, never several at once:
    # the schedule restarts from now, and the page says it is late.
    due, nxt = decode_view.play_beats(10.5, 10.80, p)
    assert due == 1 and nxt == pytest.approx(11.05)
    due, nxt = decode_view.play_beats(11.0, 13.0, p)  # far behind: one step, then restart from now
    assert due == 1 and nxt == pytest.approx(13.25)
    # Over 20 beats with ticks arriving up to 40% of a period late, exactly 20 steps run.
    nxt, steps = None, 0
    for k in range(20):
        due, nxt = decode_view.play_beats(nxt, 100 + k * p + (0.1 if k % 3 else 0.0), p)
        steps += due
    assert steps == 20


def test_achieved_rate():
    assert decode_view.achieved_rate([0.0, 0.25, 0.5]) is None  # too few steps to say
    assert decode_view.achieved_rate([i * 0.25 for i in range(20)]) == pytest.approx(4.0)
    assert decode_view.achieved_rate([i * 0.5 for i in range(20)]) == pytest.approx(2.0)


def test_grid_layers_fit_a_lecture_screen_for_any_depth():
    """Issue 38.5: on a projector Reusing Past K/V drew all 60 K/V rows of SmolLM2's 30 layers at full height (1,903 px
    on a 720 px screen) while Speculative Decoding thinned them to 2 px rows. One rule now: on a page every layer; on a
    projector as many as fit LECTURE_GRID_PX at full height, the first, the last and the rest evenly between, a
    lesson's own layers kept (the early exit's boundary)."""
    per_layer = 2 * (charts.GRID_ROW_PX + charts.GRID_GAP_PX)
    fit = charts.LECTURE_GRID_PX // per_layer
    assert fit == 4
    for n in range(1, 81):
        assert charts.grid_layers(n, lecture=False) == list(range(n))
        shown = charts.grid_layers(n, lecture=True)
        assert shown == sorted(set(shown)) and shown[0] == 0 and shown[-1] == n - 1
        assert len(shown) == min(n, fit) and len(shown) * per_layer <= charts.LECTURE_GRID_PX
        gaps = [b - a for a, b in zip(shown, shown[1:], strict=False)]
        assert not gaps or max(gaps) - min(gaps) <= 1  # evenly spread
        for m in range(1, n):  # an early exit after m layers: layers m - 1 and m both shown
            kept = charts.grid_layers(n, lecture=True, keep=(m - 1, m))
            assert {0, m - 1, m, n - 1} <= set(kept) and len(kept) == min(n, fit)
    assert charts.grid_layers(4, lecture=True) == [0, 1, 2, 3]  # the shipped model: every layer, as before
    assert charts.grid_layers(30, lecture=True) == [0, 10, 19, 29]  # SmolLM2
    assert charts.grid_layers(30, lecture=True, keep=(21, 22)) == [0, 21, 22, 29]  # its default early exit


def test_the_chosen_layers_draw_at_full_height_within_the_budget():
    """The grid of SmolLM2's depth on a projector: 8 rows of 22 px (4 layers), named by their own layer."""
    written = [list(range(40))] * 30
    layers = charts.grid_layers(30, lecture=True)
    html = charts.cache_grid_html([written[i] for i in layers], [str(i) for i in range(40)], title="T", x_title="x",
                                  legend=("p", "s", "n"), hover="{row}", lecture=True,
                                  layer_names=[f"L{i}" for i in layers], rows_px=charts.LECTURE_GRID_PX)
    rows = re.findall(r'class="kv-row" data-row="([^"]+)"[^>]*height:(\d+)px;margin-bottom:(\d+)px', html)
    assert [r[0] for r in rows] == ["L0 K", "L0 V", "L10 K", "L10 V", "L19 K", "L19 V", "L29 K", "L29 V"]
    assert {(int(h), int(g)) for _, h, g in rows} == {(charts.GRID_ROW_PX, charts.GRID_GAP_PX)}
    assert re.findall(r">(L\d+ [KV])</div>", html) == [r[0] for r in rows]  # every row labelled


def test_presets_come_in_the_ui_language_first():
    from kvviz.i18n import t

    ko = decode_view.presets("reuse", "ko")
    assert ko == [t(f"reuse.preset_{i}", "ko") for i in (1, 2, 3)] + [t(f"reuse.preset_{i}", "en") for i in (1, 2, 3)]
    assert decode_view.presets("spec", "en")[:3] == [t(f"spec.preset_{i}", "en") for i in (1, 2, 3)]
    assert sorted(decode_view.presets("spec", "en")) == sorted(decode_view.presets("spec", "ko"))


def test_can_step_play_warning_and_check_verdict(gen):
    assert decode_view.can_step(gen) and not decode_view.can_step(gen, stale=True)
    assert not decode_view.can_step(None)
    done = Generation(random_backend(CFG), max_new_tokens=1)
    done.prefill("ab")
    assert done.done and not decode_view.can_step(done)
    freed = Generation(random_backend(CFG), max_new_tokens=4)
    freed.prefill("ab")
    freed.cache = None  # a hosted demo freed it after idling
    assert not decode_view.can_step(freed)
    period = 0.25  # 4 steps/s asked
    assert decode_view.play_warning(3.5, period, 1e9) == "play_behind"  # under 3.6 = 90 % of 4
    assert decode_view.play_warning(3.7, period, 1e9) is None
    assert decode_view.play_warning(None, period, 2.9) == "play_late"  # a beat late 2.9 s ago, no rate yet
    assert decode_view.play_warning(None, period, 3.1) is None
    assert decode_view.play_warning(3.0, period, 0.0) == "play_behind"  # the rate, once known, says it first
    assert decode_view.check_verdict(True, True) == "check_same"
    assert decode_view.check_verdict(True, False) == "check_differs"
    assert decode_view.check_verdict(False, True) == "check_beyond"


def test_cache_grid_tooltips_keep_a_short_legends_words():
    """Issue 38.5: on a projector Speculative Decoding's legend is short (one line) and the early exit's explanation
    is the title's tooltip; the page's own words stay, escaped, as each entry's and the title's tooltip."""
    kw = dict(title="T", x_title="x", hover="{row}", lecture=True, legend_kinds=("prefill", "rejected"))
    html = charts.cache_grid_html([list(range(3))], ["a", "b", "c"], legend=("p", "rolled back"),
                                  legend_help=("prefill", 'written by the "verify", rolled back'),
                                  title_help="layers 0–2 <shared>", **kw)
    legend = re.search(r'<span class="kv-legend">(.*?)</span><span style="color:#555">', html).group(1)
    assert re.findall(r'<span data-kind="(\w+)" title="([^"]*)"', legend) == [
        ("prefill", "prefill"), ("rejected", "written by the &quot;verify&quot;, rolled back")]
    assert ">rolled back</span>" in legend
    assert re.search(r'class="kv-grid-help" title="([^"]*)"', html).group(1) == "layers 0–2 &lt;shared&gt;"
    plain = charts.cache_grid_html([list(range(3))], ["a", "b", "c"], legend=("p", "r"), **kw)
    assert "kv-grid-help" not in plain and re.findall(r'<span data-kind="\w+" title="([^"]*)"', plain) == ["p", "r"]


def test_cache_grid_escapes_every_text():
    """The pages set the grid's HTML as it is (kvviz.app.widgets.own_html, no sanitizer): the title, the labels of
    positions and layers, the axis, the hover words and the legend are escaped where the grid is built."""
    hostile = "<img/src=x/onerror=alert(1)>"
    html = charts.cache_grid_html([[0, 0, 1]], ["a", "b", hostile], title=f"T {hostile}", x_title=f"x {hostile}",
                                  hover="{row} " + hostile, legend=(hostile, "s", "n"), layer_names=[hostile])
    assert "<img" not in html and html.count("&lt;img/src=x/onerror=alert(1)&gt;") >= 5
