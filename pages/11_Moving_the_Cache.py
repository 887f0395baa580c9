"""Moving the Cache: offload tiers and reuse across requests, TTFT loading vs recomputing, the break-even for real
deployments, and the prefill→decode handoff (kvviz workers and llama.cpp)."""
import dataclasses

import streamlit as st

from kvviz.app.hosted import check_offload_store
from kvviz.app.language import show_error, tr
from kvviz.app.lecture import idea_title, ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import get_backend, loading_engine, model_caption
from kvviz.app.shell import page_setup
from kvviz.app.uploads import config_upload
from kvviz.app.widgets import chart, number_in_range, table
from kvviz.charts import moving as charts
from kvviz.errors import InputError
from kvviz.kv.formula import KV_DTYPES, kv_footprint
from kvviz.kv.hardware import HARDWARE, LINKS
from kvviz.kv.presets import PRESETS
from kvviz.kv.transfer import LoadVsRecompute, handoff_bytes
from kvviz.units import format_binary

CHUNK_SIZES = (16, 32, 64, 128, 256)  # 256: LMCache's default
TIER_REPEATS = 5
ss = st.session_state

settings = page_setup("moving.title")
lecture = settings.lecture
head = lecture_head(tr("moving.title"))
with head[0]:
    about = intro_box()
with about:
    st.write(tr("moving.intro"))
if settings.model == "hf":
    st.info(tr("moving.hf_note"))  # the store copies into kvviz's own cache: the shipped model runs instead
    settings = dataclasses.replace(settings, model="tiny")
IDEAS = ("tiers", "ttft", "break_even", "handoff")
shown = {IDEAS[i] for i in ideas([tr(f"moving.idea_{name}") for name in IDEAS], "moving")}
with loading_engine():  # the first screen is drawn: now torch and the model
    import pandas as pd  # ~1,000 modules with pyarrow: after the first screen

    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.offload.serve import SCRIPT, OffloadDemo, tier_costs
    backend = get_backend(settings)
if not isinstance(backend, NativeBackend):
    st.stop()
if not lecture:  # on a projector behind the settings button
    model_caption(backend.spec)
with head[1]:  # on a projector one button holds the store's settings, the deployment's and the links
    box = settings_box()
if lecture:
    with box:
        model_caption(backend.spec)
dtype = str(backend.dtype).removeprefix("torch.")
max_len = backend.spec.max_context



def reason_text(m: dict) -> str:
    tier = tr(f"moving.tier_{m['tier']}") if m.get("tier") else ""
    return tr(f"moving.reason_{m['reason']}", token=m["token"], changed_at=m.get("changed_at"), tier=tier,
              request=m.get("request") or "?")


# ---- the store and its requests ----------------------------------------------------------------------------
def store_section() -> OffloadDemo | None:
    c = box.columns(4)
    sizes = [s for s in CHUNK_SIZES if 2 * s + s // 4 + 4 < max_len] or [CHUNK_SIZES[0]]
    chunk = c[0].selectbox(tr("moving.chunk_size"), sizes, index=len(sizes) - 1, key="mv_chunk",
                           help=tr("moving.chunk_size_help"))
    mem = int(number_in_range(c[1], tr("moving.memory_chunks"), 0, 64, 3, "mv_memory",
                                 help=tr("moving.memory_chunks_help")))
    disk = int(number_in_range(c[2], tr("moving.disk_chunks"), 0, 64, 6, "mv_disk",
                                  help=tr("moving.disk_chunks_help")))
    repeats = int(number_in_range(c[3], tr("moving.repeats"), 1, 9, 3, "mv_repeats",
                                     help=tr("moving.repeats_help")))
    chunk_bytes = kv_footprint(backend.spec, chunk, 1, dtype).total
    box.caption(tr("moving.store_caption", chunk=chunk, bytes=format_binary(chunk_bytes),
                   memory=format_binary(mem * chunk_bytes), disk=format_binary(disk * chunk_bytes)))
    if settings.hosted is not None:  # both tiers, before anything is written
        try:
            check_offload_store(settings.hosted, mem * chunk_bytes, (disk + 1) * chunk_bytes)
        except InputError as exc:
            show_error(exc)
            return None
    key = (id(backend.model), chunk, mem, disk, repeats)
    if ss.get("mv_demo") is None or ss.get("mv_key") != key:
        ss.mv_demo = OffloadDemo.temporary(backend, chunk_size=chunk, memory_chunks=mem, disk_chunks=disk,
                                           repeats=repeats)
        ss.mv_key, ss.mv_tiers = key, None
    return ss.mv_demo


def serve_next(all_left: bool) -> None:
    """Model work in the callback: it runs before the page draws, never while it draws."""
    demo = ss.get("mv_demo")
    try:
        while demo is not None and not demo.done:
            demo.advance()
            if not all_left:
                break
    except InputError as exc:
        ss.mv_error = exc


def reset() -> None:
    ss.mv_demo = None


def requests_view(demo: OffloadDemo) -> None:
    step = len(demo.results)
    if step < len(SCRIPT):
        st.info(tr("moving.next", n=step + 1, what=tr(f"moving.about_{SCRIPT[step][0]}")))
    else:
        st.success(tr("moving.all_done"))
    b = st.columns([3, 3, 2])
    b[0].button(tr("moving.serve_next"), on_click=serve_next, args=(False,), type="primary", key="mv_next",
                disabled=demo.done, width="stretch")
    b[1].button(tr("moving.serve_all"), on_click=serve_next, args=(True,), key="mv_all", disabled=demo.done,
                width="stretch")
    b[2].button(tr("moving.reset"), on_click=reset, key="mv_reset", width="stretch")
    if ss.get("mv_error") is not None:
        show_error(ss.mv_error)
        ss.mv_error = None
    if not demo.results:
        return
    last = demo.results[-1]
    keys = ("device", "memory", "disk", "from_memory", "from_disk", "computed_cell", "computed_hover", "held",
            "empty_slot", "chunks", "tiers_title")
    labels = {k: tr(f"moving.c_{k}") for k in keys}
    # on a projector the chart, and beside it what the last request found and the table, folded
    plot, side = st.columns([3, 2], vertical_alignment="center") if lecture else (st.container(), st.container())
    with plot:
        chart(charts.tier_boxes([(c[3], c[2]) for c in last["chunks"]], last["tokens_by_tier"]["computed"],
                                   last["after"], {"memory": demo.memory_chunks, "disk": demo.disk_chunks}, labels,
                                   lecture=lecture), "mv_tiers")
    side.caption(tr("moving.tiers_chart_caption"))
    side.markdown(tr("moving.last_request", n=last["request"], what=tr(f"moving.kind_{last['kind']}"),
                     why=reason_text(last["miss_reason"])))
    rows = [{
        tr("moving.col_request"): f"{r['request']}. {tr('moving.kind_' + r['kind'])}",
        tr("moving.col_prompt"): r["prompt_tokens"],
        tr("moving.col_memory"): r["tokens_by_tier"]["memory"],
        tr("moving.col_disk"): r["tokens_by_tier"]["disk"],
        tr("moving.col_computed"): r["tokens_by_tier"]["computed"],
        tr("moving.col_why"): reason_text(r["miss_reason"]),
        tr("moving.col_ttft"): f"{r['ttft_s'] * 1e3:.1f}",
        tr("moving.col_ttft_recompute"): f"{r['ttft_recompute_s'] * 1e3:.1f}",
        tr("moving.col_bytes"): sum(r["bytes_loaded"].values()),
        tr("moving.col_load"): f"{sum(r['load_s'].values()) * 1e3:.2f}",
        tr("moving.col_recompute"): "—" if r["recompute_s"] is None else f"{r['recompute_s'] * 1e3:.1f}",
        tr("moving.col_logits"): tr("moving.equal" if r["logits_equal_up_to_rounding"] else "moving.not_equal",
                                    diff=f"{r['max_abs_logit_diff']:.1e}", tol=f"{r['logit_rounding_tolerance']:.1e}"),
    } for r in demo.results]
    with side.expander(tr("moving.requests_table")) if lecture else st.container():  # the chart keeps the screen
        table(pd.DataFrame(rows), "mv_requests")
        st.caption(tr("moving.table_caption", repeats=demo.repeats))


def measure_tiers() -> None:
    demo = ss.get("mv_demo")
    try:
        ss.mv_tiers = tier_costs(backend, demo.session_dir / "tiers", n_chunks=2, chunk_size=demo.chunk_size,
                                 repeats=TIER_REPEATS)
    except InputError as exc:
        ss.mv_error = exc


def ttft_view(demo: OffloadDemo) -> None:
    if demo.results:
        keys = ("load_memory", "load_disk", "prefill_rest", "recompute", "ms", "ttft_title")
        labels = {k: tr(f"moving.c_{k}") for k in keys} | {f"kind_{k}": tr(f"moving.kind_{k}") for k, _, _ in SCRIPT}
        chart(charts.ttft_bars(demo.results, labels, lecture=lecture), "mv_ttft")
    # on a projector the caption beside the button, and the tiers' table folded: the chart keeps the screen
    words, press = st.columns([4, 1], vertical_alignment="center") if lecture else (st.container(), st.container())
    if demo.results:
        words.caption(tr("moving.ttft_caption"))
    else:
        words.info(tr("moving.ttft_empty"))
    press.button(tr("moving.measure_tiers"), on_click=measure_tiers, key="mv_measure", help=tr("moving.measure_help"))
    if ss.get("mv_tiers"):
        with st.expander(tr("moving.tiers_table")) if lecture else st.container():
            table(pd.DataFrame([{
                tr("moving.col_tier"): tr(f"moving.tier_{t.tier}"), tr("moving.col_tokens"): t.tokens,
                tr("moving.col_bytes"): f"{t.bytes:,}",
                tr("moving.col_file_bytes"): f"{t.file_bytes:,}" if t.file_bytes else "—",
                tr("moving.col_load"): f"{t.load_s.median * 1e3:.2f} ({t.load_s.low * 1e3:.2f}–"
                                       f"{t.load_s.high * 1e3:.2f})",
                tr("moving.col_recompute"): f"{t.recompute_s.median * 1e3:.1f} ({t.recompute_s.low * 1e3:.1f}–"
                                            f"{t.recompute_s.high * 1e3:.1f})",
                tr("moving.col_ratio"): f"{t.load_over_recompute:.3f}",
            } for t in ss.mv_tiers]), "mv_tier_costs")
            st.caption(tr("moving.tiers_caption", repeats=TIER_REPEATS, device=str(backend.device)))


# ---- a real deployment: the calculator ------------------------------------------------------------------------
def deployment(where) -> dict | None:  # noqa: ANN001 - the page, or the settings button on a projector
    """The model, GPU, KV format and tensor parallelism the calculator and the handoff's bytes use."""
    where.subheader(tr("moving.deploy_title"))
    c = where.columns([3, 2, 2, 1])
    names = list(PRESETS) + [tr("moving.upload_choice")]
    choice = c[0].selectbox(tr("moving.model"), names, index=names.index("Llama-3.1-8B"), key="mv_model")
    if choice == names[-1]:
        spec = config_upload(c[0], tr("moving.upload"), "mv_upload")
        if spec is None:
            where.info(tr("moving.upload_hint"))
            return None
    else:
        spec = PRESETS[choice]
    gpu = c[1].selectbox(tr("moving.gpu"), list(HARDWARE), index=0, key="mv_gpu")
    kv_dtype = c[2].selectbox(tr("moving.kv_dtype"), list(KV_DTYPES), index=1, key="mv_kv_dtype")
    tp = int(number_in_range(c[3], tr("moving.tp"), 1, 64, 1, "mv_tp"))
    if spec.n_params is None:
        billions = number_in_range(where, tr("moving.params_unknown", name=spec.name), 0.001, 10000.0, None,
                                      "mv_params_b", whole=False)
        if billions is None:
            return None
        spec = spec.with_params(round(billions * 1e9), "given")
    return {"spec": spec, "hw": HARDWARE[gpu], "kv_dtype": kv_dtype, "tp": tp}


def break_even_view(dep: dict) -> None:
    spec, max_tokens = dep["spec"], dep["spec"].max_context
    if max_tokens is None:
        max_tokens = int(number_in_range(box if lecture else st, tr("moving.max_tokens"), 16, 10**7, 131072,
                                         "mv_max_tokens"))
    links = (box if lecture else st).multiselect(tr("moving.links"), list(LINKS), default=list(LINKS), key="mv_links")
    try:
        cases = {name: LoadVsRecompute(spec, dep["hw"], LINKS[name], dep["kv_dtype"], tp=dep["tp"]) for name in links}
    except InputError as exc:
        show_error(exc)
        return
    even = {name: case.break_even_tokens(max_tokens) for name, case in cases.items()}
    measured = [{"label": tr("moving.here_load", tier=tr(f"moving.tier_{t.tier}")), "tokens": t.tokens,
                 "ratio": t.load_over_recompute, "color": charts.TIER_COLORS[t.tier]} for t in ss.get("mv_tiers") or []]
    labels = {k: tr(f"moving.c_{k}") for k in ("break_even_at", "tokens", "ratio", "even_line", "hover",
                                                 "break_even_title")}
    chart(charts.break_even_chart({n: c.curve(max_tokens) for n, c in cases.items()}, even, measured, labels,
                                     lecture=lecture), "mv_break_even")
    rows = []
    for name, n in even.items():
        verdict = (tr("moving.never", max=f"{max_tokens:,}") if n is None else tr("moving.always") if n == 1
                   else f"{n:,}")
        rows.append({tr("moving.col_link"): name,
                     tr("moving.col_bandwidth"): f"{LINKS[name].bandwidth_bytes_per_s / 1e9:g} GB/s",
                     tr("moving.col_break_even"): verdict})
    sources = "\n".join(f"- **{name}**: {LINKS[name].bandwidth_source}" for name in even)
    if lecture:  # the chart keeps the screen: the table and its sources folded under it, in one box
        links_box = st.expander(tr("moving.links_table"))
        with links_box:
            table(pd.DataFrame(rows), "mv_break_even_table", prose=True)
            st.markdown(f"**{tr('moving.sources_title')}**\n\n{sources}")
    else:
        table(pd.DataFrame(rows), "mv_break_even_table", prose=True)
        with st.expander(tr("moving.sources_title")):
            st.markdown(sources)
    # on a projector the caption (the rates and their sources) is folded with the table
    (links_box if lecture else st).caption(tr("moving.break_even_caption", gpu=dep["hw"].name,
                  tflops=f"{dep['hw'].peak_flops / 1e12:,.1f}", source=dep["hw"].flops_source, tp=dep["tp"],
                  here=str(backend.device), model=backend.spec.name))


# ---- prefill → decode handoff -----------------------------------------------------------------------------
def run_handoff(engine: str, n_prompt: int, n_new: int) -> None:
    from kvviz.engine.paged.demo import shared_prefix_ids

    ids = shared_prefix_ids(backend.tokenizer, n_prompt)
    try:
        if engine == "kvviz":
            from kvviz.engine.offload.handoff import run_handoff as kvviz_handoff

            ss.setdefault("mv_handoff", {})["kvviz"] = kvviz_handoff(backend, settings.model, ids, n_new)
        else:
            from kvviz.engine import fetch
            from kvviz.engine.export import export_gguf
            from kvviz.serving.handoff import llamacpp_handoff

            demo = ss.mv_demo
            if settings.model == "tiny":
                gguf = export_gguf(backend.model, backend.tokenizer, demo.session_dir / "tiny.gguf", name="kvviz-tiny")
            else:
                gguf = fetch.gguf_path(settings.model)
            ss.setdefault("mv_handoff", {})["llamacpp"] = llamacpp_handoff(gguf, backend.spec, ids, n_new,
                                                                           workdir=demo.session_dir)
    except (InputError, RuntimeError, TimeoutError, OSError) as exc:
        ss.mv_handoff_error = str(exc).splitlines()[0]


def handoff_view(dep: dict | None) -> None:
    from kvviz.serving.llamacpp import binary

    c = (box if lecture else st).columns(2)  # on a projector behind the settings button
    n_prompt = int(number_in_range(c[0], tr("moving.prompt_tokens"), 2, max(2, min(max_len - 64, 2000)), 64,
                                      "mv_prompt"))
    n_new = int(number_in_range(c[1], tr("moving.new_tokens"), 2, 64, 16, "mv_new"))
    runnable = settings.model in ("tiny", "smollm2")
    if settings.hosted is not None:
        st.info(tr("hosted.handoff_off"))
    elif not runnable:
        st.info(tr("moving.handoff_model"))
    else:
        b = st.columns(2)
        b[0].button(tr("moving.run_kvviz"), on_click=run_handoff, args=("kvviz", n_prompt, n_new), key="mv_run_kvviz",
                    type="primary", width="stretch", help=tr("moving.run_kvviz_help"))
        b[1].button(tr("moving.run_llamacpp"), on_click=run_handoff, args=("llamacpp", n_prompt, n_new),
                    key="mv_run_llamacpp", width="stretch", disabled=binary() is None,
                    help=tr("moving.run_llamacpp_help") if binary() else tr("moving.no_llama_server"))
    if ss.get("mv_handoff_error"):
        st.error(tr("moving.handoff_failed", error=ss.mv_handoff_error))
        ss.mv_handoff_error = None
    results = ss.get("mv_handoff") or {}
    if results:
        steps = []
        for engine, r in results.items():
            name = f"{tr(f'moving.engine_{engine}')} · {format_binary(r['bytes'])}"
            first = r["first_decode_s"] if engine == "kvviz" else r["decode_prompt_s"]
            for phase, seconds, text in (("prefill", r["prefill_s"], ""), ("save", r["save_s"], ""),
                                         ("transfer", r["transfer_s"], format_binary(r["bytes"])),
                                         ("restore", r["restore_s"], ""), ("decode", first, "")):
                steps.append({"engine": name, "phase": phase, "seconds": seconds or 0.0, "text": text})
        labels = {k: tr(f"moving.c_{k}") for k in ("ms", "handoff_title")} | {
            f"phase_{p}": tr(f"moving.phase_{p}") for p in ("prefill", "save", "transfer", "restore", "decode")}
        chart(charts.handoff_timeline(steps, labels, lecture=lecture), "mv_handoff")
    # on a projector the timeline keeps the screen: its tables and the calculator folded under it, in one box
    details = st.expander(tr("moving.handoff_details")) if lecture else st.container()
    with details:
        if results:
            table(pd.DataFrame([{
                tr("moving.col_engine"): tr(f"moving.engine_{engine}"), tr("moving.col_prompt"): r["prompt_tokens"],
                tr("moving.col_moved"): r["bytes"], tr("moving.col_bytes"): r["kv_bytes"],
                tr("moving.col_formula"): r["formula_bytes"],
                tr("moving.col_header"): r["header_bytes"], tr("moving.col_save"): f"{r['save_s'] * 1e3:.2f}",
                tr("moving.col_transfer"): f"{r['transfer_s'] * 1e3:.2f}",
                tr("moving.col_restore"): f"{r['restore_s'] * 1e3:.2f}",
                tr("moving.col_tokens_equal"): tr("moving.yes" if r["tokens_equal_single"] else "moving.no"),
            } for engine, r in results.items()]), "mv_handoff_table")
            st.caption(tr("moving.handoff_caption"))
            if "llamacpp" in results:
                parts = results["llamacpp"]["file_parts"]
                st.caption(tr("moving.file_parts", parts=", ".join(f"{k} {v:,} B" for k, v in parts.items())))
        if dep is not None:
            calc = handoff_bytes(dep["spec"], n_prompt, dep["kv_dtype"], dep["tp"])
            st.markdown(tr("moving.calc_line", model=dep["spec"].name, n=n_prompt, tp=dep["tp"],
                           per_rank=format_binary(calc.per_rank), total=format_binary(calc.total),
                           heads=calc.kv_heads_per_rank)
                        + (" " + tr("moving.replicated") if calc.replicated else ""))
            table(pd.DataFrame([{
                tr("moving.col_link"): name,
                tr("moving.col_per_rank"): f"{calc.seconds(link) * 1e3:.3f}",
                tr("moving.col_shared"): f"{calc.seconds(link, shared_link=True) * 1e3:.3f}",
            } for name, link in LINKS.items()]), "mv_handoff_calc")


demo = store_section()
if demo is not None and "tiers" in shown:
    idea_title(tr("moving.idea_tiers"), small=True)
    requests_view(demo)
if demo is not None and "ttft" in shown:
    idea_title(tr("moving.idea_ttft"), small=True)
    ttft_view(demo)
# On a projector the deployment is chosen behind the settings button, whichever idea is on screen.
dep = deployment(box) if lecture else deployment(st) if shown & {"break_even", "handoff"} else None
if dep is not None and "break_even" in shown:
    idea_title(tr("moving.idea_break_even"), small=True)
    break_even_view(dep)
if "handoff" in shown:
    idea_title(tr("moving.idea_handoff"), small=True)
    handoff_view(dep)
with about if lecture else st.expander(tr("moving.rules_title")):  # on a projector with the introduction, folded
    if lecture:
        st.markdown(f"**{tr('moving.rules_title')}**")
    st.markdown(tr("moving.rules"))
