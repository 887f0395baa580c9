"""Serving Engine: measure a live OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI) as `vllm bench serve`
does: TTFT, TPOT, ITL and E2E percentiles, throughput and goodput against concurrency or request rate, the
server's own counters over each point, and what a shared prefix saves. The measuring runs in a worker process
(kvviz.serving.worker, the code `serve-bench` runs); this page only starts it and reads what it writes, as a
WorkerState it keeps; kvviz.app.views.serving draws the results (and, in a lecture room, publishes the latest states
and draws a follower's page from them: a follower never reaches the server)."""
import os

import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import idea_title, intro_box, lecture_head, lecture_tabs, settings_box, shown_idea
from kvviz.app.models import secrets_dict
from kvviz.app.navigation import link_to, page_of
from kvviz.app.room.follow import room_part
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.views.kv_events import following as kv_events_following
from kvviz.app.views.kv_events import panel as kv_events_panel
from kvviz.app.views.kv_events import run_view as kv_run_view
from kvviz.app.views.kv_events import shown as kv_events_shown
from kvviz.app.views.serving import (
    SV,
    connection_details,
    follow,
    load_settings,
    prefix_details,
    prefix_results,
    prefix_settings,
    room_view,
    sweep_results,
)
from kvviz.app.widgets import current_number, number_in_range
from kvviz.errors import InputError
from kvviz.serving import client as api
from kvviz.serving import policy
from kvviz.serving.bench import check_plan
from kvviz.serving.report import describe_server
from kvviz.serving.results import load_defaults, load_plan
from kvviz.serving.worker import Worker, poll

# How often the page reads the worker's state while it runs, drawing live or not: each rerun costs CPU that a
# server on this machine would use (~0.1 s of it per rerun on a busy 2-core machine).
TICK_S = {True: 1.0, False: 5.0}

PAGE = page_of(__file__)
settings = page_setup("serving.title")
ss, lecture = st.session_state, settings.lecture
SV.seed()
# In lecture mode one row holds the title, the introduction (folded) and the server's settings (behind a button);
# then one idea per screen: the load sweep's four views, the prefix experiment, the definitions.
intro_at, server_at = lecture_head(tr("serving.title"), widths=(2, 2))
with intro_at, intro_box():
    st.write(tr("serving.intro"))
# A follower: the lecturer's runs as their workers wrote them, read-only; the lecturer: an open room's link.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
caps = settings.hosted
secrets = secrets_dict()
limits = policy.limits(caps.max_sweep_points, caps.max_new_tokens) if caps else policy.limits()
FIRST = load_defaults(limits)  # the load and prefix boxes' first values


def num(name: str) -> float:
    """A box's value as a callback (Start) sees it: what it would accept, else the last."""
    return current_number(f"serving_{name}", FIRST[name])


# ---- connection -------------------------------------------------------------------------------------
def server() -> api.Server:
    url = policy.check_url(ss.serving_url, policy.allowlist(os.environ, secrets)) if caps else ss.serving_url
    return api.Server(url, env_key or ss.get("serving_api_key") or None, float(current_number("serving_timeout")))


def connect() -> None:
    try:
        srv = server()
        info = describe_server(srv)
        SV.set("conn", {**info, "url": srv.base_url})
        SV.set("conn_error", None)
    except InputError as exc:
        SV.set("conn_error", exc)  # the last connection and its results stay


with server_at, settings_box(tr("serving.server_settings")):
    share_button(lecture)  # behind the settings button, as on Reusing Past K/V
    idea_title(tr("serving.connect_header"), small=True)
    c1, c2, c3 = st.columns([3, 2, 1])
    if caps is not None:
        allowed = policy.allowlist(os.environ, secrets)
        if not allowed:
            st.error(tr("serving.no_allowlist"))
            st.stop()
        c1.selectbox(tr("serving.url"), allowed, key="serving_url", help=tr("serving.url_hosted_help"))
    else:
        c1.text_input(tr("serving.url"), "http://127.0.0.1:8080", key="serving_url", help=tr("serving.url_help"))
    env_key = policy.api_key(os.environ, secrets)
    if env_key:
        c2.caption(tr("serving.key_from_env", var=policy.ENV_KEY))
    else:
        c2.text_input(tr("serving.api_key"), type="password", key="serving_api_key", help=tr("serving.api_key_help"))
    max_timeout = policy.HOSTED_TIMEOUT_S if caps else 600.0
    number_in_range(c3, tr("serving.timeout_label"), 1.0, max_timeout, min(30.0, max_timeout), "serving_timeout",
                    whole=False)
    st.button(tr("serving.connect"), on_click=connect, type="primary")
    if SV.get("conn_error"):
        show_error(SV.get("conn_error"))
    conn = SV.get("conn")
    per_token = None if conn is None else connection_details(conn, lecture)
if conn is None:
    st.info(tr("serving.not_connected"))
    # a server's cache events need no HTTP connection: followed without one
    if not lecture:
        st.subheader(tr("kv_events.header"))
    st.caption(tr("kv_events.not_connected"))

    def share_kv_events() -> None:
        """The cache events alone to a lecture room, once there is something drawn (no server connected)."""
        if room is not None and kv_events_shown() is not None:
            room.publish(room_view("kv_events", {}, 0, False))

    kv_events_panel(lecture=lecture, per_token=None, on_draw=share_kv_events)
    st.stop()

# Four tabs; in lecture mode seven screens: the load tab's results one view per screen, then the prefix, the cache
# events and the definitions (`view`: the one on screen, None when all are).
IDEAS = {"load": 0, "timeline": 0, "counters": 0, "numbers": 0, "prefix": 1, "kv_events": 2,
         "definitions": 3}  # idea -> its tab
tab_load, tab_prefix, tab_kv, tab_defs = lecture_tabs(
    [tr("serving.tab_sweep"), tr("serving.tab_prefix"), tr("kv_events.tab"), tr("serving.tab_defs")], "serving",
    screens=[(tab, tr("kv_events.idea") if name == "kv_events" else tr(f"serving.idea_{name}"))
             for name, tab in IDEAS.items()])
view = None if shown_idea("serving") is None else list(IDEAS)[shown_idea("serving")]


def on_screen(name: str) -> bool:
    return view is None or view == name


def share() -> None:
    """The runs' latest states to a lecture room (unchanged: not sent again)."""
    if room is not None:
        room.publish(room_view(view, conn, int(num("requests")), bool(ss.get("serving_live_charts"))))


def read_worker(name: str) -> None:
    """The worker's latest state into the session; once it is final, the worker closed and its files removed. Its
    final state read and its process gone: the whole page again, so the fragment stops ticking and the buttons
    flip."""
    worker, state = poll(SV.get(f"{name}worker"), SV.get(f"{name}state"))
    SV.set(f"{name}worker", worker)
    SV.set(f"{name}state", state)
    if state is not None and worker is None and SV.get(f"{name}was_running"):
        SV.set(f"{name}was_running", False)
        st.rerun()


# ---- load: concurrency or request rate -------------------------------------------------------------------
with tab_load:
    # on a projector one row: Start, Cancel, the load's settings (and what they mean) behind a button, live drawing
    row = st.columns([1, 1.2, 2, 4], vertical_alignment="center") if lecture else None
    with row[2] if row else st.container(), settings_box(tr("serving.load_settings")):
        mode = load_settings(limits, FIRST)

    def start() -> None:
        try:
            dataset = SV.get("dataset")
            plan = load_plan(url=server().base_url, model=ss.serving_model, endpoint=ss.serving_endpoint,
                             timeout_s=float(current_number("serving_timeout")), mode=mode,
                             concurrency=ss.get("serving_conc", ""), rates=ss.get("serving_rates", ""),
                             max_concurrency=int(num("maxc")),
                             burstiness=float(num("burst")), requests=int(num("requests")),
                             prompt_tokens=int(num("prompt")), max_tokens=int(num("max_tokens")),
                             range_ratio=float(num("range")), prefix_len=int(num("prefix_len")),
                             warmups=int(num("warmups")), slo_ttft_ms=float(num("slo_ttft")),
                             slo_tpot_ms=float(num("slo_tpot")), dataset_path=dataset["path"] if dataset else None,
                             keep_cache_ids=kv_events_following())  # attributed to the followed cache's blocks
            check_plan(plan, limits)
            if SV.get("worker") is not None:
                SV.get("worker").close()
            SV.set("worker", Worker.bench(plan, limits, env_key or ss.get("serving_api_key") or None))
            SV.set("state", None)
            SV.set("start_error", None)
            SV.set("was_running", True)
        except InputError as exc:
            SV.set("start_error", exc)  # the previous run's results stay on screen

    def cancel() -> None:
        if SV.get("worker") is not None:
            SV.get("worker").cancel()

    running = SV.get("worker") is not None
    (row[3] if row else st).checkbox(tr("serving.live_charts"), key="serving_live_charts",
                                     help=tr("serving.live_charts_help"))
    b1, b2 = row[:2] if row else st.columns([1, 1, 4])[:2]
    b1.button(tr("serving.start"), on_click=start, disabled=running, type="primary", key="serving_start")
    b2.button(tr("serving.cancel"), on_click=cancel, disabled=not running, key="serving_cancel")
    if SV.get("start_error"):
        show_error(SV.get("start_error"))

    def live() -> None:
        read_worker("")
        state = SV.get("state")
        kv_run = kv_run_view(None if state is None else state.result, final=state is not None and state.final)
        sweep_results(state, n_requests=int(num("requests")), live_charts=bool(ss.get("serving_live_charts")),
                      lecture=lecture, on_screen=on_screen, kv_run=kv_run)
        share()

    st.fragment(live, run_every=TICK_S[bool(ss.get("serving_live_charts"))] if running else None)()

# ---- prefix cache ----------------------------------------------------------------------------------------
with tab_prefix:
    # on a projector one row: Run, and the experiment's settings (and what it does) behind a button
    prefix_row = st.columns([3, 3, 5], vertical_alignment="center") if lecture else None
    with prefix_row[1] if prefix_row else st.container(), settings_box(tr("serving.prefix_settings")):
        prefix_settings(limits, FIRST, conn["block_size"])

    def start_prefix() -> None:
        try:
            srv = server()
            if SV.get("prefix_worker") is not None:
                SV.get("prefix_worker").close()
            SV.set("prefix_worker", Worker.prefix(
                srv.base_url, ss.serving_model, timeout_s=srv.timeout_s, prefix_tokens=int(num("prefix_words")),
                repeats=int(num("prefix_repeats")), api_key=srv.api_key,
                block_size=int(current_number("serving_block", conn["block_size"] or 16))))
            SV.set("prefix_state", None)
            SV.set("prefix_error", None)
            SV.set("prefix_was_running", True)
        except InputError as exc:
            SV.set("prefix_error", exc)

    prefix_running = SV.get("prefix_worker") is not None
    (prefix_row[0] if prefix_row else st).button(tr("serving.prefix_run"), key="serving_prefix_run",
                                                 on_click=start_prefix,
                                                 disabled=prefix_running)
    if SV.get("prefix_error"):
        show_error(SV.get("prefix_error"))

    def prefix_live() -> None:
        read_worker("prefix_")
        prefix_results(SV.get("prefix_state"), lecture)
        share()

    st.fragment(prefix_live, run_every=TICK_S[False] if prefix_running else None)()
    finished = SV.get("prefix_state")
    if prefix_row and finished and finished.result:  # drawn by the page, not the fragment: it ticks only while
        with prefix_row[2], st.expander(tr("serving.prefix_details")):  # the experiment runs
            prefix_details(finished.result)

# ---- the server's cache, from its KV events ---------------------------------------------------------------
def detokenize(ids: list[int]) -> str | None:
    """The tree's first tokens as text, by the connected server's own tokenizer (None: it cannot say)."""
    try:
        return api.detokenize(server(), ss.get("serving_model", ""), ids)
    except InputError:
        return None


with tab_kv:
    kv_events_panel(lecture=lecture, per_token=per_token, on_draw=share, detokenize=detokenize)

# ---- definitions ---------------------------------------------------------------------------------------
with tab_defs:
    st.markdown(tr("serving.definitions"))
    with st.expander(tr("serving.definitions_more")) if lecture else st.container():  # on a projector: TTFT, ITL, TPOT
        st.markdown(tr("serving.definitions_load"))
        st.markdown(tr("serving.definitions_why"))
    link_to("pages/2_Prefill_and_Decode.py")
    link_to("pages/3_Memory_Footprint.py")
