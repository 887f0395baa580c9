"""Issue 29 #9: the sidebar groups the pages into the sections a lecture follows, in English and Korean, and Home's
map shows the same sections and pages in the same order; pages still being built are registered and skipped."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvviz.app.navigation import HOME, PAGES, ROOT, SECTIONS
from kvviz.i18n import catalog, t

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def _outline(node, kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    """The section titles and page links under `node`, in the order drawn."""
    out = []
    for child in getattr(node, "children", {}).values():
        kind = type(child).__name__
        if kind == "PageLink":
            out.append(("page", child.label))
        elif kind in kinds:
            out.append(("section", child.value.strip("*")))
        out += _outline(child, kinds)
    return out


def _expected(lang: str) -> list[tuple[str, str]]:
    out = []
    for section in SECTIONS:
        if pages := section.built():
            out.append(("section", t(section.title_key, lang)))
            out += [("page", t(p.title_key, lang)) for p in pages]
    return out


def test_every_page_is_in_one_section_with_its_strings():
    files = {f"pages/{p.name}" for p in (ROOT / "pages").glob("*.py")}
    registered = [p.path for s in SECTIONS for p in s.pages]
    assert len(registered) == len(set(registered)) and files <= set(registered)  # each page once, none left out
    assert len(SECTIONS) >= 4 and all(s.pages for s in SECTIONS)
    assert PAGES[0] == HOME and len(PAGES) == 1 + len(registered)
    # The two pages being built are registered already: adding them is a file and its locale strings.
    names = {p.name: s.name for s in SECTIONS for p in s.pages}
    assert names["spec"] == names["moving"] == names["serving"] == "serving"
    for lang in ("en", "ko"):
        texts = catalog(lang)
        keys = [s.title_key for s in SECTIONS] + [p.title_key for p in PAGES] + [p.summary_key for p in PAGES[1:]]
        assert [k for k in keys if k not in texts] == []


@pytest.mark.parametrize("lang", ["en", "ko"])
@pytest.mark.parametrize("lecture", [False, True])
def test_sidebar_sections_and_homes_map_match(lang, lecture):
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["lang"] = lang
    if lecture:
        at.query_params["lecture"] = "1"
        at.query_params["idea"] = "3"  # the map
    at.run()
    assert not at.exception
    expected = _expected(lang)
    assert expected[0] == ("section", t("nav.section_mechanism", lang))
    assert _outline(at.sidebar, ("Caption",)) == [("page", t(HOME.title_key, lang)), *expected]
    assert [x for x in _outline(at.main, ("Markdown",)) if x[0] == "page" or x in expected] == expected
    if not lecture:  # each page with its line, never a raw locale key
        lines = [c.value for c in at.main.caption]
        for section in SECTIONS:
            for page in section.built():
                assert t(page.summary_key, lang) in lines and page.summary_key not in lines
