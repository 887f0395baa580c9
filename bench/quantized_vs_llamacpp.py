"""kvviz beside llama.cpp on the same bytes: float32 beside f32, int8 beside Q8_0, time per output token and the share
of a plain read's rate each engine draws, one run.

kvviz: the native decoder in float32 (kvviz's float32 kernel, kernels.f32, where it builds), then with every matrix
quantized to int8 per output channel (Decoder.fuse(weights="int8"): kvviz's int8 kernel where it builds), each
uncompiled, with its decode step compiled (kvviz.engine.compiled: the static cache written at a position tensor,
one inductor graph) and as kvviz's C step (the "kernels" mode: kernels/step.c, the whole step in one call, the CPU's
default where it builds). llama.cpp: llama-server
on the same float32 weights exported as an f32 GGUF and as a Q8_0 GGUF (blocks of 32 int8 and an fp16 scale,
kvviz.engine.export), and on the model's own Q4_1 GGUF for reference. Every engine gets the same prompt token ids and
decodes greedily; the engines take turns within each repeat and the fastest repeat counts (noise on a shared machine
only adds time). TPOT is each engine's own clock of its decode passes: kvviz's Generation.tpot_s (model work of
each step), llama.cpp's timings.predicted_per_token_ms. Bytes per token: the weights one decode step reads as stored
(Decoder.step_weight_bytes; the GGUF's tensors). Their quotient is the bandwidth each engine draws, and its share of
a plain streaming read's rate (engine_vs_hf.py's floor, timed in the same turns) is each engine's share of the
floor. Each thread count in --threads runs in turn (the compiled steps compiled again for it: a graph's kernels are
built for one thread count); the compile's first step and the memory it kept are printed once per count.

    python -m kvviz fetch-model smollm2
    python bench/quantized_vs_llamacpp.py [--model smollm2] [--prompt-tokens 128] [--new-tokens 64] [--repeats 3]
                                          [--threads 1,2] [--no-compiled]
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
from kvviz.engine.kernels import f32 as f32_kernel  # noqa: E402
from kvviz.engine.kernels import int8 as int8_kernel  # noqa: E402
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


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux /proc), or None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


COMPILED = ("inductor", "kernels")  # the compiled steps' modes on a CPU (kvviz.engine.compiled), each a row


def compile_step(backend, mode: str) -> str:  # noqa: ANN001 - a NativeBackend
    """The backend's step compiled in `mode` for torch's thread count now: what the first step cost, or why it runs
    uncompiled."""
    before = rss_bytes()
    done = backend.compile(mode).warm_up()
    if done is None:
        return f"not compiled ({backend.compiled.why_not}): runs uncompiled"
    kept = rss_bytes()
    mem = f", {(kept - before) / 2**20:+.0f} MiB resident" if before and kept else ""
    if mode == "kernels":  # nothing traced: kvviz's C step, built once a machine
        return f"first step {done.first_step_s * 1e3:.1f} ms (one call of the C step){mem}"
    return f"first step {done.first_step_s:.1f} s (tracing, compiling, one run){mem}"


def load_line() -> str:
    load = cpu_load()
    return f"load average {load[0]:.2f} on {load[1]} cores" if load else "load average unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=list(fetch.MODELS))
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default="1,2", help="torch intra-op threads and llama-server -t; a list: each in turn")
    ap.add_argument("--no-compiled", action="store_true", help="leave out the compiled kvviz steps")
    args = ap.parse_args()
    try:
        q4_1 = fetch.gguf_path(args.model)
        thread_counts = [int(t) for t in args.threads.split(",")]
    except (InputError, ValueError) as exc:
        sys.exit(f"quantized_vs_llamacpp: {exc}")
    f32 = load_backend(args.model, device="cpu")
    int8 = load_backend(args.model, device="cpu", weights="int8")
    kvviz = {"kvviz float32": f32, "kvviz int8": int8}
    modes = {}  # each compiled row's mode
    if not args.no_compiled:
        for weights, name in (("float", "kvviz float32"), ("int8", "kvviz int8")):
            for mode in COMPILED:
                kvviz[f"{name}, {mode}"] = load_backend(args.model, device="cpu", weights=weights)
                modes[f"{name}, {mode}"] = mode
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, f32.model.cfg.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
    ctx = args.prompt_tokens + args.new_tokens + 8
    with tempfile.TemporaryDirectory() as tmp:
        ggufs = {"f32": export_gguf(f32.model, f32.tokenizer, Path(tmp) / f"{args.model}-f32.gguf", name=args.model),
                 "q8_0": export_gguf(f32.model, f32.tokenizer, Path(tmp) / f"{args.model}-q8_0.gguf",
                                     name=args.model, q8_0=True),
                 "q4_1": q4_1}
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for backend in kvviz.values():  # packed again for this thread count: where kvviz's float32
                # kernel is not built, model.prepack chooses torch's kernel by it
                if backend.model.weights == "float":
                    backend.model.fuse()
            print(f"{f32.spec.name}: prompt {args.prompt_tokens} tokens, {args.new_tokens} new, greedy; {threads} "
                  f"threads each; best of {args.repeats} repeats")
            # which kernels multiply (prepack's choice and the int8 kernel's), so that a run says what it timed
            kernel = {"kvviz": "kvviz float32 kernel", "mkl": "MKL packed sgemm", "onednn": "oneDNN packed"}.get(
                getattr(f32.model.head_weight, "kernel", None), "F.linear")
            why = f32_kernel.why_not()
            print(f"  kernels: float32 {kernel}{f' ({why})' if why else ''}; int8 {int8_kernel.name()}")
            torch._dynamo.reset()  # graphs built for another thread count are not reused
            for name, mode in modes.items():
                print(f"  {name}: {compile_step(kvviz[name], mode)}; {load_line()}")
            try:
                servers = {alias: LlamaServer(path, alias=alias, n_parallel=1, ctx_size=ctx, threads=threads)
                           for alias, path in ggufs.items()}
            except FileNotFoundError as exc:  # not built here: kvviz's rows and the floor only
                print(f"  {exc}: kvviz's rows only")
                servers = {}
            try:
                for srv in servers.values():
                    srv.start()
                measure(kvviz, servers, ggufs, prompt, args)
            finally:
                for srv in servers.values():
                    srv.stop()


def measure(kvviz: dict, servers: dict, ggufs: dict, prompt: list[int], args: argparse.Namespace) -> None:
    n = args.new_tokens
    runs = {name: (be.model.step_weight_bytes(), lambda be=be: kvviz_tpot(be, prompt, n)) for name, be in kvviz.items()}
    labels = {"f32": "llama.cpp f32 (same weights)", "q8_0": "llama.cpp Q8_0 (same weights)",
              "q4_1": f"llama.cpp {ggufs['q4_1'].name} (Q4_1)"}
    for alias, srv in servers.items():
        runs[labels[alias]] = (gguf_weight_bytes(ggufs[alias]), lambda url=srv.base_url: llamacpp_tpot(url, prompt, n))
    runs["plain read (the floor)"] = (READ_BYTES, plain_read())
    for _, run in runs.values():
        run()  # warm-up, untimed
    best = {name: float("inf") for name in runs}
    for _ in range(args.repeats):
        for name, (_, run) in runs.items():
            best[name] = min(best[name], run())
    floor_rate = READ_BYTES / best.pop("plain read (the floor)")
    print(f"  the floor: a plain read at {floor_rate / 1e9:.2f} GB/s; {load_line()} after the turns")
    print(f"  {'engine':34s} {'MiB/token':>9} {'ms/token':>9} {'GB/s':>6} {'of floor':>8} "
          f"{'÷ llama.cpp same bytes':>22}")
    same = {name: labels["q8_0" if "int8" in name else "f32"] for name in kvviz}
    for name, s in best.items():
        n_bytes = runs[name][0]
        ratio = f"{s / best[same[name]]:22.2f}" if same.get(name) in best else ""
        print(f"  {name:34s} {n_bytes / 2**20:9.1f} {s * 1e3:9.2f} {n_bytes / s / 1e9:6.2f} "
              f"{n_bytes / s / floor_rate:8.0%} {ratio}")


if __name__ == "__main__":
    main()
