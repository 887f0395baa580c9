"""`serve-bench`: TTFT/TPOT/ITL/E2E percentiles, throughput and goodput of a live OpenAI-compatible server, as
`vllm bench serve` measures them (closed loop per concurrency, or open loop per request rate), and optionally the
prefix-cache experiment against the same server.

No model runs here: the client, load shapes and result files are kvviz.serving (bench, workload, report). This
module turns the flags into a BenchPlan and prints; a run whose requests all failed prints what it has and exits 1.
"""
from __future__ import annotations

import argparse

from kvviz.cli.common import (
    CliError,
    RunFailed,
    add_command,
    add_json,
    int_list,
    ms,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)


def rate_list(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated request rates (per second, or inf), "
                                         f"got {text!r}") from None
    if not all(r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"request rates must be > 0, got {text!r}")
    return rates


def percentile_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated percentiles, got {text!r}") from None
    if not all(0 <= v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"percentiles are between 0 and 100, got {text!r}")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    sb = add_command(sub, "serve-bench", serve_bench, show_serve_bench,
                     help="TTFT/TPOT/ITL/E2E percentiles, throughput and goodput of a live OpenAI-compatible server, "
                          "as `vllm bench serve` measures them")
    sb.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8080")
    sb.add_argument("--model", default="", help="a served model id (default: the first /v1/models lists)")
    sb.add_argument("--api-key-env", default=None, help="name of the environment variable holding the API key")
    sb.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    sb.add_argument("--timeout", type=positive_float, default=60.0, help="seconds per request")
    load = sb.add_argument_group("load (a run is one point per concurrency, or per request rate)")
    load.add_argument("--concurrency", type=int_list, default=None,
                      help="closed loop: all requests at once, at most this many in flight, e.g. 1,2,4 "
                           "(the default, 1,2,4, when no --request-rate)")
    load.add_argument("--request-rate", type=rate_list, default=None,
                      help="open loop: requests per second, e.g. 1,2,4 (inf: all at once), as vllm bench serve")
    load.add_argument("--max-concurrency", type=positive_int, default=None,
                      help="with --request-rate: at most this many requests in flight (vLLM's flag)")
    load.add_argument("--burstiness", type=positive_float, default=1.0,
                      help="gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more even (vLLM's)")
    load.add_argument("--requests", "--num-prompts", dest="requests", type=positive_int, default=None,
                      help="requests per point (default: 2 × the concurrency, at least 4; 16 with --request-rate)")
    load.add_argument("--num-warmups", type=non_negative_int, default=0,
                      help="warm-ups before each point, left out of its numbers: the point's first request sent "
                           "this many times, so it may then find its prompt cached (vLLM's, default 0)")
    load.add_argument("--seed", type=non_negative_int, default=0, help="seed of the lengths and arrival times")
    work = sb.add_argument_group("requests")
    work.add_argument("--prompt-len", "--random-input-len", dest="prompt_len", type=positive_int, default=128,
                      help="prompt tokens per request (the mean, with --random-range-ratio)")
    work.add_argument("--max-tokens", "--random-output-len", dest="max_tokens", type=positive_int, default=64,
                      help="output tokens per request (the mean, with --random-range-ratio)")
    work.add_argument("--random-range-ratio", type=non_negative_float, default=0.0,
                      help="draw lengths uniformly from [L·(1−r), L·(1+r)], r < 1 (vLLM's)")
    work.add_argument("--random-prefix-len", type=non_negative_int, default=0,
                      help="tokens of a system prompt every request starts with (vLLM's)")
    work.add_argument("--dataset-path", default=None,
                      help="prompts from a ShareGPT JSON/JSONL file or JSONL of {\"prompt\": ...} lines")
    work.add_argument("--sharegpt-output-len", type=positive_int, default=None,
                      help="output tokens for dataset requests (default: the dataset's own reply length)")
    out = sb.add_argument_group("results")
    out.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                     help="SLOs for goodput, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el; vLLM's)")
    out.add_argument("--metric-percentiles", type=percentile_list, default=[99.0],
                     help="percentiles to report besides the mean and median, e.g. 90,99 (vLLM's, default 99); "
                          "kvviz reports them for E2E too, where vLLM's --percentile-metrics defaults to ttft,tpot,itl")
    out.add_argument("--result-dir", default=None,
                     help="write one result JSON per point, with vllm bench serve's key names and file names")
    sb.add_argument("--prefix-tokens", type=positive_int, default=None,
                    help="also run the prefix-cache experiment with a shared prefix of this many words")
    sb.add_argument("--prefix-repeats", type=positive_int, default=5, help="trials of the prefix experiment")
    sb.add_argument("--block-size", type=positive_int, default=None,
                    help="vLLM's KV block size for the prediction (read from /metrics when exported)")
    add_json(sb)


def serve_bench(args: argparse.Namespace) -> dict:
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


def _n_source(r: dict) -> str:
    from kvviz.serving.results import n_source

    return {"usage": "the server usage", "messages": "counted token messages (no usage, no /tokenize)",
            "tokenizer": "the generated text by the server's /tokenize (no usage)"}[n_source(r.get("tokens_from", []))]


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _ms(value: float | None) -> str:
    return ms(value, digits=1)


def show_serve_bench(r: dict) -> None:
    from kvviz.serving.bench import error_from

    print(f"[{r['model']} at {r['url']}, engine {r['engine'] or 'unknown'}; prompts "
          f"{'exact token ids' if r['exact_prompts'] else 'text (token counts approximate)'}; N from "
          f"{_n_source(r)}]")
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
        print(f"note: {error_from(note)}")
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
