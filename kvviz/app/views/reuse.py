"""What the Reusing Past K/V page draws beyond its controls: the session keys it keeps (`REUSE`), the run's status,
the token strip, the tab row (`pick_tab`) and the picked tab (`draw`, whose status and strip are `draw_head`; a
lecture room's follower draws them and the grid with `follow`, with "Explore from here" from `run_settings`): the
cache growing per layer, its bytes, the cached K/V values, the newest token's attention, the work with and without a
cache, and the check against recomputing. Imports the engine (torch): the page imports it after its first screen is
drawn."""
from __future__ import annotations

import numpy as np
import streamlit as st

from kvviz.app.a11y import announce
from kvviz.app.decode_controls import CONTROL_KEYS
from kvviz.app.language import tr
from kvviz.app.room.explore import explore_button, model_settings
from kvviz.app.room.view import RoomView
from kvviz.app.state import page_state
from kvviz.app.widgets import chart, own_html, run_download
from kvviz.charts import decode as charts
from kvviz.charts.run_html import decode_size
from kvviz.engine import tolerance
from kvviz.engine.generation import Generation
from kvviz.engine.tokenizer import chip_labels
from kvviz.lessons import decode_view, work
from kvviz.lessons.run_record import decode_record
from kvviz.units import format_binary

# The keys the page keeps besides its widgets': the generation and the settings it started with, Play's state (on,
# its schedule, the times its steps ran, the timer), the stepper's last press applied, the check's result, the
# prompt and speed (kept across a visit to another page), an error or a clamp to say once, the status line's slot.
REUSE = page_state("reuse", gen=None, model_key=None, checks={}, prompt=None, speed=4.0, chat=False, error=None,
                   clamped=None, status_slot=None, **CONTROL_KEYS)
TABS = ("growth", "bytes", "values", "attention", "work", "check")


def draw(gen: Generation, *, lecture: bool) -> dict:
    """The run's status line, a clamp said, the token strip with the top five, the tab row and the picked tab (only
    that one is drawn, so a step redraws one lesson, not six charts). Returns what a lecture room's followers draw
    of it (decode_view.room_view)."""
    texts = decode_view.token_texts(gen.backend.tokenizer, gen.token_ids)
    labels = decode_view.position_labels(chip_labels(texts))  # byte runs as their characters
    spec = gen.backend.spec
    view = decode_view.room_view(gen.events, texts, len(gen.prompt_ids), gen.n_generated, gen.done, spec.name,
                                 (spec.n_heads, spec.n_kv_heads), st.session_state.get("reuse_attn_layer") or 0)
    draw_head(view, lecture=lecture)
    if REUSE.get("clamped"):
        n_fit, max_len = REUSE.get("clamped")
        st.warning(tr("reuse.clamped", n_new=n_fit, max_len=max_len))
    opened = pick_tab(TABS, "reuse_tab")
    if opened == "attention":
        attention_tab(spec.n_layers, view, labels, lecture, gen.events[-1].attention)
    elif opened in FOLLOWER_TABS:
        FOLLOWER_TABS[opened](view, labels, lecture)
    else:
        {"values": values_tab, "work": work_tab, "check": check_tab}[opened](gen, labels, texts, lecture)
    return view


def pick_tab(names: tuple[str, ...] | list[str], key: str) -> str:
    """The tab row: one radio button per lesson (a radio group, arrow keys and Tab reach each), the picked one drawn
    below it. Not st.tabs: a Step redraws the fragment, and st.tabs' tab list was built again on every redraw
    (~16 ms of the browser's main thread on each Step, docs/measurements.md § Step on Reusing Past K/V); the picked
    name, not its label, is kept, so a language switch keeps the tab."""
    return st.segmented_control(tr("reuse.tab_pick"), names, format_func=lambda name: tr(f"reuse.tab_{name}"),
                                key=key, default=names[0], required=True, label_visibility="collapsed") or names[0]


def draw_head(view: dict, *, lecture: bool) -> None:
    """The status line and the token strip with the top five, from a room view (the lecturer's and a follower's)."""
    (REUSE.get("status_slot") or st).caption(
        tr("reuse.status", n_prompt=view["n_prompt"], n_steps=view["n_steps"], n_gen=view["n_gen"],
           n_cached=view["n_cached"], ttft_ms=f"{view['ttft_ms']:.1f}", step_ms=f"{view['step_ms']:.1f}")
        + (" " + tr("reuse.on_c_step") if view.get("compiled") == "kernels" else "")
        + (" " + tr("reuse.done") if view["done"] else ""))
    texts = view["texts"]
    top_caption = tr("reuse.top_short" if lecture else "reuse.top_caption", token=decode_view.visible(texts[-1]))
    own_html(decode_view.token_strip_html(texts, view["n_prompt"], decode_view.top_tokens(view), top_caption,
                                          lecture=lecture, names=(tr("reuse.said_prompt"), tr("reuse.said_generated"))),
             key="reuse_strip")
    # A blind learner follows the decode: each pass's news said politely (WCAG 4.1.3)
    announce(tr("reuse.announce", n_steps=view["n_steps"], token=decode_view.spoken(texts[-1]),
                n_cached=view["n_cached"], bytes=format_binary(view["bytes"]["live"])))


def run_settings(key: decode_view.ModelKey, prompt: str, chat: bool, max_new: int) -> dict:
    """The session keys a lecturer's run was started with, as JSON: what "Explore from here" sets in a follower's."""
    return {**model_settings(key), "reuse_prompt": prompt, "reuse_chat": chat, "_w_reuse_max_new": max_new}


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Reusing Past K/V: the lecturer's status and strip, and the tabs drawn from published
    data (cache grid, bytes, the attention row of the lecturer's layer), read-only; the follower picks the tab."""
    if view.explore is not None:
        explore_button(view.explore, view["n_steps"])
    draw_head(view, lecture=lecture)
    labels = decode_view.position_labels(chip_labels(view["texts"]))
    names = [name for name in FOLLOWER_TABS if name != "attention" or view.get("attention")]
    FOLLOWER_TABS[pick_tab(names, "room_reuse_tab")](view, labels, lecture)


def download(where, gen: Generation | None, *, compact: bool) -> None:  # noqa: ANN001 - a Streamlit container
    """"Download this run" for the steps shown now (a later step is not in the file until the button is drawn
    again)."""
    if gen is None or not gen.events:
        run_download(where, "reuse_download", "kvviz-run.html", None, compact=compact)
        return
    n, spec = len(gen.events), gen.backend.spec
    settings = {"prompt": gen.backend.tokenizer.decode(gen.prompt_ids), "max_new_tokens": gen.max_new_tokens,
                "temperature": gen.temperature, "seed": gen.seed}
    run_download(where, "reuse_download", f"kvviz-run-{spec.name}-{n}-steps.html",
                 lambda: decode_record(gen, settings, n_steps=n),
                 decode_size(spec.n_layers, spec.n_heads, len(gen.prompt_ids), n, attention=gen.capture_attention),
                 compact=compact)


def grid_html(written: list[list[int]], labels: list[str], *, title: str, lecture: bool, keep: tuple[int, ...] = (),
              prefix: str = "L", **kw) -> str:
    """The cache grid of the layers charts.grid_layers chooses for this screen (both decode pages draw theirs
    here), its title saying which layers when not all: a deep model's grid fits a 1280×720 projector."""
    layers = charts.grid_layers(len(written), lecture=lecture, keep=keep)
    if len(layers) < len(written):
        title = tr("common.grid_layers", title=title, shown=", ".join(str(i) for i in layers), n=len(written))
    kinds = kw.pop("kinds", None)
    return charts.cache_grid_html(
        [written[i] for i in layers], labels, title=title, layer_names=[f"{prefix}{i}" for i in layers],
        kinds=None if kinds is None else [kinds[i] for i in layers], lecture=lecture,
        rows_px=charts.LECTURE_GRID_PX if lecture else None, **kw)


def growth_tab(view: dict, labels: list[str], lecture: bool) -> None:
    if not lecture:  # said aloud on a projector; the legend under the grid names the colours
        st.caption(tr("reuse.growth_help"))
    own_html(grid_html(
        view["written_at"], labels, title=tr("reuse.growth_chart", n=view["n_cached"]),
        x_title=tr("reuse.position"), hover=tr("reuse.growth_hover"),
        legend=(tr("reuse.legend_prefill"), tr("reuse.legend_steps"), tr("reuse.legend_newest")), lecture=lecture),
        key="reuse_grid")
    if not lecture:  # on a projector the Cache bytes tab shows them
        b = view["bytes"]
        st.caption(tr("reuse.bytes_line", live=f"{b['live']:,}", formula=f"{b['formula']:,}",
                      allocated=f"{b['allocated']:,}"))


def bytes_tab(view: dict, labels: list[str], lecture: bool) -> None:
    ev = view["series"]
    chart(charts.cache_bytes_figure(
        ev["index"], ev["live"], ev["allocated"], ev["formula"], title=tr("reuse.bytes_chart"),
        x_title=tr("reuse.pass"),
        y_title=tr("reuse.bytes"), names=(tr("reuse.live"), tr("reuse.allocated"), tr("reuse.formula")),
        lecture=lecture), key="reuse_bytes", summary=bytes_summary(view["bytes"], len(ev["index"])))


def bytes_summary(b: dict, n_passes: int) -> str:
    """The bytes chart in a sentence: the cache now, against the formula (exactly: both are whole bytes)."""
    return tr("reuse.bytes_summary", n=n_passes, live=format_binary(b["live"]), formula=format_binary(b["formula"]),
              allocated=format_binary(b["allocated"]),
              verdict=tr("reuse.bytes_equal" if b["live"] == b["formula"] else "reuse.bytes_differs"))


def beside(lecture: bool) -> tuple:
    """Where a tab's selectors and its chart go: on a projector side by side (the chart keeps the height), else one
    above the other."""
    return st.columns([1, 4]) if lecture else (st.container(), st.container())


def values_tab(gen: Generation, labels: list[str], texts: list[str], lecture: bool) -> None:
    be, arch = gen.backend, gen.backend.spec
    if not lecture:  # the tab names it
        st.subheader(tr("reuse.kv_title"))
    pick, view = beside(lecture)
    s1, s2, s3 = (pick, pick, pick) if lecture else st.columns(3)
    layer = s1.selectbox(tr("reuse.layer"), range(arch.n_layers), key="reuse_kv_layer")
    head = s2.selectbox(tr("reuse.kv_head"), range(arch.n_kv_heads), key="reuse_kv_head")
    kind = s3.radio(tr("reuse.k_or_v"), ("K", "V"), horizontal=True, key="reuse_kv_kind")
    k, v = be.layer_kv(gen.cache, layer)
    values = (k if kind == "K" else v)[0, head].float().cpu().numpy()
    with view:
        chart(charts.kv_values_figure(
            values, labels, title=tr("reuse.kv_chart", kind=kind, layer=layer, head=head, n=values.shape[0]),
            x_title=tr("reuse.dim"), lecture=lecture), key="reuse_kv")


def attention_tab(n_layers: int, view: dict, labels: list[str], lecture: bool, rows: list[np.ndarray]) -> None:
    """The lecturer's attention tab: the layer picked (draw() read it into `view`), then its row per head, drawn
    from the run's own `rows` (the room gets them rounded)."""
    if not lecture:  # the tab names it
        st.subheader(tr("reuse.attn_title"))
    pick, where = beside(lecture)
    pick.selectbox(tr("reuse.layer"), range(n_layers), key="reuse_attn_layer")
    with where:
        attention_chart(view, labels, lecture, rows[view["attention"]["layer"]])


def attention_chart(view: dict, labels: list[str], lecture: bool, rows: np.ndarray | None = None) -> None:
    """The newest query's attention row in the view's layer, per head (the lecturer's, from `rows`, and a
    follower's, from the view)."""
    n_heads, n_kv_heads = view["heads"]
    layer = view["attention"]["layer"]
    rows = np.asarray(view["attention"]["rows"]) if rows is None else rows
    chart(charts.attention_figure(
        rows, labels, decode_view.head_labels(n_heads, n_kv_heads), decode_view.kv_head_of(n_heads, n_kv_heads),
        title=tr("reuse.attn_chart", layer=layer, token=decode_view.visible(view["texts"][rows.shape[1] - 1])),
        x_title=tr("reuse.position"), lecture=lecture), key="reuse_attn",
        summary=attention_summary(rows, labels, layer))


def attention_summary(rows: np.ndarray, labels: list[str], layer: int, top: int = 3) -> str:
    """The attention row in a sentence: the positions the newest query attends to most, averaged over its heads."""
    mean = np.asarray(rows, dtype=float).mean(axis=0)
    order = np.argsort(-mean, kind="stable")[:top]
    said = ", ".join(tr("reuse.attn_top", pct=f"{100 * mean[i]:.0f}",
                                    position=decode_view.spoken(labels[i])) for i in order)
    return tr("reuse.attn_summary", layer=layer, heads=len(rows), top=said)


def work_tab(gen: Generation, labels: list[str], texts: list[str], lecture: bool) -> None:
    arch, last, n_prompt = gen.backend.spec, gen.events[-1], len(gen.prompt_ids)
    if not lecture:  # the tab names it
        st.subheader(tr("reuse.work_title"))
    pw = work.pass_work(arch, last)
    if not lecture:  # on a projector the two charts carry the counts (their bars are labelled)
        m = st.columns(4)
        m[0].metric(tr("reuse.positions_cached"), pw.cached_positions)
        m[1].metric(tr("reuse.positions_recompute"), pw.recompute_positions)
        m[2].metric(tr("reuse.scores_cached"), f"{pw.cached_scores:,}")
        m[3].metric(tr("reuse.scores_recompute"), f"{pw.recompute_scores:,}")
    w1, w2 = st.columns(2)
    with w1:
        chart(charts.step_work_figure(
            pw, title=tr("reuse.step_work_chart", t=pw.n_keys),
            categories=(tr("reuse.qkv_vectors"), tr("reuse.scores")),
            names=(tr("reuse.with_cache"), tr("reuse.without_cache")), y_title=tr("reuse.count_log"),
            lecture=lecture), key="reuse_step_work")
    cw = work.cumulative_work(arch, gen.events)
    n_axis = list(range(n_prompt, n_prompt + gen.max_new_tokens))
    ratio = f"{cw.recompute[-1] / cw.cached[-1]:.1f}"
    # On a projector the chart's title carries the ratio the caption below gives on the page.
    cum_title = tr("reuse.cum_chart_ratio", ratio=ratio) if lecture else tr("reuse.cum_chart")
    with w2:
        chart(charts.cumulative_work_figure(
            cw, n_axis, [work.analytic_cached(arch, n) for n in n_axis],
            [work.analytic_recompute(arch, n_prompt, n) for n in n_axis], title=cum_title,
            x_title=tr("reuse.seq_len"), y_title=tr("reuse.scores"),
            names=(tr("reuse.measured_cached"), tr("reuse.measured_recompute"), tr("reuse.analytic_cached"),
                   tr("reuse.analytic_recompute")), lecture=lecture), key="reuse_cum_work")
    if not lecture:
        st.caption(tr("reuse.work_help", ratio=ratio))


def check_tab(gen: Generation, labels: list[str], texts: list[str], lecture: bool) -> None:
    be = gen.backend
    if not lecture:  # the tab names it
        st.subheader(tr("reuse.check_title"))
    if gen.cache is None:  # freed after idling on a hosted demo: nothing to compare
        st.info(tr("reuse.empty"))
        return
    check_key = (id(gen), len(gen.events))
    if check_key not in REUSE.get("checks"):  # once per pass, and only when this tab is open
        REUSE.set("checks", {check_key: gen.cache_vs_recompute()})
    delta, tok_cached, tok_fresh = REUSE.get("checks")[check_key]
    e = st.columns(3)
    e[0].metric(tr("reuse.max_delta"), f"{delta:.2e}")
    e[1].metric(tr("reuse.greedy_cached"), decode_view.visible(be.tokenizer.token_text(tok_cached)))
    e[2].metric(tr("reuse.greedy_recompute"), decode_view.visible(be.tokenizer.token_text(tok_fresh)))
    rounding = tolerance.agreement(delta, be.dtype, tolerance.magnitude(gen.last_logits), be.spec.d_model)
    verdict = decode_view.check_verdict(rounding.within, tok_cached == tok_fresh)
    (st.success if verdict == "check_same" else st.warning)(
        tr(f"reuse.{verdict}", delta=f"{delta:.2e}", tol=f"{rounding.tolerance:.2e}"))


# The tabs drawn from a room view alone: a follower draws them too (values, work and the check need the model's run).
FOLLOWER_TABS = {"growth": growth_tab, "bytes": bytes_tab, "attention": attention_chart}
