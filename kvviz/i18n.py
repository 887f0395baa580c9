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
# Text said to a screen reader only, not drawn (the usual visually hidden box): a chart's, the cache grid's and the
# token strip's text alternatives (WCAG 1.1.1), the live region's news.
SR_ONLY = ("position:absolute;width:1px;height:1px;margin:-1px;padding:0;overflow:hidden;clip-path:inset(50%);"
           "white-space:nowrap;border:0")


def _flatten(prefix: str, table: dict, out: dict[str, str]) -> None:
    for key, value in table.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            _flatten(name, value, out)
        else:
            out[name] = str(value)


@cache
def section(lang: str, name: str) -> dict[str, str]:
    """One locale file's strings (`<lang>/<name>.toml`), read when a key of it is first asked for: a page's first
    run parses only the sections it shows, not all ~490 KB of TOML (parsing them all was a third of a first run)."""
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}: choose one of {', '.join(LANGS)}")
    path = LOCALES / lang / f"{name}.toml"
    out: dict[str, str] = {}
    if path.is_file():
        _flatten(name, tomllib.loads(path.read_text(encoding="utf-8")), out)
    return out


def catalog(lang: str) -> dict[str, str]:
    """Every string of `lang` (the tests compare the languages' keys)."""
    out: dict[str, str] = {}
    for path in sorted((LOCALES / lang).glob("*.toml")):
        out.update(section(lang, path.stem))
    return out


def _lookup(key: str, lang: str) -> str | None:
    return section(lang, key.split(".", 1)[0]).get(key)


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
    text = _lookup(key, lang)
    if text is None:
        if os.environ.get(STRICT_ENV) == "1":
            raise MissingString(f"no string {key!r} in kvviz/locales/{lang}/ ({STRICT_ENV}=1)")
        text = _lookup(key, "en") or key
    return fill(text, **values) if values else text
