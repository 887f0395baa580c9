"""Reusing Past K/V in a real browser: Step latency, rapid clicks, Play's rate and the cold start.

Runs the real app (`streamlit run app.py`) and the system Chromium through tests/browser/harness.py.

- step latency: median and p90 of click Step → page redrawn (new token in the strip, the cache grid one column wider,
  the script idle) over --steps steps, as Playwright sees it and on the page's own clock (the click event to the
  first animation frame that shows all three: what a hand sees, without Playwright's own round trips; the goal
  <= 120 ms is read there), next to the model's own per-pass time read from the page, and split where the
  time goes, on the page's own clock (performance.now()): click → the rerun request on the websocket; request → the
  server's last message (the server's own fragment run, from its timing log, and the rest: Streamlit's queueing,
  serializing and the transfer), with the bytes received; last message → redrawn (the browser); and Chromium's own
  main-thread time over the step (CDP Performance.getMetrics: script, style, layout, the rest = paint, compositing,
  parsing, GC) and the page's element count;
- rapid clicks: --rapid clicks as fast as Playwright can send them (no waiting between), then the number of
  new tokens (goal: exactly one per click);
- Play: the measured rate over --play-steps steps at --play-speed steps/s (from the tokens' arrival times);
- cold start: a fresh server, then the time from its health check answering to the Home page drawn
  (script idle, title shown), and to the decode page drawn after following its link;
- every page opened directly (a link shared in a lecture chat): for each page its own fresh server, then the time
  from the request to its first screen (the title painted, on the page's own clock: every page draws its title and
  introduction before it imports the engine, tests/app/test_cold_start.py) and to the page drawn (model loaded,
  script idle, charts drawn); goal: the first screen <= 2.5 s on each page, the median of --repeats fresh servers.

    python bench/app_step_latency.py [--model tiny|smollm2] [--steps 20] [--rapid 30] [--play-steps 20]
                                     [--play-speed 4] [--threads N] [--no-direct] [--lecture]
    python bench/app_step_latency.py --compare OTHER_CHECKOUT [--rounds 3] [--steps 10] [--model smollm2]
        # step latency only, this checkout's app and OTHER_CHECKOUT's on two servers, alternating rounds
    python bench/app_step_latency.py --direct-only [--model smollm2] [--repeats 3] [--pages Home,Memory_Footprint]
        # only the pages opened directly
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
from harness import IDLE, ROOT, TOKENS_JS, app_server, chromium, url_path, wait_charts, wait_idle  # noqa: E402

# Counted in tokens, not chips: a run of byte tokens (a Korean syllable, an emoji) is one chip of several tokens.
UPDATED_BODY = f"""document.querySelector("{IDLE}") !== null && ({TOKENS_JS}) === n
  && document.querySelector('.kv-grid[data-positions="' + cached + '"]') !== null"""
STEP = "button.kv-step"


def tokens(page) -> int:  # noqa: ANN001
    """Tokens shown in the strip."""
    return page.evaluate(TOKENS_JS)


def cached(page) -> int:  # noqa: ANN001
    return int(page.locator(".kv-grid").first.get_attribute("data-positions"))


def p90(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


@contextlib.contextmanager
def settings_shown(page):  # noqa: ANN001, ANN201
    """The page's settings and model line in view: in lecture mode they are behind the settings button."""
    folded = not page.get_by_role("spinbutton", name="Max new tokens").is_visible()
    if folded:
        page.get_by_role("button", name="Prompt, length and speed").click()
    yield
    if folded:
        page.keyboard.press("Escape")
        page.wait_for_timeout(300)


def model_line(page) -> str:  # noqa: ANN001
    with settings_shown(page):
        return page.get_by_text(re.compile(r"· \d+ layers ·")).first.inner_text()


def prefill(page, max_new: int) -> None:  # noqa: ANN001
    with settings_shown(page):
        page.get_by_role("spinbutton", name="Max new tokens").fill(str(max_new))
        page.keyboard.press("Enter")
        page.wait_for_timeout(300)
        wait_idle(page)
    page.get_by_role("button", name="Prefill", exact=True).click()
    page.wait_for_selector(".kv-chip.newest", timeout=120_000)
    page.wait_for_selector(".kv-grid", timeout=120_000)
    wait_idle(page)


def open_decode_page(page, url: str, query: str) -> float:  # noqa: ANN001
    """Home, then the decode page through the sidebar's link (in lecture mode, whose sidebar is folded away, its
    own URL); Home's seconds."""
    t0 = time.perf_counter()
    page.goto(f"{url}/{query}")
    page.wait_for_selector("h1", timeout=120_000)
    wait_idle(page, 120_000)
    home_s = time.perf_counter() - t0
    if "lecture=1" in query:
        page.goto(f"{url}/{url_path('pages/1_Reusing_Past_KV.py')}{query}")
    else:
        page.get_by_role("link", name="Reusing Past K/V").first.click()
    page.wait_for_timeout(300)
    wait_idle(page)
    return home_s


# On the page's own clock: the Step click, and each websocket message sent and received (time, bytes). The
# listener is added when the socket is made, before Streamlit's own handler, so a message is timed as it arrives.
PROBE_JS = """(() => {
  const T = window.__kvT = {click: 0, sent: [], recv: []};
  window.addEventListener('click', (e) => {  // the button may sit in a component's shadow root
    if (e.composedPath().some((el) => el.classList && el.classList.contains('kv-step'))) T.click = performance.now();
  }, true);
  const size = (d) => d ? (d.byteLength ?? d.size ?? d.length ?? 0) : 0;
  const WS = window.WebSocket;
  class Timed extends WS {
    constructor(...a) {
      super(...a);
      this.addEventListener('message', (ev) => T.recv.push([performance.now(), size(ev.data)]));
    }
    send(d) { T.sent.push([performance.now(), size(d)]); return super.send(d); }
  }
  window.WebSocket = Timed;
})();"""
# Chromium's main-thread time by kind (seconds, cumulative): CDP Performance.getMetrics.
METRICS = ("TaskDuration", "ScriptDuration", "RecalcStyleDuration", "LayoutDuration")


def chrome_metrics(cdp) -> dict[str, float]:  # noqa: ANN001 - a CDPSession
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def step_latency(page, n: int, cdp=None) -> dict:  # noqa: ANN001
    """n Steps, each timed click -> redrawn, and split (see the module's docstring) when the page has PROBE_JS."""
    step = page.locator(STEP)
    keys = ("wall", "page", "chip", "model", "to_send", "to_first", "to_last", "tail", "bytes", "task", "script",
            "style", "layout", "nodes")
    out: dict[str, list[float]] = {k: [] for k in keys}
    probed = page.evaluate("() => !!window.__kvT")
    for _ in range(n):
        before, cols = tokens(page), cached(page)
        page.evaluate("() => { if (window.__kvT) { __kvT.sent = []; __kvT.recv = []; __kvT.click = 0; } }")
        m0 = chrome_metrics(cdp) if cdp else {}
        # The first frame in which the page shows the step, on the page's clock: watched by the page itself on
        # every animation frame (Playwright's own polls answer a round trip later).
        page.evaluate(f"""([n, cached]) => {{ window.__kvDone = 0;
            const tick = () => {{ if ({UPDATED_BODY}) window.__kvDone = performance.now();
                                  else requestAnimationFrame(tick); }};
            requestAnimationFrame(tick); }}""", [before + 1, cols + 1])
        t0 = time.perf_counter()
        step.click()
        page.wait_for_function(f"n => ({TOKENS_JS}) === n", arg=before + 1,
                               timeout=60_000, polling="raf")
        out["chip"].append((time.perf_counter() - t0) * 1e3)
        page.wait_for_function("window.__kvDone > 0", timeout=60_000, polling="raf")
        out["wall"].append((time.perf_counter() - t0) * 1e3)
        if cdp:
            m1 = chrome_metrics(cdp)
            for key, name in zip(("task", "script", "style", "layout"), METRICS, strict=True):
                out[key].append((m1[name] - m0[name]) * 1e3)
            out["nodes"].append(m1["Nodes"])
        if probed:
            t = page.evaluate("() => ({click: __kvT.click, done: window.__kvDone, sent: __kvT.sent, "
                              "recv: __kvT.recv})")
            sent = next((ts for ts, _ in t["sent"] if ts >= t["click"]), t["click"])
            recv = [(ts, b) for ts, b in t["recv"] if sent <= ts <= t["done"]]
            last = recv[-1][0] if recv else sent
            out["page"].append(t["done"] - t["click"])
            out["to_send"].append(sent - t["click"])
            out["to_first"].append((recv[0][0] if recv else sent) - sent)
            out["to_last"].append(last - sent)
            out["tail"].append(t["done"] - last)
            out["bytes"].append(sum(b for _, b in recv))
        status = page.get_by_text(re.compile(r"last pass [\d.]+ ms")).first.inner_text()
        out["model"].append(float(re.search(r"last pass ([\d.]+) ms", status).group(1)))
    return out


def server_runs(log: str, since: float, until: float) -> list[float]:
    """The server's own fragment run (ms) of each run that served steps between `since` and `until`."""
    if not os.path.exists(log):
        return []
    with open(log, encoding="utf-8") as f:
        return [r["run_s"] * 1e3 for r in map(json.loads, f)
                if r.get("event") == "reuse_steps" and since <= r["t"] <= until]


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.0f}" if values else "-"


def print_split(lat: dict, runs: list[float]) -> None:
    """Where a Step's time goes, medians over the steps."""
    wall = lat["wall"]
    print(f"click Step -> redrawn page ({len(wall)} steps): median {statistics.median(wall):.0f} ms, "
          f"p90 {p90(wall):.0f} ms (min {min(wall):.0f}, max {max(wall):.0f})")
    if lat["page"]:  # what a user sees: no Playwright round trips (its click's dispatch, its polls' answers)
        page = lat["page"]
        print(f"  on the page's own clock (the click event -> the first frame with the new token and column): "
              f"median {statistics.median(page):.0f} ms, p90 {p90(page):.0f} ms (goal <= 120 ms)")
    print(f"  of which click -> new token: median {statistics.median(lat['chip']):.0f} ms")
    print(f"  model pass itself (StepEvent.seconds, the page's 'last pass'): median "
          f"{statistics.median(lat['model']):.1f} ms")
    if runs:
        print(f"  server's own fragment run per step (script, incl. the model): "
              f"median {statistics.median(runs):.0f} ms, p90 {p90(runs):.0f} ms")
    if lat["to_last"]:
        rest = [a - b for a, b in zip(lat["to_last"], runs, strict=False)] if len(runs) == len(lat["to_last"]) else []
        print(f"  split (medians, page clock): click -> request sent {med(lat['to_send'])} ms; request -> server's "
              f"first message {med(lat['to_first'])} ms, last message {med(lat['to_last'])} ms (fragment run "
              f"{med(runs)}, queueing + serializing + transfer {med(rest)}); last message -> redrawn (browser) "
              f"{med(lat['tail'])} ms; "
              f"{statistics.median(lat['bytes']) / 1024:.1f} KiB received per step")
    if lat["task"]:
        other = [t - s - y - la for t, s, y, la in zip(lat["task"], lat["script"], lat["style"], lat["layout"],
                                                       strict=True)]
        print(f"  Chromium main thread over the step (Performance.getMetrics, medians): busy {med(lat['task'])} ms = "
              f"script {med(lat['script'])} + style {med(lat['style'])} + layout {med(lat['layout'])} + "
              f"paint/composite/other {med(other)}; DOM nodes {statistics.median(lat['nodes']):.0f}")


def open_probed(browser, url: str, model: str, lecture: bool = False):  # noqa: ANN001, ANN201
    """A page with PROBE_JS and a CDP session measuring it, opened on the decode page; and Home's seconds."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.add_init_script(PROBE_JS)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable", {"timeDomain": "threadTicks"})
    query = f"?model={model}" + ("&lecture=1" if lecture else "")
    home_s = open_decode_page(page, url, query)
    return page, cdp, home_s


def compare(other: str, args: argparse.Namespace) -> None:
    """This checkout's app and `other`'s, each on its own server, measured in alternating rounds of --steps steps
    (the machine's load drifts: alternating shares it fairly). Prints each app's split over all its rounds."""
    roots = {"this": ROOT, "other": Path(other).resolve()}
    logs = {k: tempfile.NamedTemporaryFile(prefix=f"kvviz-timing-{k}-", suffix=".jsonl", delete=False).name
            for k in roots}
    total = args.rounds * args.steps + 4
    with chromium() as browser, contextlib.ExitStack() as stack:
        pages, lats, runs, loads = {}, {k: {} for k in roots}, {k: [] for k in roots}, []
        for k, root in roots.items():
            url = stack.enter_context(app_server({"KVVIZ_TIMING_LOG": logs[k]}, root=root))
            pages[k] = open_probed(browser, url, args.model, args.lecture)[:2]
            prefill(pages[k][0], total)
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for k in roots:
                page, cdp = pages[k]
                t_lat = time.time()
                lat = step_latency(page, args.steps, cdp)
                runs[k] += server_runs(logs[k], t_lat, time.time())
                for key, values in lat.items():
                    lats[k].setdefault(key, []).extend(values)
        model = model_line(pages["this"][0])
    print(f"model: {model}; {args.rounds} alternating rounds of {args.steps} steps; load average (1 min) at each "
          f"round: {', '.join(f'{x:.2f}' for x in loads)} on {os.cpu_count()} cores"
          + ("; lecture mode" if args.lecture else ""))
    for k, root in roots.items():
        print(f"{k} ({root}):")
        print_split(lats[k], runs[k])


def rapid(page, n: int) -> tuple[int, float]:  # noqa: ANN001
    """n clicks back to back; returns the new tokens once the page settles, and the seconds it took."""
    before = tokens(page)
    t0 = time.perf_counter()
    page.locator(STEP).evaluate("(b, n) => { for (let i = 0; i < n; i++) b.click(); }", n)
    deadline = time.monotonic() + 120
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = tokens(page)
        if now != last:
            last, stable_since = now, time.monotonic()
        elif now - before >= n or time.monotonic() - stable_since > 5:
            break
        page.wait_for_timeout(100)
    wait_idle(page)
    return tokens(page) - before, time.perf_counter() - t0


def play_rate(page, n: int, speed: float) -> tuple[float, str]:  # noqa: ANN001
    """Steps per second over n steps of Play (first token after Play to the n-th), and any 'behind' note."""
    before = tokens(page)
    page.locator(".st-key-reuse_btn_play button").click()
    page.wait_for_function(f"n => ({TOKENS_JS}) > n", arg=before, timeout=60_000,
                           polling="raf")
    t0, first = time.perf_counter(), tokens(page)
    page.wait_for_function(f"n => ({TOKENS_JS}) >= n", arg=first + n, timeout=120_000,
                           polling="raf")
    rate = (tokens(page) - first) / (time.perf_counter() - t0)
    note = page.locator("[data-testid='stAlert']").all_inner_texts()
    page.locator(".st-key-reuse_btn_pause button").click(force=True)
    page.wait_for_selector(".st-key-reuse_btn_play", timeout=30_000)
    wait_idle(page)
    return rate, " | ".join(t for t in note if "steps/s" in t)


# The title's paint on the page's own clock (Element Timing: the browser's renderTime of an element marked
# `elementtiming`, marked here as it enters the DOM, before its first paint). Playwright's wait_for_selector answers
# only once the page's main thread is free: on Memory Footprint it answered 0.4-1.7 s after the title was painted,
# while Plotly's code was being compiled.
TITLE_JS = """(() => {
  new MutationObserver((_, seen) => {
    const h1 = document.querySelector('h1');
    if (h1) { seen.disconnect(); h1.setAttribute('elementtiming', 'kv-title'); }
  }).observe(document, {subtree: true, childList: true});
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) if (e.identifier === 'kv-title') window.__kvTitle = e.renderTime || e.loadTime;
  }).observe({type: 'element', buffered: true});
  window.__kvLong = [];  // the main thread's long tasks (> 50 ms): while one runs, the page answers no input
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) window.__kvLong.push([e.startTime, e.duration]);
  }).observe({type: 'longtask', buffered: true});
})();"""


def title_painted(page, started: float) -> float:  # noqa: ANN001
    """Seconds from `started` (time.time() at the request) to the title's first paint, on the page's clock."""
    page.wait_for_function("window.__kvTitle !== undefined", timeout=120_000)
    origin_ms, painted_ms = page.evaluate("[performance.timeOrigin, window.__kvTitle]")
    return (origin_ms + painted_ms) / 1000 - started


def blocked_after_title(page) -> float:  # noqa: ANN001
    """Seconds of the main thread's long tasks from the title's paint on: the time the shown page could not answer
    a click or a key (each long task's whole length, as Lighthouse's Total Blocking Time counts it less 50 ms)."""
    return page.evaluate("window.__kvLong.filter(([t]) => t >= window.__kvTitle).reduce((a, [, d]) => a + d, 0)") / 1000


def direct_open(browser, env: dict, page_file: str, model: str) -> tuple[float, float, float]:  # noqa: ANN001
    """A fresh server, then `page_file` opened at its own URL (with ?model=): seconds to its title painted, to the
    page drawn (script idle, every chart drawn), and of long tasks between the two."""
    with app_server(env) as url:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.add_init_script(TITLE_JS)
        t0, started = time.perf_counter(), time.time()
        page.goto(f"{url}/{url_path(page_file)}?model={model}")
        title_s = title_painted(page, started)
        wait_idle(page, 120_000)
        wait_charts(page, 120_000)
        drawn_s = time.perf_counter() - t0
        blocked_s = blocked_after_title(page)
        page.context.close()
    return title_s, drawn_s, blocked_s


def page_files() -> list[str]:
    return ["app.py", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py"))]


def print_direct(browser, env: dict, model: str, repeats: int = 3, only: list[str] | None = None) -> None:  # noqa: ANN001
    """Each page (or those named in `only`, by URL path) opened directly, each time on a fresh server, `repeats`
    times in turn: the median first screen and page drawn, and the load average beside each page's runs."""
    print(f"every page opened directly on a fresh server, model {model}, median of {repeats} (first screen / page "
          "drawn / main thread blocked by long tasks in between); goal: first screen <= 2.5 s:")
    files = [f for f in page_files() if only is None or (url_path(f) or "Home") in only]
    runs: dict[str, list[tuple[float, float, float]]] = {f: [] for f in files}
    loads: dict[str, list[float]] = {f: [] for f in files}
    for _ in range(repeats):  # the pages in turn, so that a busy minute does not fall on one page's runs
        for f in files:
            loads[f].append(os.getloadavg()[0])
            runs[f].append(direct_open(browser, env, f, model))
    slowest = 0.0
    for f in files:
        title_s = statistics.median(r[0] for r in runs[f])
        drawn_s = statistics.median(r[1] for r in runs[f])
        blocked_s = statistics.median(r[2] for r in runs[f])
        slowest = max(slowest, title_s)
        each = ", ".join(f"{r[0]:.2f}" for r in runs[f])
        print(f"  {url_path(f) or 'Home':28s} {title_s:5.2f} s / {drawn_s:5.2f} s / {blocked_s:4.2f} s  (first screens "
              f"{each}; load "
              f"{min(loads[f]):.1f}-{max(loads[f]):.1f})", flush=True)
    print(f"  slowest first screen (median): {slowest:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="the sidebar's model, as a link's ?model= gives it")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rapid", type=int, default=30)
    ap.add_argument("--play-steps", type=int, default=20)
    ap.add_argument("--play-speed", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for the app server (0 = inherit)")
    ap.add_argument("--direct-only", action="store_true", help="only every page opened directly on a fresh server")
    ap.add_argument("--no-direct", action="store_true", help="skip the pages opened directly")
    ap.add_argument("--repeats", type=int, default=3, help="fresh servers per page opened directly (the median)")
    ap.add_argument("--pages", help="pages opened directly, by URL path (Home,Memory_Footprint): default all")
    ap.add_argument("--lecture", action="store_true", help="the decode page in lecture mode (?lecture=1)")
    ap.add_argument("--compare", metavar="CHECKOUT", help="step latency only: this app against CHECKOUT's, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="with --compare: alternating rounds of --steps steps")
    args = ap.parse_args()
    if args.compare:
        compare(args.compare, args)
        return
    log = tempfile.NamedTemporaryFile(prefix="kvviz-timing-", suffix=".jsonl", delete=False).name
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
    if args.direct_only:
        with chromium() as browser:
            print_direct(browser, env, args.model, args.repeats, args.pages.split(",") if args.pages else None)
        return
    env["KVVIZ_TIMING_LOG"] = log  # the page appends the server's own time for each run that served steps
    with chromium() as browser:
        t_up = time.perf_counter()
        with app_server(env) as url:
            up_s = time.perf_counter() - t_up
            t0 = time.perf_counter()
            page, cdp, home_s = open_probed(browser, url, args.model, args.lecture)
            decode_s = time.perf_counter() - t0
            total = args.steps + args.rapid + args.play_steps + 8
            prefill(page, total)
            model = model_line(page)
            load = os.getloadavg()
            t_lat = time.time()
            lat = step_latency(page, args.steps, cdp)
            t_lat_end = time.time()
            got, rapid_s = rapid(page, args.rapid) if args.rapid else (0, 0.0)
            if args.play_steps:
                rate, note = play_rate(page, args.play_steps, args.play_speed)
        if not args.no_direct:
            print_direct(browser, env, args.model, args.repeats, args.pages.split(",") if args.pages else None)
    print(f"model: {model}")
    print(f"OMP_NUM_THREADS: {args.threads or 'inherited'}")
    print(f"cold start: server healthy after {up_s:.1f} s; Home drawn {home_s:.2f} s after it was healthy "
          f"(decode page {decode_s:.2f} s incl. following the link); goal <= 3 s")
    print(f"load average during the steps: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    print_split(lat, server_runs(log, t_lat, t_lat_end))
    if args.rapid:
        print(f"rapid clicks: {args.rapid} clicks -> {got} new tokens in {rapid_s:.1f} s "
              f"({'none lost' if got == args.rapid else f'{args.rapid - got} lost'})")
    if args.play_steps:
        print(f"Play at {args.play_speed:g} steps/s: measured {rate:.2f} steps/s over {args.play_steps} steps "
              f"(goal >= {0.9 * args.play_speed:.1f}){'; page said: ' + note if note else ''}")


if __name__ == "__main__":
    main()
