"""Issue 29 #11: the app layer is split by role, each module's docstring says what lives there, and pages import
what they use by name (so a newcomer finds a helper from the page that calls it)."""
import ast
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "kvviz" / "app"
MODULES = sorted(p for p in APP.glob("*.py") if p.name != "__init__.py")
PAGES = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))]


def test_each_role_has_its_module():
    from kvviz.app import language, lecture, models, navigation, shell, sidebar, timing, url_state, widgets

    where = {shell.page_setup: "shell", navigation.nav_links: "navigation", sidebar.sidebar: "sidebar",
             models.get_backend: "models", widgets.number_in_range: "widgets", widgets.stepper: "widgets",
             lecture.ideas: "lecture", timing.noise_indicator: "timing", timing.record_timing: "timing",
             language.tr: "language", url_state.url_state: "url_state"}
    assert {f.__name__: f.__module__ for f in where} == {f.__name__: f"kvviz.app.{m}" for f, m in where.items()}
    assert not (APP / "ui.py").exists()  # no catch-all module left behind


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_the_docstring_names_what_lives_there(path):
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree) or ""
    public = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and not n.name.startswith("_")]
    assert public, f"{path.name} defines nothing public"
    missing = [name for name in public if name not in doc]
    assert not missing, f"{path.name}'s docstring does not say that {missing} live there"


@pytest.mark.parametrize("path", PAGES, ids=[p.stem for p in PAGES])
def test_pages_import_what_they_use_by_name(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("kvviz.app") for a in node.names), ast.unparse(node)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvviz.app"):
            assert node.module != "kvviz.app", f"{path.name}: {ast.unparse(node)} imports a module, not names"
            module = importlib.import_module(node.module)
            assert not [a.name for a in node.names if inspect.ismodule(getattr(module, a.name))], ast.unparse(node)
