"""The package's layers (docs/architecture.md § Layers and the import rule, README § Layout): imports point down
only and no modules import each other in a circle. Read from the source with `ast`; an import under
`if TYPE_CHECKING:` is a type annotation, not a dependency, and is left out."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Lower rank = lower layer; a module may import its own layer or any lower one. errors, i18n and units are the
# base every layer may use; training (corpus, the tiny model's training) sits on the engine, below the lessons.
# notebook (kvviz.Session) draws what the pages draw from Python: beside app and cli.
# room (lecture rooms' store) needs only errors: beside kv.
RANK = {"errors": 0, "i18n": 0, "units": 0, "kv": 1, "room": 1, "engine": 2, "training": 3, "serving": 3,
        "compression": 4, "lessons": 4, "charts": 5, "app": 6, "cli": 6, "notebook": 6, "__main__": 7, "__init__": 7}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (ROOT / "kvviz").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _runtime_imports(path: Path, name: str, mods: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # drop `if TYPE_CHECKING:` bodies
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            node.body = []
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{module}.{alias.name}"
                found.add(full if full in mods else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in mods and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _runtime_imports(path, name, mods) for name, path in mods.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_point_down_only():
    upward = sorted(f"{a} imports {b}" for a, bs in _graph().items() for b in bs
                    if RANK[_layer(b)] > RANK[_layer(a)])
    assert not upward, upward


def test_every_layer_has_a_rank():
    assert {_layer(m) for m in _graph()} <= set(RANK)


def test_no_modules_import_each_other_in_a_circle():
    graph, index, low, stack, on_stack, circles = _graph(), {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_kv_layer_needs_neither_torch_nor_streamlit():
    for path in (ROOT / "kvviz" / "kv").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] in ("torch", "streamlit")], path
