"""The Check page's answers come from the calculator, not from typed-in numbers."""
from pathlib import Path

from kvviz.app.navigation import PAGES
from kvviz.i18n import catalog
from kvviz.lessons import quiz
from kvviz.units import format_binary
from tests.kv.kvref import textbook_bytes


def test_cache_size_answer_is_64_gib_from_the_formula():
    m = quiz.cache_size_memory()
    assert m.total == textbook_bytes(32, 32, 4096, 32, 128, 2) == 64 * 2**30
    assert format_binary(m.total) == "64.00 GiB"
    assert m.per_token_per_layer == 16 * 1024 and m.per_request == 2 * 2**30


def test_number_verdicts():
    assert quiz.check_number(64) is quiz.Verdict.CORRECT
    assert quiz.check_number(64.4) is quiz.Verdict.CORRECT  # within 1 %
    assert quiz.check_number(68.7) is quiz.Verdict.DECIMAL_UNITS  # 68.7 GB = 64 GiB
    assert quiz.check_number(32) is quiz.Verdict.WRONG
    assert quiz.check_number(0) is quiz.Verdict.WRONG


def test_questions_are_complete():
    assert len(quiz.QUESTIONS) == 10
    assert sum(q.kind is quiz.Kind.TRUTH for q in quiz.QUESTIONS) == 5  # the five misconceptions
    pages = {p.path for p in PAGES}
    for lang in ("en", "ko"):
        texts = catalog(lang)
        for q in quiz.QUESTIONS:
            assert q.page in pages
            for suffix in ("q", "short", "explain"):
                assert f"check.{q.id}_{suffix}" in texts
            if q.kind is quiz.Kind.CHOICE:
                assert q.answer in q.options
                assert all(f"check.{q.id}_opt_{o}" in texts for o in q.options)
    assert quiz.check_choice(quiz.question("why_kv"), "once")
    assert not quiz.check_choice(quiz.question("why_kv"), "bigger")


def test_question_text_takes_its_factors_from_the_spec():
    """Issue 12 item 11: the numbers a question states are the ones its answer is computed from."""
    from kvviz.i18n import t

    values = quiz.explain_values()
    for lang in ("en", "ko"):
        text = t("check.cache_size_q", lang, **values)
        spec = quiz.CACHE_SIZE_SPEC
        assert all(str(x) in text for x in (spec.n_layers, spec.n_kv_heads, spec.d_head, 4096))
    raw = (Path(quiz.__file__).parents[1] / "locales" / "en" / "check.toml").read_text()
    line = next(line for line in raw.splitlines() if line.startswith("cache_size_q"))
    assert not any(ch.isdigit() for ch in line.split("=", 1)[1]), line  # no factor typed into the text
