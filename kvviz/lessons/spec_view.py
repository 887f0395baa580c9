"""What the Speculative Decoding page draws, from a SpeculativeGeneration's events (no streamlit, no plotly)."""
from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.engine.spec.decoding import SpecEvent
from kvviz.engine.tokenizer import byte_run_chips
from kvviz.lessons.decode_view import STRIP_CSS, visible, written_at


@dataclass(frozen=True)
class Grid:
    """Per layer: the pass that wrote each position and how to draw it; the last step's rolled-back positions are
    appended after the kept ones (drawn striped), so a step shows what the verify wrote and what the rollback took."""

    written: list[list[int]]
    kinds: list[list[str]]
    rejected_ids: list[int]  # the drafted tokens whose positions were rolled back, in position order


def cache_grid(events: Sequence[SpecEvent], shared_layers: int = 0, *, own_lengths: bool = False) -> Grid:
    """The target's cache (or with own_lengths the draft model's, from draft_lengths) after the latest step."""
    if own_lengths:
        events = [_as_draft(e) for e in events]
    written = written_at(events)
    last = events[-1] if events else None
    kinds = []
    for layer, row in enumerate(written):
        newest = "draft" if layer < shared_layers else "newest"
        kinds.append(["prefill" if p == 0 else newest if last is not None and p == last.index and p > 0 else "step"
                      for p in row])
    rejected: list[int] = []
    if last is not None and last.phase == "verify" and not own_lengths:
        rejected = last.drafted[last.accepted:][: last.rolled_back]
        for layer in range(len(written)):
            written[layer] += [last.index] * last.rolled_back
            kinds[layer] += ["rejected"] * last.rolled_back
    return Grid(written, kinds, rejected)


def _as_draft(e: SpecEvent) -> SpecEvent:
    """An event whose cache lengths are the draft model's own (for the second grid)."""
    from dataclasses import replace

    return replace(e, cache_lengths=e.draft_lengths or [])


_SPEC_CSS = """<style>
.kv-chip.acc{background:#d8f5dc;border-color:#2f9e44}
.kv-chip.acc::after{content:"✓";margin-left:2px}
.kv-chip.own{background:#ffb020;border-color:#c77c00;font-weight:700}
.kv-chip.rej{background:#ffe3e3;border-color:#e5484d;color:#a4161a;text-decoration:line-through}
.kv-spec-legend{margin-top:6px;font-size:calc(var(--kv-size,15px) * 0.85);color:#555}
</style>"""


def step_strip_html(token_texts: Sequence[str], n_prompt: int, event: SpecEvent | None, texts_of: dict[int, str],
                    legend: str, *, lecture: bool = False) -> str:
    """Prompt and generated tokens as chips; the latest step's accepted drafts (green, ✓), the target's own token
    (orange, bold) and the rejected drafts (red, struck through, after them: they never became text)."""
    n_new = len(event.emitted) if event is not None and event.phase == "verify" else 0
    first_new, last = len(token_texts) - n_new, len(token_texts) - 1
    chips = []
    for c in byte_run_chips(token_texts):  # a run of byte tokens is one chip showing its characters, as on page 1
        i = c.stop - 1
        kind = "prompt" if i < n_prompt else "gen"
        if n_new and i >= first_new:
            kind = "own" if i == last else "acc"
        chips.append(f'<span class="kv-chip {kind}" title="position {c.positions}" data-tokens="{c.stop - c.start}">'
                     f'{html.escape(visible(c.text))}</span>')
    if event is not None and event.phase == "verify":
        for c in byte_run_chips([texts_of[d] for d in event.drafted[event.accepted:]]):
            chips.append(f'<span class="kv-chip rej" title="rejected" data-tokens="{c.stop - c.start}">'
                         f'{html.escape(visible(c.text))}</span>')
    size = "22px" if lecture else "15px"
    return (f'{STRIP_CSS}{_SPEC_CSS}<div style="--kv-size:{size}"><div class="kv-strip">{"".join(chips)}</div>'
            f'<div class="kv-spec-legend">{html.escape(legend)}</div></div>')


def draft_rows(event: SpecEvent, texts_of: dict[int, str]) -> list[dict]:
    """One row per drafted token: its position, the token, p under the target, q under the draft, kept or not."""
    rows = []
    for i, d in enumerate(event.drafted):
        rows.append({"i": i + 1, "position": event.position + 1 + i, "token": visible(texts_of[d]),
                     "p": event.target_probs[i] if i < len(event.target_probs) else None,
                     "q": event.draft_probs[i] if i < len(event.draft_probs) else None,
                     "kept": i < event.accepted})
    return rows


def acceptance_series(events: Sequence[SpecEvent]) -> dict[str, list]:
    """Per step: tokens drafted, kept and rejected, tokens emitted, and vLLM's mean acceptance length so far."""
    out: dict[str, list] = {"step": [], "accepted": [], "rejected": [], "emitted": [], "mean_length": []}
    drafts = accepted = 0
    for e in events[1:]:
        if e.drafted:
            drafts += 1
            accepted += e.accepted
        out["step"].append(e.index)
        out["accepted"].append(e.accepted)
        out["rejected"].append(len(e.drafted) - e.accepted)
        out["emitted"].append(len(e.emitted))
        out["mean_length"].append(1 + accepted / drafts if drafts else None)
    return out


def strip_legend(event: SpecEvent) -> str:
    """Which line names the strip's colours (a spec.* locale key): the prefill's, a step with no draft, else the
    drafted / accepted / rolled-back counts."""
    if event.phase == "prefill":
        return "strip_prefill"
    return "strip_legend" if event.drafted else "strip_nodraft"


def grid_legend(shared_layers: int) -> tuple[str, ...]:
    """The kinds the target's cache grid draws: with an early exit, the draft's writes into its shared layers too."""
    return ("prefill", "step", "draft", "newest", "rejected") if shared_layers else ("prefill", "step", "newest",
                                                                                      "rejected")


def per_token_us(prediction: object, n_generated: int) -> tuple[float, float]:
    """A GPU prediction's plain and speculative seconds per token after the first, in µs."""
    per = max(n_generated - 1, 1)
    return prediction.plain_s / per * 1e6, prediction.spec_s / per * 1e6


def spread_ms(s: object) -> str:
    """A metrics.Spread of seconds as 'median ms (low–high)'."""
    return f"{s.median * 1e3:.2f} ms ({s.low * 1e3:.2f}–{s.high * 1e3:.2f})"
