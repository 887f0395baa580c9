"""Reusing Past K/V in a real browser: Step latency, rapid clicks, Play's rate and the cold start.

Runs the real app (`streamlit run app.py`) and the system Chromium through tests/browser/harness.py.

- step latency: median and p90 of click Step → page redrawn (new token in the strip, the cache grid one column wider,
  the script idle) over --steps steps, next to the model's own per-pass time read from the page;
- rapid clicks: --rapid clicks as fast as Playwright can send them (no waiting between), then the number of
  new tokens (goal: exactly one per click);
- Play: the measured rate over --play-steps steps at --play-speed steps/s (from the tokens' arrival times);
- cold start: a fresh server, then the time from its health check answering to the Home page drawn
  (script idle, title shown), and to the decode page drawn after following its link;
- every page opened directly (a link shared in a lecture chat): for each page its own fresh server, then the time
  from the request to its first screen (the title shown: every page draws its title and introduction before it
  imports the engine, tests/app/test_cold_start.py) and to the page drawn (model loaded, script idle, charts drawn);
  goal: the first screen <= 3 s on each page.

    python bench/app_step_latency.py [--model tiny|smollm2] [--steps 20] [--rapid 30] [--play-steps 20]
                                     [--play-speed 4] [--threads N]
    python bench/app_step_latency.py --direct-only [--model smollm2]   # only the pages opened directly
"""
from __future__ import annotations

import argparse
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
UPDATED = f"""([n, cached]) => document.querySelector("{IDLE}") !== null
  && ({TOKENS_JS}) === n
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


def prefill(page, max_new: int) -> None:  # noqa: ANN001
    page.get_by_role("spinbutton", name="Max new tokens").fill(str(max_new))
    page.keyboard.press("Enter")
    page.wait_for_timeout(300)
    wait_idle(page)
    page.get_by_role("button", name="Prefill", exact=True).click()
    page.wait_for_selector(".kv-chip.newest", timeout=120_000)
    page.wait_for_selector(".kv-grid", timeout=120_000)
    wait_idle(page)


def open_decode_page(page, url: str) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("h1", timeout=120_000)
    wait_idle(page, 120_000)
    home_s = time.perf_counter() - t0
    page.get_by_role("link", name="Reusing Past K/V").first.click()
    page.wait_for_timeout(300)
    wait_idle(page)
    return home_s


def step_latency(page, n: int) -> dict:  # noqa: ANN001
    step = page.locator(STEP)
    wall, chip_ms, model_ms = [], [], []
    for _ in range(n):
        before, cols = tokens(page), cached(page)
        t0 = time.perf_counter()
        step.click()
        page.wait_for_function(f"n => ({TOKENS_JS}) === n", arg=before + 1,
                               timeout=60_000, polling="raf")
        chip_ms.append((time.perf_counter() - t0) * 1e3)
        page.wait_for_function(UPDATED, arg=[before + 1, cols + 1], timeout=60_000, polling="raf")
        wall.append((time.perf_counter() - t0) * 1e3)
        status = page.get_by_text(re.compile(r"last pass [\d.]+ ms")).first.inner_text()
        model_ms.append(float(re.search(r"last pass ([\d.]+) ms", status).group(1)))
    return {"wall": wall, "chip": chip_ms, "model": model_ms}


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


def direct_open(browser, env: dict, page_file: str, model: str) -> tuple[float, float]:  # noqa: ANN001 - a Browser
    """A fresh server, then `page_file` opened at its own URL (with ?model=): seconds to its title, and to the page
    drawn (script idle, every chart drawn)."""
    with app_server(env) as url:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        t0 = time.perf_counter()
        page.goto(f"{url}/{url_path(page_file)}?model={model}")
        page.wait_for_selector("h1", timeout=120_000)
        title_s = time.perf_counter() - t0
        wait_idle(page, 120_000)
        wait_charts(page, 120_000)
        drawn_s = time.perf_counter() - t0
        page.context.close()
    return title_s, drawn_s


def page_files() -> list[str]:
    return ["app.py", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py"))]


def print_direct(browser, env: dict, model: str) -> None:  # noqa: ANN001
    print(f"every page opened directly on a fresh server, model {model} (first screen / page drawn); goal: first "
          "screen <= 3 s:")
    slowest = 0.0
    for f in page_files():
        title_s, drawn_s = direct_open(browser, env, f, model)
        slowest = max(slowest, drawn_s)
        print(f"  {url_path(f) or 'Home':28s} {title_s:5.2f} s / {drawn_s:5.2f} s", flush=True)
    print(f"  slowest page drawn: {slowest:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="the sidebar's model, as a link's ?model= gives it")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rapid", type=int, default=30)
    ap.add_argument("--play-steps", type=int, default=20)
    ap.add_argument("--play-speed", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for the app server (0 = inherit)")
    ap.add_argument("--direct-only", action="store_true", help="only every page opened directly on a fresh server")
    args = ap.parse_args()
    log = tempfile.NamedTemporaryFile(prefix="kvviz-timing-", suffix=".jsonl", delete=False).name
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
    if args.direct_only:
        with chromium() as browser:
            print_direct(browser, env, args.model)
        return
    env["KVVIZ_TIMING_LOG"] = log  # the page appends the server's own time for each run that served steps
    with chromium() as browser:
        t_up = time.perf_counter()
        with app_server(env) as url:
            up_s = time.perf_counter() - t_up
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            t0 = time.perf_counter()
            home_s = open_decode_page(page, f"{url}/?model={args.model}")
            decode_s = time.perf_counter() - t0
            total = args.steps + args.rapid + args.play_steps + 8
            prefill(page, total)
            model = page.get_by_text(re.compile(r"· \d+ layers ·")).first.inner_text()
            t_lat = time.time()
            lat = step_latency(page, args.steps)
            t_lat_end = time.time()
            got, rapid_s = rapid(page, args.rapid) if args.rapid else (0, 0.0)
            if args.play_steps:
                rate, note = play_rate(page, args.play_steps, args.play_speed)
        print_direct(browser, env, args.model)
    wall = lat["wall"]
    print(f"model: {model}")
    print(f"OMP_NUM_THREADS: {args.threads or 'inherited'}")
    print(f"cold start: server healthy after {up_s:.1f} s; Home drawn {home_s:.2f} s after it was healthy "
          f"(decode page {decode_s:.2f} s incl. following the link); goal <= 3 s")
    print(f"click Step -> redrawn page ({len(wall)} steps): median {statistics.median(wall):.0f} ms, "
          f"p90 {p90(wall):.0f} ms (min {min(wall):.0f}, max {max(wall):.0f}); goal <= 400 ms")
    print(f"  of which click -> new token: median {statistics.median(lat['chip']):.0f} ms")
    print(f"  model pass itself (StepEvent.seconds): median {statistics.median(lat['model']):.1f} ms")
    runs = []
    if os.path.exists(log):
        with open(log, encoding="utf-8") as f:
            runs = [r["run_s"] * 1e3 for r in map(json.loads, f) if t_lat <= r["t"] <= t_lat_end]
    if runs:
        print(f"  server's own fragment run per step (script, incl. the model): "
              f"median {statistics.median(runs):.0f} ms, p90 {p90(runs):.0f} ms")
    if args.rapid:
        print(f"rapid clicks: {args.rapid} clicks -> {got} new tokens in {rapid_s:.1f} s "
              f"({'none lost' if got == args.rapid else f'{args.rapid - got} lost'})")
    if args.play_steps:
        print(f"Play at {args.play_speed:g} steps/s: measured {rate:.2f} steps/s over {args.play_steps} steps "
              f"(goal >= {0.9 * args.play_speed:.1f}){'; page said: ' + note if note else ''}")


if __name__ == "__main__":
    main()
