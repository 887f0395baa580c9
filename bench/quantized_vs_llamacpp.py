"""kvviz on int8 weights beside llama.cpp on int8 weights: time per output token and bytes per token, one run.

kvviz: the native decoder in float32, then with every matrix quantized to int8 per output channel
(Decoder.fuse(weights="int8"): torch's weight-only int8 kernel, activations in float32). llama.cpp: llama-server on
the same float32 weights exported as a Q8_0 GGUF (blocks of 32 int8 and an fp16 scale, kvviz.engine.export), and on
the model's own Q4_1 GGUF for reference. Every engine gets the same prompt token ids and decodes greedily; the
engines take turns within each repeat and the fastest repeat counts (noise on a shared machine only adds time).
TPOT is each engine's own clock of its decode passes: kvviz's Generation.tpot_s (model work of each step),
llama.cpp's timings.predicted_per_token_ms. Bytes per token: the weights one decode step reads as stored
(Decoder.step_weight_bytes; the GGUF's tensors). Their quotient is the bandwidth each engine draws, and its share
of a plain streaming read's rate (engine_vs_hf.py's floor, timed in the same turns) is each engine's share of the
floor: llama.cpp's hand-written kernels beside kvviz's.

    python -m kvviz fetch-model smollm2
    python bench/quantized_vs_llamacpp.py [--model smollm2] [--prompt-tokens 128] [--new-tokens 64] [--repeats 3]
                                          [--threads 2]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine_vs_hf import READ_BYTES, plain_read  # noqa: E402 - this folder's floor

from kvviz.engine import fetch  # noqa: E402
from kvviz.engine.export import export_gguf  # noqa: E402
from kvviz.engine.generation import Generation  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.machine import cpu_load  # noqa: E402
from kvviz.errors import InputError  # noqa: E402
from kvviz.serving.llamacpp import LlamaServer, complete_ids  # noqa: E402


def gguf_weight_bytes(path: Path) -> int:
    """Bytes of a GGUF's tensors as stored (a tied token_embd once: llama.cpp reads it as the output matrix)."""
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


def kvviz_tpot(backend, prompt: list[int], n_new: int) -> float:
    gen = Generation(backend, max_new_tokens=n_new, stop_at_eos=False)
    gen.run(prompt)
    return gen.tpot_s


def llamacpp_tpot(url: str, prompt: list[int], n_new: int) -> float:
    return complete_ids(url, prompt, n_new, timeout_s=600)["timings"]["predicted_per_token_ms"] / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=list(fetch.MODELS))
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads and llama-server -t")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        q4_1 = fetch.gguf_path(args.model)
    except InputError as exc:
        sys.exit(f"quantized_vs_llamacpp: {exc}")
    f32 = load_backend(args.model, device="cpu")
    int8 = load_backend(args.model, device="cpu", weights="int8")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, f32.model.cfg.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
    ctx = args.prompt_tokens + args.new_tokens + 8
    with tempfile.TemporaryDirectory() as tmp:
        q8_0 = export_gguf(f32.model, f32.tokenizer, Path(tmp) / f"{args.model}-q8_0.gguf", name=args.model,
                           q8_0=True)
        with (LlamaServer(q8_0, alias="q8_0", n_parallel=1, ctx_size=ctx, threads=args.threads) as s8,
              LlamaServer(q4_1, alias="q4_1", n_parallel=1, ctx_size=ctx, threads=args.threads) as s4):
            runs = {
                "kvviz float32": (f32.model.step_weight_bytes(), lambda: kvviz_tpot(f32, prompt, args.new_tokens)),
                "kvviz int8 (per channel)": (int8.model.step_weight_bytes(),
                                             lambda: kvviz_tpot(int8, prompt, args.new_tokens)),
                "llama.cpp Q8_0 (same weights)": (gguf_weight_bytes(q8_0),
                                                  lambda: llamacpp_tpot(s8.base_url, prompt, args.new_tokens)),
                f"llama.cpp {q4_1.name} (Q4_1)": (gguf_weight_bytes(q4_1),
                                                 lambda: llamacpp_tpot(s4.base_url, prompt, args.new_tokens)),
            }
            runs["plain read (the floor)"] = (READ_BYTES, plain_read())
            for _, run in runs.values():
                run()  # warm-up, untimed
            best = {name: float("inf") for name in runs}
            for _ in range(args.repeats):
                for name, (_, run) in runs.items():
                    best[name] = min(best[name], run())
    load = cpu_load()
    conditions = f"load average {load[0]:.2f} on {load[1]} cores" if load else "load average unknown"
    print(f"{f32.spec.name}: prompt {args.prompt_tokens} tokens, {args.new_tokens} new, greedy; {args.threads} threads "
          f"each; best of {args.repeats} repeats; {conditions}")
    base = best["kvviz int8 (per channel)"]
    floor_rate = READ_BYTES / best.pop("plain read (the floor)")
    print(f"  the floor: a plain read at {floor_rate / 1e9:.2f} GB/s")
    print(f"  {'engine':32s} {'MiB/token':>9} {'ms/token':>9} {'GB/s':>6} {'of floor':>8} {'time ÷ kvviz int8':>18}")
    for name, s in best.items():
        n_bytes = runs[name][0]
        print(f"  {name:32s} {n_bytes / 2**20:9.1f} {s * 1e3:9.2f} {n_bytes / s / 1e9:6.2f} "
              f"{n_bytes / s / floor_rate:8.0%} {s / base:18.2f}")


if __name__ == "__main__":
    main()
