"""What the Prefill & Decode page says about one request measured as whole repeated runs, without streamlit or torch:
the request it starts from (`default_request`), the run it draws (`median_run`, the median by T), the range of a
figure over the runs (`spread_text`), how each card's figure splits (`splits`), the runs as a table (`runs_table`),
T = TTFT + (N−1)·TPOT checked on every run (`formula_text`), how steady the steps were (`step_noise`) and the
table of phases (`phases_table`). Every text is in the language given; kvviz.app.views.prefill draws it."""
from __future__ import annotations

from collections.abc import Sequence

from kvviz.engine.metrics import LatencySummary, Spread, formula_check
from kvviz.i18n import t
from kvviz.units import format_ms as ms

PHASES = ("training", "prefill", "decode")
ASPECTS = ("inputs", "computation", "stored", "latency")
STEADY = 1.25  # p90 / p50 of the steps below which decoding counts as steady


def default_request(max_len: int, max_new: int, kv_tokens: int) -> tuple[int, int]:
    """(prompt, new tokens) of the first request: new tokens within the cap, and a prompt whose cache fits the
    `kv_tokens` a hosted demo's KV budget holds, so a first click on Run is never refused."""
    n_new = min(64, max_len // 4, max_new)
    return max(1, min(max_len // 2, kv_tokens - n_new)), n_new


def median_run(summaries: Sequence[LatencySummary]) -> int:
    """The index of the median run by T (the lower middle of an even count): whole runs, never a mix of columns."""
    order = sorted(range(len(summaries)), key=lambda i: summaries[i].e2e_s)
    return order[(len(order) - 1) // 2]


def spread_text(s: Spread | None, lang: str) -> str:
    """The range of one figure over every run ("" from one run: there is no spread yet)."""
    if s is None or s.n < 2:
        return ""
    return t("prefill.spread", lang, low=ms(s.low), high=ms(s.high), n=s.n, pct=f"{s.relative * 100:.0f}")


def splits(s: LatencySummary, lang: str) -> dict[int, str]:
    """How the cards' figures split, by card: TTFT = queue + prefill; TPOT's mean and p90; the decode rate."""
    out = {0: t("prefill.ttft_split", lang, queue=ms(s.queue_s), prefill=ms(s.prefill_s))}
    if s.tpot_p50_s:
        out[1] = t("prefill.tpot_split", lang, mean=ms(s.tpot_s), p90=ms(s.tpot_p90_s))
        # named by the TPOT it inverts: the p50 in the card beside it
        out[2] = t("prefill.decode_rate", lang, rate=f"{1 / s.tpot_p50_s:.1f}", p50=ms(s.tpot_p50_s))
    return out


def runs_table(summaries: Sequence[LatencySummary], lang: str) -> list[dict]:
    """One row per whole run: TTFT, TPOT p50 and p90, T, in ms."""
    return [{t("prefill.col_run", lang): i + 1, "TTFT (ms)": round(x.ttft_s * 1e3, 3),
             "TPOT p50 (ms)": round(x.tpot_p50_s * 1e3, 3) if x.tpot_p50_s else None,
             "TPOT p90 (ms)": round(x.tpot_p90_s * 1e3, 3) if x.tpot_p90_s else None,
             "T (ms)": round(x.e2e_s * 1e3, 3)} for i, x in enumerate(summaries)]


def formula_text(summaries: Sequence[LatencySummary], gaps: Sequence[Sequence[float]], shown: int,
                 lang: str) -> tuple[str, str] | None:
    """(the exact form with the mean TPOT, the p50 form judged against its tolerance and how many runs it held in)
    for the run shown; `gaps` are each run's decode steps in seconds. None where there are not two steps."""
    totals = [x.e2e_s for x in summaries]  # T of every whole run: the machine's own repeatability
    s = summaries[shown]
    check = formula_check(s, gaps[shown], totals)
    if check is None:
        return None
    exact = t("prefill.formula_exact", lang, n=s.n_tokens, ttft=ms(s.ttft_s), mean=ms(s.tpot_s),
              exact=ms(check.exact_s), measured=ms(check.measured_s))
    within = [c.within for c in (formula_check(x, g, totals) for x, g in zip(summaries, gaps, strict=True))
              if c is not None]
    sampling = ms(check.sampling_s)
    why = (t("prefill.tolerance_runs", lang, sampling=sampling, runs_spread=ms(check.run_spread_s))
           if check.run_spread_s is not None else t("prefill.tolerance_one_run", lang, sampling=sampling))
    verdict = "formula_within" if check.within else "formula_outside"
    judged = (t(f"prefill.{verdict}", lang, n=s.n_tokens, p50=ms(s.tpot_p50_s), predicted=ms(check.p50_form_s),
                error=f"{check.error_s * 1e3:+.2f} ms".replace("-", "−"),
                pct=f"{check.error_s / check.measured_s * 100:+.1f}".replace("-", "−"),
                tolerance=ms(check.tolerance_s), why=why)
              + " " + t("prefill.formula_runs", lang, ok=sum(within), runs=len(within)))
    return exact, judged


def step_noise(s: LatencySummary, gaps: Sequence[float], lang: str) -> str | None:
    """How steady the decode steps were: p90 / p50 and the slowest step (None without a step)."""
    if not s.tpot_p50_s:
        return None
    noise = s.tpot_p90_s / s.tpot_p50_s
    return t("prefill.step_noise", lang, ratio=f"{noise:.2f}", slowest=ms(max(gaps)),
             verdict=t("prefill.steady" if noise < STEADY else "prefill.unsteady", lang))


def phases_table(lang: str) -> str:
    """Training, prefill and decode side by side as a markdown table: one column per phase, one row per aspect
    (three wide columns read in two or three lines per cell)."""
    lines = ["| | " + " | ".join(f"**{t(f'prefill.row_{p}', lang)}**" for p in PHASES) + " |",
             "|---" * (len(PHASES) + 1) + "|"]
    for aspect in ASPECTS:
        lines.append(f"| **{t(f'prefill.col_{aspect}', lang)}** | "
                     + " | ".join(t(f"prefill.{p}_{aspect}", lang) for p in PHASES) + " |")
    return "\n".join(lines)
