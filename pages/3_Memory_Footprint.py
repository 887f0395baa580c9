"""Memory Footprint: M_KV = 2·B·L·n·H_kv·d_head·bytes with every factor shown, real presets, any config.json,
the capacity planner, and the live cache's measured bytes beside the formula."""

import math

import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import idea_title, intro_box, lecture_head, lecture_tabs, screen_part, settings_box
from kvviz.app.models import check_request, get_backend, preload_engine
from kvviz.app.shell import page_setup
from kvviz.app.uploads import config_upload
from kvviz.app.url_state import DEFAULTS, VLLM_VERSIONS, read_query, scenario_query
from kvviz.app.widgets import chart, number_in_range
from kvviz.charts.memory import (
    CacheCurve,
    Residual,
    allocation_figure,
    attention_comparison_figure,
    cache_vs_weights_figure,
    residual_figure,
)
from kvviz.errors import InputError
from kvviz.kv.capacity import compare_allocation, parse_lengths, plan_capacity
from kvviz.kv.formula import (
    KV_DTYPES,
    KVSpec,
    attention_variants,
    cache_stops_growing,
    kv_footprint,
    tokens_to_reach,
    weight_bytes,
)
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.log_check import TOLERANCE as LOG_TOLERANCE
from kvviz.kv.log_check import check_all
from kvviz.kv.presets import HF_REPOS, PRESETS
from kvviz.kv.sglang_pool import plan_sglang
from kvviz.kv.vllm_profile import ServingFlags, why_text
from kvviz.units import format_binary, format_decimal

settings = page_setup("memory.title")
ss, lecture = st.session_state, settings.lecture
head = lecture_head(tr("memory.title"))
with head[0], intro_box():
    st.write(tr("memory.intro"))
LOG_CHECKS = check_all()  # pure arithmetic over kvviz/kv/startup_logs.json, cached once per process

# ---- inputs: seeded once from the URL (a shared link reproduces a scenario), then owned by the widgets ----
if "mem_url_values" not in ss:
    ss.mem_url_values, ss.mem_url_bad = read_query(dict(st.query_params))
# Widget state is dropped when the user visits another page: re-seed from this page's last scenario.
for key, value in (ss.get("mem_saved") or ss.mem_url_values).items():
    ss.setdefault("mem_" + key, value)
if ss.get("mem_url_bad"):
    st.warning(tr("memory.url_bad", values=", ".join(ss.mem_url_bad)))
    ss.mem_url_bad = []  # said once; the values the user fixes afterwards are not malformed
if ss.mem_url_values.get("src") == "upload" and "mem_upload_spec" not in ss:
    st.info(tr("memory.url_upload"))  # a file cannot travel in a link


def load_seed(kv_heads: int) -> None:
    """The study note's example: Llama-2-7B's shape, bf16, 4096 tokens, 32 requests."""
    ss.update(
        mem_src="custom",
        mem_layers=32,
        mem_heads=32,
        mem_kv_heads=kv_heads,
        mem_d_head=128,
        mem_tokens=4096,
        mem_batch=32,
        mem_kv_dtype="bfloat16",
        mem_params_b=6.74,
    )


# The formula, then the tabs; in lecture mode one of them per screen, the scenario's inputs behind one button.
# (the capacity tab's paged blocks are a screen of their own in lecture mode)
sections = ["idea_formula", "tab_compare", "tab_growth", "tab_capacity", *(["paged_title"] if lecture else []),
            "tab_live"]
# In lecture mode the capacity planner takes two screens: the planner, then how it did on real start-up logs.
CAPACITY = sections.index("tab_capacity")
screens = [(i, tr(f"memory.{s}")) for i, s in enumerate(sections)]
screens.insert(CAPACITY + 1, (CAPACITY, tr("memory.logs_title")))
CAP_SCREENS = [n for n, (section, _) in enumerate(screens) if section == CAPACITY]  # their ideas (0-based)
top, tab_cmp, tab_growth, tab_cap, *tab_paged, tab_live = lecture_tabs(
    [tr(f"memory.{s}") for s in sections], "memory", first_on_page=True, screens=screens if lecture else None)
tab_paged = tab_paged[0] if tab_paged else tab_cap
if lecture:
    with head[1]:
        left = settings_box(tr("memory.settings"))
    seeds, right = left, top
else:
    with top:
        seeds = st.container()
        left, right = st.columns([1, 2])
with seeds:
    c1, c2 = st.columns([3, 2])
    c1.button(tr("memory.seed_mha"), on_click=load_seed, args=(32,), key="mem_seed_mha")
    c2.button(tr("memory.seed_gqa"), on_click=load_seed, args=(8,), key="mem_seed_gqa")
with left:
    src = st.radio(
        tr("memory.source"),
        ["preset", "custom", "upload"],
        key="mem_src",
        horizontal=True,
        format_func={s: tr(f"memory.source_{s}") for s in ("preset", "custom", "upload")}.get,
    )
    spec: KVSpec | None = None
    try:
        if src == "preset":
            name = st.selectbox(tr("memory.preset"), list(PRESETS), key="mem_preset")
            spec = PRESETS[name]
            st.caption(tr("memory.preset_source", repo=HF_REPOS[name]))
        elif src == "custom":
            a, b = st.columns(2)
            layers = number_in_range(a, tr("memory.layers"), 1, 1000, DEFAULTS["layers"], "mem_layers")
            heads = number_in_range(b, tr("memory.heads"), 1, 1024, DEFAULTS["heads"], "mem_heads")
            kv_heads = number_in_range(a, tr("memory.kv_heads"), 1, 1024, DEFAULTS["kv_heads"], "mem_kv_heads")
            d_head = number_in_range(b, tr("memory.d_head"), 1, 4096, DEFAULTS["d_head"], "mem_d_head")
            params_b = number_in_range(st, tr("memory.params_b"), 0.001, 10_000.0, DEFAULTS["params_b"],
                                       "mem_params_b", whole=False, format="%.3f")
            spec = KVSpec(n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, d_head=d_head,
                          name=tr("memory.source_custom"), d_model=heads * d_head,
                          n_params=round(params_b * 1e9), params_source="given")
        else:
            def read(parsed: KVSpec) -> None:
                # the box shows this config's own count, or stays empty when the config cannot give one
                ss.mem_upload_params_b = None if parsed.n_params is None else round(parsed.n_params / 1e9, 3)

            spec = config_upload(st, tr("memory.upload"), "mem_upload", read)
            if spec is None:
                st.info(tr("memory.upload_hint"))
            else:
                st.caption(tr("memory.upload_loaded", name=spec.name))
                given = number_in_range(st, tr("memory.params_b"), 0.001, 10_000.0, None, "mem_upload_params_b",
                                        whole=False, format="%.3f", placeholder=tr("memory.params_placeholder"),
                                        help=tr("memory.params_help"))
                if given is None:
                    st.warning(tr("memory.params_unknown"))
                    spec = spec.with_params(None, "unknown")
                elif spec.n_params is None or abs(given * 1e9 - spec.n_params) >= 5e5:
                    spec = spec.with_params(round(given * 1e9), "given")
    except InputError as exc:
        show_error(exc)
        spec = None
    if spec is None and ss.get("mem_last_spec") is not None:
        spec = ss.mem_last_spec  # keep the last valid result on screen
        st.caption(tr("memory.kept_last", name=spec.name))
    a, b = st.columns(2)
    tokens = number_in_range(a, tr("memory.tokens"), 1, 10_000_000, DEFAULTS["tokens"], "mem_tokens", step=1024)
    batch = number_in_range(b, tr("memory.batch"), 1, 100_000, DEFAULTS["batch"], "mem_batch")
    kv_dtype_name = a.selectbox(tr("memory.kv_dtype"), list(KV_DTYPES), key="mem_kv_dtype")
    w_dtype_name = b.selectbox(tr("memory.w_dtype"), list(KV_DTYPES), key="mem_w_dtype")
    fmt = KV_DTYPES[kv_dtype_name]
    if fmt.group_size:
        st.caption(tr(f"memory.scale_note_{fmt.name}", dtype=fmt.name, group=fmt.group_size,
                      scale=fmt.scale_bytes_per_group, block=fmt.vector_bytes(fmt.group_size)))

if spec is None:
    st.stop()
ss.mem_last_spec = spec
shape = spec
try:
    fp = kv_footprint(shape, int(tokens), int(batch), kv_dtype_name)
except InputError as exc:  # a llama.cpp block format this head size is not whole blocks of (llama.cpp refuses it too)
    show_error(exc)
    st.stop()
weights = weight_bytes(spec.n_params, w_dtype_name)  # None: unknown, and nothing below pretends otherwise


with right:
    if spec.max_context is not None and tokens > spec.max_context:
        st.warning(tr("memory.past_context", tokens=f"{int(tokens):,}", max_context=f"{spec.max_context:,}",
                      name=spec.name))
    st.subheader(tr("memory.formula_title", name=spec.name, kind=shape.attention_kind))
    elem = f"{fmt.data_bytes:g}"
    if shape.is_mla:
        symbolic = r"B \cdot L \cdot n \cdot (d_c + d_R) \cdot \text{bytes}"
        numbers = rf"{batch} \cdot {shape.n_layers} \cdot {tokens}"
        numbers += rf" \cdot ({shape.kv_lora_rank} + {shape.qk_rope_head_dim})"
    elif shape.n_sliding_layers:
        # full layers keep n tokens, windowed layers the W − 1 tokens the next query can still see
        full, kept = shape.n_layers - shape.n_sliding_layers, min(int(tokens), shape.window_kept)
        symbolic = r"2 \cdot B \cdot (L_{full} \cdot n + L_{W} \cdot \min(n, W - 1))"
        symbolic += r" \cdot H_{kv} \cdot d_{head} \cdot \text{bytes}"
        numbers = rf"2 \cdot {batch} \cdot ({full} \cdot {tokens} + {shape.n_sliding_layers} \cdot {kept})"
        numbers += rf" \cdot {shape.n_kv_heads} \cdot {shape.d_head}"
    else:
        symbolic = r"2 \cdot B \cdot L \cdot n \cdot H_{kv} \cdot d_{head} \cdot \text{bytes}"
        numbers = rf"2 \cdot {batch} \cdot {shape.n_layers} \cdot {tokens}"
        numbers += rf" \cdot {shape.n_kv_heads} \cdot {shape.d_head}"
    total = f"{fp.total:,}".replace(",", "{,}")
    st.latex(
        rf"\begin{{aligned}} M_{{KV}} &= {symbolic} \\ &= {numbers} \cdot {elem}\,\text{{B}}"
        + (r" + \text{scales}" if fp.scale_bytes_per_token_per_layer else "")
        + rf" \\ &= {total}\,\text{{B}} \end{{aligned}}"
    )
    if shape.n_sliding_layers:
        st.caption(
            tr("memory.window_note", window=shape.sliding_window, sliding=shape.n_sliding_layers, layers=shape.n_layers)
        )
    if shape.is_mla:
        st.caption(tr("memory.mla_note", rank=shape.kv_lora_rank, rope=shape.qk_rope_head_dim, heads=shape.n_kv_heads))
    if fp.scale_bytes_per_token_per_layer:
        st.caption(tr("memory.scale_bytes", scale=fp.scale_bytes_per_token_per_layer))
    per_layer_factors = (
        f"({shape.kv_lora_rank} + {shape.qk_rope_head_dim}) · {fmt.data_bytes:g} B"
        if shape.is_mla
        else f"2 · {shape.n_kv_heads} · {shape.d_head} · {fmt.data_bytes:g} B"
    )
    if fp.scale_bytes_per_token_per_layer:
        per_layer_factors += f" + {fp.scale_bytes_per_token_per_layer} B ({tr('memory.scales_unit')})"
    steps = [
        ("per_token_per_layer", per_layer_factors, fp.per_token_per_layer),
        ("per_token", f"· {shape.n_layers} {tr('memory.layers_unit', n=shape.n_layers)}", fp.per_token),
        (
            "per_request",
            f"· {tokens:,} {tr('memory.tokens_unit', n=tokens)}"
            if not shape.n_sliding_layers
            else f"· Σ {fp.cached_token_layers:,} {tr('memory.token_layers_unit')}",
            fp.per_request,
        ),
        ("total", f"· {batch} {tr('memory.requests_unit', n=batch)}", fp.total),
    ]
    if not lecture:  # on a projector the table below gives the same four sizes, in bold
        cols = [c for _ in range(2) for c in st.columns(2)]  # 2×2: a metric needs ~200 px at this font
        for col, (key, _, value) in zip(cols, steps, strict=True):
            col.metric(tr(f"memory.step_{key}"), format_binary(value), help=f"{value:,} B")
    rows = [
        f"| {tr('memory.col_step')} | {tr('memory.col_factors')} | {tr('memory.col_bytes')} | "
        f"{tr('memory.col_binary')} | {tr('memory.col_decimal')} |",
        "|---|---|--:|--:|--:|",
    ]
    rows += [
        f"| {tr(f'memory.step_{key}')} | {factors} | {value:,} B | **{format_binary(value)}** | "
        f"{format_decimal(value)} |"
        for key, factors, value in steps
    ]
    st.markdown("\n".join(rows))
    if not lecture:
        st.caption(tr("memory.units_note"))
    if weights is not None:
        st.write(
            tr(
                "memory.vs_weights",
                weights=format_binary(weights),
                params=f"{spec.n_params / 1e9:.2f}",
                source=tr(f"memory.params_{spec.params_source}"),
                dtype=w_dtype_name,
                ratio=f"{fp.total / weights:.3g}",
            )
        )


with tab_cmp:
    variants, per_token, refused = {}, [], []
    for kind, variant in attention_variants(shape).items():
        try:
            per_token.append(kv_footprint(variant, 1, 1, kv_dtype_name).per_token)
            variants[kind] = variant
        except InputError:  # e.g. an MLA latent that is not whole q8_0 blocks: that format cannot store it
            refused.append(kind)
    mla = attention_variants(shape)["MLA"]
    labels = [f"{kind} (H_kv={s.n_kv_heads})" for kind, s in variants.items() if kind != "MLA"]  # MHA/GQA/MQA
    if "MLA" in variants:
        labels.append(f"MLA ({mla.kv_lora_rank}+{mla.qk_rope_head_dim})")
    chart(
        attention_comparison_figure(
            labels,
            list(variants),
            per_token,
            title=tr(
                "memory.compare_title",
                layers=shape.n_layers,
                heads=shape.n_heads,
                d_head=shape.d_head,
                dtype=kv_dtype_name,
            ),
            y_title=tr("memory.kib_per_token"),
            lecture=lecture,
        ),
        key="mem_compare_chart",
    )
    st.caption(tr("memory.compare_note", rank=mla.kv_lora_rank, rope=mla.qk_rope_head_dim))
    if refused:
        st.caption(tr("memory.compare_refused", kinds=", ".join(refused), dtype=kv_dtype_name))

with tab_growth:
    if weights is None:
        st.info(tr("memory.no_params"))
    else:
        batches = sorted({1, 8, 32, int(batch)})
        crossings = {b: tokens_to_reach(shape, weights, b, kv_dtype_name) for b in batches}
        # contexts from 256 tokens to past the last crossing (at least 128k, at most 4M)
        top = max([17] + [min(22, math.ceil(math.log2(c)) + 1) for c in crossings.values() if c])
        grid = sorted({2**k for k in range(8, top + 1)} | {int(tokens)})
        curves = [
            CacheCurve(b, grid, [kv_footprint(shape, n, b, kv_dtype_name).total for n in grid], crossings[b])
            for b in batches
        ]
        chart(
            cache_vs_weights_figure(
                curves,
                weights,
                title=tr("memory.growth_title"),
                x_title=tr("memory.tokens"),
                y_title=tr("memory.gib_axis"),
                weights_label=tr("memory.weights_label", weights=format_binary(weights)),
                batch_label=tr("memory.batch_label"),
                crossing_label=tr("memory.crossing_label"),
                lecture=lecture,
            ),
            key="mem_growth_chart",
        )
        for c in curves:
            if c.crossing_tokens:
                st.write(tr("memory.crossing_at", batch=c.batch, tokens=f"{c.crossing_tokens:,}"))
            elif cache_stops_growing(shape):
                st.write(tr("memory.crossing_never", batch=c.batch))
            else:
                st.write(tr("memory.crossing_beyond", batch=c.batch, tokens=f"{2**24:,}"))

with tab_cap:
    # In lecture mode two screens: the planner (its inputs behind one button, the answer beside it, how it was
    # computed folded) and how it did on real start-up logs.
    planner = screen_part("memory", CAP_SCREENS[0], "planner")
    logs_box = screen_part("memory", CAP_SCREENS[1], "logs")
with planner, settings_box(tr("memory.cap_settings")):  # in lecture mode behind one button
    engine = st.radio(tr("memory.engine"), ["vllm", "sglang"], key="mem_engine", horizontal=True,
                      format_func={e: tr(f"memory.engine_{e}") for e in ("vllm", "sglang")}.get)
    a, b, c = st.columns(3)
    gpu_name = a.selectbox(tr("memory.gpu"), list(HARDWARE), key="mem_gpu")
    n_gpus = number_in_range(b, tr("memory.n_gpus"), 1, 64, DEFAULTS["n_gpus"], "mem_n_gpus")
    if engine == "vllm":
        fraction = c.slider(tr("memory.fraction"), 0.1, 1.0, key="mem_frac", step=0.05)
    else:
        sgl_frac = number_in_range(c, tr("memory.sgl_frac"), 0.0, 1.0, DEFAULTS["sgl_frac"], "mem_sgl_frac",
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
                                f"mem_total_{gpu_name}", whole=False, optional=True, placeholder=tr("memory.unknown"))
    reserve_gib = None
    if engine == "vllm":
        reserve_gib = number_in_range(e, tr("memory.reserve"), 0.0, 1000.0, None,
                                      f"mem_reserve_{spec.name}_{n_gpus}", whole=False, format="%.2f",
                                      placeholder=tr("memory.reserve_estimated"), help=tr("memory.reserve_help"))
        f1, f2, f3 = st.columns([2, 2, 1])
        # the names are formatted now, in this run's language (a test harness may format options later)
        versions = {v: tr("memory.any_version") if v == "any" else v for v in VLLM_VERSIONS}
        version = f1.selectbox(tr("memory.vllm_version"), VLLM_VERSIONS, key="mem_vllm", format_func=versions.get)
        entry = f2.selectbox(tr("memory.entry"), ["any", "serve", "llm"], key="mem_entry",
                             format_func={v: tr(f"memory.entry_{v}") for v in ("any", "serve", "llm")}.get)
        eager = f3.checkbox(tr("memory.eager"), key="mem_eager")
        g1, g2 = st.columns(2)
        mbt = number_in_range(g1, tr("memory.mbt"), 0, 1_000_000, DEFAULTS["mbt"], "mem_mbt", step=1024.0,
                              help=tr("memory.zero_default"))
        seqs = number_in_range(g2, tr("memory.seqs"), 0, 100_000, DEFAULTS["seqs"], "mem_seqs", step=64.0,
                               help=tr("memory.zero_default"))
with planner:
    plan = None
    if weights is None:
        st.warning(tr("memory.cap_params_unknown"))
    elif total_gib is None:
        st.info(tr("memory.cap_memory_unknown"))
    else:
        shown = None if gpu.memory_bytes is None else round(gpu.memory_bytes / 2**30, 2)
        total = gpu.memory_bytes if total_gib == shown else round(total_gib * 2**30)  # exact unless edited
        try:
            if engine == "vllm":
                flags = ServingFlags(vllm_version=None if version == "any" else version,
                                     entry=None if entry == "any" else entry, enforce_eager=bool(eager),
                                     max_num_batched_tokens=int(mbt) or None, max_num_seqs=int(seqs) or None)
                plan = plan_capacity(spec, total, max_model_len=int(tokens),
                                     gpu_memory_utilization=fraction, tp=int(n_gpus), kv_dtype_name=kv_dtype_name,
                                     weight_dtype=w_dtype_name, flags=flags, gpu_name=gpu_name,
                                     reserve_bytes=None if reserve_gib is None else round(reserve_gib * 2**30))
            else:
                plan = plan_sglang(spec, total, context_len=int(tokens), tp=int(n_gpus),
                                   smi_mib=gpu.nvidia_smi_total_mib, mem_fraction_static=sgl_frac or None,
                                   kv_dtype_name=kv_dtype_name, weight_dtype=w_dtype_name)
        except InputError as exc:
            show_error(exc)
    if plan is not None and engine == "vllm":
        m = st.columns(5)
        m[0].metric(tr("memory.cap_usable"), format_binary(plan.requested_bytes), help=f"{plan.requested_bytes:,} B")
        m[1].metric(tr("memory.cap_weights"), format_binary(plan.weights_bytes), help=f"{plan.weights_bytes:,} B")
        m[2].metric(tr("memory.cap_budget"), format_binary(plan.kv_budget_bytes), help=f"{plan.kv_budget_bytes:,} B")
        m[3].metric(tr("memory.cap_tokens"), f"{plan.kv_cache_tokens:,}")
        m[4].metric(tr("memory.cap_requests", tokens=f"{int(tokens):,}"), f"{plan.max_requests:,}")
        if not plan.weights_fit:
            st.warning(tr("memory.cap_no_fit"))
        details = st.expander(tr("memory.cap_details")) if lecture else st.container()
        details.caption(
            tr(
                "memory.cap_steps",
                total=format_binary(plan.device_total_bytes),
                frac=fraction,
                usable=format_binary(plan.requested_bytes),
                weights=format_binary(plan.weights_bytes),
                tp=plan.tp,
                reserve=format_binary(plan.reserve_bytes),
                how=tr("memory.reserve_was_estimated" if plan.reserve_estimated else "memory.reserve_was_given"),
                budget=format_binary(plan.kv_budget_bytes),
                block=plan.block_size,
                per_block=format_binary(plan.kv_bytes_per_block),
                blocks=f"{plan.num_blocks:,}",
                concurrency=f"{plan.max_concurrency:,.2f}",
                tokens=f"{int(tokens):,}",
            )
        )
        if plan.reserve_terms is not None:
            with details:
                lo, hi = plan.kv_cache_tokens_range
                launch = plan.launch
                st.markdown(tr("memory.range", lo=f"{lo:,}", hi=f"{hi:,}", likely=f"{plan.kv_cache_tokens:,}",
                               clo=f"{plan.max_concurrency_range[0]:,.2f}", chi=f"{plan.max_concurrency_range[1]:,.2f}",
                               tokens=f"{int(tokens):,}"))
                if plan.narrowing_flag:
                    st.caption(tr("memory.narrows", flag="--" + plan.narrowing_flag.replace("_", "-"),
                                  low=launch["low_reserve_launch"]["vllm_line"],
                                  high=launch["high_reserve_launch"]["vllm_line"]))
                else:
                    st.caption(tr("memory.narrows_none"))
                terms = plan.reserve_terms
                rows = [f"| {tr('memory.term')} | {tr('memory.col_bytes')} | {tr('memory.term_how')} |",
                        "|---|--:|---|"]
                batch_how = tr("memory.how_batch", line=launch["vllm_line"], engine=launch["engine"].upper(),
                               entry=tr(f"memory.entry_{launch['entry']}"),
                               tokens=f"{launch['max_num_batched_tokens']:,}", seqs=f"{launch['max_num_seqs']:,}",
                               source=why_text(launch["batch_why"], settings.lang))
                for key, how in (("activation", tr("memory.how_activation") + " " + batch_how),
                                 ("sampler", tr(f"memory.how_sampler_{launch['sampler']}")),
                                 ("non_torch", tr("memory.how_non_torch",
                                                  source=why_text(launch["non_torch_why"], settings.lang))),
                                 ("cudagraph", tr("memory.how_cudagraph"))):
                    rows.append(f"| {tr(f'memory.term_{key}')} | {format_binary(terms[key])} | {how} |")
                rows.append(f"| **{tr('memory.term_reserve')}** | **{format_binary(plan.reserve_bytes)}** | "
                            f"{tr('memory.how_reserve')} |")
                st.markdown("\n".join(rows))
    elif plan is not None:
        m = st.columns(4)
        m[0].metric(tr("memory.sgl_free"), format_binary(plan.free_at_start_bytes),
                    help=f"{plan.free_at_start_bytes:,} B")
        m[1].metric(tr("memory.cap_weights"), format_binary(plan.weights_bytes), help=f"{plan.weights_bytes:,} B")
        m[2].metric(tr("memory.cap_tokens"), f"{plan.kv_cache_tokens:,}")
        m[3].metric(tr("memory.sgl_requests", tokens=f"{int(tokens):,}"), f"{plan.max_concurrency:,.2f}")
        lo, hi = plan.kv_cache_tokens_range
        if not plan.weights_fit:
            st.warning(tr("memory.cap_no_fit"))
        details = st.expander(tr("memory.cap_details")) if lecture else st.container()
        details.caption(tr("memory.sgl_steps", free=format_binary(plan.free_at_start_bytes),
                      after=format_binary(plan.free_after_load_bytes), frac=f"{plan.mem_fraction_static:.3f}",
                      source=tr(plan.mem_fraction_rule), pool=format_binary(plan.kv_budget_bytes),
                      per_token=f"{plan.kv_bytes_per_token:,}", tokens=f"{plan.kv_cache_tokens:,}",
                      lo=f"{lo:,}", hi=f"{hi:,}"))

with logs_box:
    # ---- the planner against real start-up logs: where its prediction could be wrong, term by term ------
    idea_title(tr("memory.logs_title"), small=True)  # in lecture mode the stepper shows it
    st.caption(tr("memory.logs_intro", n=len(LOG_CHECKS), tolerance=f"{LOG_TOLERANCE:.0%}"))
    term_names = {t: tr(f"memory.term_{t}") for t in ("weights", "activation", "non_torch", "kv_tokens")}
    st.plotly_chart(
        residual_figure(
            [Residual(f"{c.model} · {c.gpu}×{c.tp} · {c.engine} {c.version}", term_names[t.name], t.kv_effect,
                      c.flags_named)
             for c in LOG_CHECKS for t in c.terms if t.name in term_names and t.kv_effect is not None],
            list(term_names.values()), tolerance=LOG_TOLERANCE, title=tr("memory.logs_chart"),
            y_title=tr("memory.logs_axis"), named_label=tr("memory.logs_named"),
            unnamed_label=tr("memory.logs_unnamed"),
            band_label=tr("memory.logs_band", tolerance=f"{LOG_TOLERANCE:.0%}"),
            lecture=lecture,
        ),
        key="mem_residual_chart",
    )

    def cell(check, name: str) -> str:
        t = check.term(name)
        if t is None or t.logged is None:
            return f"? → {t.predicted:,.2f}" if t is not None else "—"
        fmt = "{:,.0f}" if t.unit == "tokens" else "{:,.2f}"
        mark = "*" if t.derived else ""
        return f"{fmt.format(t.logged)}{mark} → {fmt.format(t.predicted)} ({t.difference:+.1%})"

    with st.expander(tr("memory.logs_table"), expanded=not lecture):
        rows = [f"| {tr('memory.logs_log')} | {tr('memory.logs_setup')} | " + " | ".join(term_names.values()) + " |",
                "|---|---|" + "--:|" * len(term_names)]
        for c in LOG_CHECKS:
            flag = "" if c.flags_named else " †"
            setup = f"{c.engine} {c.version} · {c.gpu} × {c.tp}"
            url = c.source_url.split(" ")[0]
            name = f"[{c.model}]({url})" if url.startswith("https://") else f"{c.model} ({c.source_url})"
            rows.append(f"| {name}{flag} | {setup} | "
                        + " | ".join(cell(c, t) for t in term_names) + " |")
        st.markdown("\n".join(rows))
        st.caption(tr("memory.logs_notes"))

with tab_paged:
    if not lecture:
        st.subheader(tr("memory.paged_title"))
    a, b = st.columns([3, 1])
    lengths_text = a.text_input(tr("memory.lengths"), key="mem_lengths")
    block = number_in_range(b, tr("memory.block"), 1, 4096, DEFAULTS["block"], "mem_block")
    try:
        lengths = parse_lengths(lengths_text)
        if longer := [n for n in lengths if n > tokens]:  # the request mix follows the context set above
            st.caption(tr("memory.lengths_capped", n=len(longer), max_len=f"{int(tokens):,}"))
            lengths = [min(n, int(tokens)) for n in lengths]
        alloc = compare_allocation(lengths, int(tokens), fp.per_token, int(block))
        ss.mem_last_alloc = alloc
    except InputError as exc:
        show_error(exc)
        alloc = ss.get("mem_last_alloc")
    if alloc is not None:
        chart(
            allocation_figure(
                [tr("memory.contiguous"), tr("memory.paged", block=alloc.block_size)],
                alloc.live_bytes,
                [alloc.contiguous_bytes, alloc.paged_bytes],
                title=tr("memory.paged_chart", max_len=f"{alloc.max_len:,}"),
                live_label=tr("memory.live"),
                waste_label=tr("memory.waste"),
                y_title=tr("memory.bytes_axis"),
                lecture=lecture,
            ),
            key="mem_alloc_chart",
        )
        live = format_binary(alloc.live_bytes)
        if plan is not None:
            fit_contiguous, fit_paged = alloc.requests_that_fit(plan.kv_budget_bytes)
            st.write(
                tr(
                    "memory.fit_compare",
                    budget=format_binary(plan.kv_budget_bytes),
                    contiguous=f"{fit_contiguous:,}",
                    paged=f"{fit_paged:,}",
                    max_len=f"{alloc.max_len:,}",
                )
            )
        if not lecture:  # on a projector the bars carry the waste
            st.markdown(
                "\n".join(
                    [
                        f"| | {tr('memory.allocated')} | {tr('memory.live')} | {tr('memory.waste')} |",
                        "|---|--:|--:|--:|",
                        f"| {tr('memory.contiguous')} | {format_binary(alloc.contiguous_bytes)} | {live} | "
                        f"{format_binary(alloc.contiguous_waste_bytes)} ({alloc.contiguous_waste_fraction:.1%}) |",
                        f"| {tr('memory.paged', block=alloc.block_size)} | {format_binary(alloc.paged_bytes)} | "
                        f"{live} | "
                        f"{format_binary(alloc.paged_waste_bytes)} ({alloc.paged_waste_fraction:.1%}) |",
                    ]
                )
            )

with tab_live:
    st.write(tr("memory.live_intro"))
    # The model loads when asked for (get_backend says why when it cannot): the page's arithmetic needs none, so a
    # link to this page draws without torch.
    if st.button(tr("memory.run_here"), key="mem_run_here") and (backend := get_backend(settings)) is not None:
        from kvviz.engine.generation import Generation

        try:
            prompt = tr("memory.run_prompt")
            check_request(settings, backend, batch=1, prompt_tokens=len(backend.tokenizer.encode(prompt)),
                          max_new_tokens=4)  # the hosted caps, as on every page that runs the model
            gen = Generation(backend, max_new_tokens=4)
            gen.prefill(prompt)
            if not gen.done:  # a prefill that emitted EOS already holds the cache to measure
                gen.step()
            ss.memory_generation = gen
        except InputError as exc:
            show_error(exc)
    # The decode page's generation, and one run here.
    keys = [key for key in ("reuse_gen", "memory_generation") if ss.get(key) is not None]
    if keys:  # a generation in this session: the engine is imported already
        from kvviz.engine.generation import Generation

        keys = [key for key in keys if isinstance(ss[key], Generation)]
    shown = [(key, ss[key]) for key in keys]
    if not shown:
        st.info(tr("memory.live_none"))
    for key, gen in shown:
        if not gen.events or not gen.use_cache:
            st.info(tr("memory.live_empty"))
            continue
        event, arch = gen.events[-1], gen.backend.spec
        stored_heads = gen.backend.layer_kv(gen.cache, 0)[0].shape[1]
        dtype_name = str(gen.backend.dtype).removeprefix("torch.")
        # The engine's kv_footprint() of the model's KVSpec for the positions cached (windows, MLA latents too).
        formula = event.formula_bytes
        st.markdown(
            f"**{tr('memory.live_from_' + key)}** — "
            + tr(
                "memory.live_shape",
                name=arch.name,
                batch=gen.batch_size,
                layers=arch.n_layers,
                n=event.cache_lengths[0],
                kv_heads=arch.n_kv_heads,
                d_head=arch.d_head,
                dtype=dtype_name,
                device=str(gen.backend.device),
            )
        )
        m = st.columns(4)
        m[0].metric(tr("memory.live_measured"), f"{event.live_bytes:,} B", help=format_binary(event.live_bytes))
        m[1].metric(tr("memory.live_formula"), f"{formula:,} B", help=format_binary(formula))
        m[2].metric(
            tr("memory.live_allocated"), f"{event.allocated_bytes:,} B", help=format_binary(event.allocated_bytes)
        )
        m[3].metric(
            tr("memory.live_device"),
            f"{event.device_memory_bytes:,} B"
            if event.device_memory_bytes is not None
            else tr("memory.live_no_device"),
        )
        if event.live_bytes == formula:
            st.success(tr("memory.live_equal"))
        elif not arch.is_mla and stored_heads != arch.n_kv_heads and event.live_bytes * arch.n_kv_heads == (
                formula * stored_heads):
            # transformers' Falcon (new_decoder_architecture) caches K/V already repeated for every query head
            st.info(tr("memory.live_expanded", stored=stored_heads, needed=arch.n_kv_heads,
                       factor=f"{stored_heads / arch.n_kv_heads:g}"))
        else:
            st.error(tr("memory.live_differ", diff=f"{event.live_bytes - formula:,}"))

# ---- the scenario back into the URL, so the link reproduces it ---------------------------------------------
# a number box's last valid value, never one it refused
saved = {k[4:]: ss.get(f"_valid_{k}", ss[k]) for k in (f"mem_{name}" for name in DEFAULTS) if k in ss}
ss.mem_saved = saved
for key, value in scenario_query(saved).items():
    if st.query_params.get(key) != value:
        st.query_params[key] = value
for key in set(st.query_params) - set(scenario_query(saved)) - {"lang", "lecture"}:
    del st.query_params[key]
preload_engine()  # the page is drawn: torch and the engine load in the background for Run here
