"""Prefill on one worker process, decode on another, the K/V sent between them over a loopback socket — the shape
of vLLM / llm-d / Dynamo disaggregated serving, with kvviz's engine in both processes.

The prefill worker runs the prompt, emits the first token, packs the cache's K/V (serde: safetensors with a sha256)
and sends it; the decode worker checks it, copies it into a fresh cache and decodes on from the first token
(Generation.adopt). Each worker is `python -m kvviz.engine.offload.handoff`, speaking one JSON line on stdout.
Times are perf_counter readings: CLOCK_MONOTONIC on Linux, one clock for every process of the machine, so the
transfer is the receiver's last byte minus the sender's first.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the folder holding the kvviz package the workers must import
LENGTH = 8  # bytes of the message-length prefix


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"the sender closed after {got} of {n} bytes")
        got += k
    return buf


def _load(model: str, dtype: str):  # noqa: ANN202 - a NativeBackend
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.loading import load_backend
    from kvviz.engine.timing import warm_up

    backend = load_backend(model, dtype=dtype, device="cpu")
    if not isinstance(backend, NativeBackend):
        raise SystemExit(f"{model}: the handoff runs kvviz's own decoder")
    warm_up(backend)
    return backend


def prefill_worker(model: str, dtype: str, prompt_ids: list[int], port: int) -> dict:
    from kvviz.engine.generation import Generation
    from kvviz.engine.offload import serde
    from kvviz.engine.offload.store import chunk_from
    from kvviz.engine.offload.tiers import ChunkInfo
    from kvviz.engine.timing import quiet

    backend = _load(model, dtype)
    with quiet():
        gen = Generation(backend, max_new_tokens=1, stop_at_eos=False)
        event = gen.prefill(prompt_ids)
        t0 = time.perf_counter()
        chunk = chunk_from(gen.cache, ChunkInfo("", "", 0, tuple(prompt_ids)))
        blob = serde.pack(chunk.k, chunk.v, {"prompt": json.dumps(prompt_ids), "first_token": str(event.token_id)})
        save_s = time.perf_counter() - t0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        t_send = time.perf_counter()
        sock.sendall(len(blob).to_bytes(LENGTH, "little"))
        sock.sendall(blob)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the receiver's "got it": the connection stays open until every byte is in
    return {"prefill_s": event.seconds, "first_token": event.token_id, "save_s": save_s, "t_send": t_send,
            "bytes": chunk.nbytes, "wire_bytes": LENGTH + len(blob)}


def decode_worker(model: str, dtype: str, new_tokens: int) -> dict:
    from kvviz.engine.generation import Generation
    from kvviz.engine.offload import serde
    from kvviz.engine.offload.store import copy_into
    from kvviz.engine.offload.tiers import Chunk, ChunkInfo
    from kvviz.engine.timing import quiet

    backend = _load(model, dtype)
    with socket.create_server(("127.0.0.1", 0)) as server:
        print(json.dumps({"port": server.getsockname()[1]}), flush=True)
        conn, _ = server.accept()
        with conn:
            n = int.from_bytes(_recv_exact(conn, LENGTH), "little")
            blob = _recv_exact(conn, n)
            t_received = time.perf_counter()
            conn.sendall(b"k")
    with quiet():
        t0 = time.perf_counter()
        k, v, meta = serde.unpack(bytes(blob))  # refuses a damaged message
        prompt = json.loads(meta["prompt"])
        cache = backend.new_cache(1, len(prompt) + new_tokens)
        copy_into(cache, Chunk(ChunkInfo("", "", 0, tuple(prompt)), k, v), len(prompt))
        restore_s = time.perf_counter() - t0
        gen = Generation(backend, max_new_tokens=new_tokens, stop_at_eos=False)
        gen.adopt(prompt, int(meta["first_token"]), cache)
        while not gen.done:
            gen.step()
    return {"t_received": t_received, "restore_s": restore_s, "tokens": gen.generated[0],
            "decode_s": [e.seconds for e in gen.events], "bytes": k.nbytes + v.nbytes}


def _spawn(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "kvviz.engine.offload.handoff", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _last_json(proc: subprocess.Popen, timeout_s: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise TimeoutError(f"a handoff worker ran past {timeout_s} s") from None
    if proc.returncode != 0:
        why = err.strip().splitlines()[-1] if err.strip() else proc.returncode
        raise RuntimeError(f"a handoff worker failed: {why}")
    return json.loads(out.strip().splitlines()[-1])


def run_handoff(backend, model: str, prompt_ids: list[int], new_tokens: int, *,  # noqa: ANN001 - a NativeBackend
                timeout_s: float = 600.0) -> dict:
    """Prefill worker → K/V over a loopback socket → decode worker, next to the same request in this one process
    (`backend`, loaded from `model`): the tokens, the bytes against the formula, and each step's time."""
    from kvviz.engine.generation import Generation
    from kvviz.kv.formula import kv_footprint

    dtype = str(backend.dtype).removeprefix("torch.")
    decode = _spawn(["decode", "--model", model, "--dtype", dtype, "--new-tokens", str(new_tokens)])
    prefill = None
    try:
        line = decode.stdout.readline()
        if not line:
            return _last_json(decode, timeout_s)  # raises with the worker's own message
        port = json.loads(line)["port"]
        prefill = _spawn(["prefill", "--model", model, "--dtype", dtype, "--port", str(port),
                          "--prompt-ids", ",".join(map(str, prompt_ids))])
        p = _last_json(prefill, timeout_s)
        d = _last_json(decode, timeout_s)
    finally:
        for proc in (decode, prefill):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    single = Generation(backend, max_new_tokens=new_tokens, stop_at_eos=False)
    single.run(list(prompt_ids))
    handed = [p["first_token"], *d["tokens"][1:]]
    return {
        "engine": "kvviz", "model": backend.spec.name, "dtype": dtype, "prompt_tokens": len(prompt_ids),
        "new_tokens": new_tokens,
        # bytes: all that crossed the socket; kv_bytes: its K/V part, held against the formula.
        "bytes": p["wire_bytes"], "kv_bytes": d["bytes"],
        "formula_bytes": kv_footprint(backend.spec, len(prompt_ids), 1, dtype).total,
        "header_bytes": p["wire_bytes"] - d["bytes"],
        "prefill_s": p["prefill_s"], "save_s": p["save_s"], "transfer_s": d["t_received"] - p["t_send"],
        "restore_s": d["restore_s"], "first_decode_s": d["decode_s"][0] if d["decode_s"] else None,
        "decode_s": d["decode_s"], "tokens": handed, "single_tokens": single.generated[0],
        "tokens_equal_single": handed == single.generated[0],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kvviz.engine.offload.handoff")
    p.add_argument("role", choices=["prefill", "decode"])
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--port", type=int)
    p.add_argument("--prompt-ids", default="")
    p.add_argument("--new-tokens", type=int, default=8)
    a = p.parse_args(argv)
    if a.role == "prefill":
        out = prefill_worker(a.model, a.dtype, [int(x) for x in a.prompt_ids.split(",")], a.port)
    else:
        out = decode_worker(a.model, a.dtype, a.new_tokens)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
