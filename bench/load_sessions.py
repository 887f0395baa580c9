"""Load and isolation: N browser sessions at once on one server, each Prefill + Step ×K on its own prompt.

    python bench/load_sessions.py [--sessions 8] [--steps 20] [--rapid 30] [--margin-mib 64]

Checks, and exits 1 when one fails:
- no cross-talk: every session's generated text equals what its prompt alone produces, computed here
  in-process with `Generation` on the app's default model settings (same seeded weights);
- no Streamlit exception box in any session;
- the server's resident memory returns to within --margin-mib of its level before the sessions
  (measured after one warm-up session loaded the model) once the sessions close.
- no lost click: every session's token count is exactly its clicks (prefill + one per Step); with --rapid,
  session 0 clicks Step that many times back to back (no waiting) while the others step, alone first and
  then under load, and must get exactly that many new tokens.
Prints the peak and settled server memory, the median step latency (click → rerun finished, so it
includes queueing behind the other sessions: the latency a visitor sees under this load), and the server's
own time per step (read from the page's timing log, KVVIZ_TIMING_LOG: script run and model pass) with one
session alone and with all of them at once.

Drives the decode page (pages/1_Reusing_Past_KV.py) by what a visitor sees: the first text area of the
main area is the prompt, buttons labelled "Prefill" and "Step" (English UI), and the generated text
somewhere in the main area. Streamlit's disconnected-session TTL is set short so closed sessions are
collected within the run.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "browser")]

from harness import CHROMIUM, CHROMIUM_ARGS, IDLE, TOKENS_JS, app_server, url_path  # noqa: E402

from kvviz.app.sidebar import DEFAULTS  # noqa: E402
from kvviz.engine.generation import Generation  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.tokenizer import byte_run_chips  # noqa: E402
from kvviz.lessons import decode_view  # noqa: E402

DECODE_PAGE = "pages/1_Reusing_Past_KV.py"
RUNNING = "[data-testid='stApp'][data-test-script-state='running']"
EXCEPTION = "[data-testid='stException']"
SESSION_TTL_S = 5  # Streamlit keeps a closed tab's session this long for a reconnect (default 120)
PROMPTS = [
    "The KV cache stores keys and values",
    "Prefill runs the whole prompt at once;",
    "캐시를 재사용하면 과거의 키와 값은",
    "Decode emits one token per forward pass",
    "🙂 emoji prompts are bytes too:",
    "Grouped-query attention shares KV heads",
    "TTFT = queue + prefill, and then",
    "A long prompt makes every step slower",
]


def rss_bytes(pid: int) -> int:
    """Resident memory of the server process (psutil when installed, else /proc)."""
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except ImportError:
        with open(f"/proc/{pid}/status") as f:  # a process that has exited has no VmRSS line: 0
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)


class PeakSampler(threading.Thread):
    def __init__(self, pid: int, period_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.period_s, self.peak, self._halt = pid, period_s, 0, threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(self.period_s)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return self.peak



@functools.cache
def default_backend():  # noqa: ANN201 - a Backend
    """The model the app loads with its default sidebar settings (seeded: the same weights)."""
    d = DEFAULTS
    shape = d["kv_shape"] if d["kv_model"] == "random" else None
    return load_backend(d["kv_model"], dtype=d["kv_dtype"], device=d["kv_device"], shape=shape)


def expected_chips(prompt: str, steps: int) -> list[tuple[str, int]]:
    """The chips this prompt alone produces on the app's default settings, prefill + `steps` steps: (text, tokens
    it spans), as the page draws them (a run of byte tokens is one chip showing its characters)."""
    backend = default_backend()
    gen = Generation(backend, max_new_tokens=steps + 1)
    gen.prefill(prompt)
    while not gen.done:
        gen.step()
    texts = decode_view.token_texts(backend.tokenizer, gen.token_ids)
    return [(decode_view.visible(c.text), c.stop - c.start) for c in byte_run_chips(texts)]


CHIPS_JS = "Array.from(document.querySelectorAll('.kv-chip')).map(c => [c.innerText, Number(c.dataset.tokens || 1)])"


@dataclass
class SessionResult:
    prompt: str
    step_s: list[float] = field(default_factory=list)
    chips: list[tuple[str, int]] = field(default_factory=list)  # (text, tokens it spans)
    exceptions: int = 0
    clicks: int = 0  # Step clicks sent
    rapid: bool = False


MAIN_TEXT = "document.querySelector(\"[data-testid='stMain']\").innerText"


async def rerun(page, action, *, changes_page: bool = True) -> float:  # noqa: ANN001 - Page, awaitable factory
    """Run an action that triggers a rerun and wait until it finished; return the seconds it took.

    Under load a rerun can start seconds after the click, so "idle" alone could be the state before it:
    an action that changes the page (a Step adds a token) is over once the text changed and the app is idle.
    """
    before = await page.evaluate(MAIN_TEXT)
    t0 = time.perf_counter()
    await action()
    if changes_page:
        await page.wait_for_function(f"before => {MAIN_TEXT} !== before", arg=before, timeout=120_000)
    else:
        try:  # the run may already be over by the time we look
            await page.wait_for_selector(RUNNING, timeout=5_000)
        except Exception:  # noqa: BLE001 - Playwright's TimeoutError: no rerun seen, it was that quick
            pass
    await page.wait_for_selector(IDLE, timeout=120_000)
    return time.perf_counter() - t0


async def wait_tokens(page, n: int, quiet_s: float = 5.0) -> int:  # noqa: ANN001
    """Wait until the page's chips span n tokens, or until their count stopped changing for quiet_s; return it."""
    last, since = -1, time.monotonic()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        now = await page.evaluate(TOKENS_JS)
        if now != last:
            last, since = now, time.monotonic()
        if now >= n or time.monotonic() - since > quiet_s:
            break
        await page.wait_for_timeout(100)
    await page.wait_for_selector(IDLE, timeout=120_000)
    return await page.evaluate(TOKENS_JS)


async def drive(browser, url: str, prompt: str, steps: int, rapid: int = 0) -> SessionResult:  # noqa: ANN001
    result = SessionResult(prompt, rapid=bool(rapid))
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    page = await context.new_page()
    try:
        await page.goto(f"{url}/{url_path(DECODE_PAGE)}?lang=en", timeout=120_000)
        await page.wait_for_selector(IDLE, timeout=120_000)
        box = page.locator("[data-testid='stMain'] textarea").first
        await box.fill(prompt)
        await rerun(page, lambda: box.press("Tab"), changes_page=False)  # a text area commits on blur
        new = page.get_by_role("spinbutton", name="Max new tokens")
        await new.fill(str(max(steps, rapid) + 2))
        await rerun(page, lambda: new.press("Enter"), changes_page=False)
        await rerun(page, lambda: page.get_by_role("button", name="Prefill", exact=True).click())
        step = page.locator("button.kv-step")  # the Step button (in its component's shadow root)
        if rapid:
            before = await page.evaluate(TOKENS_JS)
            t0 = time.perf_counter()
            await step.evaluate("(b, n) => { for (let i = 0; i < n; i++) b.click(); }", rapid)
            result.clicks = rapid
            await wait_tokens(page, before + rapid)
            result.step_s.append((time.perf_counter() - t0) / rapid)
        else:
            for _ in range(steps):
                result.step_s.append(await rerun(page, step.click))
                result.clicks += 1
        result.chips = [(text, n) for text, n in await page.evaluate(CHIPS_JS)]
        result.exceptions = await page.locator(EXCEPTION).count()
    finally:
        await context.close()
    return result


async def run_sessions(url: str, prompts: list[str], steps: int, rapid: int = 0) -> list[SessionResult]:
    """All sessions at once; with `rapid`, session 0 sends that many back-to-back clicks instead of steps."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            return await asyncio.gather(*(drive(browser, url, prompt, steps, rapid if i == 0 else 0)
                                          for i, prompt in enumerate(prompts)))
        finally:
            await browser.close()


def settle_rss(pid: int, target: int, timeout_s: float) -> int:
    """Poll until the server's memory is back under `target` (or the time is up); return the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = rss_bytes(pid)
        if now <= target or time.monotonic() > deadline:
            return now
        time.sleep(1)


def server_steps(log: str, since: float, until: float) -> tuple[list[float], list[float]]:
    """The server's own seconds per served step in [since, until]: (script run, model pass) per step."""
    runs, model = [], []
    if not os.path.exists(log):
        return runs, model
    with open(log, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "reuse_steps" and since <= r["t"] <= until:
                runs.append(r["run_s"] / r["steps"])
                model.append(r["model_s"] / r["steps"])
    return runs, model


def ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    s = sorted(values)
    return f"median {statistics.median(s) * 1e3:.0f} ms, p90 {s[int(round(0.9 * (len(s) - 1)))] * 1e3:.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rapid", type=int, default=30, help="back-to-back Step clicks of session 0 (0 = off)")
    ap.add_argument("--margin-mib", type=float, default=64.0,
                    help="settled memory may exceed the pre-load level by this much")
    ap.add_argument("--settle-s", type=float, default=60.0)
    args = ap.parse_args()
    if not (ROOT / DECODE_PAGE).exists():
        print(f"needs the decode page {DECODE_PAGE}, which is not in this checkout", file=sys.stderr)
        return 2
    prompts = [PROMPTS[i % len(PROMPTS)] + f" (session {i})" for i in range(args.sessions)]
    expected = {p: expected_chips(p, args.steps) for p in prompts}
    mib = 2**20
    if args.rapid:
        expected[prompts[0]] = expected_chips(prompts[0], args.rapid)
    log = tempfile.NamedTemporaryFile(prefix="kvviz-timing-", suffix=".jsonl", delete=False).name
    env = {"STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL": str(SESSION_TTL_S), "KVVIZ_TIMING_LOG": log}
    with app_server(env=env) as url:
        # Warm-up: one session loads the shared model, so the baseline holds the weights but no session.
        asyncio.run(run_sessions(url, [prompts[0]], 1))
        # One session alone: the server's time per step without competition, and rapid clicks alone.
        t_alone = time.time()
        alone = asyncio.run(run_sessions(url, [prompts[1 % len(prompts)]], args.steps))
        alone_rapid = asyncio.run(run_sessions(url, [prompts[0]], args.steps, args.rapid)) if args.rapid else []
        t_alone_end = time.time()
        time.sleep(SESSION_TTL_S + 2)
        baseline = rss_bytes(url.pid)
        sampler = PeakSampler(url.pid)
        sampler.start()
        t0, t_load = time.perf_counter(), time.time()
        results = asyncio.run(run_sessions(url, prompts, args.steps, args.rapid))
        wall_s, t_load_end = time.perf_counter() - t0, time.time()
        peak = sampler.stop()
        settled = settle_rss(url.pid, baseline + int(args.margin_mib * mib), SESSION_TTL_S + args.settle_s)

    failures = []
    lost_total = 0
    labelled = [("alone", r) for r in alone + alone_rapid] + [(f"session {i}", r) for i, r in enumerate(results)]
    for name, r in labelled:
        own = expected[r.prompt]
        # Cross-talk would show another prompt's tokens; a lost click leaves it shorter.
        ok_tokens = bool(r.chips) and r.chips == own[: len(r.chips)]
        n_prompt = len(default_backend().tokenizer.encode(r.prompt))
        # A generation that ended (EOS) takes no more steps.
        possible = min(r.clicks, sum(n for _, n in own) - n_prompt - 1)
        lost = possible - (sum(n for _, n in r.chips) - n_prompt - 1)  # tokens, not chips
        lost_total += lost
        if not ok_tokens:
            failures.append(f"{name}: its tokens {r.chips!r} are not its prompt's own {own!r}")
        if lost:
            failures.append(f"{name}: {lost} of {r.clicks} Step clicks lost")
        if r.exceptions:
            failures.append(f"{name}: {r.exceptions} exception box(es)")
        kind = f"{r.clicks} rapid clicks" if r.rapid else f"{len(r.step_s)} steps"
        print(f"{name}: {kind}, median {statistics.median(r.step_s) * 1e3:.0f} ms per step (browser), "
              f"tokens {'its own' if ok_tokens else 'MISMATCH'}, lost clicks {lost}, exceptions {r.exceptions}")
    steps = [s for r in results if not r.rapid for s in r.step_s]
    run_alone, model_alone = server_steps(log, t_alone, t_alone_end)
    run_load, model_load = server_steps(log, t_load, t_load_end)
    within = settled <= baseline + args.margin_mib * mib
    if not within:
        failures.append(f"memory did not settle: {settled / mib:.0f} MiB vs baseline {baseline / mib:.0f} MiB "
                        f"+ {args.margin_mib:.0f} MiB")
    print(f"\n{args.sessions} sessions x {args.steps} steps in {wall_s:.1f} s; cross-talk checks "
          f"{'passed' if not any('MISMATCH' in f or 'continuation' in f for f in failures) else 'FAILED'}")
    print(f"median step latency under load: {statistics.median(steps) * 1e3:.0f} ms "
          f"(max {max(steps) * 1e3:.0f} ms, click to rerun finished, in the browsers)")
    print(f"lost Step clicks: {lost_total} (alone and under load, {sum(r.clicks for _, r in labelled)} sent)")
    print(f"server time per step, script run: alone {ms(run_alone)}; under load {ms(run_load)}")
    print(f"server time per step, model pass: alone {ms(model_alone)}; under load {ms(model_load)}")
    print(f"server RSS: baseline {baseline / mib:.0f} MiB, peak {peak / mib:.0f} MiB "
          f"(+{(peak - baseline) / mib:.0f}), settled {settled / mib:.0f} MiB "
          f"(+{(settled - baseline) / mib:.0f}; margin {args.margin_mib:.0f} MiB: {'ok' if within else 'EXCEEDED'})")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
