"""Latency & Capacity: sweeps on the real engine (prompt length, cache, batch, dtype) and roofline bounds."""
from collections.abc import Callable
from dataclasses import replace

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from kvviz.app import ui
from kvviz.charts import latency as charts
from kvviz.engine import metrics, sweeps
from kvviz.engine.backends.base import Backend
from kvviz.engine.device import DTYPES
from kvviz.errors import InputError
from kvviz.kv.capacity import plan_capacity
from kvviz.kv.formula import KV_DTYPES
from kvviz.kv.hardware import HARDWARE, Hardware
from kvviz.kv.presets import PRESETS
from kvviz.kv.roofline import Roofline
from kvviz.units import format_binary

TICK_S = 0.3  # the fragment's period while a sweep runs
BUDGET_S = 0.25  # measuring per tick before the chart redraws

settings = ui.page_setup("latency.title")
tr = ui.tr
st.title(tr("latency.title"))
st.write(tr("latency.intro"))
backend = ui.get_backend(settings)
if backend is None:
    st.stop()
ui.model_caption(backend)
max_len = backend.spec.max_context
ss = st.session_state


def labels(prefix: str, *names: str) -> dict[str, str]:
    return {n: tr(f"latency.{prefix}_{n}") for n in names}


def sweep_panel(kind: str, make: Callable[[], sweeps.Sweep], draw: Callable[[list[dict]], go.Figure],
                describe: Callable[[list[dict]], str]) -> None:
    """Start/Cancel, and a fragment that measures a little per tick and redraws progress, chart and CSV."""
    key = f"lc_run_{kind}"

    def start() -> None:
        try:
            ss[key], ss[key + "_error"] = sweeps.SweepRun(make()), None
        except InputError as exc:
            ss[key + "_error"] = exc

    def cancel() -> None:
        if ss.get(key) is not None and not ss[key].finished:
            ss[key].cancel()

    run: sweeps.SweepRun | None = ss.get(key)
    running = run is not None and not run.finished
    b1, b2, _ = st.columns([1, 1, 4])
    b1.button(tr("latency.start"), on_click=start, disabled=running, type="primary", key=f"lc_start_{kind}")
    b2.button(tr("latency.cancel"), on_click=cancel, disabled=not running, key=f"lc_cancel_{kind}")
    if ss.get(key + "_error"):
        ui.show_error(ss[key + "_error"])

    def live() -> None:
        run: sweeps.SweepRun | None = ss.get(key)
        if run is None:
            st.info(tr("latency.idle"))
            return
        if not run.finished:
            run.advance(BUDGET_S)
            if run.finished:
                st.rerun()  # the whole page: the fragment stops ticking and the buttons flip
        done, total = len(run.rows), run.sweep.total
        state = "cancelled" if run.cancelled else "done" if run.finished else "running"
        st.progress(run.progress, text=tr(f"latency.progress_{state}", done=done, total=total))
        if run.error:
            ui.show_error(run.error)
        if not run.rows:
            return
        st.plotly_chart(draw(run.rows), key=f"lc_chart_{kind}", width="stretch")
        st.markdown(describe(run.rows))
        table = pd.DataFrame(run.rows, columns=sweeps.COLUMNS[kind])
        with st.expander(tr("latency.table")):
            st.dataframe(table, hide_index=True)
        st.download_button(tr("latency.csv"), table.to_csv(index=False), file_name=f"kvviz_{kind}_sweep.csv",
                           mime="text/csv", on_click="ignore", key=f"lc_csv_{kind}")

    st.fragment(live, run_every=TICK_S if running else None)()


def sizes(widget_key: str, limit: int) -> list[int]:
    values = sweeps.parse_sizes(ss[widget_key], max_value=limit)
    ui.check_sweep(settings, len(values))  # a hosted demo caps the points per sweep
    return values


def fmt_ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f} ms"


def fmt_duration(seconds: float) -> str:
    """A bound in the unit that reads best: µs, ms, s, or hours for absurd inputs (never '26668357.15 ms')."""
    for limit, scale, unit in ((1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (3600.0, 1.0, "s")):
        if seconds < limit:
            return f"{seconds * scale:,.3g} {unit}"
    return f"{seconds / 3600:,.3g} h"


def fmt_slope(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


tab_prompt, tab_cache, tab_batch, tab_dtype, tab_roof = st.tabs(
    [tr(f"latency.tab_{t}") for t in ("prompt", "cache", "batch", "dtype", "roofline")])

# ---- prompt length ---------------------------------------------------------------------------------
with tab_prompt:
    st.write(tr("latency.prompt_intro"))
    c1, c2, c3 = st.columns([3, 1, 1])
    c2.number_input(tr("latency.new_tokens"), 2, 64, 8, key="lc_p_new")
    c1.text_input(tr("latency.prompt_lengths", max_len=max_len),
                  ", ".join(map(str, sweeps.default_prompt_lengths(max_len, 8))), key=f"lc_p_lengths_{max_len}")
    c3.number_input(tr("latency.repeats"), 1, 9, 1, key="lc_p_repeats")

    def make_prompt() -> sweeps.Sweep:
        return sweeps.prompt_length_sweep(backend, sizes(f"lc_p_lengths_{max_len}", max_len - 1),
                                          n_new=int(ss.lc_p_new), repeats=int(ss.lc_p_repeats))

    def draw_prompt(rows: list[dict]) -> go.Figure:
        x = [r["prompt_tokens"] for r in rows]
        fits = {k: metrics.loglog_slope(x, [r[k] for r in rows]) for k in ("ttft_s", "tpot_s")}
        return charts.prompt_length_chart(rows, fits, labels("pchart", "title", "x", "y", "ttft_s", "tpot_s", "fit"),
                                          lecture=settings.lecture)

    def describe_prompt(rows: list[dict]) -> str:
        s = sweeps.summary("prompt-length", rows)
        per_token = s["ttft_s_per_prompt_token"]
        return tr("latency.prompt_result", ttft_slope=fmt_slope(s["ttft_loglog_slope"]),
                  tpot_slope=fmt_slope(s["tpot_loglog_slope"]),
                  per_token="—" if per_token is None else f"{per_token * 1e6:.1f} µs",
                  fixed=fmt_ms(s["ttft_fixed_s"]))

    sweep_panel("prompt-length", make_prompt, draw_prompt, describe_prompt)

# ---- cache vs no cache -------------------------------------------------------------------------------
with tab_cache:
    st.write(tr("latency.cache_intro"))
    c1, c2 = st.columns([3, 1])
    c2.number_input(tr("latency.cache_repeats"), 1, 9, 3, key="lc_c_repeats")
    c1.text_input(tr("latency.contexts", max_len=max_len), ", ".join(map(str, sweeps.default_contexts(max_len, 3))),
                  key=f"lc_c_contexts_{max_len}")

    def make_cache() -> sweeps.Sweep:
        repeats = int(ss.lc_c_repeats)
        return sweeps.cache_sweep(backend, sizes(f"lc_c_contexts_{max_len}", max_len - repeats), repeats=repeats)

    def cache_fits(rows: list[dict]) -> dict:
        return {m: metrics.loglog_slope([r["context_tokens"] for r in rows if r["mode"] == m],
                                        [r["seconds"] for r in rows if r["mode"] == m]) for m in ("cache", "no_cache")}

    def draw_cache(rows: list[dict]) -> go.Figure:
        names = labels("cchart", "title", "x", "y", "cache", "no_cache", "fit")
        return charts.cache_chart(rows, cache_fits(rows), names,
                                  lecture=settings.lecture)

    def describe_cache(rows: list[dict]) -> str:
        s = sweeps.summary("cache", rows)
        with_cache, without = s["cache"]["total_s"], s["no_cache"]["total_s"]
        text = tr("latency.cache_result", cache_slope=fmt_slope(s["cache"]["loglog_slope"]),
                  no_cache_slope=fmt_slope(s["no_cache"]["loglog_slope"]))
        if with_cache and without:
            contexts = [r["context_tokens"] for r in rows]
            text += "\n\n" + tr("latency.cache_total", first=min(contexts), last=max(contexts),
                                cache=f"{with_cache:.2f} s", no_cache=f"{without:.2f} s",
                                ratio=f"{without / with_cache:.1f}")
        return text

    sweep_panel("cache", make_cache, draw_cache, describe_cache)

# ---- batch -----------------------------------------------------------------------------------------------
with tab_batch:
    st.write(tr("latency.batch_intro"))
    c1, c2, c3 = st.columns([3, 1, 1])
    c1.text_input(tr("latency.batches"), "1, 2, 4, 8, 16", key="lc_b_batches")
    c2.number_input(tr("latency.prompt_tokens"), 1, max_len - 2, min(64, max_len // 4), key=f"lc_b_prompt_{max_len}")
    c3.number_input(tr("latency.new_tokens"), 2, 64, 16, key="lc_b_new")

    def make_batch() -> sweeps.Sweep:
        batches, n_prompt, n_new = sizes("lc_b_batches", 256), int(ss[f"lc_b_prompt_{max_len}"]), int(ss.lc_b_new)
        ui.check_request(settings, backend, batch=max(batches), prompt_tokens=n_prompt, max_new_tokens=n_new)
        return sweeps.batch_sweep(backend, batches, n_prompt=n_prompt, n_new=n_new)

    def draw_batch(rows: list[dict]) -> go.Figure:
        return charts.batch_chart(rows, labels("bchart", "title", "x", "tpot", "tokens_per_s", "kv"),
                                  lecture=settings.lecture)

    def describe_batch(rows: list[dict]) -> str:
        first, last = rows[0], rows[-1]
        return tr("latency.batch_result", b0=first["batch"], b1=last["batch"],
                  tpot_ratio=f"{last['tpot_s'] / first['tpot_s']:.2f}",
                  tps_ratio=f"{last['tokens_per_s'] / first['tokens_per_s']:.2f}",
                  kv_ratio=f"{last['kv_bytes'] / first['kv_bytes']:.0f}",
                  kv=format_binary(last["kv_bytes"]), formula=format_binary(last["kv_formula_bytes"]))

    sweep_panel("batch", make_batch, draw_batch, describe_batch)

# ---- dtype ---------------------------------------------------------------------------------------------
with tab_dtype:
    st.write(tr("latency.dtype_intro"))
    c1, c2, c3 = st.columns([3, 1, 1])
    c1.multiselect(tr("latency.dtypes"), list(DTYPES), list(DTYPES), key="lc_d_dtypes")
    c2.number_input(tr("latency.prompt_tokens"), 1, max_len - 2, min(64, max_len // 4), key=f"lc_d_prompt_{max_len}")
    c3.number_input(tr("latency.new_tokens"), 2, 64, 16, key="lc_d_new")

    def load_dtype(dtype: str) -> Backend:
        loaded = ui.get_backend(replace(settings, dtype=dtype))
        if loaded is None:  # get_backend has shown why
            raise RuntimeError(tr("latency.dtype_unavailable", dtype=dtype))
        return loaded

    def make_dtype() -> sweeps.Sweep:
        if not ss.lc_d_dtypes:
            raise InputError("latency.no_dtypes")
        return sweeps.dtype_sweep(load_dtype, ss.lc_d_dtypes, n_prompt=int(ss[f"lc_d_prompt_{max_len}"]),
                                  n_new=int(ss.lc_d_new))

    def draw_dtype(rows: list[dict]) -> go.Figure:
        return charts.dtype_chart(rows, labels("dchart", "title", "y", "ttft_s", "tpot_s"), lecture=settings.lecture)

    def describe_dtype(rows: list[dict]) -> str:
        lines = [tr("latency.dtype_row", dtype=r["dtype"], ttft=fmt_ms(r["ttft_s"]), tpot=fmt_ms(r["tpot_s"]),
                    weights=format_binary(r["weight_bytes"]), kv=format_binary(r["kv_bytes"]))
                 if r["supported"] else tr("latency.dtype_unsupported", dtype=r["dtype"], error=r["error"])
                 for r in rows]
        return "\n".join(f"- {line}" for line in lines) + "\n\n" + tr("latency.dtype_note")

    sweep_panel("dtype", make_dtype, draw_dtype, describe_dtype)

# ---- roofline ----------------------------------------------------------------------------------------------
with tab_roof:
    st.write(tr("latency.roof_intro"))
    # The Memory page's presets (experts excepted: a token reads only its experts) and the model in use.
    models = {**{n: s for n, s in PRESETS.items() if not s.is_moe}, backend.spec.name: backend.spec}
    c1, c2 = st.columns(2)
    hw_name = c1.selectbox(tr("latency.hardware"), list(HARDWARE), key="lc_r_hw")
    names = list(models)
    model_name = c2.selectbox(tr("latency.roof_model"), names, index=names.index("Llama-3.1-8B"), key="lc_r_model")
    preset = HARDWARE[hw_name]
    st.caption(tr("latency.hw_sources", memory=preset.memory_source or tr("latency.unknown"),
                  bandwidth=preset.bandwidth_source, flops=preset.flops_source))
    h1, h2, h3 = st.columns(3)
    # Keyed by preset: choosing another accelerator reloads its numbers, which stay editable.
    memory_gib = h1.number_input(tr("latency.memory_gib"), 0.1, 100_000.0,
                                 None if preset.memory_bytes is None else round(preset.memory_bytes / 2**30, 2),
                                 key=f"lc_r_mem_{hw_name}", placeholder=tr("latency.unknown"))
    bandwidth_tb = h2.number_input(tr("latency.bandwidth_tb"), 0.001, 100.0, preset.bandwidth_bytes_per_s / 1e12,
                                   format="%.3f", key=f"lc_r_bw_{hw_name}")
    peak_tf = h3.number_input(tr("latency.peak_tflops"), 0.01, 100_000.0, preset.peak_flops / 1e12,
                              key=f"lc_r_peak_{hw_name}")
    hw = Hardware(hw_name, bandwidth_tb * 1e12, peak_tf * 1e12,
                  None if memory_gib is None else round(memory_gib * 2**30))
    d1, d2, d3, d4 = st.columns(4)
    weight_dtype = d1.selectbox(tr("latency.weight_dtype"), ["bfloat16", "fp8", "int4", "float32"], key="lc_r_wdtype")
    kv_dtype = d2.selectbox(tr("latency.kv_dtype"), list(KV_DTYPES), index=1, key="lc_r_kvdtype")
    n_context = int(d3.number_input(tr("latency.context"), 1, 10_000_000, 4096, key="lc_r_context"))
    batch = int(d4.number_input(tr("latency.batch"), 1, 100_000, 1, key="lc_r_batch"))
    try:
        roof = Roofline(models[model_name], hw, weight_dtype, kv_dtype)
    except InputError as exc:
        ui.show_error(exc)
        st.stop()

    decode = roof.decode_bound(batch=batch, n_context=n_context)
    prefill = roof.prefill_bound(n_prompt=n_context)
    b_star = roof.compute_bound_batch(n_context=n_context)
    crossing = roof.kv_equals_weights_tokens(batch=batch)
    weights, kv_req = roof.weight_bytes, roof.kv_bytes(n_context)
    # How many requests fit: the capacity planner, the same function (and answer) as the Memory page.
    plan = None if hw.memory_bytes is None else plan_capacity(
        roof.spec, hw.memory_bytes, max_model_len=n_context, kv_dtype_name=kv_dtype, weight_dtype=weight_dtype)

    st.markdown(tr("latency.roof_decode", weights=format_binary(weights), batch=batch, kv=format_binary(kv_req),
                   bw=f"{hw.bandwidth_bytes_per_s / 1e12:.3f}", tpot=fmt_duration(decode.memory_s),
                   compute=fmt_duration(decode.compute_s), bound=fmt_duration(decode.seconds),
                   limit=tr(f"latency.limit_{decode.limited_by}")))
    m = st.columns(4)
    m[0].metric(tr("latency.m_tpot"), fmt_duration(decode.seconds))
    m[0].caption(tr(f"latency.limit_{decode.limited_by}"))
    m[1].metric(tr("latency.m_prefill", n=n_context), fmt_duration(prefill.seconds))
    m[1].caption(tr(f"latency.limit_{prefill.limited_by}"))
    m[2].metric(tr("latency.m_compute_batch"), "∞" if b_star is None else f"{b_star:,.3g}")
    ridge = tr("latency.ridge", ridge=f"{hw.ridge_flops_per_byte:,.3g}")
    m[2].caption(tr("latency.never_compute") if b_star is None else ridge)
    weights_only = roof.compute_bound_batch(n_context=0)  # the textbook figure: no cache reads
    if weights_only is not None:
        m[2].caption(tr("latency.weights_only_batch", batch=f"{weights_only:,.3g}"))
    if plan is None:
        m[3].metric(tr("latency.m_fits"), tr("latency.unknown"))
        m[3].caption(tr("latency.memory_unknown"))
    else:
        m[3].metric(tr("latency.m_fits"), f"{plan.max_requests:,}" if plan.weights_fit else "—")
        m[3].caption(tr("latency.fits_how", util=plan.gpu_memory_utilization, reserve=format_binary(plan.reserve_bytes))
                     if plan.weights_fit else tr("latency.weights_no_fit", weights=format_binary(weights)))
    m[3].caption(tr("latency.crossing", tokens=f"{crossing:,}", batch=batch) if crossing is not None
                 else tr("latency.crossing_never", batch=batch))
    fits = plan.max_requests if plan is not None else 0

    top = max(1024, 2 * fits, int(2 * (b_star or 0)))
    batches = sorted({int(round(b)) for b in [2**i for i in range(0, top.bit_length() + 1)] + [batch]})
    curve = roof.decode_curve(batches=batches, n_context=n_context)
    st.plotly_chart(charts.roofline_chart(curve, labels("rchart", "title", "x", "y", "y2", "memory", "compute", "bound",
                                                         "tokens_per_s", "compute_batch", "max_batch", "kv_weights"),
                                          compute_batch=b_star, max_batch=fits,
                                          kv_weights_batch=weights / kv_req, lecture=settings.lecture),
                    key="lc_roofline", width="stretch")
    tokens = sorted({2**i for i in range(7, 21)} | {n_context})
    kv_labels = labels("kchart", "x", "y", "kv", "weights", "crossing")
    kv_labels["title"] = tr("latency.kchart_title", batch=batch)
    st.plotly_chart(charts.kv_vs_weights_chart(tokens, [roof.kv_bytes(n, batch) for n in tokens],
                                               weights, crossing, kv_labels, lecture=settings.lecture),
                    key="lc_kv_weights", width="stretch")
    st.caption(tr("latency.roof_note"))
