"""Issue 44: every string the code asks for exists, in English and in Korean. The keys are read from the source
(every literal `section.name` of a locale section, every InputError's key) and, for the keys built from names at run
time, from the registries those names come from (the pages, the KV dtypes, the compression methods, ...). The tests
run t() strict (tests/conftest.py sets KVVIZ_STRICT_I18N=1), so a key missing at run time fails the test that
draws it; the app itself shows the key."""
import ast
import re
from pathlib import Path

import pytest

from kvviz.i18n import LOCALES, STRICT_ENV, MissingString, catalog, t

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "kvviz").rglob("*.py")), *sorted((ROOT / "pages").glob("*.py")), ROOT / "app.py"]
SECTIONS = {p.stem for p in (LOCALES / "en").glob("*.toml")}
KEY = re.compile(r"^([a-z_]+)\.([A-Za-z0-9_]+)$")
FILES = (".py", ".toml", ".json", ".md", ".safetensors", ".gguf", ".html", ".svg", ".png", ".csv", ".txt")
# Literals that are the stem a key is built on, not a key: `f"{prefix}_{option}"` (Check's true/false labels).
STEMS = {"check.truth"}


def _stems(tree: ast.AST) -> set[int]:
    """The constants a key is built on: an f-string's parts, the left of `"moving.kind_" + kind`."""
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return parts | {id(node.left) for node in ast.walk(tree) if isinstance(node, ast.BinOp)
                    and isinstance(node.op, ast.Add)}


def used_keys() -> dict[str, set[str]]:
    """Every literal locale key in the source, with the files that use it: a string `section.name` whose section is
    a locale file (not a file name, not the constant start of an f-string), and every InputError's key (a bare one is
    in errors.toml)."""
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        in_fstring = _stems(tree)
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "InputError" and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    key = arg.value if "." in arg.value else f"errors.{arg.value}"
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstring
                  and (m := KEY.match(node.value)) and m.group(1) in SECTIONS and not node.value.endswith(FILES)):
                key = node.value
            if key is not None and key not in STEMS:
                found.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return found


def built_keys() -> set[str]:
    from kvviz.app.navigation import PAGES
    from kvviz.app.navigation import SECTIONS as NAV_SECTIONS
    from kvviz.app.sidebar import ENGINES, MODELS
    from kvviz.app.views.reuse import TABS
    from kvviz.compression.quality import all_methods
    from kvviz.engine.spec.drafts import METHODS as DRAFTS
    from kvviz.kv.formats import KV_DTYPES

    keys = {p.title_key for p in PAGES} | {p.summary_key for p in PAGES[1:]} | {s.title_key for s in NAV_SECTIONS}
    keys |= {f"memory.scale_note_{name}" for name, fmt in KV_DTYPES.items() if fmt.group_size}  # views/memory.py
    methods = all_methods([8], native=True, n_kv_heads=4)  # every method: eviction, quantized, pooled heads
    keys |= {f"compression.method_{m.name}" for m in methods}  # views/compression.py method_name()
    keys |= {f"spec.method_{m}" for m in DRAFTS}  # pages/10_Speculative_Decoding.py
    keys |= {f"common.model_{m}" for m in MODELS} | {f"common.engine_{e}" for e in ENGINES}  # the sidebar
    keys |= {f"reuse.tab_{name}" for name in TABS}  # views/reuse.py
    return keys


def test_every_key_the_code_names_exists_in_both_languages():
    used = used_keys()
    assert len(used) > 900  # the scan finds the app's strings (1,100+), not nothing
    for lang in ("en", "ko"):
        texts = catalog(lang)
        missing = {key: sorted(files) for key, files in used.items() if key not in texts}
        assert missing == {}, f"keys the code asks for with no {lang} string: {missing}"


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_every_key_built_from_a_registry_exists(lang):
    keys = built_keys()
    assert {"memory.scale_note_int4", "compression.method_h2o", "compression.title"} <= keys
    assert sorted(k for k in keys if k not in catalog(lang)) == []


def test_every_built_key_has_some_string():
    """A key built from a name the code does not enumerate here (`serving.verdict_{v}`): at least its pattern has
    strings (a renamed section or prefix leaves none)."""
    patterns = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                head = str(node.values[0].value)
                if head.split(".")[0] in SECTIONS and "." in head:
                    patterns.add("".join(re.escape(v.value) if isinstance(v, ast.Constant) else "[A-Za-z0-9_]+"
                                         for v in node.values))
    assert len(patterns) > 80
    for lang in ("en", "ko"):
        keys = list(catalog(lang))
        # a pattern may be a stem itself (Check's f"check.{q.id}_opt", then "_<option>")
        assert sorted(p for p in patterns if not any(re.fullmatch(p + "(_[A-Za-z0-9_]+)?", k) for k in keys)) == []


def test_strict_raises_and_the_app_shows_the_key(monkeypatch):
    assert t("reuse.title", "ko") != "reuse.title"
    with pytest.raises(MissingString, match="no string 'reuse.no_such_key' in kvviz/locales/ko/"):
        t("reuse.no_such_key", "ko")  # the tests run strict (tests/conftest.py)
    monkeypatch.delenv(STRICT_ENV)
    assert t("reuse.no_such_key", "ko") == "reuse.no_such_key"  # the app: the key, never a crash
