"""Serving Engine's cache events: subscribe to a server's KV events (kvviz.serving.kv_watch, on a thread of this
session) and draw the tree of its cached blocks, its size in blocks, tokens and bytes, and the blocks stored and
removed per second, once a second whatever the rate of events (`panel`). What is drawn is plain data (`shown()`),
which a lecture room's followers draw with `draw` and never subscribe. A load run of the page against the same
server is drawn beside it (`run_view`, `draw_run_clock`, `draw_attribution`): the blocks stored and removed on the
run's clock, and each request attributed to the cached blocks (kvviz.serving.kv_run)."""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.state import page_state
from kvviz.app.widgets import chart, table
from kvviz.charts import kv_events as charts
from kvviz.errors import InputError
from kvviz.i18n import t
from kvviz.serving.kv_attribution import DEFAULT_ALGO, HASH_ALGOS
from kvviz.serving.kv_run import point_end_s
from kvviz.serving.kv_watch import SERVER_FLAG, UNREAD_AFTER_S, Watch, name_chains
from kvviz.units import format_fixed

# The subscription (a Watch: its thread and sockets), the error of the last Subscribe, the last state drawn; a load
# run's view on it (`run`) and what it was computed for (`run_key`: the run's points, hash and seed).
# `texts`: chains' first tokens as the connected server detokenized them (kv_watch.name_chains). `ended_unread`:
# the watch ended itself, read by no page for kv_watch.UNREAD_AFTER_S (a closed tab).
KE = page_state("kv_events", watch=None, error=None, last=None, run=None, run_key=None, texts={},
                ended_unread=False)
TICK_S = 1.0  # drawn once a second: a flood of events is folded into the tree between two drawings
LECTURE_TREE_PX = 330


def _subscribe() -> None:
    ss = st.session_state
    try:
        watch = Watch(ss.get("kv_events_endpoint", ""), ss.get("kv_events_replay") or None,
                      unread_after_s=UNREAD_AFTER_S)
    except InputError as exc:
        KE.set("error", exc)
        return
    _stop()
    KE.set("watch", watch)
    KE.set("error", None)
    KE.set("ended_unread", False)


def _stop() -> None:
    watch = KE.get("watch")
    if watch is not None:
        watch.close()
        KE.set("watch", None)


def shown() -> dict | None:
    """The last state drawn (numbers only: what a room's followers get), None before any subscription."""
    return KE.get("last")


def panel(*, lecture: bool, per_token: int | None, on_draw=None,  # noqa: ANN001 - on_draw() -> None
          detokenize: Callable[[list[int]], str | None] | None = None) -> None:
    """The endpoints, Subscribe and Stop, then the live picture (`per_token`: the served model's KV bytes per token,
    None while unknown); `on_draw` runs after each drawing (the page shares the view with a room); `detokenize`:
    the connected server's /detokenize, which names each chain's first tokens in the tree's hover (ids without)."""
    if lecture:  # on a projector the screen is the tree's
        with st.expander(tr("kv_events.header")):
            st.write(tr("kv_events.intro"))
    else:
        st.write(tr("kv_events.intro"))
    c1, c2, c3, c4 = st.columns([3, 3, 1, 1], vertical_alignment="bottom")
    c1.text_input(tr("kv_events.endpoint"), "tcp://127.0.0.1:5557", key="kv_events_endpoint",
                  help=tr("kv_events.endpoint_help"))
    c2.text_input(tr("kv_events.replay"), "", key="kv_events_replay", help=tr("kv_events.replay_help"))
    if KE.get("watch") is not None and not KE.get("watch").alive:  # it ended itself while this page was not read
        KE.set("ended_unread", KE.get("watch").ended_unread)
        _stop()
    watching = KE.get("watch") is not None
    c3.button(tr("kv_events.subscribe"), on_click=_subscribe, type="primary", key="kv_events_subscribe")
    c4.button(tr("kv_events.stop"), on_click=_stop, disabled=not watching, key="kv_events_stop")
    h1, h2 = st.columns(2)  # what the server hashes with: a load run's requests are attributed with them
    h1.selectbox(tr("kv_events.algo"), HASH_ALGOS, index=HASH_ALGOS.index(DEFAULT_ALGO), key="kv_events_algo",
                 help=tr("kv_events.algo_help"))
    h2.text_input(tr("kv_events.seed"), "", key="kv_events_seed", help=tr("kv_events.seed_help"))
    if KE.get("error") is not None:
        show_error(KE.get("error"))
    if KE.get("ended_unread"):
        st.info(tr("kv_events.ended_unread", s=int(UNREAD_AFTER_S)))

    def live() -> None:
        watch = KE.get("watch")
        if watch is not None and not watch.alive:
            st.rerun()  # the whole page: it says why the subscription ended and offers Subscribe again
        if watch is not None:
            state = watch.state()
            state["per_token"] = per_token
            texts = KE.get("texts")
            name_chains(state["chains"]["chains"], texts, detokenize)
            KE.set("texts", texts)
            KE.set("last", _plain(state))
        last = KE.get("last")
        if last is None:
            st.info(tr("kv_events.idle"))
        else:
            draw(last, lecture=lecture)
        if on_draw is not None:
            on_draw()

    st.fragment(live, run_every=TICK_S if watching else None)()


def _plain(state: dict) -> dict:
    """The state as JSON-able data (hashes are already text in chains; group keys may be None)."""
    s = dict(state["summary"])
    s["groups"] = [g for g in s["groups"]]
    return {**state, "summary": s}


def draw(state: dict, *, lecture: bool) -> None:
    """One drawing of the subscription's state: what is wrong if anything, the numbers, the tree, the rates."""
    status, endpoint = state["status"], state["endpoint"]
    if status == "waiting":
        st.info(tr("kv_events.waiting", endpoint=endpoint))
    elif status == "unreachable":
        st.error(tr("kv_events.unreachable", endpoint=endpoint))
    elif status == "silent":
        st.warning(tr("kv_events.silent_page", endpoint=endpoint))
        st.code(f"vllm serve MODEL {SERVER_FLAG}", language="bash")
    s = state["summary"]
    per_token = state.get("per_token")
    cols = st.columns(6)
    cols[0].metric(tr("kv_events.m_blocks"), f"{s['blocks']:,}")
    cols[1].metric(tr("kv_events.m_tokens"), f"{s['tokens']:,}")
    size = tr("kv_events.bytes_unknown") if per_token is None else _bytes(s["tokens"] * per_token)
    cols[2].metric(tr("kv_events.m_bytes"), size, help=tr("kv_events.bytes_help"))
    cols[3].metric(tr("kv_events.m_stored"), f"{s['stored']:,}")
    cols[4].metric(tr("kv_events.m_removed"), f"{s['removed']:,}")
    cols[5].metric(tr("kv_events.m_resets"), f"{s['cleared']:,}")
    notes = []
    if s["copies"]:
        notes.append(tr("kv_events.media", media=", ".join(f"{m} {n:,}" for m, n in sorted(s["copies"].items()))))
    if state["folded"]:
        notes.append(tr("kv_events.folded", n=state["folded"]))
    if notes:
        st.caption(" · ".join(notes))
    for gap in s["incomplete"]:
        st.warning(tr("kv_events.incomplete", n=gap.get("n", "?"), first=gap.get("first", "?"),
                      last=gap.get("last", "?")))
    for what, n in s["skipped"].items():
        st.warning(tr("kv_events.skipped", what=what, n=n))
    if s["restarts"]:
        st.info(tr("kv_events.restarted", n=s["restarts"]))
    if s["orphans"]:
        st.caption(tr("kv_events.orphans", n=s["orphans"]))
    if s["unknown_removed"]:
        st.caption(tr("kv_events.unknown_removed", n=s["unknown_removed"]))
    tree = state["chains"]
    if not tree["chains"]:
        st.caption(tr("kv_events.tree_empty"))
    else:
        labels = {k: t(f"kv_events.{k}", _lang()) for k in ("root", "unknown_parent", "box", "hover")}
        title = "" if lecture else tr("kv_events.tree_title")  # on a projector the idea's title names it
        chart(charts.tree_chart(tree["chains"], tree["groups"], labels | {"title": title},
                                lecture=lecture, lecture_height=LECTURE_TREE_PX), "kv_events_tree")
        if tree["folded"]:
            st.caption(tr("kv_events.tree_folded", n=tree["folded"], blocks=tree["folded_blocks"]))
    if state["rates"] and not lecture:
        chart(charts.rates_chart(state["rates"], {"title": tr("kv_events.rates_title"),
                                                  "stored": tr("kv_events.stored"), "removed": tr("kv_events.removed"),
                                                  "x": tr("kv_events.rates_x"), "y": tr("kv_events.rates_y")},
                                 lecture=lecture), "kv_events_rates")


def _lang() -> str:
    from kvviz.app.language import lang

    return lang()


def _bytes(n: int) -> str:
    from kvviz.units import format_binary

    return format_binary(n)


def follow(view: dict | None, *, lecture: bool) -> None:
    """A follower's cache events: the lecturer's last drawing, read-only (no endpoint, no subscription here)."""
    st.caption(tr("kv_events.room"))
    if view is None:
        st.info(tr("kv_events.room_none"))
        return
    draw(view, lecture=lecture)


# ---- a load run against the followed server ------------------------------------------------------------------
def following() -> bool:
    """Whether this session follows a server's KV events now (a load run then keeps its prompts' ids)."""
    return KE.get("watch") is not None


def run_view(result: dict | None, *, final: bool) -> dict | None:
    """A load run beside the followed cache, as plain data: the blocks stored and removed per second on the clock of
    the point the timeline draws, and once the run is final its requests attributed (kvviz.serving.kv_run); the
    last one kept when nothing is followed (Stop), None before any."""
    from kvviz.serving.results import Sweep

    if not result:
        return None
    sweep = Sweep(result)
    point = sweep.timeline_point()
    starts = [p.get("start_unix_s") for p in [*sweep.points, *([sweep.current] if sweep.current else [])]]
    kept = KE.get("run")
    watch = KE.get("watch")
    if watch is None:  # nothing followed now: the view computed for this run while it was, if any
        return kept if kept is not None and kept.get("run_start") == starts[:1] else None
    view = dict(kept or {}) if kept is not None and kept.get("run_start") == starts[:1] else {}
    view["run_start"] = starts[:1]
    if point and point.get("start_unix_s") is not None:
        end_s = max(point_end_s(point), 0.01)
        view.update(rates=watch.run_rates(point["start_unix_s"], end_s), x_max_ms=end_s * 1e3)
    ss = st.session_state
    algo, seed = ss.get("kv_events_algo", DEFAULT_ALGO), (ss.get("kv_events_seed") or "").strip() or None
    key = [[p.get("start_unix_s") for p in result.get("points", [])], algo, seed]
    if final and KE.get("run_key") != key:
        view["attribution"] = watch.run_view(result, algo=algo, seed=seed)
        view["kept"] = bool((result.get("plan") or {}).get("keep_cache_ids"))
        KE.set("run_key", key)
    elif not final:
        view.pop("attribution", None)
        KE.set("run_key", None)
    KE.set("run", view)
    return view


def run_shown() -> dict | None:
    """The load run's last view beside the cache (numbers only: what a room's followers get)."""
    return KE.get("run")


def draw_run_clock(view: dict) -> None:
    """Under the request timeline and the server's blocks per second (kvviz.charts.serving.request_timeline): what
    their times mean, and the bins' width."""
    bin_ms = 1e3 * view["rates"][0]["width_s"] if view["rates"] else 0
    st.caption(tr("kv_events.run_clock", bin=format_fixed(bin_ms, 0)))


REASON_KEYS = ("never", "evicted", "diverged", "reset", "unseeded")


def _why(row: dict) -> str:
    """A request's first miss in words (or why it cannot be known)."""
    if row["unknown"] is not None:
        return tr(f"kv_events.unknown_{row['unknown']}")
    if row["reason"] is None:
        return tr("kv_events.why_hit" if row["lookup"] else "kv_events.why_no_block")
    t = row["removed_s"]
    if row["reason"] in ("evicted", "reset") and t is None:
        return tr(f"kv_events.why_{row['reason']}_when_unknown", block=row["first_miss"])
    return tr(f"kv_events.why_{row['reason']}", block=row["first_miss"], t="" if t is None else format_fixed(t, 2))


def draw_attribution(view: dict | None, *, lecture: bool) -> None:
    """A finished run's requests against the cache: the settings used, a one-line summary, a row per request."""
    att = (view or {}).get("attribution")
    if att is None:
        return
    st.markdown(tr("kv_events.run_header"))
    if not view.get("kept"):
        st.info(tr("kv_events.run_not_kept"))
    block = "?" if att["block_size"] is None else att["block_size"]
    st.caption(tr("kv_events.run_settings", block=block, algo=att["algo"],
                  seed=att["seed"] if att["seed"] is not None else tr("kv_events.seed_default")))
    if att["incomplete"]:
        st.warning(tr("kv_events.run_incomplete"))
    s = att["summary"]
    first = s["first_miss"]
    pct = "—" if not s["lookup_blocks"] else f"{100 * s['hit_blocks'] / s['lookup_blocks']:.0f}%"
    st.markdown(tr("kv_events.run_summary", requests=len(att["rows"]), hit=s["hit_blocks"], lookup=s["lookup_blocks"],
                   pct=pct, unknown=sum(att["unknown"].values()), **{k: first[k] for k in REASON_KEYS}))
    check = att.get("server_agree") or {"compared": 0}
    if check["compared"]:
        st.caption(tr("kv_events.run_server_agree", agree=check["agree"], n=check["compared"]))
    rows = [{**r, "why": _why(r)} for r in att["rows"]]
    keys = [k for k in ("point", "request", "sent_s", "tokens", "lookup", "hit_blocks", "why", "server_cached")
            if any(r[k] is not None for r in rows)]  # a column nobody knows left out (a server without usage)
    with st.expander(tr("kv_events.run_rows"), expanded=not lecture):
        table([{tr(f"kv_events.r_{k}"): r[k] for k in keys} for r in rows], "kv_events_attribution")
