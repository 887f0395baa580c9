"""What the Latency & Capacity page draws: the session keys it keeps (`LC`), the page's context (`LatencyPage`), a
sweep's panel (`sweep_panel`: its settings, Start and Cancel, the fragment that draws the progress and measures a
little per tick, then the chart, verdict, table and CSV) and the roofline tab (`roofline`: its settings in
`roof_inputs`, drawn by `roof_figures`, its cards in `bounds`); in a lecture room what the lecturer's page publishes
(`room_view`: finished sweeps' rows, the roofline's inputs) and a follower's page drawn from it (`follow`). What a
sweep measures comes from kvviz.engine.sweeps (imported with the model, when a sweep starts); what its rows and the
roofline say from kvviz.lessons.latency. Nothing here imports torch before a sweep starts."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import streamlit as st

from kvviz.app.hosted import batches_within, points_within, tokens_within
from kvviz.app.language import lang, show_error, tr
from kvviz.app.lecture import settings_box
from kvviz.app.models import check_request, check_sweep, get_backend, limit
from kvviz.app.room.explore import explore_from
from kvviz.app.room.share import share_button
from kvviz.app.room.view import RoomView
from kvviz.app.state import page_state
from kvviz.app.timing import draw_then_measure
from kvviz.app.widgets import chart, number_in_range
from kvviz.charts import latency as charts
from kvviz.engine import sweep_stats as stats
from kvviz.engine.device_names import DTYPE_NAMES
from kvviz.errors import InputError
from kvviz.kv.formats import KV_DTYPES
from kvviz.kv.formula import KVSpec
from kvviz.kv.hardware import HARDWARE
from kvviz.lessons import latency as lessons

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from kvviz.app.sidebar import Settings
    from kvviz.engine.backends.base import Backend
    from kvviz.engine.sweeps import Sweep, SweepRun

TICK_S = 0.3  # the fragment's period while a sweep runs
BUDGET_S = 1.0  # measuring per tick (in quiet) after the progress bar is drawn
SWEEPS = ("prompt", "cache", "batch", "dtype")
ROOF_PARTS = ("bounds", "chart", "kv")
IDEAS = (*SWEEPS, "roof_bounds", "roof_chart", "roof_kv")
KIND = {"prompt": "prompt-length", "cache": "cache", "batch": "batch", "dtype": "dtype"}
# Per sweep kind: its SweepRun, a Start clicked (built on the next rerun), the error that refused it, and the tick
# to skip (the Start click redraws the whole page: measuring begins on the fragment's first tick).
LC = page_state("latency", **{f"run_{kind}{part}": False if part in ("_start", "_skip") else None
                         for kind in KIND.values() for part in ("", "_start", "_error", "_skip")})


@dataclass(frozen=True)
class LatencyPage:
    """What every panel of the page reads: the settings, the model's description, and the lecture head's two
    places (the introduction's, the settings')."""

    settings: Settings
    spec: KVSpec
    head: tuple[Any, Any]

    @property
    def lecture(self) -> bool:
        return self.settings.lecture

    @property
    def max_len(self) -> int:
        return self.spec.max_context

    @cached_property
    def budget_len(self) -> int:
        """The longest context a hosted demo's KV budget holds: the defaults fit its caps."""
        return tokens_within(self.settings.hosted, self.spec, self.settings.dtype, self.max_len)

    def load(self) -> Backend | None:
        """The model, loaded when a sweep or the noise check first needs it (None after showing why not)."""
        return get_backend(self.settings)

    def sizes(self, text: str, max_value: int) -> list[int]:
        values = stats.parse_sizes(text, max_value=max_value)
        check_sweep(self.settings, len(values))  # a hosted demo caps the points per sweep
        return values


def labels(prefix: str, *names: str) -> dict[str, str]:
    return {n: tr(f"latency.{prefix}_{n}") for n in names}


def sweep_panel(page: LatencyPage, name: str) -> None:
    """Settings, Start/Cancel, and a fragment that draws the progress, then measures a little per tick (in quiet);
    the chart, the verdict and the CSV are drawn once the sweep is done or cancelled. In lecture mode the settings
    sit behind one button beside Start, and the details under the verdict are folded."""
    controls, make, draw_chart = PANELS[name]
    kind, lecture = KIND[name], page.lecture
    key = f"run_{kind}"
    run: SweepRun | None = LC.get(key)
    running = run is not None and not run.finished
    if lecture:
        with page.head[1]:
            where, b1, b2 = st.columns([3, 3, 2], vertical_alignment="center")
        with where, settings_box():
            share_button(lecture)  # behind the settings button, as on Reusing Past K/V
            st.write(tr(f"latency.{name}_intro"))
            values = controls(page)
    else:
        st.write(tr(f"latency.{name}_intro"))
        values = controls(page)
        b1, b2, _ = st.columns([1, 1, 4])

    def start() -> None:
        LC.set(key + "_start", True)  # built below from this rerun's checked values (a callback sees the last run's)

    def cancel() -> None:
        if LC.get(key) is not None:
            LC.get(key).cancel()  # a flag: a thread measuring stops after its run, keeping every row complete

    if LC.pop(key + "_start"):
        try:
            sweep = make(page, values)
            if sweep is not None:
                from kvviz.engine.sweeps import SweepRun  # the engine: imported with the model, when a sweep starts

                run, running = SweepRun(sweep), True
                LC.set(key, run)
                LC.set(key + "_error", None)
                LC.set(key + "_skip", True)
        except InputError as exc:
            LC.set(key + "_error", exc)
    b1.button(tr("latency.start"), on_click=start, disabled=running, type="primary", key=f"latency_start_{kind}")
    b2.button(tr("latency.cancel"), on_click=cancel, disabled=not running or run.cancelled,
              key=f"latency_cancel_{kind}")
    if LC.get(key + "_error"):
        show_error(LC.get(key + "_error"))

    def live() -> None:
        run: SweepRun | None = LC.get(key)
        if run is None:
            st.info(tr("latency.idle"))
            return
        if run.finished and running:
            # The whole page, so the fragment stops ticking and the buttons flip: also when the run was finished by
            # an older script thread (a Cancel's rerun starts while the last tick is still measuring).
            st.rerun()

        def draw() -> None:
            state = run.state
            if not lecture or state != "done":  # on a projector a finished sweep's chart says it
                st.progress(run.progress, text=tr(f"latency.progress_{state}", done=run.done, total=run.sweep.total,
                                                  settings=run.sweep.settings, kept=len(run.rows)))
            if run.error:
                show_error(run.error)
            if run.finished and run.rows:  # while measuring only the progress bar: a chart redrawn in the browser
                results(lecture, kind, run.rows, draw_chart)  # competes with the model; with no whole round, the
                # progress line says so

        # The Start click's whole-page run draws the page first: measuring begins on the fragment's first tick.
        if running and not LC.pop(key + "_skip"):
            draw_then_measure(draw, lambda: run.advance(BUDGET_S))
            if run.finished:
                st.rerun()  # the last round measured: the whole page, with the results
        else:
            draw()

    st.fragment(live, run_every=TICK_S if running else None)()


def results(lecture: bool, kind: str, rows: list[dict], draw: Any) -> None:
    """A finished sweep: its chart and verdict (side by side on a projector), then the details, table and CSV (the
    lecturer's page's, and a room follower's from the lecturer's rows)."""
    import pandas as pd  # ~1 s to import: only once a sweep has rows to show

    verdict, details = lessons.describe(kind, rows, lang(), lecture=lecture)
    where, text = st.columns([3, 2]) if lecture else (st.container(), st.container())  # one screen: side by side
    with where:
        chart(draw(rows, lecture), f"latency_chart_{kind}")
    text.markdown(verdict)
    with text, st.expander(tr("latency.details")) if lecture else st.container():
        st.markdown(details)
        with st.expander(tr("latency.table")):
            st.dataframe(pd.DataFrame(lessons.table_rows(kind, rows, lang())), hide_index=True)
        st.download_button(tr("latency.csv"), stats.records_csv(rows), file_name=f"kvviz_{kind}_sweep.csv",
                           mime="text/csv", on_click="ignore", key=f"latency_csv_{kind}")


# ---- prompt length ---------------------------------------------------------------------------------
def prompt_controls(page: LatencyPage) -> dict:
    c1, c2, c3 = st.columns([3, 1, 1])
    n_new = number_in_range(c2, tr("latency.new_tokens"), 2, limit(page.settings, "max_new_tokens", 64), 8,
                            "latency_p_new")
    default = stats.default_prompt_lengths(page.budget_len, 8, points_within(page.settings.hosted, 6))
    lengths = c1.text_input(tr("latency.prompt_lengths", max_len=page.max_len), ", ".join(map(str, default)),
                            key=f"latency_p_lengths_{page.max_len}")
    repeats = number_in_range(c3, tr("latency.repeats"), 1, 20, stats.DEFAULT_REPEATS["prompt-length"],
                              "latency_p_repeats")
    return {"lengths": lengths, "n_new": n_new, "repeats": repeats}


def make_prompt(page: LatencyPage, v: dict) -> Sweep | None:
    lengths = page.sizes(v["lengths"], page.max_len - 1)
    backend = page.load()
    if backend is None:
        return None
    check_request(page.settings, backend, batch=1, prompt_tokens=max(lengths), max_new_tokens=v["n_new"])
    from kvviz.engine import sweeps

    return sweeps.prompt_length_sweep(backend, lengths, n_new=v["n_new"], repeats=v["repeats"])


def draw_prompt(rows: list[dict], lecture: bool) -> go.Figure:
    names = labels("pchart", "title", "x", "y", "ttft_s", "tpot_s", "fit_ttft_s", "fit_tpot_s")
    return charts.prompt_length_chart(rows, stats.model_fits("prompt-length", rows), names, lecture=lecture)


# ---- cache vs no cache -------------------------------------------------------------------------------
def cache_controls(page: LatencyPage) -> dict:
    c1, c2 = st.columns([3, 1])
    repeats = number_in_range(c2, tr("latency.cache_repeats"), 1, 20, stats.DEFAULT_REPEATS["cache"],
                              "latency_c_repeats")
    default = stats.default_contexts(page.budget_len, points_within(page.settings.hosted, 8))
    contexts = c1.text_input(tr("latency.contexts", max_len=page.max_len), ", ".join(map(str, default)),
                             key=f"latency_c_contexts_{page.max_len}")
    return {"contexts": contexts, "repeats": repeats}


def make_cache(page: LatencyPage, v: dict) -> Sweep | None:
    contexts = page.sizes(v["contexts"], page.max_len - 1)
    backend = page.load()
    if backend is None:
        return None
    check_request(page.settings, backend, batch=1, prompt_tokens=max(contexts), max_new_tokens=1)
    from kvviz.engine import sweeps

    return sweeps.cache_sweep(backend, contexts, repeats=v["repeats"])


def draw_cache(rows: list[dict], lecture: bool) -> go.Figure:
    names = labels("cchart", "title", "x", "y", "cache", "no_cache", "fit_cache", "fit_no_cache")
    return charts.cache_chart(rows, stats.model_fits("cache", rows), names, lecture=lecture)


# ---- batch -----------------------------------------------------------------------------------------------
def batch_controls(page: LatencyPage) -> dict:
    settings, caps, max_len = page.settings, page.settings.hosted, page.max_len
    c1, c2, c3 = st.columns([3, 1, 1])
    # Default batches within a hosted demo's batch cap whose cache holds a prompt and the 16 new tokens, and a
    # default prompt that fits the largest of them.
    default = [b for b in batches_within(caps, (1, 2, 4, 8, 16))
               if tokens_within(caps, page.spec, settings.dtype, max_len, batch=b) > 16] or [1]
    batches = c1.text_input(tr("latency.batches"), ", ".join(map(str, default)), key="latency_b_batches")
    n_new = number_in_range(c3, tr("latency.new_tokens"), 2, limit(settings, "max_new_tokens", 64), 16, "latency_b_new")
    fits = tokens_within(caps, page.spec, settings.dtype, max_len, batch=max(default)) - 16
    n_prompt = number_in_range(c2, tr("latency.prompt_tokens"), 1, max_len - 2, max(1, min(64, max_len // 4, fits)),
                               f"latency_b_prompt_{max_len}")
    return {"batches": batches, "n_prompt": n_prompt, "n_new": n_new}


def make_batch(page: LatencyPage, v: dict) -> Sweep | None:
    batches = page.sizes(v["batches"], 256)
    backend = page.load()
    if backend is None:
        return None
    check_request(page.settings, backend, batch=max(batches), prompt_tokens=v["n_prompt"], max_new_tokens=v["n_new"])
    from kvviz.engine import sweeps

    return sweeps.batch_sweep(backend, batches, n_prompt=v["n_prompt"], n_new=v["n_new"])


def draw_batch(rows: list[dict], lecture: bool) -> go.Figure:
    return charts.batch_chart(rows, labels("bchart", "title", "x", "tpot", "tokens_per_s", "kv"),
                              lecture=lecture)


# ---- dtype ---------------------------------------------------------------------------------------------
def dtype_controls(page: LatencyPage) -> dict:
    max_len = page.max_len
    c1, c2, c3 = st.columns([3, 1, 1])
    dtypes = c1.multiselect(tr("latency.dtypes"), list(DTYPE_NAMES), list(DTYPE_NAMES), key="latency_d_dtypes")
    n_prompt = number_in_range(c2, tr("latency.prompt_tokens"), 1, max_len - 2, min(64, max_len // 4),
                               f"latency_d_prompt_{max_len}")
    n_new = number_in_range(c3, tr("latency.new_tokens"), 2, limit(page.settings, "max_new_tokens", 64), 16,
                            "latency_d_new")
    return {"dtypes": dtypes, "n_prompt": n_prompt, "n_new": n_new}


def make_dtype(page: LatencyPage, v: dict) -> Sweep | None:
    if not v["dtypes"]:
        raise InputError("latency.no_dtypes")
    from kvviz.engine import sweeps

    def load(dtype: str) -> Backend:
        loaded = get_backend(replace(page.settings, dtype=dtype))
        if loaded is None:  # get_backend has shown why
            raise RuntimeError(tr("latency.dtype_unavailable", dtype=dtype))
        return loaded

    return sweeps.dtype_sweep(load, v["dtypes"], n_prompt=v["n_prompt"], n_new=v["n_new"])


def draw_dtype(rows: list[dict], lecture: bool) -> go.Figure:
    return charts.dtype_chart(rows, labels("dchart", "title", "y", "ttft_s", "tpot_s"), lecture=lecture)


PANELS = {"prompt": (prompt_controls, make_prompt, draw_prompt), "cache": (cache_controls, make_cache, draw_cache),
          "batch": (batch_controls, make_batch, draw_batch), "dtype": (dtype_controls, make_dtype, draw_dtype)}


# ---- roofline ----------------------------------------------------------------------------------------------
def roofline(page: LatencyPage, parts: tuple[str, ...] = ROOF_PARTS) -> dict:
    """The bounds and their two charts (in lecture mode `parts` says which one is on screen); returns the inputs
    they were drawn from (what a lecture room's followers draw them from)."""
    if not page.lecture:
        st.write(tr("latency.roof_intro"))
    inputs = roof_inputs(page)
    roof_figures(inputs, parts, page.lecture)
    return inputs


def roof_inputs(page: LatencyPage) -> dict:
    """The roofline's settings (in lecture mode behind one button), as JSON: the accelerator as typed over its
    preset, the model (its description: the sidebar's model is one of them), the dtypes, context and batch."""
    models = lessons.roofline_models(page.spec)
    with page.head[1], settings_box(tr("latency.roof_settings")):
        share_button(page.lecture)  # behind the settings button, as on Reusing Past K/V
        if page.lecture:
            st.write(tr("latency.roof_intro"))
        c1, c2 = st.columns(2)
        hw_name = c1.selectbox(tr("latency.hardware"), list(HARDWARE), key="latency_r_hw")
        names = list(models)
        model_name = c2.selectbox(tr("latency.roof_model"), names, index=names.index("Llama-3.1-8B"),
                                  key="latency_r_model")
        preset = HARDWARE[hw_name]
        h1, h2, h3 = st.columns(3)
        # Keyed by preset: choosing another accelerator reloads its numbers, which stay editable.
        memory_gib = number_in_range(h1, tr("latency.memory_gib"), 0.1, 100_000.0, lessons.preset_memory_gib(preset),
                                     f"latency_r_mem_{hw_name}", whole=False, placeholder=tr("latency.unknown"))
        bandwidth_tb = number_in_range(h2, tr("latency.bandwidth_tb"), 0.001, 100.0,
                                       preset.bandwidth_bytes_per_s / 1e12, f"latency_r_bw_{hw_name}", whole=False,
                                       format="%.3f")
        peak_tf = number_in_range(h3, tr("latency.peak_tflops"), 0.01, 100_000.0, preset.peak_flops / 1e12,
                                  f"latency_r_peak_{hw_name}", whole=False)
        # One short line names where the numbers come from; the sources themselves are one click away.
        st.caption(tr("latency.hw_sources", gpu=hw_name))
        with st.expander(tr("latency.hw_sources_full")):
            st.markdown(lessons.hardware_sources(preset, lang()))
        d1, d2, d3, d4 = st.columns(4)
        weight_dtype = d1.selectbox(tr("latency.weight_dtype"), ["bfloat16", "fp8", "int4", "float32"],
                                    key="latency_r_wdtype")
        kv_dtypes = list(KV_DTYPES)  # by name: a dtype added to the table never moves the default
        kv_dtype = d2.selectbox(tr("latency.kv_dtype"), kv_dtypes, index=kv_dtypes.index("bfloat16"),
                                key="latency_r_kvdtype")
        n_context = number_in_range(d3, tr("latency.context"), 1, 10_000_000, 4096, "latency_r_context")
        batch = number_in_range(d4, tr("latency.batch"), 1, 100_000, 1, "latency_r_batch")
    return {"hw_name": hw_name, "memory_gib": memory_gib, "bandwidth_tb": bandwidth_tb, "peak_tf": peak_tf,
            "model": asdict(models[model_name]), "weight_dtype": weight_dtype, "kv_dtype": kv_dtype,
            "n_context": int(n_context), "batch": int(batch)}


def roof_figures(inputs: dict, parts: tuple[str, ...], lecture: bool) -> None:
    """The bounds and the two charts in `parts`, computed from `roof_inputs` (the page's own, or a follower's copy
    of the lecturer's)."""
    hw = lessons.edited_hardware(HARDWARE[inputs["hw_name"]], inputs["memory_gib"], inputs["bandwidth_tb"],
                                 inputs["peak_tf"])
    n_context, batch = inputs["n_context"], inputs["batch"]
    try:
        view = lessons.roof_view(KVSpec(**inputs["model"]), hw, inputs["weight_dtype"], inputs["kv_dtype"], n_context,
                                 batch)
    except InputError as exc:
        show_error(exc)
        return

    if "bounds" in parts:
        bounds(view, lecture)
    roof = view.roof
    if "chart" in parts:
        curve = roof.decode_curve(batches=view.curve_batches(), n_context=n_context)
        names = labels("rchart", "title", "x", "y", "y2", "memory", "compute", "bound", "tokens_per_s",
                       "compute_batch", "max_batch", "kv_weights")
        chart(charts.roofline_chart(curve, names, compute_batch=view.compute_batch, max_batch=view.fits,
                                    kv_weights_batch=roof.weight_bytes / view.kv_request_bytes, lecture=lecture),
              "latency_roofline")
    if "kv" in parts:
        tokens = view.kv_tokens()
        kv_labels = labels("kchart", "x", "y", "kv", "weights", "crossing")
        kv_labels["title"] = tr("latency.kchart_title", batch=batch)
        chart(charts.kv_vs_weights_chart(tokens, [roof.kv_bytes(n, batch) for n in tokens], roof.weight_bytes,
                                         view.crossing, kv_labels, lecture=lecture), "latency_kv_weights")
    if not lecture:  # on a projector it is folded under the bounds
        st.caption(tr("latency.roof_note"))


def bounds(view: lessons.RoofView, lecture: bool) -> None:
    """The decode bound in words and four cards: TPOT and prefill bounds, where compute takes over, what fits.
    In lecture mode the longer notes under the cards go into one fold below them."""
    st.markdown(lessons.decode_text(view, lang()))
    folded: list[str] = []
    for column, card in zip(st.columns(4), lessons.bound_cards(view, lang()), strict=True):
        column.metric(card.label, card.value)
        if card.alert is not None:
            getattr(column, card.alert[0])(card.alert[1])
        for text, short in card.notes:
            if lecture and not short:
                folded.append(f"- **{card.label}:** {text}")
            else:
                column.caption(text)
    if folded:
        with st.expander(tr("latency.roof_details")):
            st.markdown("\n".join(folded) + "\n\n" + tr("latency.roof_note"))


# ---- a lecture room --------------------------------------------------------------------------------------------
def room_view(shown: list[str], roof: dict | None, model: str) -> dict:
    """What a lecture room's followers draw of this page, as JSON: the ideas on screen, each shown sweep's rows once
    it has finished (while it runs, only that it does), the model they ran on and the roofline's inputs (None: not
    on screen)."""
    sweeps = {}
    for name in shown:
        run = LC.get(f"run_{KIND[name]}") if name in SWEEPS else None
        if run is not None:
            sweeps[name] = {"rows": run.rows} if run.finished else {"measuring": True}
    return {"shown": shown, "sweeps": sweeps, "roof": roof, "model": model}


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Latency & Capacity: the lecturer's finished sweeps and roofline, the ideas on the
    lecturer's screen (all of them when the lecturer is not in lecture mode), in this session's language; no model
    runs here, no setting of this session's is drawn."""
    explore_from(view, "latency", help_key="room.explore_measure_help")
    if view["sweeps"]:
        st.caption(tr("room.lecturers_model", model=view["model"]))
    for name in view["shown"]:
        if name not in SWEEPS:
            continue
        st.subheader(tr(f"latency.idea_{name}"))
        sweep = view["sweeps"].get(name)
        if sweep is None:
            st.info(tr("room.waiting_run"))
        elif "rows" not in sweep:
            st.info(tr("room.measuring"))
        else:
            results(lecture, KIND[name], sweep["rows"], PANELS[name][2])
    parts = tuple(name.removeprefix("roof_") for name in view["shown"] if name.startswith("roof_"))
    if parts and view["roof"] is not None:
        if len(parts) == 1:
            st.subheader(tr(f"latency.idea_roof_{parts[0]}"))
        roof_figures(view["roof"], parts, lecture)
