"""Which matrix kernel a decode step should call on this CPU: one-row products at a model's real weight shapes,
GB/s of weights each path streams, against a plain read of the same bytes, all in one run.

    python bench/gemv_paths.py [--model smollm2] [--threads 1] [--repeats 7] [--attention]

Per dtype (float32, bfloat16) and per matrix shape of a decode step (fused Q/K/V, O, fused gate/up, down, the LM
head; as many matrices as the model has layers, so no cache holds them): F.linear on the plain matrix, and
kvviz's linear() on the matrix prepack()ed for oneDNN (what Decoder.fuse does on CPU); a torch.sum over the same
tensors is the plain read. The paths take turns in each repeat and the fastest repeat counts. --attention also
times one decode query's attention (9 query heads over 3 KV heads of 64, as SmolLM2) with its products in the
model's dtype against cast to float32 (what attend() does on CPU).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.machine import cpu_load  # noqa: E402
from kvviz.engine.model import attend, linear, prepack  # noqa: E402


def fastest(paths: dict, repeats: int) -> dict[str, float]:
    best = dict.fromkeys(paths, float("inf"))
    with torch.inference_mode():
        for run in paths.values():
            run()  # warm-up
        for _ in range(repeats):
            for name, run in paths.items():
                t0 = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def matrices(args: argparse.Namespace) -> None:
    cfg = load_backend(args.model, device="cpu").model.cfg
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head
    shapes = {"qkv": (qkv, cfg.d_model), "o": (cfg.d_model, cfg.n_heads * cfg.d_head),
              "gate_up": (2 * cfg.d_ff, cfg.d_model), "down": (cfg.d_model, cfg.d_ff), "lm_head": (cfg.vocab_size,
                                                                                                  cfg.d_model)}
    total: dict[tuple[str, str], float] = {}
    for dtype in (torch.float32, torch.bfloat16):
        for name, (n, k) in shapes.items():
            count = 1 if name == "lm_head" else cfg.n_layers
            ws = [torch.randn(n, k).to(dtype) for _ in range(count)]
            packed = [prepack(w) for w in ws]
            x = torch.randn(1, 1, k).to(dtype)
            best = fastest({
                "F.linear": lambda ws=ws, x=x: [F.linear(x, w) for w in ws],
                "prepacked (kvviz)": lambda ps=packed, x=x: [linear(x, p) for p in ps],
                "plain read": lambda ws=ws: [w.sum() for w in ws],
            }, args.repeats)
            nbytes = sum(w.nbytes for w in ws)
            print(f"{str(dtype)[6:]:8s} {name:8s} {count:2d} × {n:>6,} × {k:<5,} "
                  + "  ".join(f"{p} {nbytes / s / 1e9:5.1f} GB/s ({s / count * 1e6:6.0f} µs)" for p, s in best.items()))
            for p, s in best.items():
                total[str(dtype)[6:], p] = total.get((str(dtype)[6:], p), 0.0) + s
    for (dtype, path), s in total.items():
        print(f"a step's matrices, {dtype}, {path}: {s * 1e3:.1f} ms")


def attention(args: argparse.Namespace) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for n_keys in (160, 1000):
            cache_k, cache_v = (torch.randn(1, 3, 2048, 64).to(dtype) for _ in range(2))
            q, k, v = torch.randn(1, 9, 1, 64).to(dtype), cache_k[:, :, :n_keys], cache_v[:, :, :n_keys]

            def in_dtype(q=q, k=k, v=v) -> None:  # the products in the model's dtype (attend before float32 on CPU)
                scores = q.reshape(1, 3, 3, 64) @ k.transpose(-1, -2) / 8
                (scores.float().softmax(-1).to(q.dtype) @ v).view(1, 9, 1, 64)

            best = fastest({"in the model's dtype": lambda: [in_dtype() for _ in range(30)],
                            "float32 (attend)": lambda q=q, k=k, v=v: [attend(q, k, v, None, capture=True)
                                                                       for _ in range(30)]}, args.repeats)
            print(f"attention, {str(dtype)[6:]}, {n_keys} keys: "
                  + "  ".join(f"{p} {s / 30 * 1e6:.1f} µs" for p, s in best.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--attention", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = cpu_load()
    print(f"{args.threads} thread(s)" + (f", load average {load[0]:.2f} on {load[1]} cores" if load else ""))
    matrices(args)
    if args.attention:
        attention(args)


if __name__ == "__main__":
    main()
