"""`python -m kvviz ...` and the `kvviz` console script: the engine and formulas from a shell.

One module per group of commands, each with `register(sub)` that adds its parsers and binds each to the function
that computes its result (a dict, what --json prints) and the one that prints it as text (kvviz.cli.common
.add_command). This module only builds the parser from GROUPS and runs the command chosen; exit codes and one-line
errors live here alone: a bad argument (CliError, InputError, a missing file) exits 2 with one line, a run that
failed after producing a result (RunFailed) shows it and exits 1. No module imports torch until its command runs.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kvviz.cli import compress, decode, export, kv_events, memory, paged, serve, serving, speculate
from kvviz.cli.common import CliError, Parser, RunFailed

# In the order `kvviz --help` lists their commands.
GROUPS = (decode, memory, paged, compress, speculate, export, serving, kv_events, serve)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvviz", description="See and measure the KV cache of a real decoder.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        result = args.run(args)
    except RunFailed as exc:
        if args.json:
            print(json.dumps(exc.result, ensure_ascii=False))
        else:
            args.show(exc.result)
        print(f"kvviz: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except (CliError, ValueError, FileNotFoundError, TimeoutError) as exc:  # InputError is a ValueError
        print(f"kvviz: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, whatever was typed
        return 2
    if args.json:
        keys = args.json_keys
        print(json.dumps({k: result[k] for k in keys} if keys else result, ensure_ascii=False))
    else:
        args.show(result)
    return 0


def main_entry() -> None:
    """The `kvviz` console script."""
    sys.exit(main())
