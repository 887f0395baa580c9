"""Latency & Capacity: sweeps on the real engine (prompt length, cache, batch, dtype) and roofline bounds."""
from collections.abc import Callable
from dataclasses import replace

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import intro_box
from kvviz.app.models import check_request, check_sweep, get_backend, model_caption
from kvviz.app.shell import page_setup
from kvviz.app.timing import noise_indicator
from kvviz.app.widgets import number_in_range
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
BUDGET_S = 1.0  # measuring per tick (in quiet) before the progress bar redraws

settings = page_setup("latency.title")
st.title(tr("latency.title"))
with intro_box():
    st.write(tr("latency.intro"))
backend = get_backend(settings)
if backend is None:
    st.stop()
model_caption(backend.spec)
noise_indicator(backend, "lc")
max_len = backend.spec.max_context
ss = st.session_state


def labels(prefix: str, *names: str) -> dict[str, str]:
    return {n: tr(f"latency.{prefix}_{n}") for n in names}


def sweep_panel(kind: str, make: Callable[[], sweeps.Sweep], draw: Callable[[list[dict]], go.Figure],
                describe: Callable[[list[dict]], str]) -> None:
    """Start/Cancel, and a fragment that measures a little per tick (in quiet), then draws progress;
    the chart, the verdict and the CSV are drawn once the sweep is done or cancelled."""
    key = f"lc_run_{kind}"

    def start() -> None:
        ss[key + "_start"] = True  # built below from this rerun's checked values (a callback sees the last run's)

    if ss.pop(key + "_start", False):
        try:
            ss[key], ss[key + "_error"] = sweeps.SweepRun(make()), None
            ss[key + "_skip"] = True  # the Start click redraws the page: measure from the fragment's first tick
        except InputError as exc:
            ss[key + "_error"] = exc

    def cancel() -> None:
        if ss.get(key) is not None and not ss[key].finished:
            ss[key].cancel()  # a flag: the thread measuring stops after its setting, keeping every row done

    run: sweeps.SweepRun | None = ss.get(key)
    running = run is not None and not run.finished
    b1, b2, _ = st.columns([1, 1, 4])
    b1.button(tr("latency.start"), on_click=start, disabled=running, type="primary", key=f"lc_start_{kind}")
    b2.button(tr("latency.cancel"), on_click=cancel, disabled=not running, key=f"lc_cancel_{kind}")
    if ss.get(key + "_error"):
        show_error(ss[key + "_error"])

    def live() -> None:
        run: sweeps.SweepRun | None = ss.get(key)
        if run is None:
            st.info(tr("latency.idle"))
            return
        if not run.finished:
            if not ss.pop(key + "_skip", False):
                run.advance(BUDGET_S)  # model work first, in quiet; drawing comes after
            if run.finished:
                st.rerun()  # the whole page: the fragment stops ticking and the buttons flip
        done, total = len(run.rows), run.sweep.total
        state = "cancelled" if run.cancelled else "done" if run.finished else "running"
        st.progress(run.progress, text=tr(f"latency.progress_{state}", done=done, total=total))
        if run.error:
            show_error(run.error)
        if not run.rows or not run.finished:
            return  # while measuring, only the progress bar: a chart redrawn in the browser competes with the model
        st.plotly_chart(draw(run.rows), key=f"lc_chart_{kind}", width="stretch")
        st.markdown(describe(run.rows))
        table = pd.DataFrame(run.rows, columns=sweeps.COLUMNS[kind])
        with st.expander(tr("latency.table")):
            st.dataframe(table, hide_index=True)
        runs = pd.DataFrame(sweeps.run_records(run.rows))  # every whole run, not only the medians
        st.download_button(tr("latency.csv"), runs.to_csv(index=False), file_name=f"kvviz_{kind}_sweep.csv",
                           mime="text/csv", on_click="ignore", key=f"lc_csv_{kind}")

    st.fragment(live, run_every=TICK_S if running else None)()


def sizes(widget_key: str, limit: int) -> list[int]:
    values = sweeps.parse_sizes(ss[widget_key], max_value=limit)
    check_sweep(settings, len(values))  # a hosted demo caps the points per sweep
    return values


def fmt_ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f} ms"


def fmt_slope(value: float | None, se: float | None = None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if se is None else f"{value:.2f} ± {se:.2f}"


def fmt_duration(seconds: float | None) -> str:
    """Milliseconds up to a second, then s, min, h, days: a bound of hours never prints as '26668357.15 ms'."""
    if seconds is None:
        return "—"
    for unit, size in (("days", 86_400), ("h", 3_600), ("min", 60), ("s", 1)):
        if seconds >= size:
            return f"{seconds / size:,.2f} {unit}" if unit != "days" else f"{seconds / size:,.1f} {tr('latency.days')}"
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.2f} µs"


def fmt_count(value: float) -> str:
    """A count that may be fractional: grouped digits, and significant digits below 10 (never a bare '0')."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


tab_prompt, tab_cache, tab_batch, tab_dtype, tab_roof = st.tabs(
    [tr(f"latency.tab_{t}") for t in ("prompt", "cache", "batch", "dtype", "roofline")])

# ---- prompt length ---------------------------------------------------------------------------------
with tab_prompt:
    st.write(tr("latency.prompt_intro"))
    c1, c2, c3 = st.columns([3, 1, 1])
    p_new = number_in_range(c2, tr("latency.new_tokens"), 2, 64, 8, "lc_p_new")
    c1.text_input(tr("latency.prompt_lengths", max_len=max_len),
                  ", ".join(map(str, sweeps.default_prompt_lengths(max_len, 8))), key=f"lc_p_lengths_{max_len}")
    p_repeats = number_in_range(c3, tr("latency.repeats"), 1, 20, sweeps.DEFAULT_REPEATS["prompt-length"],
                                  "lc_p_repeats")

    def make_prompt() -> sweeps.Sweep:
        return sweeps.prompt_length_sweep(backend, sizes(f"lc_p_lengths_{max_len}", max_len - 1),
                                          n_new=p_new, repeats=p_repeats)

    def draw_prompt(rows: list[dict]) -> go.Figure:
        fits = {k: metrics.loglog_slope(*sweeps.runs_xy(rows, "prompt_tokens", k)) for k in ("ttft_s", "tpot_s")}
        return charts.prompt_length_chart(rows, fits, labels("pchart", "title", "x", "y", "ttft_s", "tpot_s", "fit"),
                                          lecture=settings.lecture)

    def describe_prompt(rows: list[dict]) -> str:
        s = sweeps.summary("prompt-length", rows)
        text = tr("latency.prompt_slopes", ttft_slope=fmt_slope(s["ttft_loglog_slope"], s["ttft_loglog_slope_se"]),
                  tpot_slope=fmt_slope(s["tpot_loglog_slope"], s["tpot_loglog_slope_se"]), runs=s["n_runs"])
        per_token, se = s["ttft_s_per_prompt_token"], s["ttft_s_per_prompt_token_se"]
        verdict = s["ttft_verdict"]
        if verdict == "rising":  # only a cost the data supports is printed as one
            text += "\n\n" + tr("latency.prompt_rising", fixed=fmt_ms(s["ttft_fixed_s"]),
                                  per_token=f"{per_token * 1e6:.1f} µs", se=f"{se * 1e6:.1f} µs")
        else:
            text += "\n\n" + tr(f"latency.prompt_{verdict}", runs=s["n_runs"])
        return text

    sweep_panel("prompt-length", make_prompt, draw_prompt, describe_prompt)

# ---- cache vs no cache -------------------------------------------------------------------------------
with tab_cache:
    st.write(tr("latency.cache_intro"))
    c1, c2 = st.columns([3, 1])
    c_repeats = number_in_range(c2, tr("latency.cache_repeats"), 1, 20, sweeps.DEFAULT_REPEATS["cache"],
                                  "lc_c_repeats")
    c1.text_input(tr("latency.contexts", max_len=max_len),
                  ", ".join(map(str, sweeps.default_contexts(max_len, sweeps.DEFAULT_REPEATS["cache"]))),
                  key=f"lc_c_contexts_{max_len}")

    def make_cache() -> sweeps.Sweep:
        return sweeps.cache_sweep(backend, sizes(f"lc_c_contexts_{max_len}", max_len - c_repeats), repeats=c_repeats)

    def cache_fits(rows: list[dict]) -> dict:
        return {m: metrics.loglog_slope(*sweeps.runs_xy([r for r in rows if r["mode"] == m], "context_tokens",
                                                        "seconds")) for m in ("cache", "no_cache")}

    def draw_cache(rows: list[dict]) -> go.Figure:
        names = labels("cchart", "title", "x", "y", "cache", "no_cache", "fit")
        return charts.cache_chart(rows, cache_fits(rows), names,
                                  lecture=settings.lecture)

    def describe_cache(rows: list[dict]) -> str:
        s = sweeps.summary("cache", rows)
        with_cache, without = s["cache"]["total_s"], s["no_cache"]["total_s"]
        text = tr("latency.cache_result",
                  cache_slope=fmt_slope(s["cache"]["loglog_slope"], s["cache"]["loglog_slope_se"]),
                  no_cache_slope=fmt_slope(s["no_cache"]["loglog_slope"], s["no_cache"]["loglog_slope_se"]))
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
    b_prompt = number_in_range(c2, tr("latency.prompt_tokens"), 1, max_len - 2, min(64, max_len // 4),
                                 f"lc_b_prompt_{max_len}")
    b_new = number_in_range(c3, tr("latency.new_tokens"), 2, 64, 16, "lc_b_new")

    def make_batch() -> sweeps.Sweep:
        batches, n_prompt, n_new = sizes("lc_b_batches", 256), b_prompt, b_new
        check_request(settings, backend, batch=max(batches), prompt_tokens=n_prompt, max_new_tokens=n_new)
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
    d_prompt = number_in_range(c2, tr("latency.prompt_tokens"), 1, max_len - 2, min(64, max_len // 4),
                                 f"lc_d_prompt_{max_len}")
    d_new = number_in_range(c3, tr("latency.new_tokens"), 2, 64, 16, "lc_d_new")

    def load_dtype(dtype: str) -> Backend:
        loaded = get_backend(replace(settings, dtype=dtype))
        if loaded is None:  # get_backend has shown why
            raise RuntimeError(tr("latency.dtype_unavailable", dtype=dtype))
        return loaded

    def make_dtype() -> sweeps.Sweep:
        if not ss.lc_d_dtypes:
            raise InputError("latency.no_dtypes")
        return sweeps.dtype_sweep(load_dtype, ss.lc_d_dtypes, n_prompt=d_prompt, n_new=d_new)

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
    memory_gib = number_in_range(h1, tr("latency.memory_gib"), 0.1, 100_000.0,
                                 None if preset.memory_bytes is None else round(preset.memory_bytes / 2**30, 2),
                                 f"lc_r_mem_{hw_name}", whole=False, placeholder=tr("latency.unknown"))
    bandwidth_tb = number_in_range(h2, tr("latency.bandwidth_tb"), 0.001, 100.0, preset.bandwidth_bytes_per_s / 1e12,
                                     f"lc_r_bw_{hw_name}", whole=False, format="%.3f")
    peak_tf = number_in_range(h3, tr("latency.peak_tflops"), 0.01, 100_000.0, preset.peak_flops / 1e12,
                                f"lc_r_peak_{hw_name}", whole=False)
    exact = preset.memory_bytes is not None and memory_gib == round(preset.memory_bytes / 2**30, 2)
    hw = Hardware(hw_name, bandwidth_tb * 1e12, peak_tf * 1e12,
                  preset.memory_bytes if exact else None if memory_gib is None else round(memory_gib * 2**30))
    d1, d2, d3, d4 = st.columns(4)
    weight_dtype = d1.selectbox(tr("latency.weight_dtype"), ["bfloat16", "fp8", "int4", "float32"], key="lc_r_wdtype")
    kv_dtype = d2.selectbox(tr("latency.kv_dtype"), list(KV_DTYPES), index=1, key="lc_r_kvdtype")
    n_context = number_in_range(d3, tr("latency.context"), 1, 10_000_000, 4096, "lc_r_context")
    batch = number_in_range(d4, tr("latency.batch"), 1, 100_000, 1, "lc_r_batch")
    try:
        roof = Roofline(models[model_name], hw, weight_dtype, kv_dtype)
    except InputError as exc:
        show_error(exc)
        st.stop()

    decode = roof.decode_bound(batch=batch, n_context=n_context)
    prefill = roof.prefill_bound(n_prompt=n_context)
    b_star = roof.compute_bound_batch(n_context=n_context)
    crossing = roof.kv_equals_weights_tokens(batch=batch)
    weights, kv_req = roof.weight_bytes, roof.kv_bytes(n_context)
    # How many requests fit: the capacity planner, the same function (and answer) as the Memory page.
    plan_error = None
    try:
        plan = None if hw.memory_bytes is None else plan_capacity(
            roof.spec, hw.memory_bytes, max_model_len=n_context, kv_dtype_name=kv_dtype, weight_dtype=weight_dtype,
            gpu_name=hw.name)
    except InputError as exc:  # a context past the model's, or a reserve kvviz cannot predict (MoE, MLA)
        plan, plan_error = None, exc

    st.markdown(tr("latency.roof_decode", weights=format_binary(weights), batch=batch, kv=format_binary(kv_req),
                   bw=f"{hw.bandwidth_bytes_per_s / 1e12:.3f}", tpot=fmt_duration(decode.memory_s),
                   compute=fmt_duration(decode.compute_s), bound=fmt_duration(decode.seconds),
                   limit=tr(f"latency.limit_{decode.limited_by}")))
    m = st.columns(4)
    m[0].metric(tr("latency.m_tpot"), fmt_duration(decode.seconds))
    m[0].caption(tr(f"latency.limit_{decode.limited_by}"))
    m[1].metric(tr("latency.m_prefill"), fmt_duration(prefill.seconds))
    m[1].caption(tr("latency.prefill_of", n=f"{n_context:,}", limit=tr(f"latency.limit_{prefill.limited_by}")))
    # Below one request the batch is not a count: the ridge is so low that decode is compute-bound from B = 1.
    m[2].metric(tr("latency.m_compute_batch"), "∞" if b_star is None else "1" if b_star <= 1 else fmt_count(b_star))
    ridge = tr("latency.ridge", ridge=fmt_count(hw.ridge_flops_per_byte))
    m[2].caption(tr("latency.never_compute") if b_star is None else
                 tr("latency.compute_from_one", batch=f"{b_star:.2g}") + " " + ridge if b_star <= 1 else ridge)
    weights_only = roof.compute_bound_batch(n_context=0)  # the textbook figure: no cache reads
    if weights_only is not None:
        m[2].caption(tr("latency.weights_only_batch", batch=fmt_count(weights_only)))
    if plan is None:
        m[3].metric(tr("latency.m_fits"), tr("latency.unknown"))
        m[3].caption(tr("latency.memory_unknown") if plan_error is None else plan_error.message(settings.lang))
    else:
        m[3].metric(tr("latency.m_fits"), f"{plan.max_requests:,}")
        if not plan.weights_fit:
            m[3].error(tr("latency.weights_no_fit", weights=format_binary(weights)))
        elif plan.max_requests == 0:
            m[3].warning(tr("latency.request_does_not_fit", kv=format_binary(kv_req),
                            free=format_binary(plan.kv_budget_bytes)))
        else:
            m[3].caption(tr("latency.fits_how", util=plan.gpu_memory_utilization,
                            reserve=format_binary(plan.reserve_bytes)))
    m[3].caption(tr("latency.crossing", tokens=fmt_count(crossing), batch=batch) if crossing is not None
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
