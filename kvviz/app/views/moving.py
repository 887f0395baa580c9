"""What the Moving the Cache page draws, idea by idea: the session keys it keeps (`MV`), the store's settings and its
OffloadDemo (`store_section`), the requests through the tiers (`requests_view`), TTFT loading vs recomputing with
the per-tier costs (`ttft_view`), the deployment the calculator uses (`deployment`), the break-even
(`break_even_view`) and the prefill→decode handoff (`handoff_view`). The tables and numbers come from
kvviz.lessons.moving; the model runs only in the buttons' callbacks, before the page draws. The engine's modules
(torch) are imported inside the functions: the page imports this module before its first screen is drawn."""
from __future__ import annotations

from typing import Any

import streamlit as st

from kvviz.app.hosted import check_offload_store
from kvviz.app.language import lang, show_error, tr
from kvviz.app.room.explore import explore_from
from kvviz.app.room.view import RoomView
from kvviz.app.sidebar import Settings
from kvviz.app.state import page_state
from kvviz.app.uploads import config_upload
from kvviz.app.widgets import chart, number_in_range, table
from kvviz.charts import moving as charts
from kvviz.errors import InputError
from kvviz.kv.formats import KV_DTYPES
from kvviz.kv.formula import kv_footprint
from kvviz.kv.hardware import HARDWARE, LINKS
from kvviz.kv.presets import PRESETS
from kvviz.kv.transfer import handoff_bytes
from kvviz.lessons import moving as lesson
from kvviz.units import format_binary

# The keys the page keeps besides its widgets': the demo and the settings it was built for, the tiers' costs, the
# handoff's results and the last error of each. Never seeded: a key appears when what it holds first exists (a
# hosted page that refuses the store's size leaves no demo behind).
MV = page_state("moving", demo=None, key=None, tiers=None, error=None, handoff=None, handoff_error=None)
TIER_REPEATS = 5


# ---- the store and its requests ----------------------------------------------------------------------------
def store_section(box: Any, backend: Any, hosted: Any) -> Any:
    """The store's settings (chunk size, tier capacities, repeats) in `box`, and the OffloadDemo built for them
    (kept while they stay); None when a hosted demo refuses the store's size."""
    from kvviz.engine.offload.serve import OffloadDemo

    c = box.columns(4)
    sizes = lesson.chunk_sizes(backend.spec.max_context)
    chunk = c[0].selectbox(tr("moving.chunk_size"), sizes, index=len(sizes) - 1, key="moving_chunk",
                           help=tr("moving.chunk_size_help"))
    mem = int(number_in_range(c[1], tr("moving.memory_chunks"), 0, 64, 3, "moving_memory",
                              help=tr("moving.memory_chunks_help")))
    disk = int(number_in_range(c[2], tr("moving.disk_chunks"), 0, 64, 6, "moving_disk",
                               help=tr("moving.disk_chunks_help")))
    repeats = int(number_in_range(c[3], tr("moving.repeats"), 1, 9, 3, "moving_repeats",
                                  help=tr("moving.repeats_help")))
    chunk_bytes = kv_footprint(backend.spec, chunk, 1, str(backend.dtype).removeprefix("torch.")).total
    box.caption(tr("moving.store_caption", chunk=chunk, bytes=format_binary(chunk_bytes),
                   memory=format_binary(mem * chunk_bytes), disk=format_binary(disk * chunk_bytes)))
    if hosted is not None:  # both tiers, before anything is written
        try:
            check_offload_store(hosted, mem * chunk_bytes, (disk + 1) * chunk_bytes)
        except InputError as exc:
            show_error(exc)
            return None
    key = (id(backend.model), chunk, mem, disk, repeats)
    if MV.get("demo") is None or MV.get("key") != key:
        MV.set("demo", OffloadDemo.temporary(backend, chunk_size=chunk, memory_chunks=mem, disk_chunks=disk,
                                             repeats=repeats))
        MV.set("key", key)
        MV.set("tiers", None)
    return MV.get("demo")


def serve_next(all_left: bool) -> None:
    """Model work in the callback: it runs before the page draws, never while it draws."""
    demo = MV.get("demo")
    try:
        while demo is not None and not demo.done:
            demo.advance()
            if not all_left:
                break
    except InputError as exc:
        MV.set("error", exc)


def show_last_error() -> None:
    if MV.get("error") is not None:
        show_error(MV.get("error"))
        MV.set("error", None)


def store_state(demo: Any) -> dict:
    """The store's requests and sizes, as `requests_figures` draws them (a lecture room's followers get it; a copy
    of the list, which the demo appends to: publish compares it with the last view sent)."""
    return {"results": list(demo.results), "memory_chunks": demo.memory_chunks, "disk_chunks": demo.disk_chunks,
            "repeats": demo.repeats}


def requests_view(demo: Any, lecture: bool) -> None:
    """What the next request shows, the buttons that serve it, the tiers after the last one and every request's
    row."""
    store = store_state(demo)
    next_request(store)
    b = st.columns([3, 3, 2])
    b[0].button(tr("moving.serve_next"), on_click=serve_next, args=(False,), type="primary", key="moving_next",
                disabled=demo.done, width="stretch")
    b[1].button(tr("moving.serve_all"), on_click=serve_next, args=(True,), key="moving_all", disabled=demo.done,
                width="stretch")
    b[2].button(tr("moving.reset"), on_click=MV.set, args=("demo", None), key="moving_reset", width="stretch")
    show_last_error()
    requests_figures(store, lecture)


def next_request(store: dict) -> None:
    """What the next scripted request shows, or that all were served."""
    from kvviz.engine.offload.serve import SCRIPT

    step = len(store["results"])
    if step < len(SCRIPT):
        st.info(tr("moving.next", n=step + 1, what=tr(f"moving.about_{SCRIPT[step][0]}")))
    else:
        st.success(tr("moving.all_done"))


def requests_figures(store: dict, lecture: bool) -> None:
    """The tiers after the last request and every request's row, from the store's state (`requests_view`'s: the
    lecturer's page's own, or a room follower's copy)."""
    if not store["results"]:
        return
    results = store["results"]
    last = results[-1]
    keys = ("device", "memory", "disk", "from_memory", "from_disk", "computed_cell", "computed_hover", "held",
            "empty_slot", "chunks", "tiers_title")
    labels = {k: tr(f"moving.c_{k}") for k in keys}
    # on a projector the chart, and beside it what the last request found and the table, folded
    plot, side = st.columns([3, 2], vertical_alignment="center") if lecture else (st.container(), st.container())
    with plot:
        chart(charts.tier_boxes([(c[3], c[2]) for c in last["chunks"]], last["tokens_by_tier"]["computed"],
                                last["after"], {"memory": store["memory_chunks"], "disk": store["disk_chunks"]},
                                labels, lecture=lecture), "moving_tiers")
    side.caption(tr("moving.tiers_chart_caption"))
    side.markdown(tr("moving.last_request", n=last["request"], what=tr(f"moving.kind_{last['kind']}"),
                     why=lesson.reason_text(last["miss_reason"], lang())))
    with side.expander(tr("moving.requests_table")) if lecture else st.container():  # the chart keeps the screen
        table(lesson.request_rows(results, lang()), "moving_requests")
        st.caption(tr("moving.table_caption", repeats=store["repeats"]))


def measure_tiers(backend: Any) -> None:
    from kvviz.engine.offload.serve import tier_costs

    demo = MV.get("demo")
    try:
        MV.set("tiers", tier_costs(backend, demo.session_dir / "tiers", n_chunks=2, chunk_size=demo.chunk_size,
                                   repeats=TIER_REPEATS))
    except InputError as exc:
        MV.set("error", exc)


def ttft_view(demo: Any, backend: Any, lecture: bool) -> None:
    """Each request's TTFT with the store and recomputing, and the button that measures every tier's cost."""
    ttft_figures(demo.results, MV.get("tiers"), str(backend.device), lecture,
                 lambda press: press.button(tr("moving.measure_tiers"), on_click=measure_tiers, args=(backend,),
                                            key="moving_measure", help=tr("moving.measure_help")))


def ttft_figures(results: list[dict], tiers: list | None, device: str, lecture: bool,
                 measure: Any = None) -> None:
    """The TTFT chart and the tiers' costs (the lecturer's page's, with `measure` drawing its button; or a room
    follower's copy, without)."""
    from kvviz.engine.offload.serve import SCRIPT

    if results:
        keys = ("load_memory", "load_disk", "prefill_rest", "recompute", "ms", "ttft_title")
        labels = {k: tr(f"moving.c_{k}") for k in keys} | {f"kind_{k}": tr(f"moving.kind_{k}") for k, _, _ in SCRIPT}
        chart(charts.ttft_bars(results, labels, lecture=lecture), "moving_ttft")
    # on a projector the caption beside the button, and the tiers' table folded: the chart keeps the screen
    words, press = st.columns([4, 1], vertical_alignment="center") if lecture else (st.container(), st.container())
    if results:
        words.caption(tr("moving.ttft_caption"))
    else:
        words.info(tr("moving.ttft_empty"))
    if measure is not None:
        measure(press)
    if tiers:
        with st.expander(tr("moving.tiers_table")) if lecture else st.container():
            table(lesson.tier_rows(tiers, lang()), "moving_tier_costs")
            st.caption(tr("moving.tiers_caption", repeats=TIER_REPEATS, device=device))


# ---- a real deployment: the calculator ------------------------------------------------------------------------
def deployment(where: Any) -> dict | None:
    """The model, GPU, KV format and tensor parallelism the calculator and the handoff's bytes use (`where`: the
    page, or the settings button on a projector)."""
    where.subheader(tr("moving.deploy_title"))
    c = where.columns([3, 2, 2, 1])
    names = list(PRESETS) + [tr("moving.upload_choice")]
    choice = c[0].selectbox(tr("moving.model"), names, index=names.index("Llama-3.1-8B"), key="moving_model")
    if choice == names[-1]:
        spec = config_upload(c[0], tr("moving.upload"), "moving_upload")
        if spec is None:
            where.info(tr("moving.upload_hint"))
            return None
    else:
        spec = PRESETS[choice]
    gpu = c[1].selectbox(tr("moving.gpu"), list(HARDWARE), index=0, key="moving_gpu")
    kv_dtypes = list(KV_DTYPES)  # by name: a dtype added to the table never moves the default
    kv_dtype = c[2].selectbox(tr("moving.kv_dtype"), kv_dtypes, index=kv_dtypes.index("bfloat16"),
                              key="moving_kv_dtype")
    tp = int(number_in_range(c[3], tr("moving.tp"), 1, 64, 1, "moving_tp"))
    if spec.n_params is None:
        billions = number_in_range(where, tr("moving.params_unknown", name=spec.name), 0.001, 10000.0, None,
                                   "moving_params_b", whole=False)
        if billions is None:
            return None
        spec = spec.with_params(round(billions * 1e9), "given")
    return {"spec": spec, "hw": HARDWARE[gpu], "kv_dtype": kv_dtype, "tp": tp}


def break_even_view(dep: dict, box: Any, backend: Any, lecture: bool) -> dict:
    """Loading over each chosen link vs recomputing on the deployment's GPUs, this machine's tiers beside them, and
    the table of where loading starts to win; returns the links and context drawn (a room's followers draw them)."""
    max_tokens = dep["spec"].max_context
    if max_tokens is None:
        max_tokens = int(number_in_range(box if lecture else st, tr("moving.max_tokens"), 16, 10**7, 131072,
                                         "moving_max_tokens"))
    links = (box if lecture else st).multiselect(tr("moving.links"), list(LINKS), default=list(LINKS),
                                                 key="moving_links")
    picks = {"links": links, "max_tokens": max_tokens}
    break_even_figures(dep, picks, MV.get("tiers"), str(backend.device), backend.spec.name, lecture)
    return picks


def break_even_figures(dep: dict, picks: dict, tiers: list | None, device: str, model: str, lecture: bool) -> None:
    """The break-even chart, table and sources for the deployment, the links and context in `picks` (the lecturer's
    page's, or a room follower's copy)."""
    try:
        curves, even = lesson.break_even(dep["spec"], dep["hw"], picks["links"], dep["kv_dtype"], dep["tp"],
                                         picks["max_tokens"])
    except InputError as exc:
        show_error(exc)
        return
    measured = [{"label": tr("moving.here_load", tier=tr(f"moving.tier_{t.tier}")), "tokens": t.tokens,
                 "ratio": t.load_over_recompute, "color": charts.TIER_COLORS[t.tier]} for t in tiers or []]
    labels = {k: tr(f"moving.c_{k}") for k in ("break_even_at", "tokens", "ratio", "even_line", "hover",
                                              "break_even_title")}
    chart(charts.break_even_chart(curves, even, measured, labels, lecture=lecture), "moving_break_even")
    rows, sources = lesson.break_even_rows(even, picks["max_tokens"], lang()), lesson.link_sources(list(even))
    if lecture:  # the chart keeps the screen: the table and its sources folded under it, in one box
        links_box = st.expander(tr("moving.links_table"))
        with links_box:
            table(rows, "moving_break_even_table", prose=True)
            st.markdown(f"**{tr('moving.sources_title')}**\n\n{sources}")
    else:
        table(rows, "moving_break_even_table", prose=True)
        with st.expander(tr("moving.sources_title")):
            st.markdown(sources)
    # on a projector the caption (the rates and their sources) is folded with the table
    (links_box if lecture else st).caption(tr("moving.break_even_caption", gpu=dep["hw"].name,
                  tflops=f"{dep['hw'].peak_flops / 1e12:,.1f}", source=dep["hw"].flops_source, tp=dep["tp"],
                  here=device, model=model))


# ---- prefill → decode handoff -----------------------------------------------------------------------------
def run_handoff(engine: str, backend: Any, model: str, n_prompt: int, n_new: int) -> None:
    try:
        result = lesson.run_handoff(engine, backend, model, n_prompt, n_new, MV.get("demo").session_dir)
        MV.set("handoff", {**(MV.get("handoff") or {}), engine: result})
    except (InputError, RuntimeError, TimeoutError, OSError) as exc:
        MV.set("handoff_error", str(exc).splitlines()[0])


def handoff_view(dep: dict | None, box: Any, backend: Any, settings: Settings) -> dict:
    """The handoff's prompt and buttons (kvviz's workers, llama.cpp), its timeline and tables, and the
    calculator's bytes and times for the deployment; returns the results and the prompt's length drawn (a room's
    followers draw them)."""
    from kvviz.serving.llamacpp import binary

    lecture = settings.lecture
    max_len = backend.spec.max_context
    c = (box if lecture else st).columns(2)  # on a projector behind the settings button
    n_prompt = int(number_in_range(c[0], tr("moving.prompt_tokens"), 2, max(2, min(max_len - 64, 2000)), 64,
                                   "moving_prompt"))
    n_new = int(number_in_range(c[1], tr("moving.new_tokens"), 2, 64, 16, "moving_new"))
    if settings.hosted is not None:
        st.info(tr("hosted.handoff_off"))
    elif settings.model not in ("tiny", "smollm2"):
        st.info(tr("moving.handoff_model"))
    else:
        b = st.columns(2)
        b[0].button(tr("moving.run_kvviz"), on_click=run_handoff, args=("kvviz", backend, settings.model, n_prompt,
                    n_new), key="moving_run_kvviz", type="primary", width="stretch", help=tr("moving.run_kvviz_help"))
        b[1].button(tr("moving.run_llamacpp"), on_click=run_handoff, args=("llamacpp", backend, settings.model,
                    n_prompt, n_new), key="moving_run_llamacpp", width="stretch", disabled=binary() is None,
                    help=tr("moving.run_llamacpp_help") if binary() else tr("moving.no_llama_server"))
    if MV.get("handoff_error"):
        st.error(tr("moving.handoff_failed", error=MV.get("handoff_error")))
        MV.set("handoff_error", None)
    handoff = {"results": MV.get("handoff") or {}, "n_prompt": n_prompt}
    handoff_figures(handoff, dep, lecture)
    return handoff


def handoff_figures(handoff: dict, dep: dict | None, lecture: bool) -> None:
    """The handoff's timeline and tables and the calculator's bytes and times (the lecturer's page's, or a room
    follower's copy)."""
    results, n_prompt = handoff["results"], handoff["n_prompt"]
    if results:
        labels = {k: tr(f"moving.c_{k}") for k in ("ms", "handoff_title")} | {
            f"phase_{p}": tr(f"moving.phase_{p}") for p in lesson.PHASES}
        chart(charts.handoff_timeline(lesson.handoff_steps(results, lang()), labels, lecture=lecture), "moving_handoff")
    # on a projector the timeline keeps the screen: its tables and the calculator folded under it, in one box
    with st.expander(tr("moving.handoff_details")) if lecture else st.container():
        if results:
            table(lesson.handoff_rows(results, lang()), "moving_handoff_table")
            st.caption(tr("moving.handoff_caption"))
            if "llamacpp" in results:
                parts = results["llamacpp"]["file_parts"]
                st.caption(tr("moving.file_parts", parts=", ".join(f"{k} {v:,} B" for k, v in parts.items())))
        if dep is not None:
            calc = handoff_bytes(dep["spec"], n_prompt, dep["kv_dtype"], dep["tp"])
            st.markdown(lesson.calc_line(dep["spec"].name, calc, lang()))
            table(lesson.calc_rows(calc, lang()), "moving_handoff_calc")


# ---- a lecture room --------------------------------------------------------------------------------------------
def room_view(shown: set[str], parts: dict, dep: dict | None, model: str, device: str) -> dict:
    """What a lecture room's followers draw of this page, as JSON: the ideas on screen and, per idea drawn, its
    numbers (`parts`: the store's requests, the links and context, the handoff's results), the tiers' measured
    costs and the deployment (its model's description, the GPU's name, KV format and TP)."""
    from dataclasses import asdict

    return {"shown": sorted(shown), "model": model, "device": device, **parts,
            "tiers": [asdict(t) for t in MV.get("tiers") or []],
            "deployment": None if dep is None else {"spec": asdict(dep["spec"]), "gpu": dep["hw"].name,
                                                    "kv_dtype": dep["kv_dtype"], "tp": dep["tp"]}}


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Moving the Cache: the lecturer's requests, costs, break-even and handoff, the ideas
    on the lecturer's screen (all of them when the lecturer is not in lecture mode), in this session's language; no
    model runs here, no button or box of this session's is drawn."""
    from kvviz.engine.metrics import Spread
    from kvviz.engine.offload.serve import TierCost
    from kvviz.kv.formula import KVSpec

    explore_from(view, "moving")  # the settings only: the store's requests and the runs are the follower's to make
    shown = set(view["shown"])
    tiers = [TierCost(**{**t, "load_s": Spread(**t["load_s"]), "recompute_s": Spread(**t["recompute_s"])})
             for t in view["tiers"]]
    d = view["deployment"]
    dep = None if d is None else {"spec": KVSpec(**d["spec"]), "hw": HARDWARE[d["gpu"]], "kv_dtype": d["kv_dtype"],
                                  "tp": d["tp"]}
    for name in ("tiers", "ttft", "break_even", "handoff"):
        if name not in shown:
            continue
        st.subheader(tr(f"moving.idea_{name}"))
        store = view.get("store")
        if name in ("tiers", "ttft") and store is None or name == "break_even" and (dep is None or "links" not in view):
            st.info(tr("room.waiting_run"))
        elif name == "tiers":
            next_request(store)
            requests_figures(store, lecture)
        elif name == "ttft":
            ttft_figures(store["results"], tiers, view["device"], lecture)
        elif name == "break_even":
            break_even_figures(dep, view["links"], tiers, view["device"], view["model"], lecture)
        elif "handoff" in view:
            handoff_figures(view["handoff"], dep, lecture)
