"""Figure functions of the Training page: the data they draw, read back from the figure."""
import math

import numpy as np

from kvviz.charts import training as charts
from kvviz.charts.base import LECTURE_MAX_HEIGHT


def test_attention_figure_blanks_the_mask_and_outlines_the_new_row():
    probs = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    fig = charts.attention_figure(probs, list("abcd"), title="t", key_axis="k", query_axis="q", new_row="new",
                                  past_rows="past")
    z = np.asarray(fig.data[0].z)
    assert np.isnan(z[0, 1]) and math.isclose(z[3, 0], math.log10(0.25))  # masked = blank, colour = log10 p
    outline = [s for s in fig.layout.shapes if s.line.color == "#d62728"]
    assert len(outline) == 1 and (outline[0].y0, outline[0].y1) == (2.5, 3.5)  # exactly the last row
    assert tuple(fig.layout.yaxis.range) == (3.5, -0.5)


def test_logits_chart_keeps_true_values_and_draws_zero_at_the_floor():
    fig = charts.logits_diff_figure([0.0, 0.0, 2e-7, 1e-6], n_prompt=2, tolerance=1e-4, title="t", x_title="x",
                                    y_title="y", prefill_name="p", decode_name="d", tolerance_name="tol")
    prefill, decode, tol = fig.data
    assert list(prefill.customdata) == [0.0, 0.0] and list(prefill.y) == [charts.FLOOR] * 2
    assert list(decode.x) == [2, 3] and list(decode.customdata) == [2e-7, 1e-6]
    assert list(tol.y) == [1e-4, 1e-4] and fig.layout.yaxis.type == "log"


def test_mask_figure_and_lecture_sizes():
    causal = charts.mask_figure(list("abc"), True, title="t", key_axis="k", query_axis="q", allowed="a", masked="m")
    assert np.asarray(causal.data[0].z).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    full = charts.mask_figure(list("abc"), False, title="t", key_axis="k", query_axis="q", allowed="a", masked="m",
                              lecture=True)
    assert np.asarray(full.data[0].z).min() == 1
    # larger type, and within one 1280×720 screen beside the page's title and idea stepper (issue 29 #7)
    assert full.layout.font.size == 18 and full.layout.height == min(int(420 * 1.15), LECTURE_MAX_HEIGHT)
    many = charts.mask_figure(["x"] * 30, True, title="t", key_axis="k", query_axis="q", allowed="a", masked="m")
    assert many.layout.xaxis.tickmode == "auto"  # 30 labels would overlap: positions instead


def test_kv_heatmaps_are_stacked_so_titles_never_overlap():
    par = np.random.default_rng(0).normal(size=(6, 2))
    fig = charts.kv_side_by_side(par, par + 1e-7, list("abcdef"), titles=["K parallel", "K sequential", "|diff|"],
                                 position_axis="pos", dim_axis="dim")
    titles = [a for a in fig.layout.annotations if a.text in ("K parallel", "K sequential", "|diff|")]
    assert len(titles) == 3 and len({round(a.y, 3) for a in titles}) == 3  # one title per row, each at its own height
    for axis in ("yaxis", "yaxis2", "yaxis3"):
        assert tuple(fig.layout[axis].range) == (-0.5, 1.5) and fig.layout[axis].dtick == 1  # d_head 2: ticks 0, 1
    domains = sorted(tuple(fig.layout[a].domain) for a in ("yaxis", "yaxis2", "yaxis3"))
    assert all(lo[1] < hi[0] for lo, hi in zip(domains, domains[1:], strict=False))  # the rows do not overlap


def test_drift_chart_shows_rounding_sized_bars_on_a_log_axis():
    fig = charts.drift_figure([0.0, 6e-7, 2e-7], [0.0, 1e-6, 3e-7], 1.3, [5e-6, 5e-6, 5e-6], title="t", x_title="x",
                              y_title="y", k_name="K", v_name="V", tolerance_name="tol")
    k, v, tol = fig.data
    assert fig.layout.yaxis.type == "log"
    low, high = fig.layout.yaxis.range
    assert low <= math.log10(2e-7) - 2 and high >= math.log10(1.3)  # ~1e-7 bars stand well above the axis floor
    assert list(k.customdata) == [0.0, 6e-7, 2e-7] and k.y[0] == charts.FLOOR and list(k.text) == ["0", "", ""]
    assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0  # under the plot and its axis title
    assert list(tol.y) == [5e-6] * 3
