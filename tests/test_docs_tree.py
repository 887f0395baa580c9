"""Issue 44: docs/architecture.md's tree is true to the modules. Every module under kvviz/ and pages/ is named there,
nothing named there is missing, and the layer section states the rule tests/test_layers.py enforces (its RANK)."""
import re
from pathlib import Path

from tests.test_layers import RANK

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
DESCRIPTION_AT = 30  # an entry's name starts left of the descriptions' column; a line starting there continues one


def _tree() -> list[str]:
    text = DOC.read_text()
    return text.split("## The tree", 1)[1].split("```", 2)[1].splitlines()


def _expand(name: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", name)
    return [name[:m.start()] + part + name[m.end():] for part in m.group(1).split(",")] if m else [name]


def named() -> set[str]:
    """The paths the tree names under kvviz/ and pages/ (a folder ends in /)."""
    out: set[str] = set()
    stack: list[tuple[int, str]] = []
    top = None
    for line in _tree():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= DESCRIPTION_AT:
            continue
        if indent == 0:
            top = line.split()[0] if line.split()[0] in ("kvviz/", "pages/") else None
            stack = [(0, top)] if top else []
            if top:
                out.add(top)
            continue
        if top is None:
            continue
        entry = re.split(r"\s{2,}", line.strip())[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        base = "".join(part for _, part in stack)
        for name in re.split(r" \+ |, ", entry):
            for path in _expand(name.strip()):
                out.add(base + path)
        if entry.endswith("/"):
            stack.append((indent, entry))
    return out


def test_every_module_is_named_and_every_name_exists():
    names = named()
    modules = {p.relative_to(ROOT).as_posix() for d in ("kvviz", "pages") for p in (ROOT / d).rglob("*.py")
               if p.name != "__init__.py" or p.parent == ROOT / "kvviz"}
    assert sorted(modules - names) == [], "modules the tree does not name"
    assert sorted(n for n in names if not (ROOT / n).exists()) == [], "names in the tree that do not exist"


def test_the_layer_section_states_the_enforced_rule():
    """Each layer's rank as RANK holds it, stated in the doc's layer table."""
    text = DOC.read_text().split("## Layers and the import rule", 1)[1].split("\n## ", 1)[0]
    stated = dict(re.findall(r"^\|\s*(\d+)\s*\|\s*([^|]+?)\s*\|", text, re.M))
    ranks = {}
    for rank, layers in stated.items():
        for layer in re.findall(r"`([\w_]+)`", layers):
            ranks[layer] = int(rank)
    assert ranks == RANK
