"""User-facing errors that carry a locale key, so the UI can say them in English or Korean.

InputError is a ValueError whose str() is the English text: the CLI prints it as one line.
"""
from __future__ import annotations

from kvviz.i18n import t


class InputError(ValueError):
    def __init__(self, key: str, **params: object) -> None:
        # A bare key lives in errors.toml; a dotted one ("memory.bad_config") in its own section.
        self.key, self.params = key, params
        self.locale_key = key if "." in key else f"errors.{key}"
        super().__init__(t(self.locale_key, "en", **params))

    def message(self, lang: str) -> str:
        return t(self.locale_key, lang, **self.params)
