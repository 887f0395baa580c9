"""`kv-events`: follow a server's KV cache events (vLLM's `--kv-events-config`, SGLang's, Dynamo's relay) and print
the cached-block tree's state as it goes, then a summary: blocks and tokens cached per medium, stored and removed,
resets, gaps, and what could not be read. Bytes where the model's KV shape is given (--preset or --config, with
--kv-dtype). With --json each state is one JSON line, then the summary as one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from kvviz.cli.common import (
    CliError,
    RunFailed,
    add_command,
    add_json,
    add_kv_dtype,
    add_spec_source,
    non_negative_float,
    positive_float,
    positive_int,
)
from kvviz.kv.capacity import BLOCK_SIZE


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "kv-events", kv_events, show_summary,
                    help="follow a server's KV cache events (ZMQ) as a tree of cached blocks")
    p.add_argument("--endpoint", required=True, help="the server's publisher, e.g. tcp://HOST:5557")
    p.add_argument("--replay-endpoint", default=None,
                   help="its replay socket (e.g. tcp://HOST:5558): missed batches fetched from it")
    p.add_argument("--seconds", type=non_negative_float, default=0.0,
                   help="how long to follow (default 0: until Ctrl-C)")
    p.add_argument("--every", type=positive_float, default=1.0, help="seconds between printed states")
    p.add_argument("--quiet-after", type=positive_float, default=5.0,
                   help="seconds without a connection or an event before saying so")
    g = p.add_argument_group("requests attributed to the cached blocks, at the end")
    g.add_argument("--prompts", default=None,
                   help="JSONL: one request's prompt token ids a line (a list, or {\"prompt_token_ids\": [...]})")
    g.add_argument("--block-size", type=positive_int, default=BLOCK_SIZE,
                   help="the server's block size (vLLM's default 16)")
    g.add_argument("--hash-algo", default="sha256", help="the server's --prefix-caching-hash-algo: sha256, sha256_cbor")
    g.add_argument("--hash-seed", default=None, help="the server's PYTHONHASHSEED, where it sets one")
    add_spec_source(p)
    add_kv_dtype(p)
    add_json(p)


def _bytes_per_token(args: argparse.Namespace) -> int | None:
    """The model's KV bytes per token, where its shape is given; None (unknown) where not."""
    if args.preset is None and args.config is None:
        return None
    from kvviz.cli.memory import model_spec
    from kvviz.kv.formula import kv_footprint

    return kv_footprint(model_spec(args, "kv-events"), 1, 1, args.kv_dtype).per_token


def line(state: dict, per_token: int | None) -> dict:
    """One printed state: the tree's size now and what changed."""
    s = state["summary"]
    return {"t_s": round(state["elapsed_s"], 1), "status": state["status"], "blocks": s["blocks"],
            "tokens": s["tokens"], "bytes": None if per_token is None else s["tokens"] * per_token,
            "copies": s["copies"], "stored": s["stored"], "removed": s["removed"], "cleared": s["cleared"],
            "folded": state["folded"], "incomplete": bool(s["incomplete"])}


def hint(status: str, endpoint: str) -> str | None:
    from kvviz.i18n import t
    from kvviz.serving.kv_watch import SERVER_FLAG

    if status == "unreachable":
        return t("kv_events.unreachable", "en", endpoint=endpoint)
    if status == "silent":
        return t("kv_events.silent", "en", endpoint=endpoint, flag=SERVER_FLAG)
    return None


def read_prompts(path: str) -> list[list[int]]:
    """Token ids, one request a line: a JSON list, or an object with prompt_token_ids."""
    out = []
    for n, text in enumerate(open(path, encoding="utf-8").read().splitlines(), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(f"{path} line {n}: not JSON ({exc.msg})") from None
        ids = row.get("prompt_token_ids") if isinstance(row, dict) else row
        if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise CliError(f"{path} line {n}: expected a list of token ids or {{\"prompt_token_ids\": [...]}}")
        out.append(ids)
    return out


def kv_events(args: argparse.Namespace) -> dict:
    from kvviz.serving.kv_attribution import hash_function
    from kvviz.serving.kv_watch import Watch

    prompts = read_prompts(args.prompts) if args.prompts else None
    hash_function(args.hash_algo)  # an algorithm kvviz does not compute: refused before subscribing
    per_token = _bytes_per_token(args)
    watch = Watch(args.endpoint, args.replay_endpoint, quiet_after_s=args.quiet_after)
    said = False
    try:
        end = time.monotonic() + args.seconds if args.seconds else None
        while end is None or time.monotonic() < end:
            time.sleep(args.every if end is None else max(0.0, min(args.every, end - time.monotonic())))
            state = watch.state()
            row = line(state, per_token)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(_text(row), flush=True)
            message = hint(state["status"], args.endpoint)
            if message and not said:
                print(f"kvviz: {message}", file=sys.stderr, flush=True)
                said = True
    except KeyboardInterrupt:
        pass
    finally:
        state = watch.state()
        watch.close()
    s = state["summary"]
    result = {"endpoint": args.endpoint, "replay_endpoint": args.replay_endpoint, "status": state["status"],
              "frames": state["frames"], "bytes_per_token": per_token,
              "bytes": None if per_token is None else s["tokens"] * per_token, **s}
    if prompts is not None:
        from kvviz.serving.kv_attribution import attribute, summarize

        rows = [attribute(watch.tree, p, args.block_size, algo=args.hash_algo, seed=args.hash_seed).as_dict()
                for p in prompts]
        result["attribution"] = rows
        result["attribution_summary"] = summarize(rows)
    if state["frames"] == 0:
        # the hint was said as it happened: the closing line only says how it ended
        raise RunFailed(result, "no KV events arrived" if said else hint(state["status"], args.endpoint)
                        or "no KV events arrived")
    return result


def _text(row: dict) -> str:
    media = ", ".join(f"{m} {n}" for m, n in sorted(row["copies"].items())) or "—"
    size = "" if row["bytes"] is None else f", {row['bytes'] / 2**20:.1f} MiB"
    flag = " (incomplete)" if row["incomplete"] else ""
    return (f"{row['t_s']:>6.1f}s  {row['blocks']} blocks ({media}), {row['tokens']} tokens{size}{flag} · "
            f"stored {row['stored']}, removed {row['removed']}, resets {row['cleared']} · {row['folded']} batches")


def show_summary(result: dict) -> None:
    size = "unknown (give --preset or --config)" if result["bytes"] is None else f"{result['bytes']:,} bytes"
    print(f"{result['endpoint']}: {result['frames']} batches read, {result['events']} events")
    print(f"cached now: {result['blocks']} blocks, {result['tokens']} tokens, {size}; "
          f"{result['leaves']} leaves, {result['orphans']} under a parent not seen")
    print(f"stored {result['stored']}, removed {result['removed']}, resets {result['cleared']}, "
          f"restarts {result['restarts']}, replayed {result['replayed']}")
    for gap in result["incomplete"]:
        print(f"incomplete: batches {gap.get('first')}–{gap.get('last')} missed ({gap['reason']})")
    for what, n in result["skipped"].items():
        print(f"skipped {n}×: {what}")
    for i, row in enumerate(result.get("attribution", [])):
        why = "all hit" if row["reason"] is None else f"block {row['first_miss']}: {row['reason']}"
        when = "" if row["removed_ts"] is None else f" at {row['removed_ts']:.3f}"
        print(f"request {i}: {row['hit_blocks']} of {row['lookup']} blocks hit ({row['hit_tokens']} tokens); "
              f"{why}{when}")
