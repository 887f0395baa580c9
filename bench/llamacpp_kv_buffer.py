"""kvviz's KV formula beside the KV buffer llama.cpp logs at start-up, over a grid of -c, -np, unified and cache types.

For each configuration llama-server is started (kvviz.serving.llamacpp.kv_cache_log), its
"llama_kv_cache: size = … MiB (N cells, L layers, P/S seqs), K (…): … MiB, V (…): … MiB" line read, and the server
stopped; kvviz.kv.llamacpp gives the cells and streams, kvviz.kv.formula the bytes. "equal" is the formula rounded
to the log's two decimals against what the log printed. tests/engine/test_llamacpp_kv.py checks a subset.

    python bench/llamacpp_kv_buffer.py [--models smollm2,tiny] [--json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine import fetch  # noqa: E402
from kvviz.engine.export import export_gguf  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.shape import fetched_spec, shipped_spec  # noqa: E402
from kvviz.errors import InputError  # noqa: E402
from kvviz.kv.llamacpp import llamacpp_kv  # noqa: E402
from kvviz.serving.llamacpp import KVCacheLog, kv_cache_log  # noqa: E402

MIB = 2**20
GRID = [(c, p, u) for c, p, u in itertools.product((512, 1000, 4096, 8192), (1, 2, 3, 4), (False, True))
        if not (u and p == 1)]  # one sequence: unified or not is the same cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,tiny")
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            if name == "tiny":
                backend = load_backend("tiny", device="cpu")
                gguf, spec = export_gguf(backend.model, backend.tokenizer, Path(tmp) / "t.gguf"), shipped_spec()
            else:
                gguf, spec = fetch.gguf_path(name), fetched_spec(name)
            for (n_ctx, n_par, unified), cache_type in itertools.product(GRID, args.types.split(",")):
                log = kv_cache_log(gguf, ctx_size=n_ctx, n_parallel=n_par, cache_type=cache_type, unified=unified)
                try:
                    kv = llamacpp_kv(spec, n_ctx, n_par, cache_type, unified=unified)
                except InputError as exc:
                    kv = str(exc)
                row = {"model": name, "c": n_ctx, "np": n_par, "unified": unified, "type": cache_type}
                if isinstance(log, KVCacheLog) and not isinstance(kv, str):
                    row |= {"cells": log.cells, "streams": log.n_streams, "logged_mib": log.total_mib,
                            "logged_k_mib": log.k_mib, "formula_bytes": kv.total_bytes,
                            "formula_mib": kv.total_bytes / MIB,
                            "equal": not log.differences(kv)}
                else:  # refused: equal when both refuse
                    row |= {"llamacpp": log if isinstance(log, str) else "started", "kvviz": kv if isinstance(
                        kv, str) else "sized", "equal": isinstance(log, str) and isinstance(kv, str)}
                rows.append(row)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'model':<8} {'-c':>5} {'-np':>3} {'kvu':>3} {'type':<5} | {'cells':>5} {'str':>3} "
          f"{'logged MiB':>10} {'formula MiB':>12} {'formula B':>11} | equal")
    for r in rows:
        head = f"{r['model']:<8} {r['c']:>5} {r['np']:>3} {'yes' if r['unified'] else 'no':>3} {r['type']:<5} | "
        if "cells" in r:
            print(head + f"{r['cells']:>5} {r['streams']:>3} {r['logged_mib']:>10.2f} {r['formula_mib']:>12.4f} "
                  f"{r['formula_bytes']:>11,} | {r['equal']}")
        else:
            print(head + f"both refuse ({r['llamacpp']})" if r["equal"] else head + f"DIFFER {r}")
    print(f"{sum(r['equal'] for r in rows)}/{len(rows)} configurations equal")


if __name__ == "__main__":
    main()
