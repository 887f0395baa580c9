"""Start and stop llama.cpp's `llama-server` on a loopback port (the tests, the bench scripts, a demo).

The binary is built from the llama-cpp-python source distribution by scripts/build_llama_server.sh into
build/llama.cpp/bin/ (or named by KVVIZ_LLAMA_SERVER).
"""
from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from kvviz.kv.llamacpp import LlamaCppKV

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = ROOT / "build" / "llama.cpp" / "bin" / "llama-server"


def binary(explicit: str | Path | None = None) -> Path | None:
    """The llama-server to run: `explicit` (a --llama-server flag), else KVVIZ_LLAMA_SERVER, else the build's."""
    path = Path(explicit or os.environ.get("KVVIZ_LLAMA_SERVER") or DEFAULT_BINARY)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Terminate a child process, and kill it if it has not ended within timeout_s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LlamaServer:
    """`with LlamaServer(gguf) as srv:` — srv.base_url is live inside, the process is gone after."""

    def __init__(self, model: str | Path, *, alias: str = "kvviz-tiny", metrics: bool = True, n_parallel: int = 4,
                 ctx_size: int = 2048, threads: int = 2, extra: list[str] | None = None,
                 log: Path | None = None, server: str | Path | None = None) -> None:
        exe = binary(server)
        if exe is None:
            where = server or os.environ.get("KVVIZ_LLAMA_SERVER") or DEFAULT_BINARY
            raise FileNotFoundError(f"llama-server not found at {where}: run scripts/build_llama_server.sh")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.args = [str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "--alias", alias,
                     "-np", str(n_parallel), "-c", str(ctx_size), "-t", str(threads), "--no-webui",
                     # CPU weight repacking of Q4_1 (SmolLM2's GGUF) segfaults at load in this llama.cpp build
                     # (llama-cpp-python 0.3.36's vendored copy); repacking is a speed layout, not a different result
                     "--no-repack",
                     *(["--metrics"] if metrics else []), *(extra or [])]
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> LlamaServer:
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {' '.join(self.args)}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"llama-server did not become healthy in {timeout_s} s")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def complete_ids(base_url: str, prompt_ids: list[int], n_predict: int, timeout_s: float = 120.0, *,
                 cache_prompt: bool = False, id_slot: int | None = None) -> dict:
    """llama.cpp's native /completion, greedy, on token ids; returns its JSON (tokens, timings)."""
    body = {"prompt": prompt_ids, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
            "cache_prompt": cache_prompt, "return_tokens": True, "samplers": ["top_k"],
            **({"id_slot": id_slot} if id_slot is not None else {})}
    response = httpx.post(base_url + "/completion", json=body, timeout=timeout_s)
    response.raise_for_status()
    return response.json()


# llama_kv_cache::llama_kv_cache (src/llama-kv-cache.cpp) logs, with "%7.2f MiB" precision:
#   "llama_kv_cache: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB"
KV_SIZE_LINE = re.compile(
    r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
    r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")
KV_BUFFER_LINE = re.compile(r"llama_kv_cache: +\S+ KV buffer size = +([\d.]+) MiB")
N_CTX_LINE = re.compile(r"llama_context: n_ctx += (\d+)")
REFUSED_LINE = re.compile(r"(cache type \S+ with block size \d+ does not divide \S+|"
                          r"quantized V cache requires flash_attn)")


@dataclass(frozen=True)
class KVCacheLog:
    """What llama-server logged about its KV cache at start-up (MiB as it prints them, two decimals)."""

    n_ctx: int
    cells: int
    n_layers: int
    n_seq_max: int
    n_streams: int
    type_k: str
    type_v: str
    total_mib: float
    k_mib: float
    v_mib: float
    buffer_mib: float  # the backend buffer the tensors live in

    def differences(self, kv: LlamaCppKV) -> list[str]:
        """Where kvviz's sizing of this start-up differs from the log: cells and streams exactly, bytes to the log's
        precision ("%7.2f MiB": the formula rounded to two decimals is what it printed). Empty: equal."""
        pairs = {"n_ctx": (self.n_ctx, kv.n_ctx), "cells": (self.cells, kv.cells),
                 "streams": (self.n_streams, kv.n_streams), "seqs": (self.n_seq_max, kv.n_seq_max),
                 "types": ((self.type_k, self.type_v), (kv.cache_type, kv.cache_type)),
                 **{name: (f"{logged:.2f}", f"{ours / 2**20:.2f}") for name, logged, ours in (
                     ("size MiB", self.total_mib, kv.total_bytes), ("K MiB", self.k_mib, kv.k_bytes),
                     ("V MiB", self.v_mib, kv.v_bytes), ("buffer MiB", self.buffer_mib, kv.total_bytes))}}
        return [f"{name}: logged {a}, kvviz {b}" for name, (a, b) in pairs.items() if a != b]


def kv_cache_log(model: str | Path, *, ctx_size: int, n_parallel: int, cache_type: str = "f16",
                 unified: bool = False, timeout_s: float = 120.0) -> KVCacheLog | str:
    """Start llama-server with this KV cache, read its log up to the KV cache's size line, stop it. Returns the
    logged sizes, or the line with which llama.cpp refused the configuration."""
    srv = LlamaServer(model, n_parallel=n_parallel, ctx_size=ctx_size, metrics=False, threads=1,
                      extra=["-ctk", cache_type, "-ctv", cache_type, "-fa", "on", "--no-warmup", "-lv", "4",
                             "-kvu" if unified else "-no-kvu"])
    proc = subprocess.Popen(srv.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    found: dict[str, re.Match] = {}
    tail: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            tail = [*tail[-20:], line.rstrip()]
            if m := REFUSED_LINE.search(line):
                return m.group(1)
            for key, pattern in (("n_ctx", N_CTX_LINE), ("buffer", KV_BUFFER_LINE), ("size", KV_SIZE_LINE)):
                if key not in found and (m := pattern.search(line)):
                    found[key] = m
            if "size" in found:
                size = found["size"]
                return KVCacheLog(
                    n_ctx=int(found["n_ctx"].group(1)), cells=int(size.group(2)), n_layers=int(size.group(3)),
                    n_seq_max=int(size.group(4)), n_streams=int(size.group(5)), type_k=size.group(6),
                    type_v=size.group(8), total_mib=float(size.group(1)), k_mib=float(size.group(7)),
                    v_mib=float(size.group(9)), buffer_mib=float(found["buffer"].group(1)))
    finally:
        proc.kill()
        proc.wait()
    raise RuntimeError("llama-server logged no KV cache size: " + " | ".join(tail[-5:]))


def slot_action(base_url: str, slot: int, action: str, filename: str, timeout_s: float = 120.0) -> dict:
    """POST /slots/{slot}?action=save|restore (a server started with --slot-save-path): its JSON, with n_saved or
    n_restored, n_written or n_read, and timings.save_ms or timings.restore_ms."""
    response = httpx.post(f"{base_url}/slots/{slot}", params={"action": action}, json={"filename": filename},
                          timeout=timeout_s)
    response.raise_for_status()
    return response.json()
