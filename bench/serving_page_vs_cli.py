"""The Serving Engine page's numbers beside `serve-bench`'s, for one workload on one llama-server, in one run.

Starts llama-server on a GGUF (the shipped model exported, or --gguf FILE), the app with `streamlit run`, and the
system Chromium; drives the page through a closed-loop sweep as a user would (the page draws its charts every
half second while its worker process measures), downloads the page's results, then runs `serve-bench` with the
same settings once before the page and once after, and prints, per point, the median and range of TTFT and TPOT
from the page and from both serve-bench runs, and whether the page agrees with serve-bench within their spread:
the larger of each run's range and how far the two serve-bench runs moved (kvviz.engine.metrics.within_spread);
and llama.cpp's own decode time per token during each, which tells a slower client from a slower server.
--live-charts ticks the page's "Draw the charts while measuring": on a machine that also runs the server, the
redrawing takes CPU from it.

    python bench/serving_page_vs_cli.py [--concurrency 1,2,4] [--requests 12] [--prompt-len 128] [--max-tokens 64]
                                        [--gguf FILE --alias NAME] [--live-charts] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from harness import app_server, chromium, settle, wait_idle  # noqa: E402

from kvviz.cli import main as cli  # noqa: E402
from kvviz.engine.metrics import spread, within_spread  # noqa: E402
from kvviz.serving.llamacpp import LlamaServer  # noqa: E402


def tpots(d: dict) -> list[float]:
    """Per request (E2E − TTFT)/(N − 1) from vLLM's detailed keys."""
    return [(lat - ttft) / (n - 1) for lat, ttft, n in zip(d["latencies"], d["ttfts"], d["output_lens"], strict=True)
            if n > 1 and lat is not None and ttft is not None]


def run_page(app: str, llama_url: str, args: argparse.Namespace) -> dict:
    from playwright.sync_api import expect

    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.goto(app)
        wait_idle(page)
        page.get_by_test_id("stSidebarUserContent").get_by_role("link", name="Serving Engine").click()
        wait_idle(page)

        def fill(label: str, value: object) -> None:
            box = page.get_by_label(label, exact=True).and_(page.locator("input"))
            box.fill(str(value))
            box.press("Enter")
            wait_idle(page)

        fill("Base URL", llama_url)
        page.get_by_role("button", name="Connect", exact=True).click()
        wait_idle(page)
        fill("Concurrency (comma-separated)", args.concurrency)
        fill("Requests per point", args.requests)
        fill("Prompt tokens", args.prompt_len)
        fill("Output tokens", args.max_tokens)
        if args.live_charts:
            page.get_by_text("Draw the charts while measuring").click()
            wait_idle(page)
        page.get_by_role("button", name="Start", exact=True).click()
        expect(page.get_by_text(re.compile(r"Done: \d+ of \d+ requests"))).to_be_visible(timeout=600_000)
        settle(page)
        with page.expect_download() as download:
            page.get_by_role("button", name=re.compile("Download the results")).click()
        return json.loads(Path(download.value.path()).read_text(encoding="utf-8"))


def run_cli(llama_url: str, args: argparse.Namespace) -> list[dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(["serve-bench", "--url", llama_url, "--concurrency", args.concurrency, "--requests",
                    str(args.requests), "--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens),
                    "--json"])
    if code != 0:
        raise SystemExit(f"serve-bench exited {code}")
    return json.loads(out.getvalue())["points"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--gguf", default=None, help="a GGUF to serve (default: the shipped model, exported)")
    ap.add_argument("--alias", default="kvviz-tiny")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--live-charts", action="store_true",
                    help="tick the page's 'Draw the charts while measuring' (off by default on the page)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gguf = args.gguf
        if gguf is None:
            from kvviz.engine.export import export_gguf
            from kvviz.engine.loading import load_backend

            backend = load_backend("tiny", device="cpu")
            gguf = export_gguf(backend.model, backend.tokenizer, Path(tmp) / "kvviz-tiny.gguf", name="kvviz-tiny")
        with LlamaServer(gguf, alias=args.alias, n_parallel=4, ctx_size=4096, threads=args.threads) as srv, \
                app_server() as app:
            before = run_cli(srv.base_url, args)
            page_points = run_page(app, srv.base_url, args)
            after = run_cli(srv.base_url, args)
    rows = []
    for i, (c1, c2) in enumerate(zip(before, after, strict=True)):
        p = page_points[f"point{i + 1}"]
        row = {"concurrency": c1["max_concurrency"]}
        for name, page_v in (("ttft", p["ttfts"]), ("tpot", tpots(p))):
            runs = [[r[f"{name}_s"] for r in c["requests"]] for c in (c1, c2)]
            sp, s1, s2, sc = spread(page_v), spread(runs[0]), spread(runs[1]), spread(runs[0] + runs[1])
            moved = abs(s1.median - s2.median)
            row |= {f"page_{name}_median_ms": sp.median * 1e3, f"page_{name}_range_ms": (sp.low * 1e3, sp.high * 1e3),
                    f"cli_{name}_median_ms": sc.median * 1e3, f"cli_{name}_range_ms": (sc.low * 1e3, sc.high * 1e3),
                    f"cli_{name}_moved_ms": moved * 1e3,
                    f"{name}_agree": within_spread(page_v, runs[0] + runs[1], moved),
                    f"{name}_ratio_page_over_cli": sp.median / sc.median}
        # llama.cpp's own decode time per token, mean over the point: what the server did, whoever watched it
        row |= {"page_server_tpot_ms": p["kvviz"]["server_timings"]["server_mean_tpot_ms"],
                "cli_server_tpot_ms": [c["server_timings"]["server_mean_tpot_ms"] for c in (c1, c2)]}
        rows.append(row)
    if args.json:
        print(json.dumps({"rows": rows}))
        return
    print(f"{args.requests} requests per point, {args.prompt_len} prompt / {args.max_tokens} output tokens; "
          f"serve-bench ran before and after the page (its two runs pooled; 'moved': how far their medians moved)")
    print(f"{'conc':>4} | {'TTFT page':>22} {'TTFT serve-bench':>22} {'moved':>6} {'agree':>5} {'ratio':>5} | "
          f"{'TPOT page':>20} {'TPOT serve-bench':>20} {'moved':>6} {'agree':>5} {'ratio':>5}")
    def cell(r: dict, who: str, name: str) -> str:
        lo, hi = r[f"{who}_{name}_range_ms"]
        return f"{r[f'{who}_{name}_median_ms']:.1f} [{lo:.1f}–{hi:.1f}]"

    for r in rows:
        print(f"{r['concurrency']:>4} | {cell(r, 'page', 'ttft'):>22} {cell(r, 'cli', 'ttft'):>22} "
              f"{r['cli_ttft_moved_ms']:>6.1f} {str(r['ttft_agree']):>5} {r['ttft_ratio_page_over_cli']:>5.2f} | "
              f"{cell(r, 'page', 'tpot'):>20} {cell(r, 'cli', 'tpot'):>20} {r['cli_tpot_moved_ms']:>6.1f} "
              f"{str(r['tpot_agree']):>5} {r['tpot_ratio_page_over_cli']:>5.2f} | server's own TPOT: during the page "
              f"{r['page_server_tpot_ms']:.1f} ms, during serve-bench "
              f"{' / '.join(f'{v:.1f}' for v in r['cli_server_tpot_ms'])} ms")


if __name__ == "__main__":
    main()
