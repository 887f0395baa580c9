"""What the Paged Blocks page draws of its engine: the engine's state as plain numbers (`room_view`: what the page
draws, and what a lecture room's followers get), drawn by `show` (the metrics, block tables, pool, requests with
their hits and the prefill time each saved, usage over time and fragmentation), and a room follower's page
(`follow`); PAGED, the page's session keys. Imports the engine (torch): the page imports it after its first screen
is drawn."""
from __future__ import annotations

from dataclasses import asdict

import streamlit as st

from kvviz.app.language import tr
from kvviz.app.room.explore import explore_from
from kvviz.app.room.view import RoomView
from kvviz.app.state import page_state
from kvviz.app.widgets import chart, table
from kvviz.charts import paged as charts
from kvviz.engine.paged.blocks import max_cacheable_tokens
from kvviz.engine.paged.demo import HitSaving
from kvviz.engine.paged.scheduler import BlockView, Fragmentation, PagedEngine, PoolSample, RequestView, fragmentation
from kvviz.engine.paged.scheduler import snapshot as engine_snapshot

# The keys the page keeps besides its widgets': the engine and what built it (model, block size, pool), whether Play
# runs, each request as added ([step, shared, system, own, new]: what a follower's "Explore from here" replays), the
# prefill time each hit saved (measured once per prompt length and hit), a click's error said once.
PAGED = page_state("paged", engine=None, key=None, playing=False, adds=[], savings={}, error=None)
SAVING_REPEATS = 9  # each prefill timed this many times, interleaved: the fastest of each, and their spread


def room_view(engine: PagedEngine, shown: set[str], saved: dict[int, HitSaving], max_len: int, model: str) -> dict:
    """The engine's state as JSON, for the ideas `shown`: the pool's counts, each block and request, the usage
    history and the fragmentation (the memory idea's), and the prefill time each hit saved (`saved`, measured by
    the page when the requests or savings idea is shown)."""
    blocks, requests = engine_snapshot(engine)
    frag = fragmentation(engine) if "memory" in shown else None
    return {"shown": sorted(shown), "model": model,
            "block_size": engine.block_size, "max_len": max_len, "step": engine.n_steps, "hits": engine.pool.hits,
            "queries": engine.pool.queries, "in_use": engine.pool.n_in_use(),
            "cached_free": engine.pool.n_cached_free(), "free": engine.pool.n_free,
            "blocks": [asdict(b) for b in blocks], "requests": [asdict(r) for r in requests],
            "history": [asdict(s) for s in engine.history] if "memory" in shown else [],
            "frag": None if frag is None else asdict(frag), "saved": [[i, asdict(h)] for i, h in saved.items()]}


def show(view: dict, lecture: bool) -> None:
    """The metrics and the ideas shown, from `room_view` (the lecturer's page's own, or a room follower's copy)."""
    shown = set(view["shown"])
    blocks = [BlockView(**{**b, "owners": tuple(b["owners"])}) for b in view["blocks"]]
    requests = [RequestView(**{**r, "block_table": tuple(r["block_table"])}) for r in view["requests"]]
    m = st.columns(5)
    counts = {s: sum(r.status == s for r in requests) for s in ("running", "waiting", "arriving", "finished")}
    rate = view["hits"] / view["queries"] if view["queries"] else None
    helps = {"requests": tr("paged.m_requests_help"), "blocks": tr("paged.m_blocks_help"),
             "hit_rate": tr("paged.m_hit_rate_help", hits=view["hits"], queries=view["queries"])}

    def metric(i: int, name: str, value: object) -> None:
        """A metric and what it counts: a caption under it, or on a projector a tooltip (the screen is the chart's)."""
        m[i].metric(tr(f"paged.m_{name}"), value, help=helps.get(name) if lecture else None)
        if name in helps and not lecture:
            m[i].caption(helps[name])

    metric(0, "step", view["step"])
    metric(1, "requests", f"{counts['running']} / {counts['waiting'] + counts['arriving']} / {counts['finished']}")
    metric(2, "hit_rate", "—" if rate is None else f"{rate:.0%}")
    metric(3, "blocks", f"{view['in_use']} / {view['cached_free']} / {view['free'] - view['cached_free']}")
    metric(4, "preemptions", sum(r.n_preemptions for r in requests))
    if not requests:
        st.info(tr("paged.idle"))
        return
    block_size = view["block_size"]
    labels = {k: tr(f"paged.c_{k}") for k in charts.FIGURE_LABELS}
    if "tables" in shown:
        chart(charts.block_tables(requests, blocks, block_size, labels, lecture=lecture), "paged_tables")
        if not lecture:  # said aloud on a projector
            st.caption(tr("paged.tables_caption", size=block_size))
    if "pool" in shown:
        chart(charts.pool_grid(blocks, block_size, labels, lecture=lecture), "paged_pool")
    if shown & {"requests", "savings"}:
        _requests_and_hits(requests, {i: HitSaving(**h) for i, h in view["saved"]}, shown, block_size, lecture)
    if "memory" in shown:
        _memory(view, lecture)


def _requests_and_hits(requests: list[RequestView], saved: dict[int, HitSaving], shown: set[str], block_size: int,
                       lecture: bool) -> None:
    """Each request's prompt, hit, TTFT and preemptions, and the prefill time each hit saved (measured)."""
    rows = []
    for r in requests:
        hit = saved.get(r.request_id)
        rows.append({
            tr("paged.col_request"): f"R{r.request_id}",
            tr("paged.col_label"): tr(f"paged.c_label_{r.label}"),
            tr("paged.col_status"): tr(f"paged.c_status_{charts.status_key(r)}"),
            tr("paged.col_prompt"): r.prompt_tokens,
            tr("paged.col_cached"): r.cached_tokens,
            tr("paged.col_max_cached"): max_cacheable_tokens(r.prompt_tokens, block_size),
            tr("paged.col_generated"): r.output_tokens, tr("paged.col_blocks"): len(r.block_table),
            tr("paged.col_ttft"): "—" if r.ttft_s is None else f"{r.ttft_s * 1e3:.1f}",
            tr("paged.col_preempted"): r.n_preemptions,
            tr("paged.col_saved"): "—" if hit is None else f"{hit.saved_s * 1e3:.1f}" if hit.measurable
            else f"≈ 0 (±{hit.noise_s * 1e3:.1f})",
        })
    if "requests" in shown:
        table(rows, "paged_requests")
        st.caption(tr("paged.table_caption", repeats=SAVING_REPEATS))
    if saved and "savings" in shown:
        slabels = {k: tr(f"paged.c_{k}") for k in ("full", "with_hit", "saved", "saved_noise", "ms", "savings_title")}
        chart(charts.hit_savings(list(saved.items()), slabels, lecture=lecture), "paged_savings")
        if not lecture:  # said aloud on a projector
            st.caption(tr("paged.savings_caption", repeats=SAVING_REPEATS))


def _memory(view: dict, lecture: bool) -> None:
    """The pool's blocks over time, and the running requests' K/V held four ways (fragmentation)."""
    left, right = st.columns(2)
    with left:
        usage = {k: tr(f"paged.c_{k}") for k in charts.USAGE_LABELS}
        chart(charts.pool_usage([PoolSample(**s) for s in view["history"]], usage, lecture=lecture), "paged_usage")
    with right:
        if view["frag"] is None:
            st.info(tr("paged.no_running"))
        else:
            frag = Fragmentation(**view["frag"])
            flabels = {k: tr(f"paged.c_{k}") for k in ("live", "paged", "paged_unshared", "contiguous", "kib",
                                                         "bar_text", "frag_title")}
            chart(charts.fragmentation_bars(frag, flabels, lecture=lecture), "paged_frag")
            if not lecture:  # said aloud on a projector
                st.caption(tr("paged.frag_caption", max_len=view["max_len"], per_token=f"{frag.bytes_per_token:,}"))


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Paged Blocks: the lecturer's pool and requests at the lecturer's step, the ideas on
    the lecturer's screen, in this session's language; no engine runs here, no button is drawn."""
    explore_from(view, "paged", steps={"step": view["step"], "adds": view.get("adds", [])},
                 help_key="room.explore_paged_help")
    st.caption(tr("room.lecturers_model", model=view["model"]))
    show(view, lecture)
