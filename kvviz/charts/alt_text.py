"""A figure's text alternative, computed from the figure's own data (WCAG 1.1.1): its name (the title), a sentence
or two that say what it shows, and its numbers as a table a screen reader can step through (`describe`); as the
visually hidden HTML that widgets.chart() draws beside every chart (`alt_html`). A page may pass its own summary
(what the lesson is: "KV cache after 12 passes: 27.6 KiB, equal to the formula"); the table is always the data's."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kvviz.i18n import SR_ONLY, t

if TYPE_CHECKING:
    import plotly.graph_objects as go

MAX_CELLS = 1500  # a table larger than this is cut to its first rows (and says so): a Step redraws it
MAX_SAID = 6  # series (or bars) a summary names one by one; the table has them all


@dataclass
class Alt:
    name: str
    summary: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    cut: int = 0  # rows left out of the table (MAX_CELLS)


def plain(text: Any) -> str:
    """A Plotly label as text: <br> a space, tags dropped."""
    if text is None:
        return ""
    return re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", " ", str(text))).strip()


def number(v: Any) -> str:
    """A value as the table says it: 27,648, 0.4123, 1.2e-05; a label as itself."""
    if isinstance(v, bool | np.bool_) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, int | np.integer):
        return f"{int(v):,}"
    if isinstance(v, float | np.floating):
        if not np.isfinite(v):
            return "—"
        return f"{int(v):,}" if float(v).is_integer() and abs(v) < 1e15 else f"{float(v):.4g}"
    return plain(v)


def _axis_title(fig: go.Figure, trace: Any, letter: str) -> str:
    ref = getattr(trace, f"{letter}axis", None) or letter
    axis = fig.layout[f"{letter}axis{ref[1:]}"] if len(ref) > 1 else fig.layout[f"{letter}axis"]
    return plain(axis.title.text) if axis is not None and axis.title else ""


def _values(a: Any) -> list:
    if a is None:
        return []
    return list(a) if isinstance(a, list | tuple) else list(np.asarray(a, dtype=object).ravel())


def _series(fig: go.Figure) -> list[Any]:
    return [tr for tr in fig.data if tr.type in ("scatter", "scattergl", "bar") and tr.visible not in (False,)
            and tr.y is not None]


def describe(fig: go.Figure, lang: str, summary: str | None = None) -> Alt:
    """The figure's name, summary and table, in `lang`."""
    name = plain(fig.layout.title.text if fig.layout.title else None) or t("a11y.chart", lang)
    heat = [tr for tr in fig.data if tr.type == "heatmap" and tr.z is not None]
    if heat:
        alt = _heatmap(fig, heat[0], lang)
    else:
        alt = _lines(fig, _series(fig), lang)
    alt.name = name
    if summary:
        alt.summary = summary
    return alt


def _lines(fig: go.Figure, series: list[Any], lang: str) -> Alt:
    if not series:
        return Alt("", t("a11y.no_data", lang), [])
    x_title = _axis_title(fig, series[0], "x") or "x"
    said = []
    for i, tr in enumerate(series[:MAX_SAID]):
        xs, ys = _values(tr.x) or list(range(len(_values(tr.y)))), _values(tr.y)
        label = plain(tr.name) or t("a11y.series", lang, n=i + 1)
        finite = [(x, y) for x, y in zip(xs, ys, strict=False) if isinstance(y, int | float | np.number)
                  and np.isfinite(float(y))]
        if not finite:
            continue
        if tr.type == "bar" or len(finite) <= 3:
            said.append(t("a11y.bars", lang, name=label, values=", ".join(f"{number(x)}: {number(y)}"
                                                                           for x, y in finite)))
            continue
        top = max(finite, key=lambda p: float(p[1]))
        said.append(t("a11y.line", lang, name=label, n=len(finite), first=number(finite[0][1]),
                      x0=number(finite[0][0]), last=number(finite[-1][1]), x1=number(finite[-1][0]),
                      max=number(top[1]), at=number(top[0])))
    more = len(series) - MAX_SAID
    summary = t("a11y.lines_head", lang, n=len(series), x=x_title) + " " + " ".join(said)
    if more > 0:
        summary += " " + t("a11y.more", lang, n=more)
    xs = [tuple(_values(tr.x)) for tr in series]
    names = [plain(tr.name) or t("a11y.series", lang, n=i + 1) for i, tr in enumerate(series)]
    if all(x == xs[0] and x for x in xs):  # one x column, a column per series
        header = [x_title, *names]
        rows = [[number(x), *(number(_at(tr.y, j)) for tr in series)] for j, x in enumerate(xs[0])]
    else:  # series on their own x: one row per point
        header = [t("a11y.series_col", lang), x_title, _axis_title(fig, series[0], "y") or "y"]
        rows = [[names[i], number(x), number(y)] for i, tr in enumerate(series)
                for x, y in zip(_values(tr.x) or range(len(_values(tr.y))), _values(tr.y), strict=False)]
    return _cut(Alt("", summary, header, rows))


def _at(a: Any, j: int) -> Any:
    v = _values(a)
    return v[j] if j < len(v) else None


def _heatmap(fig: go.Figure, tr: Any, lang: str) -> Alt:
    z = np.asarray(tr.z, dtype=float)
    if z.ndim == 1:
        z = z[None, :]
    n_rows, n_cols = z.shape
    xs = _values(tr.x) or list(range(n_cols))
    ys = _values(tr.y) or list(range(n_rows))
    # Numeric positions carry their labels as tick text (charts.base.fit_labels): the table names rows by them.
    xs = _ticked(fig.layout[f"xaxis{(tr.xaxis or 'x')[1:]}"], xs)
    ys = _ticked(fig.layout[f"yaxis{(tr.yaxis or 'y')[1:]}"], ys)
    finite = np.where(np.isfinite(z), z, -np.inf)
    r, c = np.unravel_index(int(np.argmax(finite)), z.shape)
    x_title, y_title = _axis_title(fig, tr, "x"), _axis_title(fig, tr, "y")
    summary = t("a11y.heatmap", lang, rows=n_rows, cols=n_cols, x=f" ({x_title})" if x_title else "",
                y=f" ({y_title})" if y_title else "", min=number(float(np.nanmin(z))), max=number(float(z[r, c])),
                at_y=number(ys[r] if r < len(ys) else r), at_x=number(xs[c] if c < len(xs) else c))
    header = [_axis_title(fig, tr, "y") or "", *(number(x) for x in xs[:n_cols])]
    rows = [[number(ys[i] if i < len(ys) else i), *(number(float(v)) for v in z[i])] for i in range(n_rows)]
    return _cut(Alt("", summary, header, rows))


def _ticked(axis: Any, values: list) -> list:
    """Values named by the axis's tick labels where it has one for them (a token for a position)."""
    ticks = dict(zip(_values(axis.tickvals), _values(axis.ticktext), strict=False)) if axis.ticktext else {}
    return [ticks.get(v, v) for v in values]


def _cut(alt: Alt) -> Alt:
    keep = max(1, MAX_CELLS // max(1, len(alt.header)))
    if len(alt.rows) > keep:
        alt.cut = len(alt.rows) - keep
        alt.rows = alt.rows[:keep]
    return alt


def alt_html(fig: go.Figure, key: str, lang: str, summary: str | None = None) -> str:
    """The text alternative as visually hidden HTML: a named group with the summary and the data table; `key` makes
    its ids (kvviz.app.a11y points the chart's aria-labelledby and aria-describedby at them)."""
    alt = describe(fig, lang, summary)
    esc = html.escape
    ident = "kv-alt-" + re.sub(r"[^A-Za-z0-9_-]", "_", key)
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in alt.header)
    body = "".join("<tr>" + "".join((f'<th scope="row">{esc(c)}</th>' if j == 0 else f"<td>{esc(c)}</td>")
                                    for j, c in enumerate(row)) + "</tr>" for row in alt.rows)
    cut = f"<p>{esc(t('a11y.cut', lang, n=alt.cut))}</p>" if alt.cut else ""
    table = (f'<table><caption>{esc(t("a11y.data", lang, name=alt.name))}</caption><thead><tr>{head}</tr></thead>'
             f"<tbody>{body}</tbody></table>{cut}") if alt.header else ""
    return (f'<div class="kv-chart-alt" data-chart="{ident}" role="group" aria-labelledby="{ident}-name" '
            f'style="{SR_ONLY}"><p id="{ident}-name">{esc(alt.name)}</p><p id="{ident}-summary">{esc(alt.summary)}'
            f"</p>{table}</div>")
