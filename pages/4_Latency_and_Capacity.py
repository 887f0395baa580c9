"""Latency & Capacity: sweeps on the real engine (prompt length, cache, batch, dtype) and roofline bounds.

The first screen needs no model: its settings come from the model's description, and the model loads when a
sweep starts (kvviz.app.models.model_spec). In lecture mode each sweep, and the roofline, is one idea per screen.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import streamlit as st

from kvviz.app.hosted import batches_within, points_within, tokens_within
from kvviz.app.language import show_error, tr
from kvviz.app.lecture import ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import check_request, check_sweep, get_backend, limit, model_caption, model_spec, preload_engine
from kvviz.app.shell import page_setup
from kvviz.app.timing import noise_indicator
from kvviz.app.widgets import chart, number_in_range
from kvviz.charts import latency as charts
from kvviz.engine import sweep_stats as stats
from kvviz.engine.device_names import DTYPE_NAMES
from kvviz.errors import InputError
from kvviz.kv.capacity import CapacityPlan, plan_capacity
from kvviz.kv.formula import KV_DTYPES
from kvviz.kv.hardware import HARDWARE, Hardware
from kvviz.kv.presets import PRESETS
from kvviz.kv.roofline import Roofline
from kvviz.units import format_binary

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from kvviz.engine.backends.base import Backend
    from kvviz.engine.sweeps import Sweep, SweepRun

TICK_S = 0.3  # the fragment's period while a sweep runs
BUDGET_S = 1.0  # measuring per tick (in quiet) before the progress bar redraws
SWEEPS = ("prompt", "cache", "batch", "dtype")
ROOF_PARTS = ("bounds", "chart", "kv")
KIND = {"prompt": "prompt-length", "cache": "cache", "batch": "batch", "dtype": "dtype"}

settings = page_setup("latency.title")
lecture, ss = settings.lecture, st.session_state
st.title(tr("latency.title"))
spec = model_spec(settings)
if spec is None:
    st.stop()


def load() -> Backend | None:
    """The model, loaded when a sweep or the noise check first needs it (None after showing why not)."""
    return get_backend(settings)


IDEAS = (*SWEEPS, "roof_bounds", "roof_chart", "roof_kv")
# In lecture mode one idea per screen: the stepper under the title, then the introduction and the idea's controls
# in one row.
shown = [IDEAS[i] for i in ideas([tr(f"latency.idea_{n}") for n in IDEAS], "latency")] if lecture else []
head = lecture_head(widths=(2, 3))
with head[0], intro_box():
    st.write(tr("latency.intro"))
    model_caption(spec)
    noise_indicator(load, "lc")
max_len = spec.max_context
caps = settings.hosted
# The defaults fit a hosted demo's caps: contexts within its KV budget, as many points as it allows.
budget_len = tokens_within(caps, spec, settings.dtype, max_len)


def labels(prefix: str, *names: str) -> dict[str, str]:
    return {n: tr(f"latency.{prefix}_{n}") for n in names}


def fmt_time(seconds: float | None, se: float | None = None) -> str:
    """A duration in the unit that suits it (ms, µs, ns), with its standard error in the same unit."""
    if seconds is None:
        return "—"
    scale, unit = next(((s, u) for s, u in ((1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")) if abs(seconds) >= s),
                       (1e-9, "ns"))
    digits = 2 if abs(seconds) / scale < 100 else 1
    value = f"{seconds / scale:.{digits}f}".replace("-", "−")
    return f"{value} {unit}" if se is None else f"{value} ± {se / scale:.{digits}f} {unit}"


def fmt_cost(*terms: tuple[str, float | None, float | None]) -> str:
    """A fitted cost as its terms, each (locale term, seconds, standard error): "1.3 ms + 42 µs per token − 0.2 ns
    per pair" (a negative term is subtracted, never printed as "+ −")."""
    out = []
    for i, (term, value, se) in enumerate(terms):
        text = tr(f"latency.term_{term}", value=fmt_time(abs(value) if i and value is not None else value, se))
        out.append(text if i == 0 else ("− " if value is not None and value < 0 else "+ ") + text)
    return " ".join(out)


def fmt_ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f} ms"


def fmt_interval(ci: list[float] | None) -> str:
    return "—" if ci is None else f"{fmt_time(ci[0])} … {fmt_time(ci[1])}"


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


def sizes(text: str, max_value: int) -> list[int]:
    values = stats.parse_sizes(text, max_value=max_value)
    check_sweep(settings, len(values))  # a hosted demo caps the points per sweep
    return values


def table(kind: str, rows: list[dict]) -> None:
    """The rows as the reader reads them: columns named in the page's language, times in ms, modes translated."""
    import pandas as pd  # ~1 s to import: only once a sweep has rows to show

    def header(column: str) -> str:
        for end, word in (("_min_s", "min"), ("_max_s", "max"), ("_min", "min"), ("_max", "max")):
            if column.endswith(end):
                base = column.removesuffix(end) + ("_s" if end.endswith("_s") else "")
                return tr(f"latency.col_{word}", name=tr(f"latency.col_{base}"))
        return tr(f"latency.col_{column}")

    def cell(column: str, value: object) -> object:
        if column == "mode":
            return tr(f"latency.cchart_{value}")
        is_time = column.endswith("_s") or column.startswith("seconds")
        return round(value * 1e3, 3) if is_time and column != "tokens_per_s" and value is not None else value

    frame = pd.DataFrame([{header(c): cell(c, r.get(c)) for c in stats.COLUMNS[kind]} for r in rows])
    st.dataframe(frame, hide_index=True)


def sweep_panel(name: str, controls: Callable[[], dict], make: Callable[[dict], Sweep | None],
                draw: Callable[[list[dict]], go.Figure], describe: Callable[[list[dict]], tuple[str, str]]) -> None:
    """Settings, Start/Cancel, and a fragment that measures a little per tick (in quiet), then draws progress;
    the chart, the verdict and the CSV are drawn once the sweep is done or cancelled. In lecture mode the settings
    sit behind one button beside Start, and the details under the verdict are folded."""
    kind = KIND[name]
    key = f"lc_run_{kind}"
    run: SweepRun | None = ss.get(key)
    running = run is not None and not run.finished
    if lecture:
        with head[1]:
            where, b1, b2 = st.columns([3, 3, 2], vertical_alignment="center")
        with where, settings_box():
            st.write(tr(f"latency.{name}_intro"))
            values = controls()
    else:
        st.write(tr(f"latency.{name}_intro"))
        values = controls()
        b1, b2, _ = st.columns([1, 1, 4])

    def start() -> None:
        ss[key + "_start"] = True  # built below from this rerun's checked values (a callback sees the last run's)

    def cancel() -> None:
        if ss.get(key) is not None:
            ss[key].cancel()  # a flag: a thread measuring stops after its run, keeping every row complete

    if ss.pop(key + "_start", False):
        try:
            sweep = make(values)
            if sweep is not None:
                from kvviz.engine.sweeps import SweepRun  # the engine: imported with the model, when a sweep starts

                ss[key], ss[key + "_error"] = SweepRun(sweep), None
                ss[key + "_skip"] = True  # the Start click redraws the page: measure from the fragment's first tick
                run, running = ss[key], True
        except InputError as exc:
            ss[key + "_error"] = exc
    b1.button(tr("latency.start"), on_click=start, disabled=running, type="primary", key=f"lc_start_{kind}")
    b2.button(tr("latency.cancel"), on_click=cancel, disabled=not running or run.cancelled, key=f"lc_cancel_{kind}")
    if ss.get(key + "_error"):
        show_error(ss[key + "_error"])

    def live() -> None:
        run: SweepRun | None = ss.get(key)
        if run is None:
            st.info(tr("latency.idle"))
            return
        if not run.finished and not ss.pop(key + "_skip", False):
            run.advance(BUDGET_S)  # model work first, in quiet; drawing comes after
        if run.finished and running:
            # The whole page, so the fragment stops ticking and the buttons flip: also when the run was finished by
            # an older script thread (a Cancel's rerun starts while the last tick is still measuring).
            st.rerun()
        state = "cancelled" if run.cancelled else "done" if run.finished else "running"
        state += "_none" if state == "cancelled" and not run.rows else ""  # no whole round: one sentence says it
        if not lecture or state != "done":  # on a projector a finished sweep's chart says it
            st.progress(run.progress, text=tr(f"latency.progress_{state}", done=run.done, total=run.sweep.total,
                                              settings=run.sweep.settings, kept=len(run.rows)))
        if run.error:
            show_error(run.error)
        if not run.finished:
            return  # while measuring, only the progress bar: a chart redrawn in the browser competes with the model
        if not run.rows:
            return  # the progress line says so
        verdict, details = describe(run.rows)
        where, text = st.columns([3, 2]) if lecture else (st.container(), st.container())  # one screen: side by side
        with where:
            chart(draw(run.rows), f"lc_chart_{kind}")
        text.markdown(verdict)
        with text, st.expander(tr("latency.details")) if lecture else st.container():
            st.markdown(details)
            with st.expander(tr("latency.table")):
                table(kind, run.rows)
            records = stats.run_records(run.rows)  # every whole run, not only the medians
            out = io.StringIO()
            writer = csv.DictWriter(out, fieldnames=list(dict.fromkeys(k for r in records for k in r)))
            writer.writeheader()
            writer.writerows(records)
            st.download_button(tr("latency.csv"), out.getvalue(), file_name=f"kvviz_{kind}_sweep.csv",
                               mime="text/csv", on_click="ignore", key=f"lc_csv_{kind}")

    st.fragment(live, run_every=TICK_S if running else None)()


# ---- prompt length ---------------------------------------------------------------------------------
def prompt_controls() -> dict:
    c1, c2, c3 = st.columns([3, 1, 1])
    n_new = number_in_range(c2, tr("latency.new_tokens"), 2, limit(settings, "max_new_tokens", 64), 8,
                               "lc_p_new")
    default = stats.default_prompt_lengths(budget_len, 8, points_within(caps, 6))
    lengths = c1.text_input(tr("latency.prompt_lengths", max_len=max_len), ", ".join(map(str, default)),
                            key=f"lc_p_lengths_{max_len}")
    repeats = number_in_range(c3, tr("latency.repeats"), 1, 20, stats.DEFAULT_REPEATS["prompt-length"],
                                 "lc_p_repeats")
    return {"lengths": lengths, "n_new": n_new, "repeats": repeats}


def make_prompt(v: dict) -> Sweep | None:
    lengths = sizes(v["lengths"], max_len - 1)
    backend = load()
    if backend is None:
        return None
    check_request(settings, backend, batch=1, prompt_tokens=max(lengths), max_new_tokens=v["n_new"])
    from kvviz.engine import sweeps

    return sweeps.prompt_length_sweep(backend, lengths, n_new=v["n_new"], repeats=v["repeats"])


def draw_prompt(rows: list[dict]) -> go.Figure:
    names = labels("pchart", "title", "x", "y", "ttft_s", "tpot_s", "fit_ttft_s", "fit_tpot_s")
    return charts.prompt_length_chart(rows, stats.model_fits("prompt-length", rows), names, lecture=lecture)


def describe_prompt(rows: list[dict]) -> tuple[str, str]:
    s = stats.summary("prompt-length", rows)
    verdict = tr(f"latency.prompt_{s['ttft_verdict']}", runs=s["n_runs"]) + " " + tr(
        "latency.prompt_tpot", verdict=tr(f"latency.trend_{s['tpot_verdict']}"))
    details = tr("latency.prompt_model", runs=s["n_runs"],
                 ttft=fmt_cost(("fixed", s["ttft_fixed_s"], s["ttft_fixed_s_se"]),
                               ("per_prompt_token", s["ttft_s_per_token"], s["ttft_s_per_token_se"]),
                               ("per_pair", s["ttft_s_per_token_pair"], s["ttft_s_per_token_pair_se"])),
                 tpot=fmt_cost(("fixed", s["tpot_fixed_s"], s["tpot_fixed_s_se"]),
                               ("per_cached_token", s["tpot_s_per_token"], s["tpot_s_per_token_se"])))
    line = s["ttft_line_fixed_s"]
    if line is not None and line < 0:  # why an ordinary straight line would print a negative fixed cost
        details += "\n\n" + tr("latency.prompt_line", line_fixed=fmt_time(line))
    return verdict, details


# ---- cache vs no cache -------------------------------------------------------------------------------
def cache_controls() -> dict:
    c1, c2 = st.columns([3, 1])
    repeats = number_in_range(c2, tr("latency.cache_repeats"), 1, 20, stats.DEFAULT_REPEATS["cache"],
                                 "lc_c_repeats")
    default = stats.default_contexts(budget_len, points_within(caps, 8))
    contexts = c1.text_input(tr("latency.contexts", max_len=max_len), ", ".join(map(str, default)),
                             key=f"lc_c_contexts_{max_len}")
    return {"contexts": contexts, "repeats": repeats}


def make_cache(v: dict) -> Sweep | None:
    contexts = sizes(v["contexts"], max_len - 1)
    backend = load()
    if backend is None:
        return None
    check_request(settings, backend, batch=1, prompt_tokens=max(contexts), max_new_tokens=1)
    from kvviz.engine import sweeps

    return sweeps.cache_sweep(backend, contexts, repeats=v["repeats"])


def draw_cache(rows: list[dict]) -> go.Figure:
    names = labels("cchart", "title", "x", "y", "cache", "no_cache", "fit_cache", "fit_no_cache")
    return charts.cache_chart(rows, stats.model_fits("cache", rows), names, lecture=lecture)


def describe_cache(rows: list[dict]) -> tuple[str, str]:
    s = stats.summary("cache", rows)
    c, u = s["cache"], s["no_cache"]
    trends = {m: tr(f"latency.trend_{s[m]['verdict']}") for m in ("cache", "no_cache")}
    verdict = tr(f"latency.cache_{s['verdict']}", cache=trends["cache"], no_cache=trends["no_cache"])
    falling = tr("latency.cache_falling") if "falling" in (c["verdict"], u["verdict"]) else ""
    if falling and not lecture:
        verdict += " " + falling
    first, last = s["contexts"]
    details = tr("latency.cache_model", runs=c["n_runs"], first=first, last=last,
                 cache=fmt_cost(("fixed", c["step_fixed_s"], c["step_fixed_s_se"]),
                                ("per_cached_token", c["step_s_per_token"], c["step_s_per_token_se"])),
                 no_cache=fmt_cost(("fixed", u["step_fixed_s"], u["step_fixed_s_se"]),
                                   ("per_token", u["step_s_per_token"], u["step_s_per_token_se"]),
                                   ("per_pair", u["step_s_per_token_pair"], u["step_s_per_token_pair_se"])),
                 c_rise=fmt_time(c["rise_s"]), c_ci=fmt_interval(c["rise_ci95_s"]),
                 u_rise=fmt_time(u["rise_s"]), u_ci=fmt_interval(u["rise_ci95_s"]))
    if falling and lecture:
        details = falling + "\n\n" + details
    if c["total_s"] and u["total_s"]:
        details += "\n\n" + tr("latency.cache_total", first=first, last=last, cache=f"{c['total_s']:.2f} s",
                               no_cache=f"{u['total_s']:.2f} s", ratio=f"{u['total_s'] / c['total_s']:.1f}")
    return verdict, details


# ---- batch -----------------------------------------------------------------------------------------------
def batch_controls() -> dict:
    c1, c2, c3 = st.columns([3, 1, 1])
    # Default batches within a hosted demo's batch cap whose cache holds a prompt and the 16 new tokens, and a
    # default prompt that fits the largest of them.
    default = [b for b in batches_within(caps, (1, 2, 4, 8, 16))
               if tokens_within(caps, spec, settings.dtype, max_len, batch=b) > 16] or [1]
    batches = c1.text_input(tr("latency.batches"), ", ".join(map(str, default)), key="lc_b_batches")
    n_new = number_in_range(c3, tr("latency.new_tokens"), 2, limit(settings, "max_new_tokens", 64), 16,
                               "lc_b_new")
    fits = tokens_within(caps, spec, settings.dtype, max_len, batch=max(default)) - 16
    n_prompt = number_in_range(c2, tr("latency.prompt_tokens"), 1, max_len - 2,
                                  max(1, min(64, max_len // 4, fits)), f"lc_b_prompt_{max_len}")
    return {"batches": batches, "n_prompt": n_prompt, "n_new": n_new}


def make_batch(v: dict) -> Sweep | None:
    batches = sizes(v["batches"], 256)
    backend = load()
    if backend is None:
        return None
    check_request(settings, backend, batch=max(batches), prompt_tokens=v["n_prompt"], max_new_tokens=v["n_new"])
    from kvviz.engine import sweeps

    return sweeps.batch_sweep(backend, batches, n_prompt=v["n_prompt"], n_new=v["n_new"])


def draw_batch(rows: list[dict]) -> go.Figure:
    return charts.batch_chart(rows, labels("bchart", "title", "x", "tpot", "tokens_per_s", "kv"), lecture=lecture)


def describe_batch(rows: list[dict]) -> tuple[str, str]:
    first, last = rows[0], rows[-1]
    return tr("latency.batch_result", b0=first["batch"], b1=last["batch"],
              tpot_ratio=f"{last['tpot_s'] / first['tpot_s']:.2f}",
              tps_ratio=f"{last['tokens_per_s'] / first['tokens_per_s']:.2f}",
              kv_ratio=f"{last['kv_bytes'] / first['kv_bytes']:.0f}",
              kv=format_binary(last["kv_bytes"]), formula=format_binary(last["kv_formula_bytes"])), ""


# ---- dtype ---------------------------------------------------------------------------------------------
def dtype_controls() -> dict:
    c1, c2, c3 = st.columns([3, 1, 1])
    dtypes = c1.multiselect(tr("latency.dtypes"), list(DTYPE_NAMES), list(DTYPE_NAMES), key="lc_d_dtypes")
    n_prompt = number_in_range(c2, tr("latency.prompt_tokens"), 1, max_len - 2, min(64, max_len // 4),
                                  f"lc_d_prompt_{max_len}")
    n_new = number_in_range(c3, tr("latency.new_tokens"), 2, limit(settings, "max_new_tokens", 64), 16,
                               "lc_d_new")
    return {"dtypes": dtypes, "n_prompt": n_prompt, "n_new": n_new}


def load_dtype(dtype: str) -> Backend:
    loaded = get_backend(replace(settings, dtype=dtype))
    if loaded is None:  # get_backend has shown why
        raise RuntimeError(tr("latency.dtype_unavailable", dtype=dtype))
    return loaded


def make_dtype(v: dict) -> Sweep | None:
    if not v["dtypes"]:
        raise InputError("latency.no_dtypes")
    from kvviz.engine import sweeps

    return sweeps.dtype_sweep(load_dtype, v["dtypes"], n_prompt=v["n_prompt"], n_new=v["n_new"])


def draw_dtype(rows: list[dict]) -> go.Figure:
    return charts.dtype_chart(rows, labels("dchart", "title", "y", "ttft_s", "tpot_s"), lecture=lecture)


def describe_dtype(rows: list[dict]) -> tuple[str, str]:
    def listed(key: str) -> str:
        return "\n".join("- " + (tr(key, dtype=r["dtype"], ttft=fmt_ms(r["ttft_s"]), tpot=fmt_ms(r["tpot_s"]),
                                     weights=format_binary(r["weight_bytes"]), kv=format_binary(r["kv_bytes"]))
                                  if r["supported"] else tr("latency.dtype_unsupported", dtype=r["dtype"],
                                                            error=r["error"])) for r in rows)

    if lecture:  # the times beside the chart; the bytes folded under them
        return listed("latency.dtype_times"), listed("latency.dtype_row") + "\n\n" + tr("latency.dtype_note")
    return listed("latency.dtype_row"), tr("latency.dtype_note")


PANELS = {"prompt": (prompt_controls, make_prompt, draw_prompt, describe_prompt),
          "cache": (cache_controls, make_cache, draw_cache, describe_cache),
          "batch": (batch_controls, make_batch, draw_batch, describe_batch),
          "dtype": (dtype_controls, make_dtype, draw_dtype, describe_dtype)}


# ---- roofline ----------------------------------------------------------------------------------------------
def roofline(parts: tuple[str, ...] = ROOF_PARTS) -> None:
    """The bounds and their two charts (in lecture mode `parts` says which one is on screen)."""
    if not lecture:
        st.write(tr("latency.roof_intro"))
    # The Memory page's presets (experts excepted: a token reads only its experts) and the model in use.
    models = {**{n: s for n, s in PRESETS.items() if not s.is_moe}, spec.name: spec}
    with head[1], settings_box(tr("latency.roof_settings")):
        if lecture:
            st.write(tr("latency.roof_intro"))
        c1, c2 = st.columns(2)
        hw_name = c1.selectbox(tr("latency.hardware"), list(HARDWARE), key="lc_r_hw")
        names = list(models)
        model_name = c2.selectbox(tr("latency.roof_model"), names, index=names.index("Llama-3.1-8B"),
                                  key="lc_r_model")
        preset = HARDWARE[hw_name]
        h1, h2, h3 = st.columns(3)
        # Keyed by preset: choosing another accelerator reloads its numbers, which stay editable.
        memory_gib = number_in_range(
            h1, tr("latency.memory_gib"), 0.1, 100_000.0,
            None if preset.memory_bytes is None else round(preset.memory_bytes / 2**30, 2), f"lc_r_mem_{hw_name}",
            whole=False, placeholder=tr("latency.unknown"))
        bandwidth_tb = number_in_range(h2, tr("latency.bandwidth_tb"), 0.001, 100.0,
                                          preset.bandwidth_bytes_per_s / 1e12, f"lc_r_bw_{hw_name}", whole=False,
                                          format="%.3f")
        peak_tf = number_in_range(h3, tr("latency.peak_tflops"), 0.01, 100_000.0, preset.peak_flops / 1e12,
                                     f"lc_r_peak_{hw_name}", whole=False)
        # One short line names where the numbers come from; the sources themselves are one click away.
        st.caption(tr("latency.hw_sources", gpu=hw_name))
        with st.expander(tr("latency.hw_sources_full")):
            st.markdown("\n".join(f"- **{tr(f'latency.source_{k}')}:** {text}" for k, text in (
                ("memory", preset.memory_source or tr("latency.unknown")), ("bandwidth", preset.bandwidth_source),
                ("flops", preset.flops_source))))
        exact = preset.memory_bytes is not None and memory_gib == round(preset.memory_bytes / 2**30, 2)
        hw = Hardware(hw_name, bandwidth_tb * 1e12, peak_tf * 1e12,
                      preset.memory_bytes if exact else None if memory_gib is None else round(memory_gib * 2**30))
        d1, d2, d3, d4 = st.columns(4)
        weight_dtype = d1.selectbox(tr("latency.weight_dtype"), ["bfloat16", "fp8", "int4", "float32"],
                                    key="lc_r_wdtype")
        kv_dtype = d2.selectbox(tr("latency.kv_dtype"), list(KV_DTYPES), index=1, key="lc_r_kvdtype")
        n_context = number_in_range(d3, tr("latency.context"), 1, 10_000_000, 4096, "lc_r_context")
        batch = number_in_range(d4, tr("latency.batch"), 1, 100_000, 1, "lc_r_batch")
    try:
        roof = Roofline(models[model_name], hw, weight_dtype, kv_dtype)
    except InputError as exc:
        show_error(exc)
        return

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

    if "bounds" in parts:
        bounds(roof, hw, plan, plan_error, batch, n_context)
    fits = plan.max_requests if plan is not None else 0
    if "chart" in parts:
        top = max(1024, 2 * fits, int(2 * (b_star or 0)))
        batches = sorted({int(round(b)) for b in [2**i for i in range(0, top.bit_length() + 1)] + [batch]})
        curve = roof.decode_curve(batches=batches, n_context=n_context)
        names = labels("rchart", "title", "x", "y", "y2", "memory", "compute", "bound", "tokens_per_s",
                       "compute_batch", "max_batch", "kv_weights")
        chart(charts.roofline_chart(curve, names, compute_batch=b_star, max_batch=fits,
                                    kv_weights_batch=weights / kv_req, lecture=lecture), "lc_roofline")
    if "kv" in parts:
        tokens = sorted({2**i for i in range(7, 21)} | {n_context})
        kv_labels = labels("kchart", "x", "y", "kv", "weights", "crossing")
        kv_labels["title"] = tr("latency.kchart_title", batch=batch)
        chart(charts.kv_vs_weights_chart(tokens, [roof.kv_bytes(n, batch) for n in tokens], weights, crossing,
                                         kv_labels, lecture=lecture), "lc_kv_weights")
    if not lecture:  # on a projector it is folded under the bounds
        st.caption(tr("latency.roof_note"))


def bounds(roof: Roofline, hw: Hardware, plan: CapacityPlan | None, plan_error: InputError | None, batch: int,
           n_context: int) -> None:
    """The decode bound in words and four cards: TPOT and prefill bounds, where compute takes over, what fits."""
    decode = roof.decode_bound(batch=batch, n_context=n_context)
    prefill = roof.prefill_bound(n_prompt=n_context)
    b_star = roof.compute_bound_batch(n_context=n_context)
    crossing = roof.kv_equals_weights_tokens(batch=batch)
    weights, kv_req = roof.weight_bytes, roof.kv_bytes(n_context)
    st.markdown(tr("latency.roof_decode", weights=format_binary(weights), batch=batch, kv=format_binary(kv_req),
                   bw=f"{hw.bandwidth_bytes_per_s / 1e12:.3f}", tpot=fmt_duration(decode.memory_s),
                   compute=fmt_duration(decode.compute_s), bound=fmt_duration(decode.seconds),
                   limit=tr(f"latency.limit_{decode.limited_by}")))
    m = st.columns(4)
    folded: list[str] = []  # in lecture mode the longer notes under the cards go into one fold below them

    def note(i: int, text: str, *, short: bool = False) -> None:
        if lecture and not short:
            folded.append(f"- **{labels_m[i]}:** {text}")
        else:
            m[i].caption(text)

    labels_m = [tr(f"latency.{k}") for k in ("m_tpot", "m_prefill", "m_compute_batch", "m_fits")]
    m[0].metric(labels_m[0], fmt_duration(decode.seconds))
    note(0, tr(f"latency.limit_{decode.limited_by}"), short=True)
    m[1].metric(labels_m[1], fmt_duration(prefill.seconds))
    note(1, tr("latency.prefill_of", n=f"{n_context:,}", limit=tr(f"latency.limit_{prefill.limited_by}")), short=True)
    # Below one request the batch is not a count: the ridge is so low that decode is compute-bound from B = 1.
    m[2].metric(labels_m[2], "∞" if b_star is None else "1" if b_star <= 1 else fmt_count(b_star))
    ridge = tr("latency.ridge", ridge=fmt_count(hw.ridge_flops_per_byte))
    if b_star is None:
        note(2, tr("latency.never_compute"))
    elif b_star <= 1:
        note(2, tr("latency.compute_from_one", batch=f"{b_star:.2g}") + " " + ridge)
    else:
        note(2, ridge, short=True)
    weights_only = roof.compute_bound_batch(n_context=0)  # the textbook figure: no cache reads
    if weights_only is not None:
        note(2, tr("latency.weights_only_batch", batch=fmt_count(weights_only)))
    if plan is None:
        m[3].metric(labels_m[3], tr("latency.unknown"))
        note(3, tr("latency.memory_unknown") if plan_error is None else plan_error.message(settings.lang), short=True)
    else:
        m[3].metric(labels_m[3], f"{plan.max_requests:,}")
        if not plan.weights_fit:
            m[3].error(tr("latency.weights_no_fit", weights=format_binary(weights)))
        elif plan.max_requests == 0:
            m[3].warning(tr("latency.request_does_not_fit", kv=format_binary(kv_req),
                            free=format_binary(plan.kv_budget_bytes)))
        else:
            note(3, tr("latency.fits_how", util=plan.gpu_memory_utilization,
                       reserve=format_binary(plan.reserve_bytes)))
    note(3, tr("latency.crossing", tokens=fmt_count(crossing), batch=batch) if crossing is not None
         else tr("latency.crossing_never", batch=batch))
    if folded:
        with st.expander(tr("latency.roof_details")):
            st.markdown("\n".join(folded) + "\n\n" + tr("latency.roof_note"))


# ---- the page: five tabs, or in lecture mode the idea on screen (the roofline's three parts apart) ------------
if lecture:
    for name in shown:
        if name in SWEEPS:
            sweep_panel(name, *PANELS[name])
        else:
            roofline((name.removeprefix("roof_"),))
else:
    names = (*SWEEPS, "roofline")
    for name, tab in zip(names, st.tabs([tr(f"latency.tab_{n}") for n in names]), strict=True):
        with tab:
            if name == "roofline":
                roofline()
            else:
                sweep_panel(name, *PANELS[name])
preload_engine()  # the page is drawn: torch and the engine load in the background for the first sweep
