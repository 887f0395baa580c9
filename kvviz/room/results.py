"""A room's results as the lecturer keeps them after class: every question asked, one CSV row per option.

Lives here: RESULT_COLUMNS (the CSV's columns, named by the caller in the session's language), result_rows() (one
row per question and option: the question, when it was asked and revealed, the option, its count, whether it is
the answer), results_csv() (those rows as CSV text, UTF-8 with a BOM so a spreadsheet reads Korean), summary()
(per question: how many answered, how many were right). Does not: import streamlit, or know who answered what
(the store keeps counts only).
"""
from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from kvviz.room.store import Asked

# question, asked at (UTC), revealed at (UTC; empty: never revealed), option, answers, is the answer (1/0; empty:
# the lecturer gave no answer)
RESULT_COLUMNS = ("question", "asked_utc", "revealed_utc", "option", "answers", "correct")


def _utc(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def result_rows(results: Sequence[Asked], question_text: Callable[[str], str],
                labels: Callable[[str], Mapping[str, str]]) -> list[tuple]:
    """One row per question asked and option, in the order asked and the question's order of options."""
    rows = []
    for asked in results:
        names = labels(asked.question)
        for option, n in asked.counts.items():
            correct = "" if asked.answer is None else int(option == asked.answer)
            rows.append((question_text(asked.question), _utc(asked.opened), _utc(asked.revealed),
                         names.get(option, option), n, correct))
    return rows


def results_csv(results: Sequence[Asked], question_text: Callable[[str], str],
                labels: Callable[[str], Mapping[str, str]], header: Sequence[str]) -> str:
    """The rows of result_rows() under `header` (RESULT_COLUMNS in the reader's language)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(result_rows(results, question_text, labels))
    return "\ufeff" + out.getvalue()  # a BOM: spreadsheets read the file as UTF-8 (Korean) rather than a code page


@dataclass(frozen=True)
class Summary:
    question: str
    answered: int
    right: int | None  # None: the lecturer gave no answer
    revealed: bool

    @property
    def right_share(self) -> float | None:
        return None if self.right is None or not self.answered else self.right / self.answered


def summary(results: Sequence[Asked]) -> list[Summary]:
    """Per question asked: how many answered, and how many picked the answer."""
    return [Summary(a.question, sum(a.counts.values()), None if a.answer is None else a.counts.get(a.answer, 0),
                    a.revealed is not None) for a in results]
