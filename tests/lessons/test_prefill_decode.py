"""What the Prefill & Decode page says about repeated runs, without Streamlit: the run drawn, the cards' splits and
ranges, the runs' table, T = TTFT + (N−1)·TPOT checked on every run, the step noise, the table of phases."""
import re
from types import SimpleNamespace

import pytest

from kvviz.engine.metrics import spread, summarize
from kvviz.i18n import t
from kvviz.lessons import prefill_decode as lessons


def _run(prefill: float, gaps: list[float], queue: float = 0.0):
    """A run's summary from its passes, as the engine reports them (queue and seconds of each pass)."""
    events = [SimpleNamespace(queue_s=queue, seconds=prefill)] + [SimpleNamespace(queue_s=0.0, seconds=g) for g in gaps]
    return summarize(events)


def test_the_first_request_fits_the_context_the_cap_and_the_budget():
    assert lessons.default_request(128, 127, 10**9) == (64, 32)
    assert lessons.default_request(4096, 200, 10**9) == (2048, 64)
    assert lessons.default_request(128, 127, 39) == (7, 32)  # a hosted budget of 39 tokens: 7 + 32 fit
    assert lessons.default_request(128, 127, 1) == (1, 32)  # nothing fits: the smallest prompt, refused with a reason
    assert lessons.default_request(128, 5, 10**9) == (64, 5)  # a hosted cap on new tokens


def test_the_run_drawn_is_the_median_by_t():
    runs = [_run(0.01, [0.001] * 4), _run(0.01, [0.003] * 4), _run(0.01, [0.002] * 4)]
    assert [r.e2e_s for r in runs] == pytest.approx([0.014, 0.022, 0.018])
    assert lessons.median_run(runs) == 2
    assert lessons.median_run([*runs, _run(0.01, [0.0005] * 4)]) == 0  # even: the lower middle, 0.014 of 4
    assert lessons.median_run(runs[:1]) == 0


def test_splits_and_ranges_under_the_cards():
    s = _run(0.012, [0.002, 0.002, 0.004, 0.002], queue=0.001)
    splits = lessons.splits(s, "en")
    assert splits[0] == t("prefill.ttft_split", "en", queue="1.00 ms", prefill="12.00 ms")
    assert splits[1] == "mean 2.50 ms · p90 3.40 ms"
    assert splits[2] == "decode alone: 500.0 tokens/s = 1 / TPOT p50 (2.00 ms)"
    assert list(lessons.splits(_run(0.01, []), "en")) == [0]  # one token: no step, no TPOT
    assert lessons.spread_text(spread([0.010, 0.012, 0.011]), "en") == "3 runs: 10.00 ms … 12.00 ms (18% spread)"
    assert lessons.spread_text(spread([0.01]), "en") == "" and lessons.spread_text(None, "en") == ""


def test_the_runs_table_in_ms():
    rows = lessons.runs_table([_run(0.01, [0.002, 0.004]), _run(0.02, [])], "ko")
    assert rows == [{t("prefill.col_run", "ko"): 1, "TTFT (ms)": 10.0, "TPOT p50 (ms)": 3.0,
                     "TPOT p90 (ms)": 3.8, "T (ms)": 16.0},
                    {t("prefill.col_run", "ko"): 2, "TTFT (ms)": 20.0, "TPOT p50 (ms)": None,
                     "TPOT p90 (ms)": None, "T (ms)": 20.0}]


def test_the_formula_holds_exactly_with_the_mean_and_within_tolerance_with_the_median():
    gaps = [[0.002] * 11, [0.002] * 10 + [0.0021], [0.002] * 11]
    runs = [_run(0.010, g) for g in gaps]
    exact, judged = lessons.formula_text(runs, gaps, 0, "en")
    assert exact.startswith("**T = TTFT + (12 − 1)·mean TPOT** = 10.00 ms + (12 − 1)·2.00 ms = **32.00 ms**")
    assert "= 32.00 ms, is off by +0.00 ms (+0.0%): **within** the tolerance ±0.10 ms" in judged
    assert "how much T varied between the identical runs (0.10 ms)" in judged  # T's spread over the 3 runs
    assert judged.endswith("Within tolerance in 3 of 3 runs.")
    alternating = [0.002, 0.0022] * 5 + [0.002]  # the median misses the mean by 1 ms, within its sampling error
    _, one = lessons.formula_text([_run(0.010, alternating)], [alternating], 0, "en")
    assert "is off by −1.00 ms" in one and "(2 standard errors × (N − 1) = 1.23 ms)" in one
    assert "with one run there is no run-to-run spread yet" in one and one.endswith("in 1 of 1 run.")
    assert lessons.formula_text([_run(0.01, [0.002])], [[0.002]], 0, "en") is None  # one step: nothing to check


def test_a_spiking_step_puts_the_median_form_outside():
    gaps = [[0.002] * 10 + [0.050]]
    (judged,) = lessons.formula_text([_run(0.010, gaps[0])], gaps, 0, "ko")[1:]
    assert t("prefill.formula_outside", "ko").split("{")[0] in judged
    error = float(re.search(r"−([\d.]+) ms", judged).group(1))
    assert error == pytest.approx(48.0)  # (N − 1)·p50 misses the spike of 48 ms


def test_step_noise_names_the_slowest_step():
    s = _run(0.01, [0.001] * 9 + [0.003])
    assert lessons.step_noise(s, [0.001] * 9 + [0.003], "en") == ("Decode steps of this run: p90 ÷ p50 = 1.20, "
                                                                  "slowest 3.00 ms: steady.")
    s = _run(0.01, [0.001] * 5 + [0.003] * 5)
    assert lessons.step_noise(s, [0.001] * 5 + [0.003] * 5, "en").endswith(t("prefill.unsteady", "en"))
    assert lessons.step_noise(_run(0.01, []), [], "en") is None


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_the_table_of_phases(lang):
    lines = lessons.phases_table(lang).splitlines()
    assert len(lines) == 2 + 4 and lines[1] == "|---|---|---|---|"
    assert lines[0] == "| | " + " | ".join(f"**{t(f'prefill.row_{p}', lang)}**"
                                             for p in ("training", "prefill", "decode")) + " |"
    assert lines[2].startswith(f"| **{t('prefill.col_inputs', lang)}** | "
                               f"{t('prefill.training_inputs', lang)} | ")
    assert all(line.count(" | ") == 3 for line in lines[2:])
