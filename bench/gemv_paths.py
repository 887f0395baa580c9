"""Which matrix kernel a decode step should call on this CPU: one-row products at a model's real weight shapes,
GB/s of weights each path streams, against a plain read of the same bytes, all in one run.

    python bench/gemv_paths.py [--model smollm2] [--threads 1] [--repeats 7] [--attention] [--int8]

Per dtype (float32, bfloat16) and per matrix shape of a decode step (fused Q/K/V, O, fused gate/up, down, the LM
head; as many matrices as the model has layers, so no cache holds them): F.linear on the plain matrix, kvviz's
linear() on the matrix prepack()ed (what Decoder.fuse does on CPU), and in float32 each kernel prepack chooses
between (kvviz's float32 kernel, kernels.f32, where it built; oneDNN's blocked layout; MKL's packed sgemm); a
torch.sum over the same tensors is the plain read.
--int8 times kvviz's int8 kernel (kvviz.engine.kernels.int8: activations int16 per block of 256, integer products)
and the int8 kernels torch offers a one-row product on this CPU, on the same int8 matrices (per output
channel): the weight-only kernel kvviz falls back on (_weight_int8pack_mm, bfloat16 activations), FBGEMM's dynamic
quantized linear (activations quantized per row to uint8: deprecated quantized tensors), oneDNN's qlinear (the
same, the PT2E path) and _int_mm (int8 × int8 → int32); the plain read is a torch.sum over the same bytes.
The paths take turns in each repeat and the fastest repeat counts. --attention also
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
from kvviz.engine.config import DecoderConfig  # noqa: E402
from kvviz.engine.kernels import f32 as f32_kernel  # noqa: E402
from kvviz.engine.kernels import int8 as int8_kernel  # noqa: E402
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


def shapes(cfg: DecoderConfig) -> list[tuple[str, tuple[int, int], int]]:
    """A decode step's matrix shapes [N, K] and how many of each (one per layer; one LM head)."""
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head
    named = {"qkv": (qkv, cfg.d_model), "o": (cfg.d_model, cfg.n_heads * cfg.d_head),
             "gate_up": (2 * cfg.d_ff, cfg.d_model), "down": (cfg.d_model, cfg.d_ff),
             "lm_head": (cfg.vocab_size, cfg.d_model)}
    return [(name, nk, 1 if name == "lm_head" else cfg.n_layers) for name, nk in named.items()]


def matrices(args: argparse.Namespace, cfg: DecoderConfig) -> None:
    total: dict[tuple[str, str], float] = {}
    for dtype in (torch.float32, torch.bfloat16):
        for name, (n, k), count in shapes(cfg):
            ws = [torch.randn(n, k).to(dtype) for _ in range(count)]
            packed = [prepack(w) for w in ws]
            x = torch.randn(1, 1, k).to(dtype)
            paths = {
                "F.linear": lambda ws=ws, x=x: [F.linear(x, w) for w in ws],
                "linear() (prepack's choice)": lambda ps=packed, x=x: [linear(x, p) for p in ps],
            }
            if dtype == torch.float32 and f32_kernel.why_not() is None:
                ours = [f32_kernel.pack(w) for w in ws]
                paths["kvviz kernel"] = lambda ps=ours, x=x, n=n: [f32_kernel.product(x, p, n) for p in ps]
            if dtype == torch.float32 and torch.backends.mkldnn.is_available() and torch.backends.mkl.is_available():
                onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in ws]
                mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, 1) for w in ws]
                paths["oneDNN"] = lambda ps=onednn, x=x: [
                    torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in ps]
                paths["MKL"] = lambda ps=mkl, ws=ws, x=x: [
                    torch.ops.mkl._mkl_linear(x, p, w, None, 1) for p, w in zip(ps, ws, strict=True)]
            paths["plain read"] = lambda ws=ws: [w.sum() for w in ws]
            best = fastest(paths, args.repeats)
            nbytes = sum(w.nbytes for w in ws)
            print(f"{str(dtype)[6:]:8s} {name:8s} {count:2d} × {n:>6,} × {k:<5,} "
                  + "  ".join(f"{p} {nbytes / s / 1e9:5.1f} GB/s ({s / count * 1e6:6.0f} µs)" for p, s in best.items()))
            for p, s in best.items():
                total[str(dtype)[6:], p] = total.get((str(dtype)[6:], p), 0.0) + s
    for (dtype, path), s in total.items():
        print(f"a step's matrices, {dtype}, {path}: {s * 1e3:.1f} ms")


def int8(args: argparse.Namespace, cfg: DecoderConfig) -> None:
    import warnings

    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")  # said in the docstring
    total: dict[str, float] = {}
    for name, (n, k), count in shapes(cfg):
        q = [torch.randint(-127, 128, (n, k), dtype=torch.int8) for _ in range(count)]
        scale = [torch.rand(n) / 127 + 1e-4 for _ in range(count)]
        x = torch.randn(1, k)
        x_bf16 = x.to(torch.bfloat16)
        int8pack = [(w, s.to(torch.bfloat16)) for w, s in zip(q, scale, strict=True)]
        fbgemm = [torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(
            w, s.double(), torch.zeros(n, dtype=torch.long), 0), None) for w, s in zip(q, scale, strict=True)]
        onednn = [torch.ops.onednn.qlinear_prepack(w, [1, k]) for w in q]
        zero = torch.zeros(n, dtype=torch.int32)

        def qlinear(x=x, onednn=onednn, scale=scale, zero=zero) -> None:
            x_scale = float(x.abs().amax()) / 127  # per row, as FBGEMM's dynamic path does it
            xq = (torch.round(x / x_scale) + 128).clamp(0, 255).to(torch.uint8)
            for w, s in zip(onednn, scale, strict=True):
                torch.ops.onednn.qlinear_pointwise(xq, x_scale, 128, w, s, zero, None, 1.0, 0, torch.float32,
                                                   "none", [], "")

        xq8 = torch.randint(-127, 128, (1, k), dtype=torch.int8)
        paths = {"kvviz kernel": lambda x=x, ws=int8pack: [int8_kernel.product(x, w, s) for w, s in ws]}
        if int8_kernel.why_not() is not None:  # not built here: said once, the others still timed
            print(f"kvviz's int8 kernel: {int8_kernel.why_not()}")
            paths = {}
        best = fastest(paths | {
            "int8pack": lambda x=x_bf16, ws=int8pack: [torch._weight_int8pack_mm(x, w, s) for w, s in ws],
            "FBGEMM dynamic": lambda x=x, ps=fbgemm: [torch.ops.quantized.linear_dynamic(x, p) for p in ps],
            "oneDNN qlinear": qlinear,
            "_int_mm": lambda x=xq8, q=q: [torch._int_mm(x, w.t()) for w in q],
            "plain read": lambda q=q: [w.view(torch.float32).sum() for w in q],
        }, args.repeats)
        nbytes = sum(w.nbytes for w in q)
        print(f"int8     {name:8s} {count:2d} × {n:>6,} × {k:<5,} "
              + "  ".join(f"{p} {nbytes / s / 1e9:5.1f} GB/s" for p, s in best.items()))
        for p, s in best.items():
            total[p] = total.get(p, 0.0) + s
    for path, s in total.items():
        print(f"a step's matrices, int8, {path}: {s * 1e3:.1f} ms")


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
    ap.add_argument("--int8", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = cpu_load()
    print(f"{args.threads} thread(s)" + (f", load average {load[0]:.2f} on {load[1]} cores" if load else ""))
    if f32_kernel.why_not() is not None:
        print(f"kvviz's float32 kernel: {f32_kernel.why_not()}")
    cfg = load_backend(args.model, device="cpu").model.cfg  # the shapes only, read once
    matrices(args, cfg)
    if args.int8:
        int8(args, cfg)
    if args.attention:
        attention(args)


if __name__ == "__main__":
    main()
