"""Serving Engine: measure a live OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI) as `vllm bench serve`
does: TTFT, TPOT, ITL and E2E percentiles, throughput and goodput against concurrency or request rate, the
server's own counters over each point, and what a shared prefix saves. The measuring runs in a worker process
(kvviz.serving.worker, the code `serve-bench` runs); this page only starts it and reads what it writes."""
import json
import os
import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

from kvviz.app.language import lang, show_error, tr
from kvviz.app.lecture import idea_title, intro_box, lecture_head, lecture_tabs, settings_box, shown_idea
from kvviz.app.models import secrets_dict
from kvviz.app.navigation import link_to
from kvviz.app.shell import page_setup
from kvviz.app.widgets import chart, current_number, number_in_range, table
from kvviz.charts import serving as charts
from kvviz.errors import InputError
from kvviz.kv.formula import KV_DTYPES, kv_footprint
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import PRESETS
from kvviz.kv.roofline import Roofline
from kvviz.serving import client as api
from kvviz.serving import policy
from kvviz.serving.bench import METRICS, BenchPlan, check_plan, closed_loop, error_from, open_loop, vllm_result
from kvviz.serving.report import describe_server, known_shape
from kvviz.serving.worker import FINAL, Worker
from kvviz.serving.workload import Workload, read_dataset
from kvviz.units import format_exact

# How often the page reads the worker's state while it runs, drawing live or not: each rerun costs CPU that a
# server on this machine would use (~0.1 s of it per rerun on a busy 2-core machine).
TICK_S = {True: 1.0, False: 5.0}
# Lecture mode, at 1280×720 under the title row, the idea stepper and the buttons, each chart with what its idea
# shows under or over it and a line to spare: the load chart over 3–4 lines of result, the gauges under the
# counters' table, the prefix chart over its result.
LECTURE_LOAD_PX = 330
LECTURE_METRICS_PX = 260
LECTURE_PREFIX_PX = 300

settings = page_setup("serving.title")
ss, lecture = st.session_state, settings.lecture
# In lecture mode one row holds the title, the introduction (folded) and the server's settings (behind a button);
# then one idea per screen: the load sweep's four views, the prefix experiment, the definitions.
intro_at, server_at = lecture_head(tr("serving.title"), widths=(2, 2))
with intro_at, intro_box():
    st.write(tr("serving.intro"))
caps = settings.hosted
secrets = secrets_dict()
limits = policy.limits(caps.max_sweep_points, caps.max_new_tokens) if caps else policy.limits()


# The load and prefix boxes' defaults; a callback (Start) reads a box with num(): what it would accept, else the last.
LOAD = {"sv_maxc": 0, "sv_burst": 1.0, "sv_requests": min(8, limits.max_requests),
        "sv_prompt": min(128, limits.max_prompt_tokens), "sv_max_tokens": min(32, limits.max_tokens), "sv_range": 0.0,
        "sv_prefix_len": 0, "sv_warmups": 1, "sv_slo_ttft": 0.0, "sv_slo_tpot": 0.0,
        "sv_prefix_words": min(256, limits.max_prompt_tokens), "sv_prefix_repeats": 5}


def num(key: str) -> float:
    return current_number(key, LOAD[key])


def fmt_ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.1f} ms"


def fmt_num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def error_text(d: dict | None) -> str:
    exc = error_from(d)
    return "" if exc is None else exc.message(lang())


# ---- connection -------------------------------------------------------------------------------------
def server() -> api.Server:
    url = policy.check_url(ss.sv_url, policy.allowlist(os.environ, secrets)) if caps else ss.sv_url
    return api.Server(url, env_key or ss.get("sv_api_key") or None, float(current_number("sv_timeout")))


def connect() -> None:
    try:
        srv = server()
        info = describe_server(srv)
        ss.sv_conn, ss.sv_conn_error = {**info, "url": srv.base_url}, None
    except InputError as exc:
        ss.sv_conn_error = exc  # the last connection and its results stay


with server_at, settings_box(tr("serving.server_settings")):
    idea_title(tr("serving.connect_header"), small=True)
    c1, c2, c3 = st.columns([3, 2, 1])
    if caps is not None:
        allowed = policy.allowlist(os.environ, secrets)
        if not allowed:
            st.error(tr("serving.no_allowlist"))
            st.stop()
        c1.selectbox(tr("serving.url"), allowed, key="sv_url", help=tr("serving.url_hosted_help"))
    else:
        c1.text_input(tr("serving.url"), "http://127.0.0.1:8080", key="sv_url", help=tr("serving.url_help"))
    env_key = policy.api_key(os.environ, secrets)
    if env_key:
        c2.caption(tr("serving.key_from_env", var=policy.ENV_KEY))
    else:
        c2.text_input(tr("serving.api_key"), type="password", key="sv_api_key", help=tr("serving.api_key_help"))
    max_timeout = policy.HOSTED_TIMEOUT_S if caps else 600.0
    number_in_range(c3, tr("serving.timeout_label"), 1.0, max_timeout, min(30.0, max_timeout), "sv_timeout",
                    whole=False)
    st.button(tr("serving.connect"), on_click=connect, type="primary")
    if ss.get("sv_conn_error"):
        show_error(ss.sv_conn_error)
    conn = ss.get("sv_conn")
    if conn is not None:
        m1, m2 = st.columns([3, 2])
        m1.selectbox(tr("serving.model"), conn["models"], key="sv_model")
        m2.radio(tr("serving.endpoint"), ("completions", "chat"), key="sv_endpoint", horizontal=True,
                 help=tr("serving.endpoint_help"))
        st.caption(tr("serving.connected", url=conn["url"], engine=conn["engine"] or tr("serving.unknown"),
                      n=len(conn["models"])))
        # The served model's KV shape: found from its id (a preset's repository, a local config.json, kvviz's own
        # model), or picked by hand from the presets when the id does not say; unknown until then, never a default.
        # Its KV dtype: as the server reports it (vLLM's cache_config_info), else picked by hand; unknown until then.
        found = known_shape(ss.sv_model or "")
        shapes = dict([found] if found is not None else []) | PRESETS
        k1, k2, k3 = st.columns([3, 3, 4] if lecture else [1, 1, 3])  # a popover's narrow boxes cut names
        picked = k1.selectbox(tr("serving.shape"), list(shapes), index=None if found is None else 0,
                              placeholder=tr("serving.shape_pick"), key=f"sv_shape_{ss.sv_model}",
                              help=tr("serving.shape_help"))
        dtypes = list(KV_DTYPES)
        reported = conn.get("kv_dtype")
        kv_dtype = k2.selectbox(tr("serving.kv_dtype"), dtypes, index=dtypes.index(reported) if reported else None,
                                placeholder=tr("serving.shape_pick"), key=f"sv_kv_dtype_{ss.sv_model}",
                                help=tr("serving.kv_dtype_help"))
        if picked is None:
            k3.caption(tr("serving.kv_unknown", model=ss.sv_model))
        elif kv_dtype is None:
            k3.caption(tr("serving.kv_dtype_unknown", shape=picked))
        else:
            per_token = kv_footprint(shapes[picked], 1, 1, kv_dtype).per_token
            source = "kv_known" if found is not None and picked == found[0] else "kv_picked"
            k3.caption(tr(f"serving.{source}", shape=picked, size=format_exact(per_token),
                          dtype=kv_dtype, dtype_source=tr("serving.dtype_reported" if kv_dtype == reported
                                                          else "serving.dtype_picked")))
            # kvviz's own bound for the same shape on the GPU the user names: one request, mid-way through a request
            g1, g2 = st.columns([1, 3])
            gpu = g1.selectbox(tr("serving.gpu"), list(HARDWARE), key="sv_gpu")
            n_context = current_number("sv_prompt", 128) + current_number("sv_max_tokens", 32) // 2
            try:
                roofline = Roofline(shapes[picked], HARDWARE[gpu], kv_dtype=kv_dtype)
                bound = roofline.decode_bound(batch=1, n_context=n_context)
                g2.caption(tr("serving.roofline", gpu=gpu, n=f"{n_context:,}", tpot=f"{bound.seconds * 1e3:.3g} ms",
                              limit=tr(f"serving.limit_{bound.limited_by}")))
            except InputError as exc:
                g2.caption(exc.message(lang()))
if conn is None:
    st.info(tr("serving.not_connected"))
    st.stop()

# Three tabs; in lecture mode six screens: the load tab's results one view per screen, then the prefix and the
# definitions (`view`: the one on screen, None when all are).
IDEAS = {"load": 0, "timeline": 0, "counters": 0, "numbers": 0, "prefix": 1, "definitions": 2}  # idea -> its tab
tab_load, tab_prefix, tab_defs = lecture_tabs(
    [tr("serving.tab_sweep"), tr("serving.tab_prefix"), tr("serving.tab_defs")], "serving",
    screens=[(tab, tr(f"serving.idea_{name}")) for name, tab in IDEAS.items()])
view = None if shown_idea("serving") is None else list(IDEAS)[shown_idea("serving")]

untitled = {"title": ""} if lecture else {}  # a chart whose idea's title, on a projector, names it


def on_screen(name: str) -> bool:
    return view is None or view == name


def poll(worker_key: str, state_key: str) -> dict | None:
    """The worker's latest state; once it is final, kept in the session and the worker's files removed."""
    worker: Worker | None = ss.get(worker_key)
    if worker is not None:
        ss[state_key] = worker.state()
        if ss[state_key]["status"] in FINAL and not worker.running:
            worker.close()
            ss[worker_key] = None
    return ss.get(state_key)


def is_running(worker_key: str) -> bool:
    return ss.get(worker_key) is not None


def parse_list(text: str, kind: type) -> list:
    return [kind(p) for p in text.replace(" ", "").split(",") if p]


# ---- load: concurrency or request rate -------------------------------------------------------------------
with tab_load:
    # on a projector one row: Start, Cancel, the load's settings (and what they mean) behind a button, live drawing
    row = st.columns([1, 1.2, 2, 4], vertical_alignment="center") if lecture else None
    with row[2] if row else st.container(), settings_box(tr("serving.load_settings")):
        st.write(tr("serving.sweep_intro"))
        mode_names = {m: tr(f"serving.mode_{m}") for m in ("closed", "open")}  # bound now, not at each format call
        mode = st.radio(tr("serving.mode"), tuple(mode_names), key="sv_mode", horizontal=True,
                        format_func=mode_names.__getitem__, help=tr("serving.mode_help"))
        s1, s2, s3 = st.columns(3)
        if mode == "closed":
            s1.text_input(tr("serving.concurrency"), "1, 2, 4", key="sv_conc")
        else:
            s1.text_input(tr("serving.rates"), "1, 2, 4", key="sv_rates", help=tr("serving.rates_help"))
            number_in_range(s2, tr("serving.max_concurrency"), 0, limits.max_concurrency, LOAD["sv_maxc"], "sv_maxc",
                            help=tr("serving.max_concurrency_help"))
            number_in_range(s3, tr("serving.burstiness"), 0.05, 100.0, LOAD["sv_burst"], "sv_burst", whole=False,
                            step=0.25, help=tr("serving.burstiness_help"))
        w1, w2, w3, w4, w5 = st.columns(5)
        number_in_range(w1, tr("serving.requests"), 1, limits.max_requests, LOAD["sv_requests"], "sv_requests")
        number_in_range(w2, tr("serving.prompt_tokens"), 1, limits.max_prompt_tokens, LOAD["sv_prompt"], "sv_prompt")
        number_in_range(w3, tr("serving.max_tokens"), 2, limits.max_tokens, LOAD["sv_max_tokens"], "sv_max_tokens")
        number_in_range(w4, tr("serving.range_ratio"), 0.0, 0.95, LOAD["sv_range"], "sv_range", whole=False, step=0.1,
                        help=tr("serving.range_ratio_help"))
        number_in_range(w5, tr("serving.prefix_len"), 0, limits.max_prompt_tokens, LOAD["sv_prefix_len"],
                        "sv_prefix_len", help=tr("serving.prefix_len_help"))
        g1, g2, g3 = st.columns(3)
        number_in_range(g1, tr("serving.warmups"), 0, limits.max_warmups, LOAD["sv_warmups"], "sv_warmups",
                        help=tr("serving.warmups_help"))
        number_in_range(g2, tr("serving.slo_ttft"), 0.0, 600_000.0, LOAD["sv_slo_ttft"], "sv_slo_ttft", whole=False,
                        step=50.0, help=tr("serving.slo_help"))
        number_in_range(g3, tr("serving.slo_tpot"), 0.0, 600_000.0, LOAD["sv_slo_tpot"], "sv_slo_tpot", whole=False,
                        step=5.0, help=tr("serving.slo_help"))
        with st.expander(tr("serving.dataset")):
            n_up = ss.setdefault("sv_dataset_n", 0)
            upload = st.file_uploader(tr("serving.dataset_upload"), type=["json", "jsonl"], key=f"sv_dataset_{n_up}",
                                      help=tr("serving.dataset_help"))
            if upload is not None:
                # A fresh, empty uploader after every file read (Streamlit's replace can lose the new file).
                path = Path(tempfile.mkdtemp(prefix="kvviz-dataset-")) / Path(upload.name).name
                path.write_bytes(upload.getvalue())
                try:
                    n_pairs = len(read_dataset(path))
                    ss.sv_dataset, ss.sv_dataset_error = {"name": upload.name, "path": str(path), "n": n_pairs}, None
                except (InputError, UnicodeDecodeError) as exc:
                    ss.sv_dataset_error = exc if isinstance(exc, InputError) else InputError(
                        "serving.bad_dataset", path=upload.name, detail="not UTF-8 text")
                ss.sv_dataset_n = n_up + 1
                st.rerun()
            if ss.get("sv_dataset_error"):
                show_error(ss.sv_dataset_error)
            if ss.get("sv_dataset"):
                d1, d2 = st.columns([3, 1])
                d1.caption(tr("serving.dataset_in_use", name=ss.sv_dataset["name"], n=ss.sv_dataset["n"]))
                d2.button(tr("serving.dataset_clear"), key="sv_dataset_clear",
                          on_click=lambda: ss.update(sv_dataset=None))

    def plan() -> BenchPlan:
        try:
            if mode == "closed":
                points = closed_loop(parse_list(ss.sv_conc, int))
            else:
                points = open_loop(parse_list(ss.sv_rates, float), int(num("sv_maxc")) or None)
        except ValueError:
            raise InputError("serving.no_points") from None
        goodput = tuple((k, float(v)) for k, v in (("ttft", num("sv_slo_ttft")), ("tpot", num("sv_slo_tpot"))) if v > 0)
        dataset = ss.get("sv_dataset")
        workload = Workload(input_len=int(num("sv_prompt")), output_len=int(num("sv_max_tokens")),
                            range_ratio=float(num("sv_range")), prefix_len=int(num("sv_prefix_len")),
                            dataset_path=dataset["path"] if dataset else None)
        return BenchPlan(url=server().base_url, model=ss.sv_model, points=points, num_prompts=int(num("sv_requests")),
                         workload=workload, endpoint=ss.sv_endpoint, timeout_s=float(current_number("sv_timeout")),
                         burstiness=float(num("sv_burst")) if mode == "open" else 1.0,
                         num_warmups=int(num("sv_warmups")), goodput=goodput)

    def start() -> None:
        try:
            p = plan()
            check_plan(p, limits)
            if ss.get("sv_worker") is not None:
                ss.sv_worker.close()
            ss.sv_worker = Worker.bench(p, limits, env_key or ss.get("sv_api_key") or None)
            ss.sv_state, ss.sv_start_error, ss.sv_was_running = None, None, True
        except InputError as exc:
            ss.sv_start_error = exc  # the previous run's results stay on screen

    def cancel() -> None:
        if ss.get("sv_worker") is not None:
            ss.sv_worker.cancel()

    running = is_running("sv_worker")
    (row[3] if row else st).checkbox(tr("serving.live_charts"), key="sv_live_charts",
                                     help=tr("serving.live_charts_help"))
    b1, b2 = row[:2] if row else st.columns([1, 1, 4])[:2]
    b1.button(tr("serving.start"), on_click=start, disabled=running, type="primary", key="sv_start")
    b2.button(tr("serving.cancel"), on_click=cancel, disabled=not running, key="sv_cancel")
    if ss.get("sv_start_error"):
        show_error(ss.sv_start_error)

    def x_label(point: dict) -> str:
        if point["request_rate"] == "inf":
            return str(point["max_concurrency"]) if point["max_concurrency"] else "∞"
        rate = f"{point['request_rate']:g}/s"
        return rate if not point["max_concurrency"] else f"{rate} ≤{point['max_concurrency']}"

    def stat_columns(points: list[dict]) -> dict[str, str]:
        """The points table's columns: kvviz/vLLM key -> translated header."""
        cols = {"x": tr("serving.col_x"), "completed": tr("serving.col_completed"), "failed": tr("serving.col_failed"),
                "duration": tr("serving.col_duration"), "request_throughput": tr("serving.col_rps"),
                "request_goodput": tr("serving.col_goodput"), "output_throughput": tr("serving.col_tps")}
        pcts = [k.split("_")[0] for k in points[0] if k.startswith("p") and k.endswith("_ttft_ms")]
        for metric in METRICS:
            for stat in ("mean", "median", *pcts):
                cols[f"{stat}_{metric}_ms"] = tr("serving.col_stat", metric=tr(f"serving.metric_{metric}"),
                                                 stat=tr(f"serving.stat_{stat}") if stat in ("mean", "median")
                                                 else stat)
        return cols

    def show_table(rows: list[dict], cols: dict[str, str], key: str) -> None:
        df = pd.DataFrame([{cols[k]: r.get(k) for k in cols} for r in rows])
        table(df.dropna(axis=1, how="all"), key)

    def live() -> None:
        state = poll("sv_worker", "sv_state")
        if state is None:
            st.info(tr("serving.idle"))
            return
        if not is_running("sv_worker") and ss.get("sv_was_running"):  # its final state read, its process gone
            ss.sv_was_running = False
            st.rerun()  # the whole page: the fragment stops ticking and the buttons flip
        run = state.get("result") or {}
        progress = run.get("progress") or {"done": 0, "total": int(num("sv_requests"))}
        status = {"starting": "running"}.get(state["status"], state["status"])
        if not lecture or status != "done":  # on a projector a finished run's results say it
            st.progress(min(1.0, progress["done"] / max(1, progress["total"])),
                        text=tr(f"serving.progress_{status}", done=progress["done"], total=progress["total"]))
        if state.get("error") or run.get("error"):
            st.error(error_text(state.get("error") or run.get("error")))
        for note in run.get("notes", []):
            if note != run.get("error"):
                st.warning(error_text(note))
        if run.get("usage_fallback"):
            st.warning(tr("serving.usage_fallback"))
        if run.get("eos_may_stop"):
            st.info(tr("serving.eos_may_stop"))
        points = [p for p in run.get("points", []) if p["sent"]]
        current = run.get("current")
        prompts = None if run.get("exact_prompts") is None else tr(
            "serving.prompts_exact" if run["exact_prompts"] else "serving.prompts_text")
        if prompts and not lecture:  # on a projector it heads the folded table of every request
            st.caption(prompts)
        if state["status"] not in FINAL and not ss.get("sv_live_charts"):
            # Drawing charts costs CPU, in this process and in the browser: on a machine that also runs the
            # server, that CPU is the server's, and the numbers would describe a slower server.
            st.caption(tr("serving.quiet_while_measuring"))
            return
        xs = [x_label(p) for p in points]
        if points and on_screen("load"):
            closed = all(p["request_rate"] == "inf" for p in points)
            chart(charts.load_chart(points, xs, {k: tr(f"serving.cc_{k}") for k in (
                "title", "latency", "throughput", "ttft_median", "ttft_p90", "ttft_p99", "tpot_median", "tpot_p90",
                "tpot_p99", "tokens_per_s", "requests_per_s", "goodput", "y_ms", "y_tps", "y_rps")}
                | {"x": tr("serving.cc_x" if closed else "serving.cc_x_rate")}
                | untitled, lecture=lecture, lecture_height=LECTURE_LOAD_PX), "serving_load")
            if len(points) >= 2:
                first, last = points[0], points[-1]
                ratio = (last["output_throughput"] / first["output_throughput"]
                         if last["output_throughput"] and first["output_throughput"] else None)
                st.markdown(tr("serving.sweep_result", c0=xs[0], c=xs[-1],
                               first_ttft=fmt_num(first["median_ttft_ms"]), ttft=fmt_num(last["median_ttft_ms"]),
                               first_tpot=fmt_num(first["median_tpot_ms"]), tpot=fmt_num(last["median_tpot_ms"]),
                               first_tps=fmt_num(first["output_throughput"]), tps=fmt_num(last["output_throughput"]),
                               ratio=fmt_num(ratio, 2),
                               source=tr("serving.n_usage" if run.get("tokens_from_usage", True)
                                         else "serving.n_chunks")))
        if points and on_screen("numbers"):
            show_table([{**p, "x": x} for p, x in zip(points, xs, strict=True)], stat_columns(points), "serving_points")
        windows = [{**p["server"], "x": x} for p, x in zip(points, xs, strict=True) if p.get("server")]
        if windows and on_screen("counters"):
            st.markdown(tr("serving.window_header"))
            show_table([{**w, "prefix_cache_hit_rate": None if w["prefix_cache_hit_rate"] is None
                         else round(100 * w["prefix_cache_hit_rate"], 2)} for w in windows],
                       {k: tr(f"serving.win_{k}") for k in (
                           "x", "prompt_tokens", "cached_tokens", "prefix_cache_hit_rate", "generation_tokens",
                           "preemptions", "prompt_tokens_per_s", "generation_tokens_per_s")}, "serving_window")
        checks = [{**p["server_timings"], "x": x} for p, x in zip(points, xs, strict=True)]
        if on_screen("numbers") and any(c["server_mean_prefill_ms"] is not None or c["server_mean_ttft_ms"] is not None
                                        for c in checks):
            st.markdown(tr("serving.crosscheck_header"))
            agree = [c.get("tpot_agree") for c in checks if c.get("tpot_agree") is not None]
            if agree:
                st.caption(tr("serving.clocks_agree" if all(agree) else "serving.clocks_disagree"))
            show_table(checks, {k: tr(f"serving.xc_{k}") for k in (
                "x", "client_mean_ttft_ms", "server_mean_ttft_ms", "server_mean_prefill_ms", "client_mean_tpot_ms",
                "server_mean_tpot_ms", "server_mean_itl_ms")}, "serving_crosscheck")
        shown = current or (points[-1] if points else None)
        if shown and shown.get("requests") and on_screen("timeline"):
            chart(charts.request_timeline(shown["requests"], {k: tr(f"serving.tl_{k}") for k in (
                "title", "queue", "ttft", "decode", "x", "y")} | {"title": tr("serving.tl_title", x=x_label(shown))},
                lecture=settings.lecture), "serving_timeline")
        samples = [g for p in [*points, *([current] if current else [])] for g in p.get("gauges", [])]
        if samples and on_screen("counters"):
            chart(charts.metrics_chart(samples, {k: tr(f"serving.mc_{k}") for k in (
                "title", "cache", "requests", "kv_usage", "running", "waiting", "not_exported", "x", "y_pct",
                "y_count")} | untitled, lecture=lecture, lecture_height=LECTURE_METRICS_PX), "serving_metrics")
        if points and state["status"] in FINAL and on_screen("numbers"):
            files = {f"point{i + 1}": vllm_result(run, p, "kvviz") for i, p in enumerate(points)}
            if not lecture:  # nobody downloads from a projector (as widgets.table's CSV)
                st.download_button(tr("serving.download_json"), json.dumps(files), file_name="serving_results.json",
                                   mime="application/json", key="sv_download")
            with st.expander(tr("serving.per_request")):
                if prompts and lecture:
                    st.caption(prompts)
                req_cols = {k: tr(f"serving.req_{k}") for k in (
                    "point", "start_s", "queue_s", "ttft_s", "tpot_s", "e2e_s", "n_tokens", "prompt_tokens",
                    "cached_tokens", "server_prefill_s", "finish_reason", "error")}
                show_table([{**r, "point": x_label(p)} for p in points for r in p["requests"]], req_cols,
                           "serving_requests")

    st.fragment(live, run_every=TICK_S[bool(ss.get("sv_live_charts"))] if running else None)()

# ---- prefix cache ----------------------------------------------------------------------------------------
with tab_prefix:
    # on a projector one row: Run, and the experiment's settings (and what it does) behind a button
    prefix_row = st.columns([3, 3, 5], vertical_alignment="center") if lecture else None
    with prefix_row[1] if prefix_row else st.container(), settings_box(tr("serving.prefix_settings")):
        st.write(tr("serving.prefix_intro"))
        p1, p2, p3 = st.columns(3)
        number_in_range(p1, tr("serving.prefix_words"), 8, limits.max_prompt_tokens, LOAD["sv_prefix_words"],
                        "sv_prefix_words")
        number_in_range(p2, tr("serving.prefix_repeats"), 1, 10, LOAD["sv_prefix_repeats"], "sv_prefix_repeats")
        number_in_range(p3, tr("serving.block_size"), 1, 256, conn["block_size"] or 16, "sv_block",
                        help=tr("serving.block_help"))

    def start_prefix() -> None:
        try:
            srv = server()
            if ss.get("sv_prefix_worker") is not None:
                ss.sv_prefix_worker.close()
            ss.sv_prefix_worker = Worker.prefix(srv.base_url, ss.sv_model, timeout_s=srv.timeout_s,
                                                prefix_tokens=int(num("sv_prefix_words")),
                                                repeats=int(num("sv_prefix_repeats")),
                                                block_size=int(current_number("sv_block", conn["block_size"] or 16)),
                                                api_key=srv.api_key)
            ss.sv_prefix_state, ss.sv_prefix_error, ss.sv_prefix_was_running = None, None, True
        except InputError as exc:
            ss.sv_prefix_error = exc

    prefix_running = is_running("sv_prefix_worker")
    (prefix_row[0] if prefix_row else st).button(tr("serving.prefix_run"), key="sv_prefix_run", on_click=start_prefix,
                                                 disabled=prefix_running)
    if ss.get("sv_prefix_error"):
        show_error(ss.sv_prefix_error)

    def rule_text(result: dict) -> str:
        """Which prompt tokens the engine can serve from its cache (the prediction's rule)."""
        rule = {"vllm": "serving.rule_block", "llama.cpp": "serving.rule_token", "sglang": "serving.rule_token"}
        return tr(rule.get(result["engine"], "serving.rule_unknown"), block=result["block_size"] or "?")

    def trials_table(result: dict) -> None:
        show = [{**r, "request": tr(f"serving.pc_{r['request']}")} for r in result["rows"]]
        cols = {k: tr(f"serving.pr_{k}") for k in ("trial", "position", "request", "prompt_tokens", "shared_tokens",
                                                   "cached_tokens", "predicted_cached_tokens", "ttft_s",
                                                   "server_prefill_s", "error")}
        table(pd.DataFrame([{cols[k]: r.get(k) for k in cols} for r in show]).dropna(axis=1, how="all"),
              "serving_prefix")

    def prefix_live() -> None:
        state = poll("sv_prefix_worker", "sv_prefix_state")
        if state is None:
            return
        if not is_running("sv_prefix_worker") and ss.get("sv_prefix_was_running"):
            ss.sv_prefix_was_running = False
            st.rerun()
        if state["status"] not in FINAL:
            st.info(tr("serving.prefix_running"))
        if state.get("error"):
            st.error(error_text(state["error"]))
        result = state.get("result")
        if not result:
            return
        rows, s = result["rows"], result["summary"]
        if not lecture:  # on a projector the rule and the trials' table are folded beside the Run button
            st.markdown(rule_text(result))
        chart(charts.prefix_chart(rows, {k: tr(f"serving.pc_{k}") for k in (
            "title", "ttft", "saving", "cached", "cold", "warm", "control", "saving_client", "saving_server",
            "measured", "predicted", "x", "y_ms", "y_tokens")} | untitled, lecture=lecture,
            lecture_height=LECTURE_PREFIX_PX), "serving_prefix")

        def saving(v: dict) -> str:
            if v["verdict"] is None:
                return tr("serving.saving_unknown")
            return tr("serving.saving", median=fmt_ms(v["median_s"]), low=fmt_ms(v["low_s"]), high=fmt_ms(v["high_s"]),
                      n=v["n"], verdict=tr(f"serving.verdict_{v['verdict']}"))

        st.markdown(tr("serving.prefix_result", cold=fmt_ms(s["ttft_cold_p50_s"]), warm=fmt_ms(s["ttft_warm_p50_s"]),
                       control=fmt_ms(s["ttft_control_p50_s"]), saved=saving(s["saving"]),
                       server_saved=saving(s["server_saving"])))
        if not lecture:
            trials_table(result)

    st.fragment(prefix_live, run_every=TICK_S[False] if prefix_running else None)()
    finished = (ss.get("sv_prefix_state") or {}).get("result")
    if prefix_row and finished:  # drawn by the page, not the fragment: it ticks only while the experiment runs
        with prefix_row[2], st.expander(tr("serving.prefix_details")):
            st.markdown(rule_text(finished))
            trials_table(finished)

# ---- definitions ---------------------------------------------------------------------------------------
with tab_defs:
    st.markdown(tr("serving.definitions"))
    with st.expander(tr("serving.definitions_more")) if lecture else st.container():  # on a projector: TTFT, ITL, TPOT
        st.markdown(tr("serving.definitions_load"))
        st.markdown(tr("serving.definitions_why"))
    link_to("pages/2_Prefill_and_Decode.py")
    link_to("pages/3_Memory_Footprint.py")
