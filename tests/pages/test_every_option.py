"""Every page on the shipped model, headless, through every option of every radio, select box, segmented control
and toggle, one widget at a time from the defaults: no option may end in a traceback. A failure names the page, the
widget and the option."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Radio, Selectbox

from tests.pages.pagetest import APP

PAGES = sorted(str(p.relative_to(Path(APP).parent)) for p in (Path(APP).parent / "pages").glob("*.py"))
KINDS = ("radio", "selectbox", "toggle")  # segmented controls: AppTest has no element for them (ButtonGroup)


def fresh(page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["lang"] = "en"
    at.switch_page(page).run()
    return at


def label(w) -> str | None:  # noqa: ANN001 - an AppTest widget
    """The option shown as chosen, as the browser sends it back (the formatted label)."""
    try:
        return w.options[w.index]
    except (ValueError, TypeError, IndexError):
        return None


def choices(at: AppTest) -> list[tuple[str, str, object]]:
    """(kind, key, option) of every option other than the chosen one, in the main area (the sidebar's model and
    language are the shell's, walked by their own tests). Options are labels, as a browser sends them."""
    out = []
    for kind in KINDS:
        for w in at.main.get(kind):
            if not w.key or getattr(w.proto, "disabled", False):  # a browser user cannot change a disabled widget
                continue
            if kind == "toggle":
                out.append((kind, w.key, not w.value))
                continue
            out += [(kind, w.key, o) for o in w.options if o != label(w)]
    return out


@pytest.fixture(autouse=True)
def _by_label(monkeypatch):
    """A widget given `_label` reports that option chosen, as a browser would: AppTest otherwise needs the option's
    Python value, which a page's format_func hides from it."""
    for cls in (Radio, Selectbox):
        index = cls.index.fget
        monkeypatch.setattr(cls, "index", property(
            lambda self, index=index: self.options.index(self._label) if hasattr(self, "_label") else index(self)))


@pytest.mark.parametrize("page", PAGES)
def test_every_option_of_the_page(page):
    """Each widget from a fresh page at the defaults, then its options one after another, as a user clicks through
    them (a fresh page per widget, not per option: the suite's slowest module took half the time this way)."""
    at = fresh(page)
    assert not at.exception, f"{page}: {at.exception[0].message}"
    widgets: dict[tuple[str, str], list[object]] = {}
    for kind, key, option in choices(at):
        widgets.setdefault((kind, key), []).append(option)
    for (kind, key), options in widgets.items():
        at = fresh(page)
        for option in options:
            w = next((x for x in at.main.get(kind) if x.key == key), None)
            if w is None or getattr(w.proto, "disabled", False):  # an earlier option hid or disabled it: from fresh
                at = fresh(page)
                w = next((x for x in at.main.get(kind) if x.key == key), None)
                if w is None:
                    continue
            if kind == "toggle":
                w.set_value(option)
            else:
                w._label = option
            at.run()
            assert not at.exception, f"{page}: {kind} {key} = {option!r}: {at.exception[0].message}"
