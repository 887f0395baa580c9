"""What every command module shares: the parser that fails in one line, the argument types, the options several
commands take (model, dtype, device, seed, shape, KV dtype, --json) and the few checks they share.

No command lives here, and nothing here imports torch: `kvviz --help` and `kvviz memory` stay torch-free.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

from kvviz.engine.config import DecoderConfig
from kvviz.engine.device_names import DEVICES, DTYPE_NAMES
from kvviz.kv.formats import KV_DTYPES


class CliError(Exception):
    """A user mistake: printed as one line, exit status 2."""


class RunFailed(Exception):
    """A command that ran and has a result to show, but whose run failed: shown, then one line, exit 1."""

    def __init__(self, result: dict, message: str) -> None:
        super().__init__(message)
        self.result = result


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print the whole usage block
        raise CliError(message)


Run = Callable[[argparse.Namespace], dict]
Show = Callable[[dict], None]


def add_command(sub: argparse._SubParsersAction, name: str, run: Run, show: Show, *, help: str,
                json_keys: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """One subcommand: its parser, the function that computes its result and the one that prints it.

    `json_keys`: a command whose --json prints a fixed set of keys (the text output may show more)."""
    p = sub.add_parser(name, help=help)
    p.set_defaults(run=run, show=show, json_keys=json_keys)
    return p


# ---- argument types ---------------------------------------------------------------------------------
def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected zero or a positive number, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number ≥ 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    try:
        return [positive_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers, got {text!r} ({exc})") from None


def dtype_list(text: str) -> list[str]:
    names = text.split(",")
    bad = [n for n in names if n not in DTYPE_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype {bad[0]!r}: use {', '.join(DTYPE_NAMES)}")
    return names


# ---- options several commands take ------------------------------------------------------------------
MODEL_HELP = ("tiny (shipped), smollm2 (after `kvviz fetch-model smollm2`), random (custom shape), a kvviz or "
              "transformers directory, a .gguf file, or a Hugging Face hub id")


def add_model(p: argparse.ArgumentParser, help: str = MODEL_HELP) -> None:
    p.add_argument("--model", default="tiny", help=help)


def add_dtype(p: argparse.ArgumentParser, help: str | None = None) -> None:
    p.add_argument("--dtype", default="float32", choices=list(DTYPE_NAMES), help=help)


def add_run_options(p: argparse.ArgumentParser, device: str = "auto") -> None:
    """--dtype, --device and --seed of a command that loads a model."""
    add_dtype(p)
    p.add_argument("--device", default=device, choices=list(DEVICES))
    p.add_argument("--seed", type=int, default=0)


def add_kv_dtype(p: argparse.ArgumentParser, flag: str = "--kv-dtype") -> None:
    """--kv-dtype or --weight-dtype: any storage format of the one dtype table."""
    p.add_argument(flag, default="bfloat16", choices=list(KV_DTYPES))


def add_spec_source(p: argparse.ArgumentParser) -> None:
    """--preset / --config: a model described without its weights (see `model_spec`)."""
    p.add_argument("--preset", help="a model preset (see `kvviz presets`)")
    p.add_argument("--config", help="a Hugging Face config.json (or its directory)")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def add_shape_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("custom shape (with --model random)")
    g.add_argument("--layers", type=positive_int, default=4)
    g.add_argument("--heads", type=positive_int, default=8)
    g.add_argument("--kv-heads", type=positive_int, default=2)
    g.add_argument("--d-head", type=positive_int, default=None)
    g.add_argument("--d-model", type=positive_int, default=256)
    g.add_argument("--d-ff", type=positive_int, default=688)
    g.add_argument("--vocab-size", type=positive_int, default=4096)
    g.add_argument("--max-seq-len", type=positive_int, default=1024)


# ---- what several commands check --------------------------------------------------------------------
def shape(args: argparse.Namespace) -> DecoderConfig | None:
    """The custom shape of `--model random` (add_shape_flags); None for any other model."""
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


def check_new_tokens_fit(n_prompt: int, context: int, max_new_tokens: int) -> None:
    """The engine would stop early at the context limit: the CLI says so instead of exiting 0 with fewer tokens."""
    if n_prompt < context < n_prompt + max_new_tokens:
        raise CliError(f"--max-new-tokens {max_new_tokens}: the prompt takes {n_prompt} of the model's {context} "
                       f"positions, so at most {context - n_prompt} new tokens fit")


def native_backend(args: argparse.Namespace, command: str):  # noqa: ANN201 - a NativeBackend
    """A trained model on kvviz's own decoder, on the CPU (the offload and handoff demos)."""
    from kvviz.engine.backends.native import NativeBackend
    from kvviz.engine.loading import load_backend

    if args.model == "random":
        raise CliError(f"{command} needs a trained model: --model tiny, smollm2 or a model directory")
    backend = load_backend(args.model, dtype=args.dtype, device="cpu")
    if not isinstance(backend, NativeBackend):
        raise CliError(f"{command} runs kvviz's own decoder: use --model tiny, smollm2 or a kvviz directory")
    return backend


def ms(seconds: float | None, digits: int = 2, unit: str = " ms", unknown: str = "—") -> str:
    """Seconds as milliseconds for a printed line; `unknown` where there is no reading."""
    return unknown if seconds is None else f"{seconds * 1e3:.{digits}f}{unit}"
