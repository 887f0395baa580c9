"""User-facing errors that carry a locale key, so the UI can say them in English or Korean.

InputError is a ValueError whose str() is the English text: the CLI prints it as one line.
"""
from __future__ import annotations

from .i18n import t


class InputError(ValueError):
    def __init__(self, key: str, **params: object) -> None:
        self.key, self.params = key, params
        super().__init__(t(f"errors.{key}", "en", **params))

    def message(self, lang: str) -> str:
        return t(f"errors.{self.key}", lang, **self.params)
