"""`speculate`: speculative decoding on the real cache (a draft proposes k tokens, the target verifies k + 1
positions in one pass, rejected positions are rolled back), measured against plain decoding of the same prompt,
with the roofline's prediction for a GPU beside it.

The run is kvviz.engine.spec.measure.speculate_report; this module checks which flags go with which method, that
the model runs on kvviz's decoder and that the tokens fit, and prints. `--json` prints exactly SPECULATE_KEYS.
"""
from __future__ import annotations

import argparse

from kvviz.cli.common import (
    CliError,
    add_command,
    add_json,
    add_model,
    add_run_options,
    add_shape_flags,
    check_new_tokens_fit,
    non_negative_float,
    positive_int,
    shape,
)

# `speculate --json` prints exactly these keys (a fixed contract); the text output adds the context.
SPECULATE_KEYS = ("token_ids", "text", "tokens_equal_plain", "acceptance_length_mean", "accepted_per_position",
                  "target_passes", "plain_passes", "rollback_tokens", "draft_kv_bytes", "tpot_s", "tpot_plain_s")


def register(sub: argparse._SubParsersAction) -> None:
    sp = add_command(sub, "speculate", speculate, show_speculate, json_keys=SPECULATE_KEYS,
                     help="speculative decoding on the real cache: draft, verify k + 1 positions in one pass, roll "
                          "rejected positions back; acceptance and speed against plain decoding")
    sp.add_argument("--method", default="ngram", choices=["ngram", "early-exit", "draft"],
                    help="ngram: prompt lookup (vLLM's ngram); early-exit: the target's first M layers; draft: a "
                         "separate model (--draft)")
    sp.add_argument("--k", type=positive_int, default=4,
                    help="tokens drafted per step (vLLM's num_speculative_tokens)")
    sp.add_argument("--exit-layer", type=positive_int,
                    help="early-exit: layers the draft runs (default 3/4 of them)")
    sp.add_argument("--draft", help="draft: a model kvviz loads natively with the same tokenizer, `random` (seeded "
                                    "random weights sharing the tokenizer) or `layers:M` (the target's first M layers "
                                    "with a cache of their own)")
    sp.add_argument("--prompt-lookup-min", type=positive_int, help="ngram: shortest n-gram matched (vLLM: 5 when "
                                                                   "neither bound is given, else the other bound)")
    sp.add_argument("--prompt-lookup-max", type=positive_int, help="ngram: longest n-gram matched")
    sp.add_argument("--prompt", required=True)
    sp.add_argument("--max-new-tokens", type=positive_int, default=32)
    sp.add_argument("--temperature", type=non_negative_float, default=0.0,
                    help="0: greedy (same tokens as plain decoding); > 0: rejection sampling")
    add_model(sp)
    add_run_options(sp)
    sp.add_argument("--repeats", type=positive_int, default=3,
                    help="plain and speculative runs, alternated, for the time per token (median)")
    sp.add_argument("--gpu", default="H100 SXM", help="the GPU of the roofline prediction printed beside the "
                                                     "measurement (see `capacity --list-gpus`)")
    add_json(sp)
    add_shape_flags(sp)


def speculate(args: argparse.Namespace) -> dict:
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.loading import load_backend
    from kvviz.engine.spec.measure import speculate_report
    from kvviz.kv.hardware import HARDWARE

    if args.gpu not in HARDWARE:
        raise CliError(f"unknown --gpu {args.gpu!r}: choose one of {', '.join(HARDWARE)}")
    if args.method == "draft" and not args.draft:
        raise CliError("--method draft needs --draft: a model directory or name, `random` or `layers:M`")
    if args.method != "draft" and args.draft:
        raise CliError(f"--draft is for --method draft, not {args.method}")
    if args.method != "early-exit" and args.exit_layer:
        raise CliError(f"--exit-layer is for --method early-exit, not {args.method}")
    backend = load_backend(args.model, dtype=args.dtype, device=args.device, shape=shape(args), seed=args.seed,
                           engine="native")
    if not isinstance(backend, NativeBackend):
        raise CliError(f"speculate runs on kvviz's own decoder: {backend.spec.name} runs on transformers here")
    check_new_tokens_fit(len(backend.tokenizer.encode(args.prompt)), backend.spec.max_context, args.max_new_tokens)
    return speculate_report(backend, args.prompt, method=args.method, k=args.k, max_new_tokens=args.max_new_tokens,
                            hw=HARDWARE[args.gpu], temperature=args.temperature, seed=args.seed, repeats=args.repeats,
                            exit_layer=args.exit_layer, draft=args.draft, prompt_lookup_min=args.prompt_lookup_min,
                            prompt_lookup_max=args.prompt_lookup_max)


def show_speculate(r: dict) -> None:
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
