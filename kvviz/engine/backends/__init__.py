"""Backends: the native decoder and (later) Hugging Face models, behind one protocol."""
from kvviz.engine.backends.base import Backend, ForwardResult

__all__ = ["Backend", "ForwardResult"]
