"""GPU readiness: decode TPOT against the memory roofline, and allocator bytes against the KV formula.

On a CUDA machine, for the shipped model and a 1B-class random model (Llama-3.2-1B's layout, bf16):

- TPOT: median decode step (device-synchronized, after an untimed warm-up pass) next to the bound
  (weight bytes + KV bytes read at that context) / bandwidth of the detected GPU (vendor datasheet figure
  from kvviz/kv/hardware.py; unknown GPU = no bound, said so, or give --bandwidth-gbs);
- the compiled step (kvviz.engine.compiled): the same TPOT with the step compiled by inductor alone, and on CUDA
  also replayed as a CUDA graph (torch.compile's reduce-overhead), each beside the bound and the uncompiled step,
  with the first step's time (the compile) and the allocator's growth over it;
- memory: torch.cuda.memory_allocated() grown by allocating the cache, against kv_footprint() for the same
  shape, length and dtype; and the weights' bytes against parameters × bytes per weight.

    python bench/gpu_check.py [--prompt-tokens 128] [--new-tokens 128] [--skip-1b]
    python bench/gpu_check.py --device cpu --skip-1b     # exercise the code path here (no bound: CPU)

Without CUDA (and without --device cpu) it says so in one line and exits with status 2: nothing is measured.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine.config import DecoderConfig  # noqa: E402
from kvviz.engine.generation import Generation  # noqa: E402
from kvviz.engine.loading import load_backend, random_backend  # noqa: E402
from kvviz.engine.sweeps import warm_up  # noqa: E402
from kvviz.kv.formula import kv_footprint, weight_bytes  # noqa: E402
from kvviz.kv.hardware import HARDWARE, Hardware  # noqa: E402

# Llama-3.2-1B's trunk (16 layers, d_model 2048, 32/8 heads, d_head 64, d_ff 8192) with a 32,000-token
# vocabulary: ~1.0B parameters, random weights (only the shape matters for time and bytes).
ONE_B = DecoderConfig(n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, d_head=64, d_ff=8192, vocab_size=32000,
                      max_seq_len=2048)
# torch.cuda.get_device_name() substrings -> the datasheet entry they are
# torch.cuda.get_device_name() substrings → the GPU table's names (first match wins: longer names first)
GPU_NAMES = (("H200", "H200"), ("H100 PCIe", "H100 PCIe"), ("H100", "H100 SXM"), ("A100-SXM4-40GB", "A100 40GB"),
             ("A100-PCIE-40GB", "A100 40GB"), ("A100", "A100 80GB"), ("L40S", "L40S"), ("L4", "L4"), ("A10", "A10"),
             ("3090", "RTX 3090"), ("4090", "RTX 4090"))


def detect_hardware(device: torch.device, bandwidth_gbs: float | None) -> Hardware | None:
    if bandwidth_gbs:
        return Hardware("given", bandwidth_gbs * 1e9, 0.0)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((HARDWARE[hw] for key, hw in GPU_NAMES if key in name), None)


def allocated(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def check(name: str, load, device: torch.device, hw: Hardware | None, args: argparse.Namespace) -> dict:  # noqa: ANN001
    before_weights = allocated(device)
    backend = load()
    after_weights = allocated(device)
    a = shape = backend.spec  # the one KV description: the formula below is the app's own
    dtype = args.dtype
    warm_up(backend)
    n_prompt = min(args.prompt_tokens, a.max_context - args.new_tokens - 1)
    prompt = [3 + i % 250 for i in range(n_prompt)]  # ids every vocabulary here has (byte-level and up)
    gen = Generation(backend, max_new_tokens=args.new_tokens, stop_at_eos=False)
    before_cache = allocated(device)
    cache_len = n_prompt + args.new_tokens
    gen.prefill(prompt)  # allocates the cache for prompt + new tokens, then runs the prompt
    after_cache = allocated(device)
    while not gen.done:
        gen.step()
    tpot = statistics.median(e.seconds for e in gen.events[1:])
    compiled = {mode: compiled_tpot(backend, mode, prompt, args.new_tokens, device) for mode in modes(device)}
    mid = n_prompt + args.new_tokens // 2
    formula_cache = kv_footprint(shape, cache_len, 1, dtype).total
    read_bytes = weight_bytes(a.n_params, dtype) + kv_footprint(shape, mid, 1, dtype).total
    bound = read_bytes / hw.bandwidth_bytes_per_s if hw else None
    out = {
        "name": name, "params": a.n_params, "tpot_ms": tpot * 1e3, "bound_ms": None if bound is None else bound * 1e3,
        "formula_cache": formula_cache, "measured_cache": gen.events[-1].allocated_bytes,
        "allocator_cache": None if after_cache is None else after_cache - before_cache,
        "formula_weights": weight_bytes(a.n_params, dtype),
        "allocator_weights": None if after_weights is None else after_weights - before_weights,
        "cache_len": cache_len, "context_mid": mid, "compiled": compiled,
    }
    del gen, backend
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def modes(device: torch.device) -> tuple[str, ...]:
    """The compiled steps to time: inductor's graph alone, and on CUDA also replayed as a CUDA graph."""
    return ("inductor", "cuda graphs") if device.type == "cuda" else ("inductor",)


def compiled_tpot(backend, mode: str, prompt: list[int], n_new: int, device: torch.device) -> dict:  # noqa: ANN001
    """The same request on the step compiled in `mode` (kvviz.engine.compiled): median TPOT, the first step's time
    (tracing, compiling, one run) and the allocator's growth over it, or why it ran uncompiled."""
    before = allocated(device)
    step = backend.compile(mode)
    done = step.warm_up()
    grew = None if before is None else allocated(device) - before
    gen = Generation(backend, max_new_tokens=n_new, stop_at_eos=False)
    gen.run(prompt)
    backend.compiled = None
    return {"tpot_ms": statistics.median(e.seconds for e in gen.events[1:]) * 1e3, "why_not": step.why_not,
            "first_step_s": done.first_step_s if done else None, "allocator_grew": grew}


def fmt_bytes(n: int | None) -> str:
    return "n/a (no CUDA allocator)" if n is None else f"{n:,} B"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--bandwidth-gbs", type=float, default=None,
                    help="memory bandwidth to use (GB/s) for an unknown GPU")
    ap.add_argument("--skip-1b", action="store_true", help="only the shipped model")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA: bench/gpu_check.py measures on a CUDA GPU and none is visible here; nothing was run "
              "(use --device cpu to exercise the code path)")
        return 2
    device = torch.device(args.device)
    hw = detect_hardware(device, args.bandwidth_gbs)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {gpu}; datasheet entry: {hw.name if hw else 'unknown (no roofline bound; --bandwidth-gbs)'}"
          + (f", {hw.bandwidth_bytes_per_s / 1e9:,.0f} GB/s" if hw else "") + f"; dtype {args.dtype}; "
          f"prompt {args.prompt_tokens}, {args.new_tokens} new tokens; TPOT after an untimed warm-up")
    models = [("shipped tiny", lambda: load_backend("tiny", dtype=args.dtype, device=args.device))]
    if not args.skip_1b:
        models.append(("1B-class random", lambda: random_backend(ONE_B, seed=0, dtype=args.dtype, device=args.device)))
    for name, load in models:
        r = check(name, load, device, hw, args)
        bound = "unknown" if r["bound_ms"] is None else f"{r['bound_ms']:.3f} ms"
        ratio = "" if r["bound_ms"] is None else f" = {r['tpot_ms'] / r['bound_ms']:.1f}× the bound"
        print(f"\n{name} ({r['params']:,} parameters)")
        print(f"  TPOT median {r['tpot_ms']:.3f} ms; roofline bound (weights + KV at {r['context_mid']} tokens) "
              f"/ bandwidth = {bound}{ratio}")
        for mode, c in r["compiled"].items():
            if c["why_not"] is not None:
                print(f"  compiled ({mode}): not compiled, {c['why_not']}; TPOT uncompiled {c['tpot_ms']:.3f} ms")
                continue
            ratio = "" if r["bound_ms"] is None else f" = {c['tpot_ms'] / r['bound_ms']:.1f}× the bound"
            print(f"  compiled ({mode}): TPOT median {c['tpot_ms']:.3f} ms{ratio}, {r['tpot_ms'] / c['tpot_ms']:.2f}× "
                  f"uncompiled; first step {c['first_step_s']:.1f} s (tracing, compiling, one run), allocator grew "
                  f"{fmt_bytes(c['allocator_grew'])}")
        print(f"  KV cache for {r['cache_len']} tokens: formula {r['formula_cache']:,} B; tensors "
              f"{r['measured_cache']:,} B; allocator grew {fmt_bytes(r['allocator_cache'])}")
        print(f"  weights: parameters × bytes {r['formula_weights']:,} B; allocator grew "
              f"{fmt_bytes(r['allocator_weights'])} (includes the fused Q/K/V and gate/up copies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
