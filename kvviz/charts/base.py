"""Layout every kvviz figure shares: a stable uirevision (zoom survives live updates) and lecture sizing; legends
(`legend_below`) and labels (`fit_labels`) placed to fit; a figure laid out for a phone's narrow screen
(`phone_layout`)."""
from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from functools import cache

import plotly.graph_objects as go
import plotly.io as pio


@cache
def _template() -> go.layout.Template:
    # plotly_white's layout only, validated once: assigning the full template costs ~0.1 s per figure,
    # which a page redrawing six charts per decode step cannot afford.
    return go.layout.Template(layout=pio.templates["plotly_white"].layout)


# Plotly's own families, then the CJK font for Hangul (a browser or Chromium falls back glyph by glyph): Korean text
# is drawn in Noto Sans CJK KR where it is installed, not in whichever CJK variant the system picks first.
FONT_FAMILY = '"Open Sans", verdana, arial, "Noto Sans CJK KR", "Noto Sans KR", "Malgun Gothic", sans-serif'

LECTURE_MAX_HEIGHT = 360  # px: with the page's title row and idea stepper, one chart per screen at 1280×720


LECTURE_TITLE_WIDTH = 56  # characters (a wide one counts two) a title line holds in half a 1280 px screen


def _display_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def wrap_title(text: str, width: int = LECTURE_TITLE_WIDTH) -> str:
    """A title broken between words into lines of at most `width` (Plotly clips a title wider than its chart)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and _display_width(lines[-1] + " " + word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def style(fig: go.Figure, *, title: str | None = None, lecture: bool = False, height: int = 360,
          lecture_height: int = LECTURE_MAX_HEIGHT) -> go.Figure:
    """Apply the shared look. `lecture` enlarges type for projection, keeps a chart within one screen's room (at most
    `lecture_height`, less where the page shows more above it) and breaks a long title into lines (charts stand two
    abreast there)."""
    size = 18 if lecture else 13
    if title and lecture:
        title = wrap_title(title)
    extra_lines = title.count("<br>") if title else 0
    fig.update_layout(
        # The title sits below Plotly's toolbar (pages keep it visible for PNG export), above any legend.
        title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=34), font=dict(size=size + 3))
        if title else None,
        uirevision="kvviz",  # keeps the user's zoom/pan when the data changes
        height=min(int(height * 1.15), lecture_height) + 24 * extra_lines if lecture else height,
        font=dict(size=size, family=FONT_FAMILY),
        margin=dict(l=50, r=20, t=((100 if lecture else 90) + 26 * extra_lines) if title else 30, b=40),
        template=_template(),
    )
    if lecture:
        _wrap_axis_titles(fig, size)
    return fig


PHONE_WIDTH_PX = 390  # a phone's width in CSS px (a room's followers hold these): the figure's width there
LEGEND_ROW_FONTS = 1.65  # a legend row in font sizes (measured in Chromium: 16 rows at 13 px took 347 px)


def phone_layout(fig: go.Figure) -> go.Figure:
    """The figure for a phone's narrow screen, a copy. A legend beside the plot took half of its 390 px (the plot
    squeezed to ~150 px), and one above it wrapped into rows over the title: every legend becomes a list under the
    plot, one entry per row, and the figure grows by those rows, so the plot keeps its height and the whole width.
    The title, the x-axis titles and subplots' titles are broken into the lines their width holds (Plotly clips them
    at the figure's edge, and lets neighbouring subplots' titles run into each other)."""
    fig = go.Figure(fig)
    font = fig.layout.font.size or 13
    legend = fig.layout.legend
    entries = [t for t in fig.data if "showlegend" in t and (  # an icicle or a treemap has no legend
        t.showlegend or (t.showlegend is None and t.name and len(fig.data) > 1 and t.type not in ("heatmap", "table")))]
    listed_below = legend.yref == "container" and legend.orientation in (None, "v")
    if fig.layout.showlegend is not False and entries and not listed_below:
        legend_font = legend.font.size or font
        groups = {t.legendgroup for t in entries if t.legendgrouptitle and t.legendgrouptitle.text}
        gap = legend.tracegroupgap if legend.tracegroupgap is not None else 10
        rows_px = int(LEGEND_ROW_FONTS * legend_font * (len(entries) + len(groups)) + gap * len(groups)) + 10
        margin = fig.layout.margin
        fig.update_layout(legend=dict(orientation="v", x=0, xanchor="left", y=0, yref="container", yanchor="bottom"),
                          height=(fig.layout.height or 450) + rows_px,  # Plotly's default height and margins
                          margin=dict(r=20, b=(margin.b or 80) + rows_px))
    # a chart is 358 px wide on that screen (Streamlit's padding, measured in Chromium), less the title's indent
    wide = PHONE_WIDTH_PX - 40
    title = fig.layout.title.text if fig.layout.title else None
    if title and "<br>" not in title:
        title_font = fig.layout.title.font.size or font + 3
        lines = wrap_title(title, max(12, int(wide / (0.55 * title_font))))
        fig.update_layout(title_text=lines, margin_t=(fig.layout.margin.t or 100) + 26 * lines.count("<br>"),
                          height=(fig.layout.height or 450) + 26 * lines.count("<br>"))
    axes = [fig.layout[k] for k in fig.layout.to_plotly_json() if k.startswith("xaxis")]
    column = wide / max(1, len({tuple(a.domain or (0, 1)) for a in axes}))  # subplots side by side share the width
    # Plotly's default margins where a figure sets none (its layout attributes: l = r = 80)
    left = fig.layout.margin.l if fig.layout.margin.l is not None else 80
    right = fig.layout.margin.r if fig.layout.margin.r is not None else 80
    for axis in axes:
        text = axis.title.text if axis.title else None
        if text and "<br>" not in text:
            # An x title stands centred under its plot, which the y axis's margin pushes right: it holds twice the
            # room from that centre to the nearer edge of the figure. Its type is 1.2× the figure's (plotly.js's
            # axis defaults size title.font as Lib.bigFont(font.size) = Math.round(1.2 * size)): a Korean title
            # wrapped at the figure's width and size ran past a phone's right edge.
            d0, d1 = axis.domain or (0, 1)
            centre = left + (wide - left - right) * (d0 + d1) / 2
            room = min(column, 2 * min(centre, wide - centre))
            size = axis.title.font.size or round(1.2 * font)
            axis.title.text = wrap_title(text, max(12, int(room / (0.55 * size))))
    for note in fig.layout.annotations:  # make_subplots' titles: standing on a plot's top edge, one per column
        if note.text and "<br>" not in note.text and note.yanchor == "bottom" and (note.y or 0) >= 0.99:
            note.text = wrap_title(note.text, max(8, int(column / (0.55 * (note.font.size or font)))))
    return fig


def _wrap_axis_titles(fig: go.Figure, size: int) -> None:
    """A y-axis title longer than its plot is tall runs off the figure: break it into lines (≈ 0.55 font size
    per character)."""
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    for name in [k for k in fig.layout.to_plotly_json() if k.startswith("yaxis")]:
        axis = fig.layout[name]
        text = axis.title.text if axis.title else None
        if text and "<br>" not in text and _display_width(text) * 0.55 * size > plot_px:
            axis.title.text = wrap_title(text, max(12, int(plot_px / (0.55 * size))))


def legend_below(fig: go.Figure, *, lecture: bool = False, rows: int = 1, page: bool = True) -> go.Figure:
    """A horizontal legend at the figure's bottom edge, under the x-axis title (placed against the plot, at −0.22 of
    its height, it sat on the title once the plot was short): the bottom margin holds the tick labels, the axis title
    and two rows of legend at the figure's font size. In lecture mode, where the figure is short, `rows` rows between
    the title and the plot instead, above the subplots' titles where it has them. `page=False`: outside lecture
    mode the figure keeps the legend it placed itself."""
    font = fig.layout.font.size
    if lecture:
        # make_subplots' titles: annotations standing on a plot's top edge
        titled = any(a.yref == "paper" and a.yanchor == "bottom" and (a.y or 0) >= 0.99 for a in fig.layout.annotations)
        over = int(1.6 * font) if titled else 0
        fig.update_layout(margin_t=fig.layout.margin.t + int(1.8 * font) * rows + over)
        plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=1.02 + over / plot_px,
                                      yanchor="bottom"))
        return fig
    if not page:
        return fig
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=0, yref="container", yanchor="bottom"),
                      margin_b=int(8 * font))
    return fig


LABEL_LINE = 1.4  # a tick label's height, in font sizes: labels closer than this overlap


def fit_labels(fig: go.Figure, labels: Sequence[str]) -> go.Figure:
    """Token labels on a figure's y axis (numeric positions, so repeated tokens stay apart): one per position while
    rows are a line of text apart, else every k-th (13 labels 10 px apart overlapped). Call after style()."""
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    fits = max(1, int(plot_px // (LABEL_LINE * fig.layout.font.size)))
    every = max(1, -(-len(labels) // fits))
    ticks = list(range(0, len(labels), every))
    fig.update_yaxes(tickmode="array", tickvals=ticks, ticktext=[labels[i] for i in ticks])
    return fig
