"""Check: a question's words in the session's language, for the page and for the room's results (its CSV and the
summary shown when a room ends): question_text(), labels_of()."""
from __future__ import annotations

from kvviz.app.language import tr
from kvviz.lessons import quiz


def labels_of(q: quiz.Question) -> dict[str, str]:
    """Each option of `q` as the reader sees it."""
    prefix = "check.truth" if q.kind is quiz.Kind.TRUTH else f"check.{q.id}_opt"
    return {o: tr(f"{prefix}_{o}") for o in q.options}


def question_text(question_id: str) -> str:
    """The question as the page asks it (its numbers from the calculator)."""
    return tr(f"check.{question_id}_q", **quiz.explain_values())


def labels_by_id(question_id: str) -> dict[str, str]:
    return labels_of(quiz.question(question_id))
