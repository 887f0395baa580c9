"""English and Korean strings from TOML locale files: kvviz/locales/<lang>/<section>.toml.

A key reads `section.name` (e.g. `sidebar.model`); every key exists in both languages, and every key the code asks
for exists (tests/app/test_i18n_keys.py). A missing key shows as itself in the app; with KVVIZ_STRICT_I18N=1 (the
tests set it) t() raises, so a string the code asks for and nobody wrote fails a test instead.
"""
from __future__ import annotations

import os
import re
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


# English plurals in a locale string: "{n} {n|token|tokens}" reads "1 token", "2 tokens" (Korean needs none).
PLURAL = re.compile(r"\{(\w+)\|([^{}|]*)\|([^{}|]*)\}")


def plural(text: str, values: dict[str, object]) -> str:
    """Resolve every {name|singular|plural} by the value of `name` (1, "1" or 1.0 is singular)."""
    def pick(m: re.Match) -> str:
        value = values.get(m.group(1))
        return m.group(2) if str(value).replace(",", "") in ("1", "1.0") else m.group(3)

    return PLURAL.sub(pick, text)


def fill(template: str, **values: object) -> str:
    """A locale string taken whole (a chart's label) filled in later: its plurals resolved, then its values."""
    return plural(template, values).format(**values)


STRICT_ENV = "KVVIZ_STRICT_I18N"  # "1": a key missing in the language asked for raises (the tests), not shown raw


class MissingString(KeyError):
    """A locale key the code asks for that the language's files do not have (raised only when strict)."""


def t(key: str, lang: str = "en", **values: object) -> str:
    """The string for `key` in `lang`, formatted with `values`; a missing key shows as itself (raises when strict)."""
    text = catalog(lang).get(key)
    if text is None:
        if os.environ.get(STRICT_ENV) == "1":
            raise MissingString(f"no string {key!r} in kvviz/locales/{lang}/ ({STRICT_ENV}=1)")
        text = catalog("en").get(key) or key
    return fill(text, **values) if values else text
