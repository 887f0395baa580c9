"""What the Memory Footprint page draws: the session keys it keeps (`MEM`), the scenario seeded from the link
(`seed_from_url`) and kept in it (`keep_in_url`), the study note's example (`seed_buttons`), the model
(`model_source`) and the scenario's sizes (`scenario_inputs`), the formula with its steps (`formula`), the attention
variants (`compare`), the cache against the weights (`growth`), the capacity planner's settings
(`planner_settings`, `PlannerChoice`) and answer (`planner`), the planner on real start-up logs (`start_up_logs`),
paged against contiguous allocation (`paged`) and the live cache's bytes (`live`); in a lecture room what the
lecturer's page publishes (`room_view`) and a follower's page drawn from it (`follow`). What is drawn is computed by
kvviz.lessons.memory and kvviz.kv; the engine (torch) is imported only after Run here is pressed."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import streamlit as st

from kvviz.app.language import lang, show_error, tr
from kvviz.app.lecture import idea_title, shown_idea
from kvviz.app.models import check_request, get_backend
from kvviz.app.room.explore import explore_button
from kvviz.app.room.view import RoomView
from kvviz.app.sidebar import Settings
from kvviz.app.state import page_state
from kvviz.app.uploads import config_upload
from kvviz.app.url_state import DEFAULTS, VLLM_VERSIONS, query_changes, read_query, scenario_in, scenario_query
from kvviz.app.widgets import chart, number_in_range
from kvviz.charts.memory import (
    allocation_figure,
    attention_comparison_figure,
    cache_vs_weights_figure,
    residual_figure,
)
from kvviz.errors import InputError
from kvviz.kv.capacity import CapacityPlan, compare_allocation, parse_lengths
from kvviz.kv.formats import KV_DTYPES
from kvviz.kv.formula import KVFootprint, KVSpec, kv_footprint, weight_bytes
from kvviz.kv.hardware import HARDWARE, Hardware
from kvviz.kv.log_check import TOLERANCE, check_all
from kvviz.kv.presets import HF_REPOS, PRESETS
from kvviz.kv.sglang_pool import SglangPlan
from kvviz.kv.vllm_profile import ServingFlags, why_text
from kvviz.lessons.memory import (
    CROSSING_LIMIT,
    LOG_TERMS,
    attention_bars,
    capped_lengths,
    crossing_kind,
    custom_spec,
    device_total,
    flag_name,
    footprint_steps,
    formula_latex,
    growth_curves,
    lecture_screens,
    live_verdict,
    log_cell,
    log_name,
    params_b_of,
    plan_for,
    residuals,
    seed_scenario,
    serving_flags,
    with_given_params,
)
from kvviz.units import format_binary, format_decimal

# The keys the page keeps besides its widgets' (`mem_<scenario name>`, seeded from the link): the link's scenario
# and what it got wrong, the scenario last drawn, the last valid model and allocation, the generation Run here made.
MEM = page_state("memory", url_values=None, url_bad=[], saved=None, last_spec=None, last_alloc=None, generation=None)
WIDGET = "memory_"  # the scenario's widgets: mem_<name> for each name of url_state.DEFAULTS


# ---- the scenario: seeded once from the link (a shared link reproduces it), then owned by the widgets ----------
def seed_from_url() -> None:
    ss = st.session_state
    if MEM.get("url_values") is None:
        values, bad = read_query(dict(st.query_params))
        MEM.set("url_values", values)
        MEM.set("url_bad", bad)
    # Widget state is dropped when the user visits another page: re-seed from this page's last scenario.
    for key, value in (MEM.get("saved") or MEM.get("url_values")).items():
        ss.setdefault(WIDGET + key, value)
    if MEM.get("url_bad"):
        st.warning(tr("memory.url_bad", values=", ".join(MEM.get("url_bad"))))
        MEM.set("url_bad", [])  # said once; the values the user fixes afterwards are not malformed
    if MEM.get("url_values").get("src") == "upload" and "memory_upload_spec" not in ss:
        st.info(tr("memory.url_upload"))  # a file cannot travel in a link


def keep_in_url() -> None:
    """The scenario back into the link, so the link reproduces it."""
    saved = scenario_in(st.session_state, WIDGET)
    MEM.set("saved", saved)
    changed, dropped = query_changes(st.query_params.to_dict(), scenario_query(saved))
    for key, value in changed.items():
        st.query_params[key] = value
    for key in dropped:
        del st.query_params[key]


def _load_seed(kv_heads: int) -> None:
    st.session_state.update({WIDGET + k: v for k, v in seed_scenario(kv_heads).items()})


def seed_buttons() -> None:
    c1, c2 = st.columns([3, 2])
    c1.button(tr("memory.seed_mha"), on_click=_load_seed, args=(32,), key="memory_seed_mha")
    c2.button(tr("memory.seed_gqa"), on_click=_load_seed, args=(8,), key="memory_seed_gqa")


# ---- the model and the scenario's sizes ------------------------------------------------------------------------
def model_source() -> KVSpec | None:
    """A preset, a shape typed in or an uploaded config.json; the last valid one while the input is not."""
    ss = st.session_state
    src = st.radio(tr("memory.source"), ["preset", "custom", "upload"], key="memory_src", horizontal=True,
                   format_func={s: tr(f"memory.source_{s}") for s in ("preset", "custom", "upload")}.get)
    spec: KVSpec | None = None
    try:
        if src == "preset":
            name = st.selectbox(tr("memory.preset"), list(PRESETS), key="memory_preset")
            spec = PRESETS[name]
            st.caption(tr("memory.preset_source", repo=HF_REPOS[name]))
        elif src == "custom":
            a, b = st.columns(2)
            layers = number_in_range(a, tr("memory.layers"), 1, 1000, DEFAULTS["layers"], "memory_layers")
            heads = number_in_range(b, tr("memory.heads"), 1, 1024, DEFAULTS["heads"], "memory_heads")
            kv_heads = number_in_range(a, tr("memory.kv_heads"), 1, 1024, DEFAULTS["kv_heads"], "memory_kv_heads")
            d_head = number_in_range(b, tr("memory.d_head"), 1, 4096, DEFAULTS["d_head"], "memory_d_head")
            params_b = number_in_range(st, tr("memory.params_b"), 0.001, 10_000.0, DEFAULTS["params_b"],
                                       "memory_params_b", whole=False, format="%.3f")
            spec = custom_spec(layers, heads, kv_heads, d_head, params_b, tr("memory.source_custom"))
        else:
            def read(parsed: KVSpec) -> None:
                # the box shows this config's own count, or stays empty when the config cannot give one
                ss.memory_upload_params_b = params_b_of(parsed)

            spec = config_upload(st, tr("memory.upload"), "memory_upload", read)
            if spec is None:
                st.info(tr("memory.upload_hint"))
            else:
                st.caption(tr("memory.upload_loaded", name=spec.name))
                given = number_in_range(st, tr("memory.params_b"), 0.001, 10_000.0, None, "memory_upload_params_b",
                                        whole=False, format="%.3f", placeholder=tr("memory.params_placeholder"),
                                        help=tr("memory.params_help"))
                if given is None:
                    st.warning(tr("memory.params_unknown"))
                spec = with_given_params(spec, given)
    except InputError as exc:
        show_error(exc)
        spec = None
    if spec is None and MEM.get("last_spec") is not None:
        spec = MEM.get("last_spec")  # keep the last valid result on screen
        st.caption(tr("memory.kept_last", name=spec.name))
    return spec


def scenario_inputs() -> tuple[int, int, str, str]:
    """(context tokens, concurrent requests, KV dtype, weight dtype)."""
    a, b = st.columns(2)
    tokens = number_in_range(a, tr("memory.tokens"), 1, 10_000_000, DEFAULTS["tokens"], "memory_tokens", step=1024)
    batch = number_in_range(b, tr("memory.batch"), 1, 100_000, DEFAULTS["batch"], "memory_batch")
    kv_dtype_name = a.selectbox(tr("memory.kv_dtype"), list(KV_DTYPES), key="memory_kv_dtype")
    w_dtype_name = b.selectbox(tr("memory.w_dtype"), list(KV_DTYPES), key="memory_w_dtype")
    fmt = KV_DTYPES[kv_dtype_name]
    if fmt.group_size:
        st.caption(tr(f"memory.scale_note_{fmt.name}", dtype=fmt.name, group=fmt.group_size,
                      scale=fmt.scale_bytes_per_group, block=fmt.vector_bytes(fmt.group_size),
                      residual=fmt.stored.residual if fmt.stored else 0))
    return int(tokens), int(batch), kv_dtype_name, w_dtype_name


# ---- the formula ----------------------------------------------------------------------------------------------
def formula(spec: KVSpec, fp: KVFootprint, weights: int | None, w_dtype_name: str, lecture: bool) -> None:
    if spec.max_context is not None and fp.n_tokens > spec.max_context:
        st.warning(tr("memory.past_context", tokens=f"{fp.n_tokens:,}", max_context=f"{spec.max_context:,}",
                      name=spec.name))
    st.subheader(tr("memory.formula_title", name=spec.name, kind=spec.attention_kind))
    st.latex(formula_latex(spec, fp))
    if spec.n_sliding_layers:
        st.caption(tr("memory.window_note", window=spec.sliding_window, sliding=spec.n_sliding_layers,
                      layers=spec.n_layers))
    if spec.is_mla:
        st.caption(tr("memory.mla_note", rank=spec.kv_lora_rank, rope=spec.qk_rope_head_dim, heads=spec.n_kv_heads))
    if fp.scale_bytes_per_token_per_layer:
        st.caption(tr("memory.scale_bytes", scale=fp.scale_bytes_per_token_per_layer))
    steps = footprint_steps(spec, fp, lang())
    if not lecture:  # on a projector the table below gives the same four sizes, in bold
        cols = [c for _ in range(2) for c in st.columns(2)]  # 2×2: a metric needs ~200 px at this font
        for col, (key, _, value) in zip(cols, steps, strict=True):
            col.metric(tr(f"memory.step_{key}"), format_binary(value), help=f"{value:,} B")
    rows = [f"| {tr('memory.col_step')} | {tr('memory.col_factors')} | {tr('memory.col_bytes')} | "
            f"{tr('memory.col_binary')} | {tr('memory.col_decimal')} |", "|---|---|--:|--:|--:|"]
    rows += [f"| {tr(f'memory.step_{key}')} | {factors} | {value:,} B | **{format_binary(value)}** | "
             f"{format_decimal(value)} |" for key, factors, value in steps]
    st.markdown("\n".join(rows))
    if not lecture:
        st.caption(tr("memory.units_note"))
    if weights is not None:
        st.write(tr("memory.vs_weights", weights=format_binary(weights), params=f"{spec.n_params / 1e9:.2f}",
                    source=tr(f"memory.params_{spec.params_source}"), dtype=w_dtype_name,
                    ratio=f"{fp.total / weights:.3g}"))


def compare(spec: KVSpec, kv_dtype_name: str, lecture: bool) -> None:
    bars = attention_bars(spec, kv_dtype_name)
    title = tr("memory.compare_title", layers=spec.n_layers, heads=spec.n_heads, d_head=spec.d_head,
               dtype=kv_dtype_name)
    chart(attention_comparison_figure(bars.labels, bars.kinds, bars.per_token, title=title,
                                      y_title=tr("memory.kib_per_token"), lecture=lecture), key="memory_compare_chart")
    st.caption(tr("memory.compare_note", rank=bars.mla.kv_lora_rank, rope=bars.mla.qk_rope_head_dim))
    if bars.refused:
        st.caption(tr("memory.compare_refused", kinds=", ".join(bars.refused), dtype=kv_dtype_name))


def growth(spec: KVSpec, fp: KVFootprint, weights: int | None, kv_dtype_name: str, lecture: bool) -> None:
    if weights is None:
        st.info(tr("memory.no_params"))
        return
    curves = growth_curves(spec, weights, fp.batch, fp.n_tokens, kv_dtype_name)
    chart(cache_vs_weights_figure(curves, weights, title=tr("memory.growth_title"), x_title=tr("memory.tokens"),
                                  y_title=tr("memory.gib_axis"),
                                  weights_label=tr("memory.weights_label", weights=format_binary(weights)),
                                  batch_label=tr("memory.batch_label"), crossing_label=tr("memory.crossing_label"),
                                  lecture=lecture), key="memory_growth_chart")
    for c in curves:
        kind = crossing_kind(c, spec)
        if kind == "at":
            st.write(tr("memory.crossing_at", batch=c.batch, tokens=f"{c.crossing_tokens:,}"))
        elif kind == "never":
            st.write(tr("memory.crossing_never", batch=c.batch))
        else:
            st.write(tr("memory.crossing_beyond", batch=c.batch, tokens=f"{CROSSING_LIMIT:,}"))


# ---- the capacity planner -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannerChoice:
    """The planner's settings as the boxes hold them (the vLLM ones unset for SGLang and the other way round)."""

    engine: str
    gpu_name: str
    gpu: Hardware
    n_gpus: int
    total_gib: float | None  # None: emptied, the device's total unknown
    fraction: float = 0.9
    reserve_gib: float | None = None  # None: predicted
    flags: ServingFlags | None = None
    sgl_frac: float = 0.0


def planner_settings(spec: KVSpec) -> PlannerChoice:
    engine = st.radio(tr("memory.engine"), ["vllm", "sglang"], key="memory_engine", horizontal=True,
                      format_func={e: tr(f"memory.engine_{e}") for e in ("vllm", "sglang")}.get)
    a, b, c = st.columns(3)
    gpu_name = a.selectbox(tr("memory.gpu"), list(HARDWARE), key="memory_gpu")
    n_gpus = number_in_range(b, tr("memory.n_gpus"), 1, 64, DEFAULTS["n_gpus"], "memory_n_gpus")
    fraction, sgl_frac = 0.9, 0.0
    if engine == "vllm":
        fraction = c.slider(tr("memory.fraction"), 0.1, 1.0, key="memory_frac", step=0.05)
    else:
        sgl_frac = number_in_range(c, tr("memory.sgl_frac"), 0.0, 1.0, DEFAULTS["sgl_frac"], "memory_sgl_frac",
                                   whole=False, step=0.01, format="%.3f", help=tr("memory.sgl_frac_help"))
    gpu = HARDWARE[gpu_name]
    st.caption(tr(f"memory.gpu_said_{gpu.memory_kind}"))  # one line; where the number comes from, folded
    if gpu.memory_source:
        with st.expander(tr("memory.gpu_source_title")):
            st.caption(tr(f"memory.gpu_kind_{gpu.memory_kind}"))
            st.caption(gpu.memory_source)
    d, e = st.columns(2)
    # optional: emptied, the device's total is unknown (never a guessed default) and the reserve is predicted
    total_gib = number_in_range(d, tr("memory.gpu_total"), 0.1, 100_000.0,
                                None if gpu.memory_bytes is None else round(gpu.memory_bytes / 2**30, 2),
                                f"memory_total_{gpu_name}", whole=False, optional=True,
                                placeholder=tr("memory.unknown"))
    choice = PlannerChoice(engine, gpu_name, gpu, int(n_gpus), total_gib, fraction=fraction, sgl_frac=sgl_frac)
    if engine != "vllm":
        return choice
    reserve_gib = number_in_range(e, tr("memory.reserve"), 0.0, 1000.0, None, f"memory_reserve_{spec.name}_{n_gpus}",
                                  whole=False, format="%.2f", placeholder=tr("memory.reserve_estimated"),
                                  help=tr("memory.reserve_help"))
    f1, f2, f3 = st.columns([2, 2, 1])
    # the names are formatted now, in this run's language (a test harness may format options later)
    versions = {v: tr("memory.any_version") if v == "any" else v for v in VLLM_VERSIONS}
    version = f1.selectbox(tr("memory.vllm_version"), VLLM_VERSIONS, key="memory_vllm", format_func=versions.get)
    entry = f2.selectbox(tr("memory.entry"), ["any", "serve", "llm"], key="memory_entry",
                         format_func={v: tr(f"memory.entry_{v}") for v in ("any", "serve", "llm")}.get)
    eager = f3.checkbox(tr("memory.eager"), key="memory_eager")
    g1, g2 = st.columns(2)
    mbt = number_in_range(g1, tr("memory.mbt"), 0, 1_000_000, DEFAULTS["mbt"], "memory_mbt", step=1024.0,
                          help=tr("memory.zero_default"))
    seqs = number_in_range(g2, tr("memory.seqs"), 0, 100_000, DEFAULTS["seqs"], "memory_seqs", step=64.0,
                           help=tr("memory.zero_default"))
    return PlannerChoice(engine, gpu_name, gpu, int(n_gpus), total_gib, fraction=fraction, reserve_gib=reserve_gib,
                         flags=serving_flags(version, entry, eager, mbt, seqs))


def planner(spec: KVSpec, choice: PlannerChoice, weights: int | None, tokens: int, kv_dtype_name: str,
            w_dtype_name: str, lecture: bool) -> CapacityPlan | SglangPlan | None:
    """The planner's answer (None when it cannot give one, and why)."""
    plan = None
    if weights is None:
        st.warning(tr("memory.cap_params_unknown"))
    elif choice.total_gib is None:
        st.info(tr("memory.cap_memory_unknown"))
    else:
        try:
            plan = plan_of(spec, choice, weights, tokens, kv_dtype_name, w_dtype_name)
        except InputError as exc:
            show_error(exc)
    if isinstance(plan, CapacityPlan):
        _vllm_plan(plan, choice.fraction, tokens, lecture)
    elif plan is not None:
        _sglang_plan(plan, tokens, lecture)
    return plan


def plan_of(spec: KVSpec, choice: PlannerChoice, weights: int | None, tokens: int, kv_dtype_name: str,
            w_dtype_name: str) -> CapacityPlan | SglangPlan | None:
    """The planner's answer; None without the parameter count or the device's total (planner() says which)."""
    if weights is None or choice.total_gib is None:
        return None
    return plan_for(choice.engine, spec, device_total(choice.gpu, choice.total_gib), tokens=tokens,
                    n_gpus=choice.n_gpus, kv_dtype_name=kv_dtype_name, weight_dtype=w_dtype_name, gpu=choice.gpu,
                    gpu_name=choice.gpu_name, fraction=choice.fraction, flags=choice.flags,
                    reserve_gib=choice.reserve_gib, sgl_frac=choice.sgl_frac)


def _vllm_plan(plan: CapacityPlan, fraction: float, tokens: int, lecture: bool) -> None:
    m = st.columns(5)
    m[0].metric(tr("memory.cap_usable"), format_binary(plan.requested_bytes), help=f"{plan.requested_bytes:,} B")
    m[1].metric(tr("memory.cap_weights"), format_binary(plan.weights_bytes), help=f"{plan.weights_bytes:,} B")
    m[2].metric(tr("memory.cap_budget"), format_binary(plan.kv_budget_bytes), help=f"{plan.kv_budget_bytes:,} B")
    m[3].metric(tr("memory.cap_tokens"), f"{plan.kv_cache_tokens:,}")
    m[4].metric(tr("memory.cap_requests", tokens=f"{tokens:,}"), f"{plan.max_requests:,}")
    if not plan.weights_fit:
        st.warning(tr("memory.cap_no_fit"))
    details = st.expander(tr("memory.cap_details")) if lecture else st.container()
    details.caption(tr(
        "memory.cap_steps", total=format_binary(plan.device_total_bytes), frac=fraction,
        usable=format_binary(plan.requested_bytes), weights=format_binary(plan.weights_bytes), tp=plan.tp,
        reserve=format_binary(plan.reserve_bytes),
        how=tr("memory.reserve_was_estimated" if plan.reserve_estimated else "memory.reserve_was_given"),
        budget=format_binary(plan.kv_budget_bytes), block=plan.block_size,
        per_block=format_binary(plan.kv_bytes_per_block), blocks=f"{plan.num_blocks:,}",
        concurrency=f"{plan.max_concurrency:,.2f}", tokens=f"{tokens:,}"))
    if plan.reserve_terms is None:
        return
    with details:
        lo, hi = plan.kv_cache_tokens_range
        launch = plan.launch
        st.markdown(tr("memory.range", lo=f"{lo:,}", hi=f"{hi:,}", likely=f"{plan.kv_cache_tokens:,}",
                       clo=f"{plan.max_concurrency_range[0]:,.2f}", chi=f"{plan.max_concurrency_range[1]:,.2f}",
                       tokens=f"{tokens:,}"))
        if plan.narrowing_flag:
            st.caption(tr("memory.narrows", flag=flag_name(plan.narrowing_flag),
                          low=launch["low_reserve_launch"]["vllm_line"],
                          high=launch["high_reserve_launch"]["vllm_line"]))
        else:
            st.caption(tr("memory.narrows_none"))
        terms = plan.reserve_terms
        rows = [f"| {tr('memory.term')} | {tr('memory.col_bytes')} | {tr('memory.term_how')} |", "|---|--:|---|"]
        batch_how = tr("memory.how_batch", line=launch["vllm_line"], engine=launch["engine"].upper(),
                       entry=tr(f"memory.entry_{launch['entry']}"),
                       tokens=f"{launch['max_num_batched_tokens']:,}", seqs=f"{launch['max_num_seqs']:,}",
                       source=why_text(launch["batch_why"], lang()))
        for key, how in (("activation", tr("memory.how_activation") + " " + batch_how),
                         ("sampler", tr(f"memory.how_sampler_{launch['sampler']}")),
                         ("non_torch", tr("memory.how_non_torch", source=why_text(launch["non_torch_why"], lang()))),
                         ("cudagraph", tr("memory.how_cudagraph"))):
            rows.append(f"| {tr(f'memory.term_{key}')} | {format_binary(terms[key])} | {how} |")
        rows.append(f"| **{tr('memory.term_reserve')}** | **{format_binary(plan.reserve_bytes)}** | "
                    f"{tr('memory.how_reserve')} |")
        st.markdown("\n".join(rows))


def _sglang_plan(plan: SglangPlan, tokens: int, lecture: bool) -> None:
    m = st.columns(4)
    m[0].metric(tr("memory.sgl_free"), format_binary(plan.free_at_start_bytes), help=f"{plan.free_at_start_bytes:,} B")
    m[1].metric(tr("memory.cap_weights"), format_binary(plan.weights_bytes), help=f"{plan.weights_bytes:,} B")
    m[2].metric(tr("memory.cap_tokens"), f"{plan.kv_cache_tokens:,}")
    m[3].metric(tr("memory.sgl_requests", tokens=f"{tokens:,}"), f"{plan.max_concurrency:,.2f}")
    lo, hi = plan.kv_cache_tokens_range
    if not plan.weights_fit:
        st.warning(tr("memory.cap_no_fit"))
    details = st.expander(tr("memory.cap_details")) if lecture else st.container()
    details.caption(tr("memory.sgl_steps", free=format_binary(plan.free_at_start_bytes),
                       after=format_binary(plan.free_after_load_bytes), frac=f"{plan.mem_fraction_static:.3f}",
                       source=tr(plan.mem_fraction_rule), pool=format_binary(plan.kv_budget_bytes),
                       per_token=f"{plan.kv_bytes_per_token:,}", tokens=f"{plan.kv_cache_tokens:,}",
                       lo=f"{lo:,}", hi=f"{hi:,}"))


def start_up_logs(lecture: bool) -> None:
    """The planner against real start-up logs: where its prediction could be wrong, term by term."""
    checks = check_all()  # pure arithmetic over kvviz/kv/startup_logs.json, cached once per process
    idea_title(tr("memory.logs_title"), small=True)  # in lecture mode the stepper shows it
    st.caption(tr("memory.logs_intro", n=len(checks), tolerance=f"{TOLERANCE:.0%}"))
    term_names = {t: tr(f"memory.term_{t}") for t in LOG_TERMS}
    chart(
        residual_figure(residuals(checks, term_names), list(term_names.values()), tolerance=TOLERANCE,
                        title=tr("memory.logs_chart"), y_title=tr("memory.logs_axis"),
                        named_label=tr("memory.logs_named"), unnamed_label=tr("memory.logs_unnamed"),
                        band_label=tr("memory.logs_band", tolerance=f"{TOLERANCE:.0%}"), lecture=lecture),
        "memory_residual_chart",
    )
    with st.expander(tr("memory.logs_table"), expanded=not lecture):
        rows = [f"| {tr('memory.logs_log')} | {tr('memory.logs_setup')} | " + " | ".join(term_names.values()) + " |",
                "|---|---|" + "--:|" * len(term_names)]
        rows += [f"| {log_name(c)} | {c.engine} {c.version} · {c.gpu} × {c.tp} | "
                 + " | ".join(log_cell(c, t) for t in term_names) + " |" for c in checks]
        st.markdown("\n".join(rows))
        st.caption(tr("memory.logs_notes"))


# ---- paged blocks ---------------------------------------------------------------------------------------------
def paged(fp: KVFootprint, plan: CapacityPlan | SglangPlan | None, lecture: bool) -> None:
    if not lecture:
        st.subheader(tr("memory.paged_title"))
    a, b = st.columns([3, 1])
    lengths_text = a.text_input(tr("memory.lengths"), key="memory_lengths")
    block = number_in_range(b, tr("memory.block"), 1, 4096, DEFAULTS["block"], "memory_block")
    paged_figures(fp, plan, lengths_text, int(block), lecture)


def paged_figures(fp: KVFootprint, plan: CapacityPlan | SglangPlan | None, lengths_text: str, block: int,
                  lecture: bool) -> None:
    """The request mix `lengths_text` in blocks of `block`: contiguous against paged (the page's, from its boxes;
    a room follower's, from the lecturer's)."""
    try:
        lengths, longer = capped_lengths(parse_lengths(lengths_text), fp.n_tokens)
        if longer:  # the request mix follows the context set above
            st.caption(tr("memory.lengths_capped", n=longer, max_len=f"{fp.n_tokens:,}"))
        alloc = compare_allocation(lengths, fp.n_tokens, fp.per_token, int(block))
        MEM.set("last_alloc", alloc)
    except InputError as exc:
        show_error(exc)
        alloc = MEM.get("last_alloc")
    if alloc is None:
        return
    chart(allocation_figure([tr("memory.contiguous"), tr("memory.paged", block=alloc.block_size)], alloc.live_bytes,
                            [alloc.contiguous_bytes, alloc.paged_bytes],
                            title=tr("memory.paged_chart", max_len=f"{alloc.max_len:,}"),
                            live_label=tr("memory.live"), waste_label=tr("memory.waste"),
                            y_title=tr("memory.bytes_axis"), lecture=lecture), key="memory_alloc_chart")
    live = format_binary(alloc.live_bytes)
    if plan is not None:
        fit_contiguous, fit_paged = alloc.requests_that_fit(plan.kv_budget_bytes)
        st.write(tr("memory.fit_compare", budget=format_binary(plan.kv_budget_bytes),
                    contiguous=f"{fit_contiguous:,}", paged=f"{fit_paged:,}", max_len=f"{alloc.max_len:,}"))
    if not lecture:  # on a projector the bars carry the waste
        st.markdown("\n".join([
            f"| | {tr('memory.allocated')} | {tr('memory.live')} | {tr('memory.waste')} |",
            "|---|--:|--:|--:|",
            f"| {tr('memory.contiguous')} | {format_binary(alloc.contiguous_bytes)} | {live} | "
            f"{format_binary(alloc.contiguous_waste_bytes)} ({alloc.contiguous_waste_fraction:.1%}) |",
            f"| {tr('memory.paged', block=alloc.block_size)} | {format_binary(alloc.paged_bytes)} | {live} | "
            f"{format_binary(alloc.paged_waste_bytes)} ({alloc.paged_waste_fraction:.1%}) |",
        ]))


# ---- the live cache -------------------------------------------------------------------------------------------
def live(settings: Settings) -> None:
    """The decode page's generation and one run here: the cache's measured bytes beside the formula's."""
    ss = st.session_state
    st.write(tr("memory.live_intro"))
    # The model loads when asked for (get_backend says why when it cannot): the page's arithmetic needs none, so a
    # link to this page draws without torch.
    if st.button(tr("memory.run_here"), key="memory_run_here") and (backend := get_backend(settings)) is not None:
        from kvviz.engine.generation import Generation

        try:
            prompt = tr("memory.run_prompt")
            check_request(settings, backend, batch=1, prompt_tokens=len(backend.tokenizer.encode(prompt)),
                          max_new_tokens=4)  # the hosted caps, as on every page that runs the model
            gen = Generation(backend, max_new_tokens=4)
            gen.prefill(prompt)
            if not gen.done:  # a prefill that emitted EOS already holds the cache to measure
                gen.step()
            MEM.set("generation", gen)
        except InputError as exc:
            show_error(exc)
    sources = {"reuse_gen": "memory.live_from_reuse_gen", MEM.key("generation"): "memory.live_from_memory_generation"}
    keys = [key for key in sources if ss.get(key) is not None]
    if keys:  # a generation in this session: the engine is imported already
        from kvviz.engine.generation import Generation

        keys = [key for key in keys if isinstance(ss[key], Generation)]
    if not keys:
        st.info(tr("memory.live_none"))
    for key in keys:
        gen = ss[key]
        if not gen.events or not gen.use_cache:
            st.info(tr("memory.live_empty"))
            continue
        event, arch = gen.events[-1], gen.backend.spec
        stored_heads = gen.backend.layer_kv(gen.cache, 0)[0].shape[1]
        # The engine's kv_footprint() of the model's KVSpec for the positions cached (windows, MLA latents too).
        formula_bytes = event.formula_bytes
        st.markdown(f"**{tr(sources[key])}** — " + tr(
            "memory.live_shape", name=arch.name, batch=gen.batch_size, layers=arch.n_layers,
            n=event.cache_lengths[0], kv_heads=arch.n_kv_heads, d_head=arch.d_head,
            dtype=str(gen.backend.dtype).removeprefix("torch."), device=str(gen.backend.device)))
        m = st.columns(4)
        m[0].metric(tr("memory.live_measured"), f"{event.live_bytes:,} B", help=format_binary(event.live_bytes))
        m[1].metric(tr("memory.live_formula"), f"{formula_bytes:,} B", help=format_binary(formula_bytes))
        m[2].metric(tr("memory.live_allocated"), f"{event.allocated_bytes:,} B",
                    help=format_binary(event.allocated_bytes))
        m[3].metric(tr("memory.live_device"), f"{event.device_memory_bytes:,} B"
                    if event.device_memory_bytes is not None else tr("memory.live_no_device"))
        verdict = live_verdict(event.live_bytes, formula_bytes, arch, stored_heads)
        if verdict == "equal":
            st.success(tr("memory.live_equal"))
        elif verdict == "expanded":
            st.info(tr("memory.live_expanded", stored=stored_heads, needed=arch.n_kv_heads,
                       factor=f"{stored_heads / arch.n_kv_heads:g}"))
        else:
            st.error(tr("memory.live_differ", diff=f"{event.live_bytes - formula_bytes:,}"))


# ---- a lecture room -------------------------------------------------------------------------------------------
def room_view(spec: KVSpec, choice: PlannerChoice) -> dict:
    """What a lecture room's followers draw of this page, as plain JSON: the scenario as the boxes hold it, the model
    it describes (an uploaded config.json travels no other way), the planner's settings (its device total and
    reserve are kept per GPU and model, not in the link) and the screen on the projector (None: not lecture mode).
    A follower computes the figures from it with the page's own pure functions: a few sums, no model."""
    planner = {"engine": choice.engine, "gpu_name": choice.gpu_name, "n_gpus": choice.n_gpus,
               "total_gib": choice.total_gib, "fraction": choice.fraction, "reserve_gib": choice.reserve_gib,
               "flags": None if choice.flags is None else dataclasses.asdict(choice.flags), "sgl_frac": choice.sgl_frac}
    return {"scenario": scenario_in(st.session_state, WIDGET), "spec": dataclasses.asdict(spec),
            "planner": planner, "screen": shown_idea("memory")}


def _room_choice(planner: dict) -> PlannerChoice:
    flags = planner["flags"]
    return PlannerChoice(**{**planner, "flags": None if flags is None else ServingFlags(**flags)},
                         gpu=HARDWARE[planner["gpu_name"]])


def _explore_settings(view: dict) -> dict:
    """The session keys that make this page the lecturer's scenario: its boxes, the planner's device total and
    reserve, an uploaded model, the screen on show."""
    scenario, planner, spec = view["scenario"], view["planner"], KVSpec(**view["spec"])
    keys = {WIDGET + name: value for name, value in scenario.items()}
    keys[MEM.key("saved")] = scenario  # what seed_from_url seeds the boxes from after a visit elsewhere
    keys[f"memory_total_{planner['gpu_name']}"] = planner["total_gib"]
    if planner["engine"] == "vllm":
        keys[f"memory_reserve_{spec.name}_{planner['n_gpus']}"] = planner["reserve_gib"]
    if scenario.get("src") == "upload":  # the file is not sent: the model read from it is
        keys.update(memory_upload_spec=spec, memory_upload_params_b=params_b_of(spec))
    if view["screen"] is not None:
        keys["kv_idea_memory"] = view["screen"] + 1
    return keys


def _room_scenario(spec: KVSpec, scenario: dict, choice: PlannerChoice, planner_on: bool) -> None:
    rows = [(tr("memory.source"), spec.name), (tr("memory.tokens"), f"{scenario['tokens']:,}"),
            (tr("memory.batch"), f"{scenario['batch']:,}"), (tr("memory.kv_dtype"), scenario["kv_dtype"]),
            (tr("memory.w_dtype"), scenario["w_dtype"])]
    if planner_on:
        rows += [(tr("memory.engine"), tr(f"memory.engine_{choice.engine}")),
                 (tr("memory.gpu"), f"{choice.gpu_name} × {choice.n_gpus}")]
    st.markdown("\n".join([f"| {tr('room.setting')} | {tr('room.value')} |", "|---|---|",
                           *(f"| {name} | {value} |" for name, value in rows)]))


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Memory Footprint: the lecturer's scenario and the screen on the projector (every
    screen when the lecturer is not in lecture mode), computed here from the scenario and drawn by this page's own
    functions in this session's language; no box of this session's is drawn, so none can change what is shown."""
    scenario, spec, choice = view["scenario"], KVSpec(**view["spec"]), _room_choice(view["planner"])
    explore_button(_explore_settings(view), help_key="room.explore_scenario_help")
    _, screens, _ = lecture_screens(True)
    shown = [screens[view["screen"]][1]] if view["screen"] is not None else [title for _, title in screens]
    _room_scenario(spec, scenario, choice, bool({"tab_capacity", "paged_title"} & set(shown)))
    tokens, kv_dtype_name, w_dtype_name = scenario["tokens"], scenario["kv_dtype"], scenario["w_dtype"]
    try:
        fp = kv_footprint(spec, tokens, scenario["batch"], kv_dtype_name)
    except InputError as exc:
        show_error(exc)
        return
    weights = weight_bytes(spec.n_params, w_dtype_name)
    for title in shown:
        if title != "logs_title":  # the logs draw their own heading
            st.subheader(tr(f"memory.{title}"))
        if title == "idea_formula":
            formula(spec, fp, weights, w_dtype_name, lecture)
        elif title == "tab_compare":
            compare(spec, kv_dtype_name, lecture)
        elif title == "tab_growth":
            growth(spec, fp, weights, kv_dtype_name, lecture)
        elif title == "tab_capacity":
            planner(spec, choice, weights, tokens, kv_dtype_name, w_dtype_name, lecture)
        elif title == "logs_title":
            start_up_logs(lecture)
        elif title == "paged_title":
            try:
                plan = plan_of(spec, choice, weights, tokens, kv_dtype_name, w_dtype_name)
            except InputError:  # said on the planner's screen
                plan = None
            paged_figures(fp, plan, scenario["lengths"], scenario["block"], lecture)
        else:  # the measured cache: the lecturer's own model run, not shared
            st.info(tr("room.memory_live"))
