"""Why the browser tests reuse their tabs (tests/browser/harness.Tabs): the same pages opened in a new browser context
each time, and in one tab that opens each next URL, alternating, on one app server and one Chromium. Per page opened
(script idle, every chart drawn): the wall time, Chromium's CPU time (all its processes, from /proc) and its main
thread's script time (CDP Performance.getMetrics); the medians, and their ratios reused ÷ new.

    python bench/browser_tab_reuse.py [--rounds 3] [--pages Memory_Footprint,Check,Moving_the_Cache]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
from harness import app_server, chromium, goto_idle, settle  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def chromium_cpu_s() -> float:
    """CPU seconds used so far by every Chromium process on this machine (user + system)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"chromium" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def open_page(page, url: str) -> tuple[float, float, float]:  # noqa: ANN001 - a Playwright Page
    """(wall s, Chromium CPU s, main-thread script s) of opening `url` until it is drawn."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    cpu, start = chromium_cpu_s(), time.perf_counter()
    goto_idle(page, url)
    settle(page)
    wall, cpu = time.perf_counter() - start, chromium_cpu_s() - cpu
    script = next(m["value"] for m in cdp.send("Performance.getMetrics")["metrics"] if m["name"] == "ScriptDuration")
    cdp.detach()
    return wall, cpu, script  # the metrics start again with each document: this one's script time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pages", default="Memory_Footprint,Check,Moving_the_Cache")
    args = ap.parse_args()
    pages = args.pages.split(",")
    runs: dict[str, list[tuple[float, float, float]]] = {"new context": [], "reused tab": []}
    with app_server() as url, chromium() as browser:
        tab_context = browser.new_context(viewport={"width": 1280, "height": 720})
        tab = tab_context.new_page()
        open_page(tab, f"{url}/Check")  # the tab's first page compiles the code it then keeps
        for _ in range(args.rounds):
            for name in pages:
                context = browser.new_context(viewport={"width": 1280, "height": 720})
                runs["new context"].append(open_page(context.new_page(), f"{url}/{name}"))
                context.close()
                runs["reused tab"].append(open_page(tab, f"{url}/{name}"))
        tab_context.close()
    print(f"{args.rounds} rounds of {', '.join(pages)}; medians per page opened (load average "
          f"{os.getloadavg()[0]:.1f}):")
    med = {way: [statistics.median(r[i] for r in rows) for i in range(3)] for way, rows in runs.items()}
    for way, (wall, cpu, script) in med.items():
        print(f"  {way:12s} wall {wall:5.2f} s, Chromium CPU {cpu:5.2f} s, script {script:5.2f} s")
    new, reused = med["new context"], med["reused tab"]
    ratios = ", ".join(f"{what} {r / n:.2f}" for what, r, n in zip(("wall", "CPU", "script"), reused, new, strict=True))
    print(f"  reused ÷ new: {ratios}")


if __name__ == "__main__":
    main()
