"""Per-token decode time: our step() loop vs transformers' generate(), same weights, one run.

    python bench/engine_vs_hf.py [--model random|tiny|smollm2] [--dtype float32|bfloat16] [--prompt-tokens 128]
                                 [--new-tokens 256] [--repeats 3] [--threads 2 | --threads 1,2]
                                 [--baseline OLD_MODEL_PY] [--compiled]

Prints ratios (noisy shared machines: only ratios measured in one run mean anything). Per-token decode
time = (time for N new tokens − time for 1 new token) / (N − 1), so prefill is excluded on both sides;
each engine gets an untimed warm-up run, the engines take turns in every repeat, and the fastest repeat
counts. --threads 1,2 measures each thread layout in turn in the same run (the floor too, at each count).
--baseline: another version of kvviz/engine/model.py (e.g. `git show REV:kvviz/engine/model.py > old.py`) runs the
same weights as one more engine in the same turns, so a change is measured before → after under the same load.
--compiled: the same weights with the decode step compiled (kvviz.engine.compiled: on a CPU kvviz's C step where it
runs the model, else inductor's graph) as one more engine, compiled again at each thread count (a graph's kernels are
built for one), the compile's first step printed.
The floor: the bytes of weights a step reads over the rate a plain streaming read (torch.sum) draws from memory
in the same run (or our products', were they faster), whatever kernel an engine multiplies with; beside it, the
step's matrix products alone through our kernel (the ceiling of a step that did nothing else).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine.backends.native import NativeBackend  # noqa: E402
from kvviz.engine.config import DecoderConfig  # noqa: E402
from kvviz.engine.generation import Generation  # noqa: E402
from kvviz.engine.loading import load_backend, random_backend  # noqa: E402
from kvviz.engine.machine import cpu_load  # noqa: E402
from kvviz.engine.model import Int8Weight, linear  # noqa: E402

READ_BYTES = 512 * 2**20  # the floor's plain read: 16× the last-level cache of the machines measured
FIXED = DecoderConfig(n_layers=4, d_model=256, n_heads=8, n_kv_heads=2, d_ff=688, vocab_size=4096, max_seq_len=1024)


def ours(backend, prompt: list[int], n_new: int, capture: bool) -> float:
    gen = Generation(backend, max_new_tokens=n_new, capture_attention=capture, stop_at_eos=False)
    t0 = time.perf_counter()
    gen.run(prompt)
    return time.perf_counter() - t0


def hf(model, prompt: list[int], n_new: int, use_cache: bool) -> float:
    ids = torch.tensor([prompt])
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, min_new_tokens=n_new,
                       do_sample=False, use_cache=use_cache, pad_token_id=0)
    return time.perf_counter() - t0


def per_token(runs: dict, n_new: int, repeats: int,
              passes: dict | None = None) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per engine, the fastest over repeats of (T(n_new) − T(1)) / (n_new − 1), and of T(1) (the prefill and its one
    token), after an untimed warm-up run; per entry of `passes` (name: a function returning seconds), the fastest of
    its seconds, one call per repeat.

    The engines and the passes take turns within each repeat, so a burst of load from other processes hits all of
    them alike; the fastest repeat is kept because noise on a shared machine only ever adds time.
    """
    passes = passes or {}
    for run in runs.values():
        run(4)  # warm-up, untimed
    samples: dict[str, list[float]] = {name: [] for name in runs}
    prefill: dict[str, list[float]] = {name: [] for name in runs}
    once: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(repeats):
        for name, run in runs.items():
            one = run(1)
            samples[name].append((run(n_new) - one) / (n_new - 1))
            prefill[name].append(one)
        for name, timed in passes.items():
            once[name].append(timed())
    fastest = lambda d: {name: min(s) for name, s in d.items()}  # noqa: E731
    return fastest(samples), fastest(prefill), fastest(once)


def _timed(work, inner: int) -> float:  # noqa: ANN001 - a callable
    """The fastest of `inner` runs of `work` in a row."""
    best = float("inf")
    with torch.inference_mode():
        for _ in range(inner):
            t0 = time.perf_counter()
            work()
            best = min(best, time.perf_counter() - t0)
    return best


def plain_read(inner: int = 3):  # noqa: ANN201 - a timed pass
    """A timed pass (seconds) of the floor's plain read: READ_BYTES read from memory by torch.sum over float32 (its
    fastest reduction; bytes are bytes whatever the model's dtype) across more tensors than any cache holds."""
    chunks = [torch.randn(2**20 // 4) for _ in range(READ_BYTES // 2**20)]
    return lambda: _timed(lambda: [c.sum() for c in chunks], inner)


def floor_passes(model, inner: int = 3) -> dict:  # noqa: ANN001 - a Decoder
    """Two timed passes for per_token, each the fastest of `inner` in a row: "read", the plain read (plain_read);
    "products", one decode step's matrix products alone, every matrix the step multiplies at its own shape through
    the step's own kernel (model.linear) on one-row inputs: the ceiling of a step that did nothing else."""
    mats = [w for layer in model.model.layers for w in (layer.self_attn.qkv_weight, layer.self_attn.o_weight,
                                                         layer.mlp.gate_up_weight, layer.mlp.down_weight)]
    mats.append(model.head_weight)
    dtype = model.lm_head.weight.dtype
    xs = [torch.randn(1, 1, (w.q if isinstance(w, Int8Weight) else w).shape[1]).to(dtype) for w in mats]

    return {"read": plain_read(inner),
            "products": lambda: _timed(lambda: [linear(x, w) for x, w in zip(xs, mats, strict=True)], inner)}


def baseline_backend(path: str, backend: NativeBackend) -> NativeBackend:
    """The same weights on the Decoder of another model.py (its imports of the rest of kvviz resolve to this tree)."""
    spec = importlib.util.spec_from_file_location("baseline_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    model = module.Decoder(backend.model.cfg)
    model.load_state_dict(backend.model.state_dict())
    return NativeBackend(model.to(backend.dtype), backend.tokenizer, backend.spec.name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="random", choices=["random", "tiny", "smollm2"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-no-cache", action="store_true")
    ap.add_argument("--baseline", help="another kvviz/engine/model.py to time beside this one, same weights")
    ap.add_argument("--compiled", action="store_true", help="also the same weights with the decode step compiled")
    ap.add_argument("--threads", default="2", help="torch intra-op threads for both engines (the app uses 1); "
                                                   "a list, e.g. 1,2: each layout in turn, in one run")
    args = ap.parse_args()

    backend = (random_backend(FIXED, seed=0, dtype=args.dtype) if args.model == "random"
               else load_backend(args.model, device="cpu", dtype=args.dtype))
    cfg = backend.model.cfg
    hf_model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k != "architectures"}))
    hf_model.load_state_dict(backend.model.state_dict())  # the very same weights
    hf_model.to(backend.dtype).eval()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
    n = args.new_tokens
    engines = {
        "ours, cache, capture off": lambda k: ours(backend, prompt, k, False),
        "ours, cache, capture on": lambda k: ours(backend, prompt, k, True),
        "HF generate(), cache": lambda k: hf(hf_model, prompt, k, True),
    }
    if args.baseline:
        old = baseline_backend(args.baseline, backend)
        engines["baseline, capture off"] = lambda k: ours(old, prompt, k, False)

    if args.compiled:
        fast = NativeBackend(backend.model, backend.tokenizer, backend.spec.name)  # the same weights, its own step
        engines["ours compiled, capture off"] = lambda k: ours(fast, prompt, k, False)

    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        backend.model.fuse()  # packed again for this thread count (`fast` shares it): where kvviz's float32
        # kernel is not built, model.prepack chooses torch's kernel by it
        if args.compiled:
            torch._dynamo.reset()  # kernels built for another thread count are not reused
            done = fast.compile().warm_up()
            print(f"compiled step ({fast.compiled.mode}) at {threads} threads: " + (
                f"first step {done.first_step_s:.2f} s" if done else
                f"not compiled ({fast.compiled.why_not}): runs uncompiled"))
        rows, prefill, passes = per_token(engines, n, args.repeats, floor_passes(backend.model))
        if not args.skip_no_cache:
            rows.update(per_token({"HF generate(), no cache": lambda k: hf(hf_model, prompt, k, False)}, n, 1)[0])
        base = rows["ours, cache, capture off"]
        load = cpu_load()
        print(f"{backend.spec.name}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads}/{cfg.n_kv_heads} "
              f"heads, {args.dtype} CPU, {torch.get_num_threads()} threads, prompt {args.prompt_tokens}, {n} new tokens"
              + (f"; load average {load[0]:.2f} on {load[1]} cores" if load else ""))
        for name, s in rows.items():
            first = f"  prefill + 1 token {prefill[name] * 1e3:9.1f} ms" if name in prefill else ""
            print(f"  {name:28s} {s * 1e3:8.3f} ms/token  {1 / s:8.1f} tokens/s  time ×{s / base:5.2f} of ours{first}")
        print(f"speed-up of ours over HF generate() with cache: {rows['HF generate(), cache'] / base:.2f}× per token, "
              f"{prefill['HF generate(), cache'] / prefill['ours, cache, capture off']:.2f}× on the prefill")
        print(f"attention capture costs {100 * (rows['ours, cache, capture on'] / base - 1):+.1f}% time per token")
        # A decode step reads every weight once (the tied embedding once, as the LM head): its floor on this machine.
        # Its bandwidth: the faster of a plain read and our products' own (a kernel that outran the plain read
        # would show the read short of what memory gives), so no share exceeds 100 %.
        weight_bytes = backend.model.step_weight_bytes()
        products = passes["products"]
        bandwidth = max(READ_BYTES / passes["read"], weight_bytes / products)
        floor = weight_bytes / bandwidth
        print(f"memory-bound floor: {weight_bytes / 2**20:,.0f} MiB of weights at {bandwidth / 1e9:.1f} GB/s "
              f"(a plain read) = {floor * 1e3:.1f} ms/token; ours at {floor / base:.0%} of it, HF at "
              f"{floor / rows['HF generate(), cache']:.0%}: no engine can beat HF by more than "
              f"{rows['HF generate(), cache'] / floor:.2f}× here")
        print(f"the step's matrix products alone (ours, same kernel and shapes): {products * 1e3:.1f} ms = "
              f"{weight_bytes / products / 1e9:.1f} GB/s, {floor / products:.0%} of the floor: the ceiling of a step "
              f"that did nothing else; the rest of ours: {(base - products) * 1e3:.1f} ms a token")
        if args.compiled:
            fast_s = rows["ours compiled, capture off"]
            print(f"compiled step at {floor / fast_s:.0%} of the floor, {base / fast_s:.2f}× the uncompiled step, "
                  f"{rows['HF generate(), cache'] / fast_s:.2f}× transformers")
        if args.baseline:
            old_s = rows["baseline, capture off"]
            print(f"baseline at {floor / old_s:.0%} of the floor, {rows['HF generate(), cache'] / old_s:.2f}× "
                  f"transformers; this model.py {old_s / base:.2f}× faster than the baseline")


if __name__ == "__main__":
    main()
