"""English and Korean strings from TOML locale files: kvviz/locales/<lang>/<section>.toml.

A key reads `section.name` (e.g. `sidebar.model`); every key exists in both languages (a test checks).
"""
from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

LANGS = ("en", "ko")
LANG_NAMES = {"en": "English", "ko": "한국어"}
LOCALES = Path(__file__).parent / "locales"


def _flatten(prefix: str, table: dict, out: dict[str, str]) -> None:
    for key, value in table.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            _flatten(name, value, out)
        else:
            out[name] = str(value)


@cache
def catalog(lang: str) -> dict[str, str]:
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}: choose one of {', '.join(LANGS)}")
    out: dict[str, str] = {}
    for path in sorted((LOCALES / lang).glob("*.toml")):
        _flatten(path.stem, tomllib.loads(path.read_text(encoding="utf-8")), out)
    return out


def t(key: str, lang: str = "en", **values: object) -> str:
    """The string for `key` in `lang`, formatted with `values`; a missing key shows as itself."""
    text = catalog(lang).get(key) or catalog("en").get(key) or key
    return text.format(**values) if values else text
