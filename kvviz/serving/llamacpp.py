"""Start and stop llama.cpp's `llama-server` on a loopback port (the tests, the bench scripts, a demo).

The binary is built from the llama-cpp-python source distribution by scripts/build_llama_server.sh into
build/llama.cpp/bin/ (or named by KVVIZ_LLAMA_SERVER).
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx

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


def slot_action(base_url: str, slot: int, action: str, filename: str, timeout_s: float = 120.0) -> dict:
    """POST /slots/{slot}?action=save|restore (a server started with --slot-save-path): its JSON, with n_saved or
    n_restored, n_written or n_read, and timings.save_ms or timings.restore_ms."""
    response = httpx.post(f"{base_url}/slots/{slot}", params={"action": action}, json={"filename": filename},
                          timeout=timeout_s)
    response.raise_for_status()
    return response.json()
