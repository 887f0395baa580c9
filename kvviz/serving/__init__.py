"""Measure a real serving engine over its OpenAI-compatible HTTP API: vLLM, SGLang, llama.cpp, TGI, ..."""
