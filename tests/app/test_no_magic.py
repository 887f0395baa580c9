"""Streamlit's magic is off (.streamlit/config.toml: a page's first run skips rewriting its syntax tree): no page may
rely on it, i.e. no statement of app.py or a page is a bare expression Streamlit would have drawn."""
import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bare_expressions(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0]) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and id(node) not in docstrings
            and not isinstance(node.value, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom))]


def test_magic_is_off_and_no_page_needs_it():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["runner"]["magicEnabled"] is False
    scripts = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))]
    assert len(scripts) > 10
    assert {p.name: bare_expressions(p) for p in scripts if bare_expressions(p)} == {}
