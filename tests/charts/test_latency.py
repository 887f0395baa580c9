"""The latency figures' layout faults a projector shows (issue 19.20): log ticks, a lone bar, legends."""
import pytest

from kvviz.charts import latency as charts

LABELS = {k: k for k in ("title", "x", "y", "y2", "queue", "prefill", "decode", "cumulative", "memory", "compute",
                         "bound", "tokens_per_s", "compute_batch", "max_batch", "kv_weights")}


@pytest.mark.parametrize("low, high", [(16, 448), (8, 32), (5.2, 9.8), (0.003, 0.02), (1, 2**20), (3.1, 3.3)])
def test_log_ticks_are_full_rising_numbers(low, high):
    values, text = charts.log_ticks(low, high)
    assert values == sorted(values) and len(set(values)) == len(values)
    assert [float(t.replace(",", "")) for t in text] == pytest.approx(values)
    assert values[0] <= low * 1.5 and values[-1] >= high / 1.5  # the ticks span the data


def test_plotlys_own_labels_would_read_9_10_2():
    """Plotly's default for a log axis under a decade repeats mantissas; the charts set their own ticks."""
    fig = charts.prompt_length_chart([{"prompt_tokens": n, "ttft_s": 0.01 * n, "tpot_s": 0.001} for n in (8, 16, 32)],
                                     {}, {**LABELS, "ttft_s": "TTFT", "tpot_s": "TPOT", "fit": "{name}"})
    axis = fig.layout.xaxis
    assert axis.tickmode == "array" and [float(t) for t in axis.ticktext] == list(axis.tickvals)
    assert "2" not in axis.ticktext  # 20 reads "20", not a bare mantissa after "10"


def test_one_token_does_not_fill_the_width():
    fig = charts.token_timeline([0.01], 0.0, LABELS)
    assert tuple(fig.layout.xaxis.range) == (0.5, charts.MIN_BARS + 0.5)
    fig = charts.token_timeline([0.01] * 40, 0.0, LABELS)
    assert tuple(fig.layout.xaxis.range) == (0.5, 40.5)


@pytest.mark.parametrize("lecture", [False, True])
def test_legends_sit_below_the_axis_titles(lecture):
    timeline = charts.token_timeline([0.01, 0.005], 0.0, LABELS, lecture=lecture)
    curve = [{"batch": b, "memory_s": 0.01, "compute_s": 0.001 * b, "seconds": max(0.01, 0.001 * b),
              "tokens_per_s": b / max(0.01, 0.001 * b)} for b in (1, 2, 4, 8, 16, 32)]
    roof = charts.roofline_chart(curve, LABELS, compute_batch=10.0, max_batch=20, kv_weights_batch=5.0, lecture=lecture)
    for fig in (timeline, roof):
        legend = fig.layout.legend
        if lecture:  # height is scarce on a 1280×720 screen: the legend stands right of the plot and its 2nd y axis
            assert legend.orientation == "v" and legend.x >= 1.1 and legend.xanchor == "left"
            assert fig.layout.margin.b >= 60 and fig.layout.height <= 330  # room for the x-axis title; one screen
            continue
        # anchored to the figure's foot (container), inside a bottom margin that also holds the x-axis title
        assert legend.yref == "container" and legend.y == 0 and legend.yanchor == "bottom"
        assert fig.layout.margin.b >= 95
