"""axe-core's WCAG 2.1 A/AA violations on every page, in English and Korean, normal and lecture mode: elements in
violation per page and the rules they break, for a checkout's app (this one, or --root another: the counts before a
change). Reusing Past K/V is scanned after its main action (Prefill, then three Steps), as the CI test does.

    python bench/axe_counts.py [--root OTHER_CHECKOUT] [--json out.json] [--pages reuse,paged]

Needs axe-core in build/axe (.ci/run installs it: npm install --prefix build/axe axe-core@<AXE_VERSION>).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
from axe import count, violations  # noqa: E402
from harness import IDLE, ROOT, TOKENS_JS, app_server, chromium, settle, url_path  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402

from kvviz.app.navigation import PAGES  # noqa: E402

MODES = {"": {"width": 1400, "height": 1000}, "&lecture=1": {"width": 1280, "height": 720}}


def main_action(page, name: str) -> None:  # noqa: ANN001 - a Playwright Page
    """The page's main action where it is cheap: the decode page's Prefill and three Steps."""
    if name != "reuse":
        return
    page.locator(".st-key-reuse_btn_prefill button").click()
    page.wait_for_function(f"({TOKENS_JS}) > 0", timeout=90_000)
    for _ in range(3):
        before = page.evaluate(TOKENS_JS)
        page.locator("button.kv-step").click()
        page.wait_for_function(f"({TOKENS_JS}) > {before}", timeout=60_000)
    page.wait_for_selector(IDLE, timeout=60_000)
    settle(page)


def scan(url: str, browser, names: set[str] | None) -> dict:  # noqa: ANN001 - a Playwright Browser
    out = {}
    for p in PAGES:
        if names and p.name not in names:
            continue
        for mode, size in MODES.items():
            for lang in ("en", "ko"):
                context = browser.new_context(viewport=size)
                page = context.new_page()
                page.goto(f"{url}/{url_path(p.path)}?lang={lang}{mode}")
                page.wait_for_selector(IDLE, timeout=120_000)
                try:
                    settle(page, 120_000)
                except PlaywrightTimeout:  # scanned as drawn: a loaded machine's lazy widget, not a finding
                    print(f"{p.name} {lang}: not settled in 120 s", flush=True)
                main_action(page, p.name)
                found = violations(page)
                out[f"{p.name} {lang}{' lecture' if mode else ''}"] = found
                print(f"{p.name:16s} {lang} {'lecture' if mode else 'page   '} {count(found):4d}  "
                      + ", ".join(f"{v['id']}×{v['count']}" for v in found), flush=True)
                context.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app is scanned")
    ap.add_argument("--json", type=Path, help="write every violation found here")
    ap.add_argument("--pages", help="page names, comma-separated (default: all)")
    args = ap.parse_args()
    start = time.monotonic()
    with app_server(root=args.root) as url, chromium() as browser:
        out = scan(url, browser, set(args.pages.split(",")) if args.pages else None)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    print(f"{sum(count(v) for v in out.values())} elements in violation over {len(out)} scans, "
          f"{time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
