"""Save, transfer and restore times of a prefill→decode handoff against the bytes moved, for several prompt lengths,
in both engines: two kvviz worker processes over a loopback socket and two llama-servers (slot save → copy →
restore, where llama-server is built). One run per length; prints MB/s per step from this one run.

    python bench/handoff_sizes.py [--model tiny|smollm2] [--lengths 25,100,400,1600] [--new 4] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine import fetch  # noqa: E402
from kvviz.engine.export import export_gguf  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.offload.handoff import run_handoff  # noqa: E402
from kvviz.engine.paged.demo import shared_prefix_ids  # noqa: E402
from kvviz.serving.handoff import llamacpp_handoff  # noqa: E402
from kvviz.serving.llamacpp import binary  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--lengths", default="25,100,400,1600")
    p.add_argument("--new", type=int, default=4)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    backend = load_backend(a.model, device="cpu")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        gguf = (export_gguf(backend.model, backend.tokenizer, Path(tmp) / "m.gguf") if a.model == "tiny"
                else fetch.gguf_path(a.model))
        for n in (int(x) for x in a.lengths.split(",")):
            ids = shared_prefix_ids(backend.tokenizer, n)
            runs = {"kvviz": run_handoff(backend, a.model, ids, a.new)}
            if binary() is not None:
                runs["llamacpp"] = llamacpp_handoff(gguf, backend.spec, ids, a.new, ctx_size=max(2048, n + a.new + 8))
            for engine, r in runs.items():
                rows.append({"engine": engine, "tokens": n, "bytes": r["bytes"], "kv_bytes": r["kv_bytes"],
                             "formula_bytes": r["formula_bytes"], "save_s": r["save_s"], "transfer_s": r["transfer_s"],
                             "restore_s": r["restore_s"], "tokens_equal_single": r["tokens_equal_single"]})
    if a.json:
        print(json.dumps(rows))
        return
    print(f"{'engine':>8} {'tokens':>6} {'bytes':>12} {'K/V=formula':>11} {'save ms':>9} {'MB/s':>7} "
          f"{'transfer ms':>11} {'MB/s':>7} {'restore ms':>10} {'MB/s':>7} {'tokens =':>8}")
    for r in rows:
        mbs = [r["bytes"] / s / 1e6 if s > 0 else float("nan") for s in (r["save_s"], r["transfer_s"], r["restore_s"])]
        print(f"{r['engine']:>8} {r['tokens']:>6} {r['bytes']:>12,} {str(r['kv_bytes'] == r['formula_bytes']):>11} "
              f"{r['save_s'] * 1e3:9.2f} {mbs[0]:7.0f} {r['transfer_s'] * 1e3:11.2f} {mbs[1]:7.0f} "
              f"{r['restore_s'] * 1e3:10.2f} {mbs[2]:7.0f} {str(r['tokens_equal_single']):>8}")


if __name__ == "__main__":
    main()
