"""The corpus parsers: reStructuredText to prose, Korean paragraphs of a help page, bills unwrapped, the split."""
from kvviz.training.corpus import Corpus, Document, is_held_out, korean_paragraphs, rst_prose, unwrap_korean

RST = """.. _tut-if:

:keyword:`!if` Statements
=========================

Perhaps the most well-known statement type is the :keyword:`if` statement.  For
example::

   >>> x = int(input("Please enter an integer: "))
   >>> if x < 0:
   ...     x = 0

There can be zero or more :keyword:`elif` parts, see :ref:`the tutorial <tut-match>` and ``switch``.

.. index::
   statement: for

.. note::

   A *note* stays as prose.

.. code-block:: python

   print("dropped")

* first item
* second item
  continues here
"""


def test_rst_prose_keeps_sentences_and_drops_code():
    text = rst_prose(RST)
    assert text.split("\n\n") == [
        "if Statements",
        "Perhaps the most well-known statement type is the if statement. For example:",
        "There can be zero or more elif parts, see the tutorial and switch.",
        "A note stays as prose.",
        "* first item\n* second item continues here",
    ]


def test_korean_paragraphs_of_a_help_page():
    page = """<html><head><title>도움말</title><script>var x = "스크립트";</script></head><body>
    <nav>탐색 메뉴</nav>
    <h1>Compare Document</h1>
    <p>현재 문서를 선택한 문서와 비교합니다.
       원할 경우 <b>거부</b>를 누릅니다.</p>
    <p>Choose Edit - Track Changes.</p>
    <p>현재 문서를 선택한 문서와 비교합니다. 원할 경우 거부를 누릅니다.</p>
    <p>@@@조건 지정 &amp; 서식</p>
    </body></html>"""
    assert korean_paragraphs(page) == (
        "현재 문서를 선택한 문서와 비교합니다. 원할 경우 거부를 누릅니다.\n\n조건 지정 & 서식")


def test_bills_are_unwrapped_inside_words():
    bill = ("초등학교 저학년의 경우에도 부모의 사랑이 필요\n한 나이이나, "
            "자녀를 양육하기 위하여 육아휴직을 할 \n수 있다.\n\n부      칙")
    assert unwrap_korean(bill) == "초등학교 저학년의 경우에도 부모의 사랑이 필요한 나이이나, 자녀를 양육하기 위하여 " \
        "육아휴직을 할 수 있다.\n\n부 칙"


def test_held_out_split_is_by_document_and_per_language():
    names = [f"{lang}:doc{i}" for lang in ("en", "ko") for i in range(400)]
    held = [n for n in names if is_held_out(n)]
    for lang in ("en", "ko"):
        n_held = sum(n.startswith(lang) for n in held)
        assert 20 <= n_held <= 60  # about one in ten, by a stable hash of the name
    docs = [Document(n, "text") for n in names]
    corpus = Corpus("test", "3", [d for d in docs if not d.held_out], [d for d in docs if d.held_out])
    assert {d.lang for d in corpus.split("ko", True)} == {"ko"}
    stats = corpus.stats()
    assert stats["ko_held_out_documents"] + stats["ko_train_documents"] == 400
    assert is_held_out("ko:kolaw/constitution") == is_held_out("ko:kolaw/constitution")


def test_documents_are_parsed_once_per_versions_and_read_back_equal(tmp_path, monkeypatch):
    from kvviz.training import corpus

    parsed = []

    def english(root):  # noqa: ANN001, ANN202 - stands in for the 2,500 pages parsed from the real packages
        parsed.append(root)
        return [Document("en:library/os", "The os module.\nIt has \"quotes\" and 한국어.")]

    monkeypatch.setattr(corpus, "english_documents", english)
    monkeypatch.setattr(corpus, "korean_documents", lambda root: [Document("ko:kolaw/constitution", "대한민국 헌법")])
    versions = {"python3.11-doc": "3.11.2-6", "konlpy": "0.6.0"}
    first = corpus.documents(tmp_path, versions)
    again = corpus.documents(tmp_path, versions)
    assert again == first and len(parsed) == 1  # read back from the file, equal to what was parsed
    assert [p.name for p in tmp_path.iterdir()] == [next(tmp_path.glob("documents-*.json")).name]
    corpus.documents(tmp_path, {**versions, "konlpy": "0.6.1"})  # another package version: parsed again
    assert len(parsed) == 2


def test_the_shipped_held_out_split_is_the_one_the_model_was_evaluated_on():
    """The package's held-out file against the training record (kvviz/assets/tiny/training.json): the same package
    versions, and per language the same documents, bytes and characters; every document is a held-out one."""
    import json

    from kvviz.engine.shape import TINY_DIR
    from kvviz.training import corpus

    record = json.loads((TINY_DIR / "training.json").read_text())["corpus"]
    versions, docs = corpus.shipped_held_out()
    assert versions == record["versions"]
    assert all(d.held_out for d in docs) and len({d.name for d in docs}) == len(docs)
    for lang in ("en", "ko"):
        mine = [d for d in docs if d.lang == lang]
        assert len(mine) == record[f"{lang}_held_out_documents"]
        assert sum(len(d.text.encode()) for d in mine) == record[f"{lang}_held_out_bytes"]
        assert sum(len(d.text) for d in mine) == record[f"{lang}_held_out_chars"]
    licences = corpus.HELD_OUT_FILE.parent
    for name in ("LICENSE-PSF-2.txt", "LICENSE-MPL-2.0.txt", "LICENSE-Apache-2.0.txt", "README.md"):
        assert (licences / name).stat().st_size > 1000


def test_evaluations_read_the_shipped_split_without_any_tool(monkeypatch):
    """held_out_text() runs no process and fetches nothing (no apt-get, dpkg or pip at run time)."""
    import subprocess

    from kvviz.compression import quality

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    quality.held_out_text.cache_clear()
    text = quality.held_out_text()
    assert len(text.encode()) == 422_200  # the README's count: the documents joined by blank lines
