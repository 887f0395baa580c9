"""Backends: the native decoder and (later) Hugging Face models, behind one protocol."""
from .base import ArchInfo, Backend, ForwardResult

__all__ = ["ArchInfo", "Backend", "ForwardResult"]
