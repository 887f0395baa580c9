"""A page's first screen without the engine: the model's description now, its weights when the page runs it.

A page opened directly (a link shared in a lecture chat) draws its title, settings and buttons from the model's
description alone: a native model (the shipped one, a custom shape) is described from its config without torch,
and the engine is imported in the background meanwhile (`ui.preload_engine`), so the first click that runs the
model finds it ready. A Hugging Face model is described by loading it.
"""
from __future__ import annotations

from kvviz.app import ui
from kvviz.kv.formula import KVSpec


def model_spec(settings: ui.Settings) -> KVSpec | None:
    """The chosen model's description: from its config for a native model (no torch), else from loading it (None,
    with the reason shown, when it cannot load)."""
    spec = ui.settings_spec(settings)
    if spec is None:
        backend = ui.get_backend(settings)
        spec = backend.spec if backend is not None else None
    return spec
