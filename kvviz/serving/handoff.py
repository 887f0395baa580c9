"""Prefill→decode handoff between two real llama-server processes on loopback.

Server P prefills the prompt (`/completion`, n_predict 1, cache_prompt) and saves its slot to a file
(`POST /slots/0?action=save`, server started with --slot-save-path); the file is copied into server D's slot
directory; D restores it (`action=restore`) and continues the same prompt with cache_prompt, so it computes only
what its cache lacks (llama.cpp re-evaluates the prompt's last token for its logits). D's tokens are held against
the same request on a server that did everything itself, and the file against kvviz's formula.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint
from kvviz.serving.llamacpp import LlamaServer, complete_ids, slot_action
from kvviz.serving.llamacpp_state import read_slot_file

FILENAME = "handoff.bin"


def handoff_gguf(model: str, backend, workdir: str | Path) -> Path:  # noqa: ANN001 - a NativeBackend
    """The GGUF both llama-servers load for `model`: a fetched model's own, a .gguf file as given, or the shipped
    model exported into `workdir` (its weights as `backend` holds them)."""
    from kvviz.engine import fetch  # the engine (torch) only when a handoff runs

    if model in fetch.MODELS:
        return fetch.gguf_path(model)
    if str(model).endswith(".gguf"):
        return Path(model)
    if model == "tiny":
        from kvviz.engine.export import export_gguf

        return export_gguf(backend.model, backend.tokenizer, Path(workdir) / "tiny.gguf", name="kvviz-tiny")
    raise InputError("handoff_gguf", name=model, choices=", ".join(fetch.MODELS))


def llamacpp_handoff(gguf: str | Path, spec: KVSpec, prompt_ids: list[int], new_tokens: int, *,
                     server: str | Path | None = None, ctx_size: int = 2048, workdir: str | Path | None = None,
                     timeout_s: float = 180.0) -> dict:
    """Run the handoff; `spec` is the model's KV description (for the formula's bytes)."""
    with tempfile.TemporaryDirectory(prefix="kvviz-handoff-", dir=workdir) as tmp:
        dirs = {role: Path(tmp) / role for role in ("prefill", "decode")}
        for d in dirs.values():
            d.mkdir()

        def start(role: str) -> LlamaServer:
            # One slot; the slot directory is a prefix llama-server glues the file name to, hence the trailing "/".
            return LlamaServer(gguf, alias=f"kvviz-{role}", metrics=False, n_parallel=1, ctx_size=ctx_size,
                               extra=["--slot-save-path", f"{dirs[role]}/"], log=Path(tmp) / f"{role}.log",
                               server=server).start(timeout_s)

        p = d = None
        try:
            p, d = start("prefill"), start("decode")
            # The reference: the same request done entirely on one server (D, before it receives anything).
            single = complete_ids(d.base_url, prompt_ids, new_tokens, timeout_s, cache_prompt=False)
            first = complete_ids(p.base_url, prompt_ids, 1, timeout_s, cache_prompt=True, id_slot=0)
            saved = slot_action(p.base_url, 0, "save", FILENAME, timeout_s)
            t0 = time.perf_counter()
            shutil.copyfile(dirs["prefill"] / FILENAME, dirs["decode"] / FILENAME)
            transfer_s = time.perf_counter() - t0
            restored = slot_action(d.base_url, 0, "restore", FILENAME, timeout_s)
            rest = complete_ids(d.base_url, prompt_ids, new_tokens, timeout_s, cache_prompt=True, id_slot=0)
            slot = read_slot_file(dirs["decode"] / FILENAME)
        finally:
            for srv in (p, d):
                if srv is not None:
                    srv.stop()
    kv_dtype = slot.kv_dtype
    formula = kv_footprint(spec, slot.n_cells, 1, kv_dtype).total if kv_dtype else None
    return {
        "engine": "llamacpp", "model": spec.name, "gguf": str(gguf), "prompt_tokens": len(prompt_ids),
        "new_tokens": new_tokens, "kv_dtype": kv_dtype,
        # bytes: the whole file; kv_bytes: its K/V rows, held against the formula.
        "bytes": saved["n_written"], "file_bytes": slot.size, "kv_bytes": slot.kv_bytes,
        "formula_bytes": formula, "header_bytes": slot.header_bytes, "file_parts": slot.parts,
        "n_saved": saved["n_saved"], "n_restored": restored["n_restored"], "n_read": restored["n_read"],
        "file_tokens_equal_prompt": slot.tokens == list(prompt_ids), "v_transposed": slot.v_trans,
        "prefill_s": first["timings"]["prompt_ms"] / 1e3,
        "save_s": saved["timings"]["save_ms"] / 1e3, "transfer_s": transfer_s,
        "restore_s": restored["timings"]["restore_ms"] / 1e3,
        # What D computed after the restore: llama.cpp re-evaluates the last prompt token, then decodes.
        "decode_prompt_tokens_evaluated": rest["timings"]["prompt_n"],
        "decode_prompt_s": rest["timings"]["prompt_ms"] / 1e3,
        "decode_s": rest["timings"]["predicted_ms"] / 1e3,
        "single_prompt_s": single["timings"]["prompt_ms"] / 1e3,
        "first_token": first["tokens"][0] if first.get("tokens") else None,
        "tokens": rest["tokens"], "single_tokens": single["tokens"],
        "tokens_equal_single": rest["tokens"] == single["tokens"],
    }
