"""Does this llama-server run on this CPU? Start it on a real model as kvviz starts it (kvviz.serving.llamacpp
.LlamaServer) and generate a few tokens. A build for the build machine's CPU (GGML_NATIVE=ON) can die with "Illegal
instruction" on the first quantized matrix product, not at start-up, so a start alone proves nothing.

    python scripts/probe_llama_server.py BINARY [GGUF]

GGUF: the model to try; by default SmolLM2's Q4_1 GGUF where `python -m kvviz fetch-model smollm2` put it, else the
shipped model exported as Q8_0 (quantized kernels, as a real model's) into a temporary file. Prints one line; exit
0: it ran, 1: it died (the signal or the error said), 2: no model to try it on.
"""
from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def probe_model(tmp: Path) -> tuple[Path, str]:
    from kvviz.engine.fetch import GGUF_NAME, MODELS
    from kvviz.engine.user_cache import cache_root

    smol = cache_root() / "models" / MODELS["smollm2"].title / GGUF_NAME
    if smol.is_file():
        return smol, "SmolLM2-135M-Instruct Q4_1"
    from kvviz.engine.export import export_gguf
    from kvviz.engine.loading import load_backend

    backend = load_backend("tiny", device="cpu")
    return export_gguf(backend.model, backend.tokenizer, tmp / "tiny-q8_0.gguf", q8_0=True), "kvviz-tiny Q8_0"


def main(argv: list[str]) -> int:
    from kvviz.serving.llamacpp import LlamaServer, complete_ids

    binary = Path(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            model, name = (Path(argv[1]), Path(argv[1]).name) if len(argv) > 1 else probe_model(Path(tmp))
        except Exception as e:  # noqa: BLE001 - any reason there is no model is said in one line
            print(f"probe: no model to try {binary} on ({type(e).__name__}: {e})")
            return 2
        server = LlamaServer(model, server=binary, n_parallel=1, ctx_size=512, log=Path(tmp) / "server.log")
        try:
            with server:
                out = complete_ids(server.base_url, [1, 2, 3, 4, 5, 6, 7, 8], 8, timeout_s=120)
            print(f"probe: {binary} ran {name}: {len(out.get('tokens', []))} tokens generated")
            return 0
        except Exception as e:  # noqa: BLE001 - a crash shows as a refused connection or an exit
            code = server.proc.poll() if server.proc is not None else None
            why = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"{type(e).__name__}"
            print(f"probe: {binary} died on {name}: {why}")
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
