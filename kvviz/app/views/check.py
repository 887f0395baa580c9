"""Check: a question's words in the session's language (or one named: the room's results are written on a thread
of their own, outside the session), for the page and for the room's results (its CSV and the summary shown when a
room ends): labels_of(), question_text(), labels_by_id()."""
from __future__ import annotations

from kvviz.app.language import lang
from kvviz.i18n import t
from kvviz.lessons import quiz


def labels_of(q: quiz.Question, language: str | None = None) -> dict[str, str]:
    """Each option of `q` as the reader sees it."""
    prefix = "check.truth" if q.kind is quiz.Kind.TRUTH else f"check.{q.id}_opt"
    return {o: t(f"{prefix}_{o}", language or lang()) for o in q.options}


def question_text(question_id: str, language: str | None = None) -> str:
    """The question as the page asks it (its numbers from the calculator)."""
    return t(f"check.{question_id}_q", language or lang(), **quiz.explain_values())


def labels_by_id(question_id: str, language: str | None = None) -> dict[str, str]:
    return labels_of(quiz.question(question_id), language)
