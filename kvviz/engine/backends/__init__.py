"""Backends: the native decoder and Hugging Face models, behind one protocol (base.Backend).

Nothing is imported here: kvviz.engine.backends.hf_policy is read by the first page drawn, before torch."""
