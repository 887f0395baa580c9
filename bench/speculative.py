"""Speculative decoding against plain decoding, measured in one run per row: acceptance (vLLM's definitions), target
passes, rollback, the draft's own KV bytes, time per token here and the roofline prediction on a GPU; then the
chi-square tests of speculative sampling. Prints Markdown tables.

    python bench/speculative.py [--models tiny,smollm2] [--k 4] [--new 32] [--repeats 3] [--gpu "H100 SXM"]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz.engine.loading import load_backend  # noqa: E402
from kvviz.engine.spec import drafts  # noqa: E402
from kvviz.engine.spec.measure import compare, gpu_prediction  # noqa: E402
from kvviz.engine.spec.ngram import NgramConfig  # noqa: E402
from kvviz.i18n import t  # noqa: E402
from kvviz.kv.hardware import HARDWARE  # noqa: E402

PROMPTS = {"list": t("spec.preset_1", "en"), "code": t("spec.preset_2", "en"), "plain": t("spec.preset_3", "en")}


def rows_for(name: str, k: int, new: int, repeats: int, gpu: str) -> list[str]:
    be = load_backend(name, device="cpu")
    m = drafts.default_exit_layer(be.spec.n_layers)
    layers = drafts.load_draft(f"layers:{m}", be)
    rnd = drafts.load_draft("random", be, seed=1)
    cases = [
        ("ngram 2–5", "list", lambda: drafts.NgramDraft(NgramConfig(2, 5))),
        ("ngram 2–5", "code", lambda: drafts.NgramDraft(NgramConfig(2, 5))),
        ("ngram 2–5", "plain", lambda: drafts.NgramDraft(NgramConfig(2, 5))),
        ("ngram 5–5 (vLLM default)", "list", lambda: drafts.NgramDraft(NgramConfig())),
        (f"early exit m={m}", "list", lambda: drafts.EarlyExitDraft(m)),
        (f"early exit m={m}", "plain", lambda: drafts.EarlyExitDraft(m)),
        (f"draft: first {m} layers", "plain", lambda: drafts.ModelDraft(layers.backend)),
        ("draft: random L2 d64", "plain", lambda: drafts.ModelDraft(rnd.backend)),
    ]
    out = []
    for label, prompt, make in cases:
        c = compare(be, make, PROMPTS[prompt], k=k, max_new_tokens=new, repeats=repeats)
        g, s = c.spec, c.spec.stats
        pred = gpu_prediction(g, HARDWARE[gpu])
        per_pos = " ".join("—" if r is None else f"{r:.2f}" for r in s.acceptance_rate_per_pos)
        out.append(f"| {be.spec.name} | {label} | {prompt} | {c.tokens_equal_plain} | {s.mean_acceptance_length:.2f} | "
                   f"{per_pos} | {g.target_passes}/{g.plain_passes} | {g.rollback_tokens} | "
                   f"{max(e.draft_formula_bytes for e in g.events):,} | {c.tpot_plain_s.median * 1e3:.1f} | "
                   f"{c.tpot_s.median * 1e3:.1f} | {c.speedup:.2f}× | {pred.verify_over_decode:.2f} | "
                   f"{pred.speedup:.2f}× |")
        print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu", default="H100 SXM")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"k = {args.k}, {args.new} new tokens, greedy; TPOT median of {args.repeats} alternated runs on this CPU; "
          f"roofline on {args.gpu} (bf16, batch 1)\n")
    print("| model | draft | prompt | same tokens | mean acc. length | per-position rate | target/plain passes | "
          "rolled back | draft KV B | TPOT plain ms | TPOT spec ms | measured | verify/decode (GPU) | predicted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        rows_for(name, args.k, args.new, args.repeats, args.gpu)


if __name__ == "__main__":
    main()
