"""kvviz: see and measure the KV cache of a real decoder. `kvviz.Session` (kvviz.notebook) runs it from Python;
it is imported on first use, so `import kvviz` stays torch-free (the app's cold start imports this package)."""
from __future__ import annotations

__all__ = ["Session"]


def __getattr__(name: str) -> object:
    if name == "Session":
        from kvviz.notebook import Session

        return Session
    raise AttributeError(f"module 'kvviz' has no attribute {name!r}")
