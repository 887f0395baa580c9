"""Where one decode step of kvviz's decoder spends its time: torch.profiler over N steps, ops by self CPU time.

    python bench/decode_profile.py [--model smollm2] [--dtype float32|bfloat16] [--weights float|int8]
                                   [--threads 1] [--steps 20] [--prompt-tokens 128] [--compile]

Prints the op table (self CPU time, calls) and the share of the matrix products (aten::mm;
mkldnn::_linear_pointwise and mkl::_mkl_linear, torch's prepacked weights' GEMVs; aten::_weight_int8pack_mm; kvviz's
float32 and int8 kernels, named for the profiler here) against everything else: the part a faster memory system would
not speed up.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine.generation import Generation  # noqa: E402
from kvviz.engine.kernels import f32 as f32_kernel  # noqa: E402
from kvviz.engine.kernels import int8 as int8_kernel  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.machine import cpu_load  # noqa: E402

# the weight products: aten's, oneDNN's and MKL's ops, kvviz's own operators (a compiled step calls them) and kvviz's
# kernels' ctypes calls, which the profiler sees only as named below (an uncompiled step calls them without an op)
KERNELS = {f32_kernel: "kvviz f32 kernel", int8_kernel: "kvviz int8 kernel"}
GEMV_OPS = ("aten::mm", "mkldnn::_linear_pointwise", "mkl::_mkl_linear", "aten::_weight_int8pack_mm",
            "kvviz::f32_linear", "kvviz::int8_linear", *KERNELS.values())


def name_kernels_for_the_profiler() -> None:
    """Each kernel's product() inside a record_function of its name (KERNELS)."""
    for module, name in KERNELS.items():
        def product(*args, inner=module.product, name=name):  # noqa: ANN002, ANN202
            with record_function(name):
                return inner(*args)
        module.product = product


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--weights", default="float", choices=["float", "int8"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--compile", action="store_true",
                    help="the decode step compiled first by inductor (kvviz.engine.compiled; its other CPU mode, "
                         "kvviz's C step, is one call the profiler cannot split)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    backend = load_backend(args.model, device="cpu", dtype=args.dtype, weights=args.weights)
    prompt = torch.randint(0, backend.model.cfg.vocab_size, (args.prompt_tokens,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    if args.compile and backend.compile("inductor").warm_up() is None:
        sys.exit(f"decode_profile: not compiled ({backend.compiled.why_not})")
    gen = Generation(backend, max_new_tokens=args.steps + 6, stop_at_eos=False)
    gen.prefill(prompt)
    for _ in range(5):  # warm-up, unprofiled
        gen.step()
    name_kernels_for_the_profiler()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            gen.step()
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=25))
    total = sum(e.self_cpu_time_total for e in averages)
    gemv = sum(e.self_cpu_time_total for e in averages if e.key in GEMV_OPS)
    load = cpu_load()
    step_ms = statistics.median(e.seconds for e in gen.events[6:]) * 1e3
    print(f"{backend.spec.name}, {args.dtype}, {args.weights} weights{', compiled' if args.compile else ''}, "
          f"{args.threads} threads, {args.steps} steps"
          + (f", load average {load[0]:.2f} on {load[1]} cores" if load else "")
          + f": step median {step_ms:.1f} ms (profiled); weight GEMVs {gemv / total:.1%} of self CPU time, "
            f"everything else {1 - gemv / total:.1%} ({(total - gemv) / args.steps / 1e3:.1f} ms a step)")


if __name__ == "__main__":
    main()
