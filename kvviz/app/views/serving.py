"""What the Serving Engine page draws, beyond its buttons: the session keys it keeps (`SV`), the connected server's
model, endpoint and KV shape with kvviz's bound beside it (`connection_details`), the load run's settings
(`load_settings`) and results (`sweep_results`), the prefix experiment's settings (`prefix_settings`), results
(`prefix_results`) and trials (`prefix_details`). What a run measures comes from kvviz.serving as a WorkerState
and is laid out by kvviz.serving.results; nothing here measures or imports torch."""
from __future__ import annotations

import json
import tempfile
from functools import partial
from pathlib import Path

import streamlit as st

from kvviz.app.language import lang, show_error, tr
from kvviz.app.room.view import RoomView
from kvviz.app.state import page_state
from kvviz.app.views.kv_events import draw_attribution, draw_run_clock
from kvviz.app.views.kv_events import follow as follow_kv_events
from kvviz.app.views.kv_events import run_shown as kv_run_shown
from kvviz.app.views.kv_events import shown as kv_events_shown
from kvviz.app.widgets import chart, current_number, number_in_range, table
from kvviz.charts import serving as charts
from kvviz.errors import InputError
from kvviz.kv.formats import KV_DTYPES
from kvviz.kv.formula import kv_footprint
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import PRESETS
from kvviz.kv.roofline import Roofline
from kvviz.serving.bench import Limits, error_from
from kvviz.serving.report import known_shape
from kvviz.serving.results import (
    CROSSCHECK_COLUMNS,
    REQUEST_COLUMNS,
    WINDOW_COLUMNS,
    Sweep,
    prefix_rule,
    stat_keys,
    x_label,
)
from kvviz.serving.worker import WorkerState
from kvviz.serving.workload import read_dataset
from kvviz.units import format_exact, format_fixed, format_ms

# The keys the page keeps besides its widgets': the connection, each worker (load run, prefix experiment) with
# its last WorkerState and whether the page saw it running, the start errors, the dataset in use.
SV = page_state("serving", conn=None, conn_error=None, worker=None, state=None, was_running=False, start_error=None,
                dataset=None, dataset_error=None, dataset_n=0, prefix_worker=None, prefix_state=None,
                prefix_error=None, prefix_was_running=False)
# Lecture mode, at 1280×720 under the title row, the idea stepper and the buttons, each chart with what its idea
# shows under or over it and a line to spare: the load chart over 3–4 lines of result, the gauges under the
# counters' table, the prefix chart over its result.
LECTURE_LOAD_PX = 330
LECTURE_METRICS_PX = 260
LECTURE_PREFIX_PX = 300


# tenths of a millisecond: a server's TTFT over HTTP varies by more than that from one request to the next
server_ms = partial(format_ms, digits=1)
def error_text(d: dict | None) -> str:
    exc = error_from(d)
    return "" if exc is None else exc.message(lang())


def show_table(rows: list[dict], cols: dict[str, str], key: str) -> None:
    """Rows of result keys as a table under the translated headers, less the columns nobody measured."""
    import pandas as pd  # ~1,000 modules with pyarrow: not before the page's title

    df = pd.DataFrame([{cols[k]: r.get(k) for k in cols} for r in rows])
    table(df.dropna(axis=1, how="all"), key)


def connection_details(conn: dict, lecture: bool) -> int | None:
    """The served model and endpoint, its KV shape and dtype (found, reported or picked; unknown until then) and,
    once both are known, kvviz's roofline bound for one request on the GPU the user names. Returns the KV bytes
    per token once both are known (the cache events' bytes), else None."""
    ss = st.session_state
    m1, m2 = st.columns([3, 2])
    m1.selectbox(tr("serving.model"), conn["models"], key="serving_model")
    m2.radio(tr("serving.endpoint"), ("completions", "chat"), key="serving_endpoint", horizontal=True,
             help=tr("serving.endpoint_help"))
    st.caption(tr("serving.connected", url=conn["url"], engine=conn["engine"] or tr("serving.unknown"),
                  n=len(conn["models"])))
    # The served model's KV shape: found from its id (a preset's repository, a local config.json, kvviz's own
    # model), or picked by hand from the presets when the id does not say; unknown until then, never a default.
    # Its KV dtype: as the server reports it (vLLM's cache_config_info), else picked by hand; unknown until then.
    found = known_shape(ss.serving_model or "")
    shapes = dict([found] if found is not None else []) | PRESETS
    k1, k2, k3 = st.columns([3, 3, 4] if lecture else [1, 1, 3])  # a popover's narrow boxes cut names
    picked = k1.selectbox(tr("serving.shape"), list(shapes), index=None if found is None else 0,
                          placeholder=tr("serving.shape_pick"), key=f"serving_shape_{ss.serving_model}",
                          help=tr("serving.shape_help"))
    dtypes = list(KV_DTYPES)
    reported = conn.get("kv_dtype")
    kv_dtype = k2.selectbox(tr("serving.kv_dtype"), dtypes, index=dtypes.index(reported) if reported else None,
                            placeholder=tr("serving.shape_pick"), key=f"serving_kv_dtype_{ss.serving_model}",
                            help=tr("serving.kv_dtype_help"))
    if picked is None:
        k3.caption(tr("serving.kv_unknown", model=ss.serving_model))
        return None
    if kv_dtype is None:
        k3.caption(tr("serving.kv_dtype_unknown", shape=picked))
        return None
    per_token = kv_footprint(shapes[picked], 1, 1, kv_dtype).per_token
    source = "kv_known" if found is not None and picked == found[0] else "kv_picked"
    k3.caption(tr(f"serving.{source}", shape=picked, size=format_exact(per_token), dtype=kv_dtype,
                  dtype_source=tr("serving.dtype_reported" if kv_dtype == reported else "serving.dtype_picked")))
    # kvviz's own bound for the same shape on the GPU the user names: one request, mid-way through a request
    g1, g2 = st.columns([1, 3])
    gpu = g1.selectbox(tr("serving.gpu"), list(HARDWARE), key="serving_gpu")
    n_context = current_number("serving_prompt", 128) + current_number("serving_max_tokens", 32) // 2
    try:
        bound = Roofline(shapes[picked], HARDWARE[gpu], kv_dtype=kv_dtype).decode_bound(batch=1, n_context=n_context)
        g2.caption(tr("serving.roofline", gpu=gpu, n=f"{n_context:,}", tpot=f"{bound.seconds * 1e3:.3g} ms",
                      limit=tr(f"serving.limit_{bound.limited_by}")))
    except InputError as exc:
        g2.caption(exc.message(lang()))
    return per_token


def _dataset_upload() -> None:
    """A dataset file (vLLM's ShareGPT-style JSON, or JSONL) whose prompts replace the random ones."""
    n_up = SV.get("dataset_n")
    upload = st.file_uploader(tr("serving.dataset_upload"), type=["json", "jsonl"], key=f"serving_dataset_{n_up}",
                              help=tr("serving.dataset_help"))
    if upload is not None:
        # A fresh, empty uploader after every file read (Streamlit's replace can lose the new file).
        path = Path(tempfile.mkdtemp(prefix="kvviz-dataset-")) / Path(upload.name).name
        path.write_bytes(upload.getvalue())
        try:
            n_pairs = len(read_dataset(path))
            SV.set("dataset", {"name": upload.name, "path": str(path), "n": n_pairs})
            SV.set("dataset_error", None)
        except (InputError, UnicodeDecodeError) as exc:
            SV.set("dataset_error", exc if isinstance(exc, InputError) else InputError(
                "serving.bad_dataset", path=upload.name, detail="not UTF-8 text"))
        SV.set("dataset_n", n_up + 1)
        st.rerun()
    if SV.get("dataset_error"):
        show_error(SV.get("dataset_error"))
    dataset = SV.get("dataset")
    if dataset:
        d1, d2 = st.columns([3, 1])
        d1.caption(tr("serving.dataset_in_use", name=dataset["name"], n=dataset["n"]))
        d2.button(tr("serving.dataset_clear"), key="serving_dataset_clear", on_click=SV.set, args=("dataset", None))


def load_settings(limits: Limits, first: dict[str, float]) -> str:
    """The load run's boxes (`first`: their first values, results.load_defaults); returns the mode picked."""
    st.write(tr("serving.sweep_intro"))
    mode_names = {m: tr(f"serving.mode_{m}") for m in ("closed", "open")}  # bound now, not at each format call
    mode = st.radio(tr("serving.mode"), tuple(mode_names), key="serving_mode", horizontal=True,
                    format_func=mode_names.__getitem__, help=tr("serving.mode_help"))

    s1, s2, s3 = st.columns(3)
    if mode == "closed":
        s1.text_input(tr("serving.concurrency"), "1, 2, 4", key="serving_conc")
    else:
        s1.text_input(tr("serving.rates"), "1, 2, 4", key="serving_rates", help=tr("serving.rates_help"))
        number_in_range(s2, tr("serving.max_concurrency"), 0, limits.max_concurrency, first["maxc"], "serving_maxc",
                        help=tr("serving.max_concurrency_help"))
        number_in_range(s3, tr("serving.burstiness"), 0.05, 100.0, first["burst"], "serving_burst", whole=False,
                        step=0.25, help=tr("serving.burstiness_help"))
    w1, w2, w3, w4, w5 = st.columns(5)
    number_in_range(w1, tr("serving.requests"), 1, limits.max_requests, first["requests"], "serving_requests")
    number_in_range(w2, tr("serving.prompt_tokens"), 1, limits.max_prompt_tokens, first["prompt"], "serving_prompt")
    number_in_range(w3, tr("serving.max_tokens"), 2, limits.max_tokens, first["max_tokens"], "serving_max_tokens")
    number_in_range(w4, tr("serving.range_ratio"), 0.0, 0.95, first["range"], "serving_range", whole=False, step=0.1,
                    help=tr("serving.range_ratio_help"))
    number_in_range(w5, tr("serving.prefix_len"), 0, limits.max_prompt_tokens, first["prefix_len"],
                    "serving_prefix_len",
                    help=tr("serving.prefix_len_help"))
    g1, g2, g3 = st.columns(3)
    number_in_range(g1, tr("serving.warmups"), 0, limits.max_warmups, first["warmups"], "serving_warmups",
                    help=tr("serving.warmups_help"))
    number_in_range(g2, tr("serving.slo_ttft"), 0.0, 600_000.0, first["slo_ttft"], "serving_slo_ttft", whole=False,
                    step=50.0, help=tr("serving.slo_help"))
    number_in_range(g3, tr("serving.slo_tpot"), 0.0, 600_000.0, first["slo_tpot"], "serving_slo_tpot", whole=False,
                    step=5.0, help=tr("serving.slo_help"))
    with st.expander(tr("serving.dataset")):
        _dataset_upload()
    return mode


# The points table's own columns, before each metric's statistics: vLLM's result key -> its header's locale key.
POINT_HEADERS = {"x": "col_x", "completed": "col_completed", "failed": "col_failed", "duration": "col_duration",
                 "request_throughput": "col_rps", "request_goodput": "col_goodput", "output_throughput": "col_tps"}


def _point_columns(points: list[dict]) -> dict[str, str]:
    """The points table's columns: kvviz/vLLM key -> translated header."""
    cols = {k: tr(f"serving.{name}") for k, name in POINT_HEADERS.items()}
    for key, metric, stat in stat_keys(points):
        cols[key] = tr("serving.col_stat", metric=tr(f"serving.metric_{metric}"),
                       stat=tr(f"serving.stat_{stat}") if stat in ("mean", "median") else stat)
    return cols


def sweep_results(state: WorkerState | None, *, n_requests: int, live_charts: bool, lecture: bool,
                  on_screen, kv_run: dict | None = None) -> None:  # noqa: ANN001 - on_screen(idea name) -> bool
    """A load run as its worker last wrote it: progress, errors and notes, then (once it ends, or while it runs
    when live charts are on) the load chart, the points table, the server's counters and clock, the request
    timeline, the gauges, the download and every request. kv_run: the run beside the server's KV events
    (kvviz.app.views.kv_events.run_view): blocks stored and removed under the timeline, on its clock, and each
    request attributed to the cached blocks."""
    if state is None:
        st.info(tr("serving.idle"))
        return
    sweep = Sweep(state.result or {})
    done, total = sweep.progress(n_requests)
    status = {"starting": "running"}.get(state.status, state.status)
    if not lecture or status != "done":  # on a projector a finished run's results say it
        st.progress(min(1.0, done / max(1, total)), text=tr(f"serving.progress_{status}", done=done, total=total))
    failure = state.failure()
    if failure is not None:
        st.error(failure.message(lang()))
    for note in sweep.notes:
        st.warning(error_text(note))
    if sweep.run.get("usage_fallback"):
        st.warning(tr("serving.usage_fallback"))
    if sweep.run.get("eos_may_stop"):
        st.info(tr("serving.eos_may_stop"))
    points, xs = sweep.points, sweep.xs
    prompts = None if sweep.exact_prompts is None else tr(
        "serving.prompts_exact" if sweep.exact_prompts else "serving.prompts_text")
    if prompts and not lecture:  # on a projector it heads the folded table of every request
        st.caption(prompts)
    if not state.final and not live_charts:
        # Drawing charts costs CPU, in this process and in the browser: on a machine that also runs the
        # server, that CPU is the server's, and the numbers would describe a slower server.
        st.caption(tr("serving.quiet_while_measuring"))
        return
    untitled = {"title": ""} if lecture else {}  # a chart whose idea's title, on a projector, names it
    if points and on_screen("load"):
        chart(charts.load_chart(points, xs, {k: tr(f"serving.cc_{k}") for k in (
            "title", "latency", "throughput", "ttft_median", "ttft_p90", "ttft_p99", "tpot_median", "tpot_p90",
            "tpot_p99", "tokens_per_s", "requests_per_s", "goodput", "y_ms", "y_tps", "y_rps")}
            | {"x": tr("serving.cc_x" if sweep.closed else "serving.cc_x_rate")}
            | untitled, lecture=lecture, lecture_height=LECTURE_LOAD_PX), "serving_load")
        ends = sweep.first_last()
        if ends is not None:
            st.markdown(tr("serving.sweep_result", c0=ends["c0"], c=ends["c"],
                           **{k: format_fixed(ends[k]) for k in ("first_ttft", "ttft", "first_tpot", "tpot",
                                                                "first_tps", "tps")},
                           ratio=format_fixed(ends["ratio"], 2),
                           source=tr({"usage": "serving.n_usage", "tokenizer": "serving.n_text",
                                      "messages": "serving.n_chunks"}[ends["n_source"]])))
    if points and on_screen("numbers"):
        show_table(sweep.point_rows(), _point_columns(points), "serving_points")
    windows = sweep.window_rows()
    if windows and on_screen("counters"):
        st.markdown(tr("serving.window_header"))
        show_table(windows, {k: tr(f"serving.win_{k}") for k in WINDOW_COLUMNS}, "serving_window")
    if on_screen("numbers") and sweep.has_server_clock():
        st.markdown(tr("serving.crosscheck_header"))
        agree = sweep.clocks_agree()
        if agree is not None:
            st.caption(tr("serving.clocks_agree" if agree else "serving.clocks_disagree"))
        show_table(sweep.crosscheck_rows(), {k: tr(f"serving.xc_{k}") for k in CROSSCHECK_COLUMNS},
                   "serving_crosscheck")
    shown = sweep.timeline_point()
    rates = (kv_run or {}).get("rates")  # the server's blocks per second under the requests, on their clock
    if shown and shown.get("requests") and on_screen("timeline"):
        chart(charts.request_timeline(shown["requests"], {k: tr(f"serving.tl_{k}") for k in (
            "title", "queue", "ttft", "decode", "x", "y")} | {"title": tr("serving.tl_title", x=x_label(shown))}
            | {k: tr(f"kv_events.{k}") for k in ("stored", "removed")} | {"rates_y": tr("kv_events.run_rates_y")},
            lecture=lecture, rates=rates, x_max_ms=kv_run["x_max_ms"] if rates else None), "serving_timeline")
        if rates:
            draw_run_clock(kv_run)
    samples = sweep.gauge_samples()
    if samples and on_screen("counters"):
        chart(charts.metrics_chart(samples, {k: tr(f"serving.mc_{k}") for k in (
            "title", "cache", "requests", "kv_usage", "running", "waiting", "not_exported", "x", "y_pct",
            "y_count")} | untitled, lecture=lecture, lecture_height=LECTURE_METRICS_PX), "serving_metrics")
    if points and state.final and on_screen("numbers"):
        if not lecture:  # nobody downloads from a projector (as widgets.table's CSV)
            st.download_button(tr("serving.download_json"), json.dumps(sweep.result_files()),
                               file_name="serving_results.json", mime="application/json", key="serving_download")
        with st.expander(tr("serving.per_request")):
            if prompts and lecture:
                st.caption(prompts)
            show_table(sweep.request_rows(), {k: tr(f"serving.req_{k}") for k in REQUEST_COLUMNS},
                       "serving_requests")
    if state.final and on_screen("numbers"):
        draw_attribution(kv_run, lecture=lecture)


def prefix_settings(limits: Limits, first: dict[str, float], block_size: int | None) -> None:
    st.write(tr("serving.prefix_intro"))
    p1, p2, p3 = st.columns(3)
    number_in_range(p1, tr("serving.prefix_words"), 8, limits.max_prompt_tokens, first["prefix_words"],
                    "serving_prefix_words")
    number_in_range(p2, tr("serving.prefix_repeats"), 1, 10, first["prefix_repeats"], "serving_prefix_repeats")
    number_in_range(p3, tr("serving.block_size"), 1, 256, block_size or 16, "serving_block",
                    help=tr("serving.block_help"))


def _rule_text(result: dict) -> str:
    """Which prompt tokens the engine can serve from its cache (the prediction's rule)."""
    return tr(f"serving.rule_{prefix_rule(result['engine'])}", block=result["block_size"] or "?")


def _trials_table(result: dict) -> None:
    show = [{**r, "request": tr(f"serving.pc_{r['request']}")} for r in result["rows"]]
    show_table(show, {k: tr(f"serving.pr_{k}") for k in (
        "trial", "position", "request", "prompt_tokens", "shared_tokens", "cached_tokens", "predicted_cached_tokens",
        "ttft_s", "server_prefill_s", "error")}, "serving_prefix")


def prefix_details(result: dict) -> None:
    """The prediction's rule and every trial (on a projector, folded beside the Run button)."""
    st.markdown(_rule_text(result))
    _trials_table(result)


def prefix_results(state: WorkerState | None, lecture: bool) -> None:
    """The prefix experiment as its worker last wrote it: TTFT cold, warm and control, and what the prefix saved by
    the client's clock and the server's, each with its verdict."""
    if state is None:
        return
    if not state.final:
        st.info(tr("serving.prefix_running"))
    if state.error:
        st.error(error_text(state.error))
    result = state.result
    if not result:
        return
    s = result["summary"]
    if not lecture:  # on a projector the rule and the trials' table are folded beside the Run button
        st.markdown(_rule_text(result))
    chart(charts.prefix_chart(result["rows"], {k: tr(f"serving.pc_{k}") for k in (
        "title", "ttft", "saving", "cached", "cold", "warm", "control", "saving_client", "saving_server",
        "measured", "predicted", "x", "y_ms", "y_tokens")} | ({"title": ""} if lecture else {}), lecture=lecture,
        lecture_height=LECTURE_PREFIX_PX), "serving_prefix")

    def saving(v: dict) -> str:
        if v["verdict"] is None:
            return tr("serving.saving_unknown")
        return tr("serving.saving", median=server_ms(v["median_s"]), low=server_ms(v["low_s"]),
                  high=server_ms(v["high_s"]), n=v["n"], verdict=tr(f"serving.verdict_{v['verdict']}"))

    st.markdown(tr("serving.prefix_result", cold=server_ms(s["ttft_cold_p50_s"]), warm=server_ms(s["ttft_warm_p50_s"]),
                   control=server_ms(s["ttft_control_p50_s"]), saved=saving(s["saving"]),
                   server_saved=saving(s["server_saving"])))
    if not lecture:
        _trials_table(result)


# ---- a lecture room --------------------------------------------------------------------------------------------
LOAD_IDEAS = ("load", "timeline", "counters", "numbers")  # the load run's screens in lecture mode


def room_view(shown: str | None, conn: dict, n_requests: int, live_charts: bool) -> dict:
    """What a lecture room's followers draw of this page, as JSON: the idea on screen (None: all), the server's
    engine and model, and the load run's and the prefix experiment's latest states as their workers wrote them
    (numbers only; a follower never connects to the server)."""
    def state(name: str) -> dict | None:
        s = SV.get(name)
        return None if s is None else {"kind": s.kind, "status": s.status, "result": s.result, "error": s.error}

    return {"shown": shown, "engine": conn.get("engine"), "model": st.session_state.get("serving_model"),
            "n_requests": n_requests, "live_charts": live_charts, "load": state("state"),
            "prefix": state("prefix_state"), "kv_events": kv_events_shown(), "kv_run": kv_run_shown()}


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Serving Engine: the lecturer's load run and prefix experiment as their workers last
    wrote them, the idea on the lecturer's screen (all when the lecturer is not in lecture mode), in this session's
    language; no server is reached from here, no box of this session's is drawn."""
    shown = view["shown"]

    def on_screen(name: str) -> bool:
        return shown is None or shown == name

    st.caption(tr("serving.room_server", engine=view["engine"] or "?", model=view["model"] or "?"))
    if shown == "kv_events" or (shown is None and view.get("kv_events") is not None):
        st.subheader(tr("kv_events.tab"))
        follow_kv_events(view.get("kv_events"), lecture=lecture)
    if shown is None or shown in LOAD_IDEAS:
        if shown is None:
            st.subheader(tr("serving.tab_sweep"))
        load = view["load"]
        sweep_results(None if load is None else WorkerState.from_dict(load), n_requests=view["n_requests"],
                      live_charts=view["live_charts"], lecture=lecture, on_screen=on_screen,
                      kv_run=view.get("kv_run"))
    if on_screen("prefix"):
        st.subheader(tr("serving.tab_prefix"))
        prefix = None if view["prefix"] is None else WorkerState.from_dict(view["prefix"])
        if prefix is None:
            st.info(tr("room.waiting_run"))
        else:
            prefix_results(prefix, lecture)
            if lecture and prefix.result:  # the page's own folds them beside its Run button
                with st.expander(tr("serving.prefix_details")):
                    prefix_details(prefix.result)
    if on_screen("definitions"):
        st.subheader(tr("serving.tab_defs"))
        st.markdown(tr("serving.definitions"))
        st.markdown(tr("serving.definitions_load"))
        st.markdown(tr("serving.definitions_why"))
