"""A corpus any machine can rebuild offline: the docstrings of the Python standard library.

Text comes from the running interpreter's own stdlib source files (Python Software Foundation
License), read with `ast` so nothing is imported or executed. One document per module: its module
docstring, then each class and function docstring under a `def name(args):` / `class Name:` header,
in source order; plus one document per topic of `pydoc_data/topics.py` (the language reference text
that `help()` shows). Modules are visited in sorted path order; whitespace is normalized; every 20th
document (by a stable hash of its name) is held out for evaluation.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import re
import sys
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_EVERY = 20
LICENSE = "Python Software Foundation License Version 2 (the CPython standard library's license)"
# Tests, demos and vendored third-party trees are not standard-library documentation.
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3", "turtledemo",
             "ensurepip", "_vendor"}


@dataclass(frozen=True)
class Document:
    name: str  # dotted module name ("json.decoder") or pydoc topic ("pydoc_data.topics:if")
    text: str

    @property
    def held_out(self) -> bool:
        return is_held_out(self.name)


@dataclass(frozen=True)
class Corpus:
    source: str
    python_version: str
    train: list[Document]
    held_out: list[Document]

    def stats(self) -> dict[str, int | str]:
        def size(docs: list[Document], unit: str) -> int:
            return sum(len(d.text.encode("utf-8")) if unit == "bytes" else len(d.text) for d in docs)

        return {
            "source": self.source,
            "python_version": self.python_version,
            "license": LICENSE,
            "train_documents": len(self.train),
            "train_bytes": size(self.train, "bytes"),
            "train_chars": size(self.train, "chars"),
            "held_out_documents": len(self.held_out),
            "held_out_bytes": size(self.held_out, "bytes"),
            "held_out_chars": size(self.held_out, "chars"),
        }


def is_held_out(name: str) -> bool:
    """Stable across runs and machines (unlike hash()): md5 of the module name."""
    return int(hashlib.md5(name.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def normalize(text: str) -> str:
    """Dedent like inspect.cleandoc, strip trailing spaces, collapse runs of blank lines."""
    text = inspect.cleandoc(text.replace("\r\n", "\n").replace("\t", "    "))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = ast.unparse(node.args)
    return f"def {node.name}({args}):"


def module_text(source: str) -> str:
    """The docstrings of one module's source, headed by their def/class lines, in source order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # old escape sequences in stdlib sources
        tree = ast.parse(source)
    parts: list[str] = []
    doc = ast.get_docstring(tree, clean=False)
    if doc:
        parts.append(normalize(doc))

    def visit(body: list[ast.stmt], indent: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    head = f"class {node.name}:" if isinstance(node, ast.ClassDef) else _signature(node)
                    body_text = "\n".join(indent + "    " + line if line else "" for line in normalize(doc).split("\n"))
                    parts.append(f"{indent}{head}\n{body_text}")
                if isinstance(node, ast.ClassDef):
                    visit(node.body, indent + "    ")

    visit(tree.body, "")
    return "\n\n".join(p for p in parts if p.strip())


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def documents(root: Path | None = None) -> list[Document]:
    """Every stdlib module with documentation, sorted by path (deterministic on any file system)."""
    root = root or stdlib_dir()
    docs = []
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS.intersection(path.relative_to(root).parts[:-1]):
            continue
        try:
            text = module_text(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are deliberately broken (bad syntax tests)
        if text:
            docs.append(Document(module_name(path, root), text))
    return docs


def pydoc_topics(root: Path) -> list[Document]:
    """The reference-manual topics `help()` shows, read as literals from pydoc_data/topics.py."""
    path = root / "pydoc_data" / "topics.py"
    if not path.exists():
        return []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "topics":
            topics: dict[str, str] = ast.literal_eval(node.value)
            return [Document(f"pydoc_data.topics:{key}", normalize(topics[key])) for key in sorted(topics)]
    return []


def build_corpus(root: Path | None = None) -> Corpus:
    root = root or stdlib_dir()
    docs = documents(root) + pydoc_topics(root)
    return Corpus(
        source=f"docstrings of the Python {sys.version.split()[0]} standard library ({root})",
        python_version=sys.version.split()[0],
        train=[d for d in docs if not d.held_out],
        held_out=[d for d in docs if d.held_out],
    )
