"""A lecture room's cost and speed, in three parts.

- Chromium tabs: the real app (`python -m kvviz serve`, tests/browser/harness.py), a lecturer's tab on Reusing Past
  K/V in lecture mode that shared the page and prefilled, and --tabs follower tabs (390×844, each its own session);
  the lecturer clicks Step --clicks times, and each tab records (a MutationObserver, the page's own clock) when its
  cache grid shows the new position. For each tab count (0: the lecturer alone) prints click -> follower redrawn
  over every (click, tab), click -> the lecturer's own page redrawn (its Step time, with and without followers),
  each median and p90, and the server's CPU while the room sits idle (the followers' polls alone). Goal: median
  <= 1 s with 10 tabs (a run's follower polls the room twice a second), the lecturer's step unchanged.
- The store alone: --followers simulated followers each polling the room once a second as a follower's page does
  (hold its seat, ask the version, read the view when it changed), while the lecturer publishes a Reusing Past K/V
  view every --publish-every seconds; in-process and on Redis (a redis-server this script starts on a free loopback
  port and stops). Prints each store's read and version-poll latency (median, p99) and publish latency (median).
  Goal: p99 read <= 10 ms with 500 followers.
- The lecturer under the polls: the real app with its rooms on Redis, the lecturer's Step -> redrawn for --clicks
  clicks with the store quiet and --clicks with --followers simulated followers polling it, alternating, in one run.
  Goal: the lecturer's step time unchanged within its spread (p10-p90).

    python bench/room_follow.py [--tabs 0,1,10] [--clicks 10] [--idle-seconds 10] [--followers 500] [--seconds 10]
                                [--threads 8] [--publish-every 0.5] [--skip-browser] [--skip-store] [--skip-lecturer]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))

from harness import IDLE, app_server, chromium, wait_idle  # noqa: E402

from kvviz.room.store import MemoryStore, RedisStore, RoomStore  # noqa: E402

# In a follower's tab: the page's clock when each number of cached positions was first drawn.
OBSERVE = """() => { window.kvSeen = {}; new MutationObserver(() => {
  const g = document.querySelector('.kv-grid'); const n = g && g.dataset.positions;
  if (n && !(n in window.kvSeen)) window.kvSeen[n] = Date.now(); })
  .observe(document.body, {subtree: true, childList: true, attributes: true}); }"""
POSITIONS = "(+(document.querySelector('.kv-grid') || {dataset: {positions: 0}}).dataset.positions)"
# Step, clicked in the page, and the page's clock then (the stepper is a component: Playwright's locator finds its
# button where document.querySelector does not)
CLICK = "b => { b.click(); return Date.now(); }"


def _tab(browser, url: str, width: int, height: int):  # noqa: ANN001, ANN202 - Playwright objects
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(300_000)  # ten tabs opening on a loaded machine
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(IDLE)
    return context, page


def _prefill(page) -> None:  # noqa: ANN001 - a Playwright Page
    """Press Prefill and wait for the fresh run's cache grid (fewer positions than a run already stepped)."""
    before = page.evaluate("() => " + POSITIONS)
    page.get_by_role("button", name="Prefill", exact=True).click()
    page.wait_for_function(f"{POSITIONS} > 0 && {POSITIONS} !== {before} && document.querySelector(\"{IDLE}\")")


def _cpu_s(pid: int) -> float:
    """The server process's CPU time so far (user + system, /proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_cpu(pid: int, seconds: float) -> float:
    """The server's share of one core while the room is idle (followers polling, nobody clicking), in %."""
    t0, c0 = time.monotonic(), _cpu_s(pid)
    time.sleep(seconds)
    return round(100 * (_cpu_s(pid) - c0) / (time.monotonic() - t0), 1)


def _summary(seconds: list[float]) -> dict:
    return {"samples": len(seconds), "median_s": round(statistics.median(seconds), 3),
            "p90_s": round(_percentile(seconds, 0.9), 3), "max_s": round(max(seconds), 3)}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def browser_run(tab_counts: list[int], clicks: int, idle_s: float) -> dict:
    """For each number of follower tabs (0: the lecturer alone), a fresh Prefill, then: the server's CPU while the
    room sits idle, and for each click, the lecturer's own Step -> redrawn and Step -> each follower redrawn."""
    out = {}
    with app_server(lecture=True) as url, chromium() as browser:
        lecture, lecturer = _tab(browser, f"{url}/Reusing_Past_KV?lecture=1", 1280, 720)
        lecturer.get_by_role("button", name="Prompt, length and speed").click()
        lecturer.get_by_role("button", name="Share with the room").click()
        link = lecturer.locator("[data-testid='stCode'] code").inner_text().strip()
        wait_idle(lecturer)
        for n_tabs in tab_counts:
            _prefill(lecturer)  # a fresh run: every click below is a step, whatever came before
            print(f"{n_tabs} follower tab(s): opening", file=sys.stderr)
            tabs = []
            for k in range(n_tabs):
                tabs.append(_tab(browser, link, 390, 844))
                print(f"  tab {k + 1} open", file=sys.stderr)
            for _, follower in tabs:
                follower.wait_for_function(f"{POSITIONS} === {lecturer.evaluate('() => ' + POSITIONS)}")
                follower.evaluate(OBSERVE)
            lecturer.evaluate(OBSERVE)
            idle = _idle_cpu(url.pid, idle_s)
            own, seconds = [], []
            for i in range(clicks):
                print(f"  click {i + 1}/{clicks}", file=sys.stderr)
                target = lecturer.evaluate("() => " + POSITIONS) + 1
                time.sleep(random.uniform(0.0, 1.0))  # clicks land anywhere in the followers' one-second poll
                clicked = lecturer.locator("button.kv-step").evaluate(CLICK)
                lecturer.wait_for_function(f"window.kvSeen['{target}'] !== undefined")
                own.append((lecturer.evaluate(f"window.kvSeen['{target}']") - clicked) / 1e3)
                for _, follower in tabs:
                    follower.wait_for_function(f"window.kvSeen['{target}'] !== undefined")
                    seconds.append((follower.evaluate(f"window.kvSeen['{target}']") - clicked) / 1e3)
                wait_idle(lecturer)
            for context, _ in tabs:
                context.close()
            out[f"{n_tabs}_tabs"] = {"server_cpu_idle_pct": idle, "lecturer_step": _summary(own),
                                     **({"follower_redrawn": _summary(seconds)} if seconds else {})}
            print(json.dumps({f"{n_tabs}_tabs": out[f"{n_tabs}_tabs"], "seconds": seconds, "own": own}),
                  file=sys.stderr)
        lecture.close()
    return out


def reuse_view(n_tokens: int = 64, n_layers: int = 30, n_heads: int = 9) -> dict:
    """A view the size a SmolLM2-sized run publishes: 30 layers' grid, nine heads' attention row, 64 tokens."""
    return {"page": "reuse", "path": "pages/1_Reusing_Past_KV.py", "n_prompt": 16, "n_steps": n_tokens - 16,
            "texts": [f"tok{i}" for i in range(n_tokens)], "top_k": [["a", 0.5]] * 5,
            "written_at": [[max(0, i - 15) for i in range(n_tokens)] for _ in range(n_layers)],
            "attention": {"layer": 0, "rows": [[round(1 / n_tokens, 5)] * n_tokens for _ in range(n_heads)]},
            "series": {k: list(range(n_tokens - 15)) for k in ("index", "live", "allocated", "formula")}}


def _poll(store: RoomStore, room_id: str, followers: int, threads: int, stop: threading.Event,
          reads: list[float], polls: list[float] | None = None) -> list[threading.Thread]:
    """`followers` simulated followers, each polling the room once a second (spread evenly over the second) as a
    follower's page does: hold its seat, ask the version (`status`), and read the view when it changed; until
    `stop`. Each read's latency into `reads`, each status's into `polls`."""
    lock = threading.Lock()

    def pool(k: int) -> None:  # followers k, k + threads, ...
        mine = [f"sim{i}" for i in range(k, followers, threads)]
        seen = dict.fromkeys(mine, -1)
        start, n = time.monotonic(), 0
        while not stop.is_set():
            stop.wait(max(0.0, start + n / max(1, len(mine)) - time.monotonic()))
            if stop.is_set():
                return
            follower = mine[n % len(mine)]
            store.hold_seat(room_id, follower)
            t0 = time.perf_counter()
            version, _ = store.status(room_id)
            t1 = time.perf_counter()
            if version != seen[follower]:
                store.read(room_id)
                seen[follower] = version
                with lock:
                    reads.append(time.perf_counter() - t1)
            if polls is not None:
                with lock:
                    polls.append(t1 - t0)
            n += 1

    workers = [threading.Thread(target=pool, args=(k,), daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    return workers


def _read_stats(reads: list[float], seconds: float, polls: list[float] | None = None) -> dict:
    reads = sorted(reads)
    out = {"reads": len(reads), "reads_per_s": round(len(reads) / seconds, 1),
           "read_median_ms": round(statistics.median(reads) * 1e3, 3),
           "read_p99_ms": round(reads[int(0.99 * (len(reads) - 1))] * 1e3, 3)}
    if polls:
        polls = sorted(polls)
        out |= {"polls": len(polls), "status_median_ms": round(statistics.median(polls) * 1e3, 3),
                "status_p99_ms": round(polls[int(0.99 * (len(polls) - 1))] * 1e3, 3)}
    return out


def run(store: RoomStore, followers: int, seconds: float, threads: int, publish_every: float) -> dict:
    room = store.create()
    view = reuse_view()
    store.publish(room.id, room.secret, view)
    reads: list[float] = []
    polls: list[float] = []
    publishes: list[float] = []
    stop = threading.Event()
    workers = _poll(store, room.id, followers, threads, stop, reads, polls)
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:  # the lecturer
        step += 1
        t0 = time.perf_counter()
        store.publish(room.id, room.secret, {**view, "n_steps": step})
        publishes.append(time.perf_counter() - t0)
        time.sleep(publish_every)
    stop.set()
    for w in workers:
        w.join()
    store.end(room.id, room.secret)
    return {**_read_stats(reads, seconds, polls), "publish_median_ms": round(statistics.median(publishes) * 1e3, 3),
            "view_bytes": len(json.dumps(view, separators=(",", ":")))}


def lecturer_under_polls(followers: int, threads: int, clicks: int) -> dict:
    """The lecturer's Step -> redrawn on the real app whose rooms are on Redis (a redis-server this script starts),
    clicks alternating between a quiet store and `followers` simulated followers polling it once a second: the
    lecturer's step time with and without the room's polls, in one run."""
    from tests.room.conftest import redis_server  # the tests' own: a redis-server on a free port, no disk

    with redis_server() as (store_url, _), app_server({"KVVIZ_ROOM_STORE": store_url}, lecture=True) as url, \
            chromium() as browser:
        context, lecturer = _tab(browser, f"{url}/Reusing_Past_KV?lecture=1", 1280, 720)
        lecturer.get_by_role("button", name="Prompt, length and speed").click()
        lecturer.get_by_role("button", name="Share with the room").click()
        room_id = lecturer.locator("[data-testid='stCode'] code").inner_text().strip().rsplit("room=", 1)[1]
        wait_idle(lecturer)
        _prefill(lecturer)
        lecturer.evaluate(OBSERVE)
        store, steps, reads = RedisStore(store_url), {"quiet": [], "polled": []}, []
        t_polled = 0.0
        for i in range(2 * clicks):
            polled = i % 2 == 1
            stop = threading.Event()
            workers = _poll(store, room_id, followers, threads, stop, reads) if polled else []
            t0 = time.monotonic()
            time.sleep(1.0)  # the polls under way (or the store quiet) before the click
            target = lecturer.evaluate("() => " + POSITIONS) + 1
            clicked = lecturer.locator("button.kv-step").evaluate(CLICK)
            lecturer.wait_for_function(f"window.kvSeen['{target}'] !== undefined")
            steps["polled" if polled else "quiet"].append(
                (lecturer.evaluate(f"window.kvSeen['{target}']") - clicked) / 1e3)
            wait_idle(lecturer)
            stop.set()
            for w in workers:
                w.join()
            t_polled += (time.monotonic() - t0) if polled else 0.0
            print(f"  click {i + 1}/{2 * clicks} ({'polled' if polled else 'quiet'})", file=sys.stderr)
        context.close()
    return {"followers": followers, **{k: {**_summary(v), "p10_s": round(_percentile(v, 0.1), 3)}
                                       for k, v in steps.items()},
            "store_while_polled": _read_stats(reads, t_polled)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--followers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--publish-every", type=float, default=0.5)
    parser.add_argument("--tabs", default="0,1,10", help="follower tab counts, comma-separated (0: the lecturer alone)")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="the idle room's server CPU, measured over")
    parser.add_argument("--clicks", type=int, default=10)
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument("--skip-store", action="store_true")
    parser.add_argument("--skip-lecturer", action="store_true", help="skip the lecturer's step under the polls")
    args = parser.parse_args()
    out: dict = {"load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    if not args.skip_browser:
        out["tabs"] = browser_run([int(n) for n in args.tabs.split(",")], args.clicks, args.idle_seconds)
    if not args.skip_store:
        out["store"] = {"followers": args.followers, "seconds": args.seconds,
                        "memory": run(MemoryStore(), args.followers, args.seconds, args.threads, args.publish_every)}
        from tests.room.conftest import redis_server  # the tests' own: a redis-server on a free port, no disk

        with redis_server() as (url, _):
            out["store"]["redis"] = run(RedisStore(url), args.followers, args.seconds, args.threads,
                                        args.publish_every)
    if not args.skip_lecturer:
        out["lecturer_step_under_polls"] = lecturer_under_polls(args.followers, args.threads, args.clicks)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
