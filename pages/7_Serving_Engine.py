"""Serving Engine: measure a live OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI) as the other pages
measure kvviz's own decoder: TTFT, TPOT and throughput against concurrency, its KV cache over time, and
what a shared prefix saves."""
import os

import pandas as pd
import streamlit as st

from kvviz.app.language import lang, show_error, tr
from kvviz.app.lecture import intro_box
from kvviz.app.models import secrets_dict
from kvviz.app.navigation import link_to
from kvviz.app.shell import page_setup
from kvviz.app.widgets import chart, current_number, number_in_range, table
from kvviz.charts import serving as charts
from kvviz.errors import InputError
from kvviz.kv.formula import kv_footprint
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import PRESETS
from kvviz.kv.roofline import Roofline
from kvviz.serving import client as api
from kvviz.serving import policy
from kvviz.serving.bench import SweepJob, check_plan
from kvviz.serving.prefix import run_prefix_experiment
from kvviz.serving.report import detect_engine, known_shape
from kvviz.units import format_exact

TICK_S = 0.5  # the fragment's period while a sweep runs

settings = page_setup("serving.title")
ss = st.session_state
st.title(tr("serving.title"))
with intro_box():
    st.write(tr("serving.intro"))
caps = settings.hosted
secrets = secrets_dict()
limits = policy.limits(caps.max_sweep_points, caps.max_new_tokens) if caps else policy.limits()


def localized(rows: list[dict]) -> pd.DataFrame:
    """Rows as a table in the user's language: its headers, the prefix experiment's request kinds, yes/no as ✓/✗."""
    df = pd.DataFrame(rows)
    if "request" in df.columns:
        df["request"] = df["request"].map(lambda kind: tr(f"serving.pc_{kind}"))
    for col in df.columns:
        if df[col].map(lambda v: isinstance(v, bool)).all():
            df[col] = df[col].map({True: "✓", False: "✗"})
    return df.rename(columns=lambda col: tr(f"serving.col_{col}"))


def fmt_ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.1f} ms"


# ---- connection -------------------------------------------------------------------------------------
st.subheader(tr("serving.connect_header"))
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
number_in_range(c3, tr("serving.timeout_label"), 1.0, max_timeout, min(30.0, max_timeout), "sv_timeout", whole=False)


def server() -> api.Server:
    url = policy.check_url(ss.sv_url, policy.allowlist(os.environ, secrets)) if caps else ss.sv_url
    return api.Server(url, env_key or ss.get("sv_api_key") or None, float(current_number("sv_timeout")))


def connect() -> None:
    try:
        srv = server()
        models = api.list_models(srv)
        engine, block = detect_engine(models, srv)
        ss.sv_conn, ss.sv_conn_error = {"url": srv.base_url, "models": [m["id"] for m in models], "engine": engine,
                                        "block_size": block}, None
    except InputError as exc:
        ss.sv_conn_error = exc  # the last connection and its results stay


st.button(tr("serving.connect"), on_click=connect, type="primary")
if ss.get("sv_conn_error"):
    show_error(ss.sv_conn_error)
conn = ss.get("sv_conn")
if conn is None:
    st.info(tr("serving.not_connected"))
    st.stop()
m1, m2 = st.columns([3, 2])
m1.selectbox(tr("serving.model"), conn["models"], key="sv_model")
m2.radio(tr("serving.endpoint"), ("completions", "chat"), key="sv_endpoint", horizontal=True,
         help=tr("serving.endpoint_help"))
st.caption(tr("serving.connected", url=conn["url"], engine=conn["engine"] or tr("serving.unknown"),
              n=len(conn["models"])))
# The served model's KV shape: found from its id (a preset's repository, a local config.json, kvviz's own model),
# or picked by hand from the presets when the id does not say; unknown until then, never a guessed default.
found = known_shape(ss.sv_model or "")
shapes = dict([found] if found is not None else []) | PRESETS
k1, k2 = st.columns([1, 3])
picked = k1.selectbox(tr("serving.shape"), list(shapes), index=None if found is None else 0,
                      placeholder=tr("serving.shape_pick"), key=f"sv_shape_{ss.sv_model}",
                      help=tr("serving.shape_help"))
if picked is None:
    k2.caption(tr("serving.kv_unknown", model=ss.sv_model))
else:
    per_token = kv_footprint(shapes[picked], 1, 1, "bfloat16").per_token
    source = "kv_known" if found is not None and picked == found[0] else "kv_picked"
    k2.caption(tr(f"serving.{source}", shape=picked, size=format_exact(per_token)))
    # kvviz's own bound for the same shape on the GPU the user names: one request, mid-way through a sweep request
    g1, g2 = st.columns([1, 3])
    gpu = g1.selectbox(tr("serving.gpu"), list(HARDWARE), key="sv_gpu")
    n_context = current_number("sv_prompt", 128) + current_number("sv_max_tokens", 32) // 2
    try:
        bound = Roofline(shapes[picked], HARDWARE[gpu]).decode_bound(batch=1, n_context=n_context)
        g2.caption(tr("serving.roofline", gpu=gpu, n=f"{n_context:,}", tpot=f"{bound.seconds * 1e3:.3g} ms",
                      limit=tr(f"serving.limit_{bound.limited_by}")))
    except InputError as exc:
        g2.caption(exc.message(lang()))

tab_sweep, tab_prefix, tab_defs = st.tabs([tr("serving.tab_sweep"), tr("serving.tab_prefix"), tr("serving.tab_defs")])

# ---- concurrency sweep ---------------------------------------------------------------------------------
with tab_sweep:
    st.write(tr("serving.sweep_intro"))
    s1, s2, s3, s4 = st.columns(4)
    s1.text_input(tr("serving.concurrency"), "1, 2, 4", key="sv_conc")
    number_in_range(s2, tr("serving.requests"), 1, limits.max_requests, min(8, limits.max_requests), "sv_requests")
    number_in_range(s3, tr("serving.prompt_tokens"), 1, limits.max_prompt_tokens, min(128, limits.max_prompt_tokens),
                    "sv_prompt")
    number_in_range(s4, tr("serving.max_tokens"), 2, limits.max_tokens, min(32, limits.max_tokens), "sv_max_tokens")

    def start() -> None:
        try:
            points = [int(p) for p in ss.sv_conc.replace(" ", "").split(",") if p]
        except ValueError:
            ss.sv_start_error = InputError("serving.no_points")
            return
        try:
            # what the boxes hold now, unless a box refused it (then its last valid value, as the box says)
            requests, prompt, max_tokens = (current_number(k) for k in ("sv_requests", "sv_prompt", "sv_max_tokens"))
            check_plan(points, requests, max_tokens, prompt, limits)
            ss.sv_job = SweepJob(server(), ss.sv_model, points, requests, prompt, max_tokens,
                                 endpoint=ss.sv_endpoint).start()
            ss.sv_start_error = None
        except InputError as exc:
            ss.sv_start_error = exc  # the previous sweep's results stay on screen

    def cancel() -> None:
        if ss.get("sv_job") is not None:
            ss.sv_job.cancel()

    job: SweepJob | None = ss.get("sv_job")
    running = job is not None and not job.finished
    b1, b2, _ = st.columns([1, 1, 4])
    b1.button(tr("serving.start"), on_click=start, disabled=running, type="primary", key="sv_start")
    b2.button(tr("serving.cancel"), on_click=cancel, disabled=not running, key="sv_cancel")
    if ss.get("sv_start_error"):
        show_error(ss.sv_start_error)

    def live() -> None:
        job: SweepJob | None = ss.get("sv_job")
        if job is None:
            st.info(tr("serving.idle"))
            return
        if job.finished and ss.get("sv_was_running"):
            ss.sv_was_running = False
            st.rerun()  # the whole page: the fragment stops ticking and the buttons flip
        ss.sv_was_running = not job.finished
        state = "cancelled" if job.cancelled else "done" if job.finished else "running"
        st.progress(job.progress, text=tr(f"serving.progress_{state}", done=job.done, total=job.total))
        if job.error is not None:
            show_error(job.error)
        for err in job.errors():
            if job.error is None or str(err) != str(job.error):
                st.warning(err.message(lang()))
        if job.metrics_error is not None:
            st.warning(job.metrics_error.message(lang()))
        if job.usage_fallback:
            st.warning(tr("serving.usage_fallback"))
        if job.eos_may_stop:
            st.info(tr("serving.eos_may_stop"))
        rows = job.rows()
        if not rows:
            return
        if job.exact_prompts is not None:
            st.caption(tr("serving.prompts_exact" if job.exact_prompts else "serving.prompts_text"))
        chart(charts.concurrency_chart(rows, {k: tr(f"serving.cc_{k}") for k in (
            "title", "latency", "throughput", "ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "tokens_per_s", "x",
            "y_ms", "y_tps")}, lecture=settings.lecture), "serving_concurrency")
        first, last = rows[0], rows[-1]

        def tps(row: dict) -> str:
            return "—" if row["output_tokens_per_s"] is None else f"{row['output_tokens_per_s']:.1f}"

        ratio = (last["output_tokens_per_s"] / first["output_tokens_per_s"]
                 if last["output_tokens_per_s"] and first["output_tokens_per_s"] else None)
        st.markdown(tr("serving.sweep_result", c0=first["concurrency"], c=last["concurrency"],
                       first_ttft=fmt_ms(first["ttft_p50_s"]), ttft=fmt_ms(last["ttft_p50_s"]),
                       first_tpot=fmt_ms(first["tpot_p50_s"]), tpot=fmt_ms(last["tpot_p50_s"]),
                       first_tps=tps(first), tps=tps(last), ratio="—" if ratio is None else f"{ratio:.2f}",
                       source=tr("serving.n_usage" if last["tokens_from_usage"] else "serving.n_chunks")))
        requests = job.request_rows()
        chart(charts.request_timeline(requests, {k: tr(f"serving.tl_{k}") for k in (
            "title", "ttft", "decode", "x", "y")}, lecture=settings.lecture), "serving_timeline")
        samples = [m.to_dict() for m in job.metrics]
        if samples:
            chart(charts.metrics_chart(samples, {k: tr(f"serving.mc_{k}") for k in (
                "title", "cache", "requests", "kv_usage", "prefix_hit_rate", "running", "waiting", "preemptions",
                "x", "y_pct", "y_count")}, lecture=settings.lecture), "serving_metrics")
            st.caption(tr("serving.metrics_names", names=", ".join(job.metrics[-1].recognized) or "—"))
        table(localized(rows), "serving_sweep")
        with st.expander(tr("serving.per_request")):
            table(localized(requests), "serving_requests")

    st.fragment(live, run_every=TICK_S if running else None)()

# ---- prefix cache ----------------------------------------------------------------------------------------
with tab_prefix:
    st.write(tr("serving.prefix_intro"))
    p1, p2, p3 = st.columns(3)
    prefix_words = number_in_range(p1, tr("serving.prefix_words"), 8, limits.max_prompt_tokens,
                                   min(256, limits.max_prompt_tokens), "sv_prefix_words")
    prefix_repeats = number_in_range(p2, tr("serving.prefix_repeats"), 1, 5, 3, "sv_prefix_repeats")
    block_size = number_in_range(p3, tr("serving.block_size"), 1, 256, conn["block_size"] or 16, "sv_block",
                    help=tr("serving.block_help"))
    if st.button(tr("serving.prefix_run"), key="sv_prefix_run"):
        try:
            with st.spinner(tr("serving.prefix_running")):
                ss.sv_prefix = run_prefix_experiment(server(), ss.sv_model, prefix_tokens=prefix_words,
                                                     repeats=prefix_repeats, engine=conn["engine"],
                                                     block_size=block_size)
            ss.sv_prefix_error = None
        except InputError as exc:
            ss.sv_prefix_error = exc
    if ss.get("sv_prefix_error"):
        show_error(ss.sv_prefix_error)
    result = ss.get("sv_prefix")
    if result is not None:
        rows = result.rows()
        s = result.summary()
        rule = {"vllm": "serving.rule_block", "llama.cpp": "serving.rule_token", "sglang": "serving.rule_token"}
        st.markdown(tr(rule.get(result.engine, "serving.rule_unknown"), block=result.block_size or "?"))
        chart(charts.prefix_chart(rows, {k: tr(f"serving.pc_{k}") for k in (
            "title", "ttft", "cached", "cold", "warm", "control", "measured", "predicted", "x", "y_ms", "y_tokens")},
            lecture=settings.lecture), "serving_prefix")
        st.markdown(tr("serving.prefix_result", cold=fmt_ms(s["ttft_cold_p50_s"]), warm=fmt_ms(s["ttft_warm_p50_s"]),
                       control=fmt_ms(s["ttft_control_p50_s"]), saved=fmt_ms(s["ttft_saved_s"])))
        table(localized(rows), "serving_prefix")

# ---- definitions ---------------------------------------------------------------------------------------
with tab_defs:
    st.markdown(tr("serving.definitions"))
    link_to("pages/2_Prefill_and_Decode.py")
    link_to("pages/3_Memory_Footprint.py")
