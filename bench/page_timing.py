"""Timing as the pages measure it, with the browser open: Prefill & Decode runs and the prompt-length sweep.

Runs the real app (`streamlit run app.py`) and the system Chromium through tests/browser/harness.py,
clicks Run request --runs times at --prompt/--new tokens and then the prompt-length sweep --sweeps times,
and reads the numbers the page drew from its charts' data (so the same analysis applies whatever the
page's own text says):

- per run: TTFT, TPOT p50, prefill ÷ one decode step (p50), T measured vs TTFT + (N−1)·TPOT_p50, decode p90 ÷ p50;
- per sweep: the straight-line TTFT slope over prompt length (µs per token) with its standard error.

    python bench/page_timing.py [--runs 3] [--sweeps 3] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
from harness import app_server, chromium, wait_idle  # noqa: E402

CHARTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => ({
  title: g.layout && g.layout.title ? g.layout.title.text : '',
  data: g.data.map(d => ({name: d.name, type: d.type, x: d.x, y: d.y}))}))"""


SIGNATURE = """() => { const g = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
  g => g.layout && g.layout.title && String(g.layout.title.text).includes('Per-token latency'));
  return g ? JSON.stringify(g.data.map(d => d.y)) : ''; }"""
FINISHED = """([before, n]) => { const g = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
  g => g.layout && g.layout.title && String(g.layout.title.text).includes('Per-token latency'));
  if (!g) return false;
  const sig = JSON.stringify(g.data.map(d => d.y));
  const bars = g.data.filter(d => d.type === 'bar');
  return sig !== before && bars.length >= 3 && bars[2].y.length === n
    && document.querySelector("[data-testid='stApp'][data-test-script-state='notRunning']") !== null; }"""


SWEEP_SIG = """() => { const g = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
  g => g.layout && g.layout.title && String(g.layout.title.text).includes('TTFT and TPOT'));
  const t = g ? g.data.find(d => d.name === 'TTFT') : null;
  return t ? JSON.stringify(t.y) : ''; }"""
SWEEP_DONE = """([before, n]) => { const g = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
  g => g.layout && g.layout.title && String(g.layout.title.text).includes('TTFT and TPOT'));
  const t = g ? g.data.find(d => d.name === 'TTFT') : null;
  return t !== null && t !== undefined && t.y.length === n && JSON.stringify(t.y) !== before
    && document.querySelector("[data-testid='stApp'][data-test-script-state='notRunning']") !== null; }"""


def _open(page, link: str) -> None:
    page.get_by_test_id("stSidebarUserContent").get_by_role("link", name=link).click()
    wait_idle(page)


def _set(page, label: str, value: str, exact: bool = False) -> None:
    box = page.get_by_label(label, exact=exact).first
    box.fill(value)
    box.press("Enter")
    page.wait_for_timeout(300)
    wait_idle(page)


def _charts(page) -> list[dict]:
    return page.evaluate(CHARTS)


def _timeline(charts: list[dict]) -> dict:
    """The Prefill & Decode timeline: queue and prefill bars for token 1, a decode bar per later token."""
    chart = next(c for c in charts if "Per-token latency" in str(c["title"]))
    bars = [d for d in chart["data"] if d["type"] == "bar"]
    queue, prefill, decode = bars[0]["y"][0], bars[1]["y"][0], bars[2]["y"]
    n = 1 + len(decode)
    ttft, total = queue + prefill, queue + prefill + sum(decode)
    p50, p90 = float(np.percentile(decode, 50)), float(np.percentile(decode, 90))
    predicted = ttft + (n - 1) * p50
    return {"ttft_ms": ttft, "tpot_p50_ms": p50, "prefill_over_step": prefill / p50,
            "formula_error_pct": (predicted - total) / total * 100, "p90_over_p50": p90 / p50,
            "max_step_ms": max(decode), "n": n, "decode_ms": decode}


def _slope(charts: list[dict]) -> dict:
    """Straight-line TTFT fit over prompt length from the chart's TTFT points: slope and standard error."""
    chart = next(c for c in charts if "TTFT and TPOT" in str(c["title"]))
    ttft = next(d for d in chart["data"] if d["name"] == "TTFT")
    x, y = np.asarray(ttft["x"], float), np.asarray(ttft["y"], float)
    (a, b), cov = np.polyfit(x, y, 1, cov=True)
    return {"us_per_token": a * 1e3, "stderr_us": float(np.sqrt(cov[0, 0])) * 1e3, "fixed_ms": b,
            "points": dict(zip(x.astype(int).tolist(), np.round(y, 2).tolist(), strict=True))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--lengths", default="16, 32, 64, 128, 256, 448")
    ap.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for the app server (0 = inherit)")
    ap.add_argument("--repeats", type=int, default=0, help="set the page's Runs box (0 = its default; absent before)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
    runs, slopes = [], []
    with app_server(env) as url, chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.goto(url)
        wait_idle(page)
        _open(page, "Prefill & Decode")
        _set(page, "Prompt length (tokens)", str(args.prompt))
        _set(page, "New tokens N", str(args.new))
        if args.repeats:
            _set(page, "Runs", str(args.repeats), exact=True)  # not "Help for Runs"
        load_start = os.getloadavg()[0]
        for _ in range(args.runs):
            before = page.evaluate(SIGNATURE)
            page.get_by_role("button", name="Run request").click()
            page.wait_for_function(FINISHED, arg=[before, args.new - 1], timeout=300_000, polling=200)
            wait_idle(page, 300_000)
            runs.append(_timeline(_charts(page)))
            verdict = page.locator("[data-testid='stMarkdownContainer']", has_text="TTFT + (").all_inner_texts()
            runs[-1]["page_says"] = " | ".join(t.replace("\n", " ") for t in verdict)
            # The TTFT metric the page shows: the median over its repeated runs of this request.
            shown = page.get_by_test_id("stMetric").filter(has_text="TTFT").first.get_by_test_id("stMetricValue")
            runs[-1]["page_ttft_ms"] = float(shown.inner_text().split()[0])
            print("run", runs[-1], flush=True)
        if args.sweeps:
            _open(page, "Latency & Capacity")
            _set(page, "Prompt lengths", args.lengths)
        for _ in range(args.sweeps):
            before = page.evaluate(SWEEP_SIG)
            page.get_by_role("tabpanel").get_by_role("button", name="Start sweep").click()
            n_lengths = len([v for v in args.lengths.split(",") if v.strip()])
            page.wait_for_function(SWEEP_DONE, arg=[before, n_lengths], timeout=600_000, polling=300)
            wait_idle(page, 300_000)
            slopes.append(_slope(_charts(page)))
            verdict = page.locator("[data-testid='stMarkdownContainer']", has_text="slopes").all_inner_texts()
            slopes[-1]["page_says"] = " | ".join(t.replace("\n", " ") for t in verdict)
            print("sweep", slopes[-1], flush=True)
            time.sleep(0.5)
    load_end = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"runs": runs, "sweeps": slopes}, indent=1))
        return
    print(f"Prefill & Decode, {args.prompt}-token prompt, {args.new} new tokens "
          f"(OMP_NUM_THREADS {args.threads or 'inherited'}; 1-min load average {load_start:.1f} at the start, "
          f"{load_end:.1f} at the end, on {os.cpu_count()} cores):")
    for i, r in enumerate(runs, 1):
        print(f"  run {i}: TTFT {r['ttft_ms']:.2f} ms, TPOT p50 {r['tpot_p50_ms']:.2f} ms, "
              f"prefill = {r['prefill_over_step']:.1f}× a decode step, "
              f"TTFT + (N−1)·TPOT_p50 {r['formula_error_pct']:+.1f}% vs T, p90/p50 {r['p90_over_p50']:.2f}, "
              f"slowest step {r['max_step_ms']:.1f} ms")
        if r.get("page_says"):
            print(f"    page: {r['page_says']}")
    if runs:
        for key in ("ttft_ms", "page_ttft_ms", "tpot_p50_ms"):
            vals = [r[key] for r in runs]
            print(f"  {key}: max/min across runs {max(vals) / min(vals):.2f} (median {statistics.median(vals):.2f})")
    print(f"Prompt-length sweep, lengths {args.lengths}:")
    for i, s in enumerate(slopes, 1):
        print(f"  sweep {i}: TTFT slope over the drawn points {s['us_per_token']:.1f} ± {s['stderr_us']:.1f} µs/token, "
              f"fixed {s['fixed_ms']:.2f} ms; points (ms) {s['points']}")
        if s.get("page_says"):
            print(f"    page: {s['page_says']}")


if __name__ == "__main__":
    main()
