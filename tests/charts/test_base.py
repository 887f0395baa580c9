"""The shared layout: a figure for a phone's narrow screen (phone_layout)."""
from kvviz.charts.base import PHONE_WIDTH_PX, _display_width, legend_below, phone_layout, style
from kvviz.charts.compression import tradeoff_figure
from kvviz.compression.runner import method_family

METHODS = [("window", "슬라이딩 윈도 (64)"), ("h2o", "H2O (64)"), ("snapkv", "SnapKV (64)"), ("int8", "KIVI int8"),
           ("fp8", "FP8 (--calculate-kv-scales)"), ("mqa", "MQA로 묶기")]
ROWS = [dict(method=m, family=method_family(m), label=label, memory_saved=0.1 * i, kl_divergence=10 ** -i,
             top1_agreement=0.9, perplexity=3.0, kv_bytes=1000, n_cached=10) for i, (m, label) in enumerate(METHODS)]
FAMILIES = {"evict": "축출", "quantize": "양자화", "share": "헤드 공유"}


def _tradeoff():
    return tradeoff_figure(ROWS, metric="kl", family_names=FAMILIES, y_title="KL",
                           x_title="절약한 메모리 (전체 캐시 대비 비율, 둘 다 bfloat16로 저장)",
                           title="절약한 메모리 대 잃은 품질 (모든 방법)")


def _plot_px(fig) -> int:
    return fig.layout.height - fig.layout.margin.t - fig.layout.margin.b


def test_a_side_legend_moves_under_the_plot_which_keeps_its_height():
    fig = _tradeoff()
    phone = phone_layout(fig)
    assert fig.layout.legend.yref is None  # a copy: the desktop figure keeps its legend at the side
    legend = phone.layout.legend
    assert (legend.yref, legend.y, legend.yanchor, legend.x) == ("container", 0, "bottom", 0)
    assert _plot_px(phone) == _plot_px(fig)  # the figure grew by the legend's rows, not the plot shrunk
    # six entries and three family titles, a row each at 1.65 font sizes, and the gaps between the groups
    rows_px = int(1.65 * 12 * (6 + 3) + 6 * 3) + 10
    assert phone.layout.margin.b == fig.layout.margin.b + rows_px
    assert phone.layout.height == fig.layout.height + rows_px + 26 * phone.layout.title.text.count("<br>")


def test_titles_are_broken_into_the_lines_a_phone_holds():
    fig = _tradeoff()
    phone = phone_layout(fig)
    wide = PHONE_WIDTH_PX - 40
    title = phone.layout.title
    assert all(_display_width(x) * 0.55 * title.font.size <= wide for x in title.text.split("<br>"))
    # the x title, centred under the plot (the y axis's 50 px margin on its left), in plotly.js's 1.2× type: 16 px
    centre = fig.layout.margin.l + (wide - fig.layout.margin.l - phone.layout.margin.r) / 2
    room = 2 * min(centre, wide - centre)
    lines = phone.layout.xaxis.title.text.split("<br>")
    assert all(_display_width(x) * 0.55 * 16 <= room for x in lines) and len(lines) == 2, lines


def test_a_legend_in_a_row_becomes_a_list_under_the_plot_and_stays_one():
    fig = legend_below(style(_tradeoff(), title="t"))  # a row under the plot, which a phone wraps onto the x title
    phone = phone_layout(fig)
    assert (phone.layout.legend.orientation, phone.layout.legend.yref) == ("v", "container")
    assert _plot_px(phone) == _plot_px(fig)
    again = phone_layout(phone)  # a list under the plot already: as it is
    assert again.layout.legend == phone.layout.legend and again.layout.height == phone.layout.height


def test_subplots_titles_are_broken_to_their_columns_width():
    from plotly.subplots import make_subplots

    titles = ["토큰당 디코드 시간 (TPOT)", "초당 토큰 수 (전체 배치)", "KV 캐시 메모리"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles)
    phone = phone_layout(style(fig, title="t"))
    column = (PHONE_WIDTH_PX - 40) / 3
    for note in phone.layout.annotations:
        assert all(_display_width(x) * 0.55 * 13 <= column for x in note.text.split("<br>")), note.text
