"""The size of a run exported as one HTML file and the time to build and write it: a greedy decode of --new tokens
with the attention rows captured, then the run record, the document and the file. One run; prints bytes (Plotly's
JavaScript and the rest apart) and seconds.

    python bench/run_html_size.py [--model tiny|smollm2] [--new 32] [--lang en|ko] [--out run.html]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvviz.charts.run_html import run_html  # noqa: E402
from kvviz.engine.generation import Generation  # noqa: E402
from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.lessons.run_record import decode_record  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--lang", default="en")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import plotly.offline

    backend = load_backend(args.model, device="cpu")
    gen = Generation(backend, max_new_tokens=args.new, capture_attention=True)
    gen.run("The cache grows one token at a time")
    t0 = time.perf_counter()
    record = decode_record(gen)
    t1 = time.perf_counter()
    document = run_html(record, args.lang)
    t2 = time.perf_counter()
    out = Path(args.out or tempfile.mkstemp(suffix=".html")[1])
    out.write_text(document, encoding="utf-8")
    t3 = time.perf_counter()
    size, plotly_js = len(document.encode()), len(plotly.offline.get_plotlyjs().encode())
    print(f"{backend.spec.name}: {backend.spec.n_layers} layers, {len(gen.events)} passes -> {out}")
    print(f"  {size:,} bytes ({plotly_js:,} Plotly's JavaScript, {size - plotly_js:,} the run and its player)")
    print(f"  record {t1 - t0:.2f} s, document {t2 - t1:.2f} s, write {t3 - t2:.2f} s")


if __name__ == "__main__":
    main()
