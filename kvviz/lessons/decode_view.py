"""Pure helpers that turn a Generation's state into what the decode pages draw (no streamlit, no plotly): token
texts and the strip, the check's verdict, Play's schedule and the warning it earns."""
from __future__ import annotations

import html
from collections.abc import Sequence
from typing import NamedTuple

from kvviz.engine.generation import StepEvent, TopToken
from kvviz.engine.tokenizer import Tokenizer, byte_run_chips
from kvviz.i18n import LANGS, SR_ONLY, t

_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥"})


def visible(text: str) -> str:
    """A token's text with whitespace made visible, so a chip or axis label is never blank."""
    return text.translate(_VISIBLE) or "∅"


_SPOKEN = str.maketrans({"␣": " ", "↵": " ", "⇥": " ", "\n": " ", "\t": " "})


def spoken(text: str) -> str:
    """Tokens' text as a screen reader should read it: whitespace as spaces (not "open box"), runs of it as one;
    a token of whitespace alone shown as visible() shows it."""
    return " ".join(text.translate(_SPOKEN).split()) or visible(text)


def token_texts(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Readable text per token; a lone byte of a multi-byte character shows as its hex, not as �."""
    out = []
    for i in ids:
        text = tokenizer.token_text(i)
        if text == "\ufffd":
            text = f"<0x{i:02X}>" if i < 256 else f"⟨{i}⟩"
        out.append(text)
    return out


def kv_head_of(n_heads: int, n_kv_heads: int) -> list[int]:
    """The KV head each query head reads (GQA: consecutive query heads share one KV head)."""
    group = n_heads // n_kv_heads
    return [h // group for h in range(n_heads)]


def head_labels(n_heads: int, n_kv_heads: int) -> list[str]:
    """'q3 → kv1' for each query head: which KV head its group shares."""
    return [f"q{h} → kv{g}" for h, g in enumerate(kv_head_of(n_heads, n_kv_heads))]


def written_at(events: Sequence[StepEvent]) -> list[list[int]]:
    """For every layer, the pass (0 = prefill, k = step k) that wrote each cached position.

    Read from the per-layer cache lengths the engine measured after each pass, so a layer that
    did not grow would show a gap.
    """
    if not events:
        return []
    out: list[list[int]] = [[] for _ in events[0].cache_lengths]
    for event in events:
        for layer, length in enumerate(event.cache_lengths):
            out[layer].extend([event.index] * (length - len(out[layer])))
    return out


def room_view(events: Sequence[StepEvent], texts: Sequence[str], n_prompt: int, n_generated: int, done: bool,
              model: str, heads: tuple[int, int], attn_layer: int = 0) -> dict:
    """What the Reusing Past K/V page draws of a run, as plain JSON data (lists and numbers, never tensors): what a
    lecture room's followers draw with the same functions, without running the model. `heads`: (query heads, KV
    heads); `attn_layer`: the layer whose newest attention row the lecturer shows (one layer: a row per head)."""
    last = events[-1]
    attention = None
    if last.attention is not None:
        attn_layer = min(max(attn_layer, 0), len(last.attention) - 1)
        # 5 decimals: a probability drawn as a colour; keeps a 9-head, 1000-position row under 100 kB of JSON
        rows = [[round(float(p), 5) for p in row] for row in last.attention[attn_layer]]
        attention = {"layer": attn_layer, "rows": rows}
    return {"heads": list(heads), "attention": attention,
            "series": {"index": [e.index for e in events], "live": [e.live_bytes for e in events],
                       "allocated": [e.allocated_bytes for e in events], "formula": [e.formula_bytes for e in events]},
            "model": model, "n_prompt": n_prompt, "n_steps": len(events) - 1,
            "n_gen": n_generated, "n_cached": last.cache_lengths[0], "done": done,
            "ttft_ms": round(events[0].seconds * 1e3, 3), "step_ms": round(last.seconds * 1e3, 3),
            "compiled": last.compiled_mode,
            "texts": list(texts), "top_k": [[t.text, round(t.prob, 6)] for t in last.top_k],
            "written_at": written_at(events),
            "bytes": {"live": last.live_bytes, "formula": last.formula_bytes, "allocated": last.allocated_bytes}}


def top_tokens(view: dict) -> list[TopToken]:
    """A room view's top five, as the strip draws them (the token ids are not shared)."""
    return [TopToken(-1, text, prob) for text, prob in view["top_k"]]


def position_labels(token_texts: Sequence[str]) -> list[str]:
    """'12 ␣the' for each position: the index keeps repeated tokens apart."""
    return [f"{i} {visible(text)}" for i, text in enumerate(token_texts)]


STRIP_CSS = """<style>
.kv-strip{display:flex;flex-wrap:wrap;gap:4px;font-family:ui-monospace,monospace;font-size:var(--kv-size,15px)}
.kv-chip{padding:2px 6px;border-radius:6px;border:1px solid #6b7280;background:#f3f4f6;white-space:pre}
.kv-chip.prompt{border-style:dashed}
.kv-chip.gen{background:#e0ecff;border-color:#3b6fd8}
.kv-chip.newest{background:#ffb020;border-color:#c77c00;font-weight:700}
.kv-top{margin-top:8px;font-size:var(--kv-size,15px)}
.kv-top-row{display:flex;flex-wrap:wrap;align-items:center;gap:4px 18px;margin-top:4px}
.kv-top-item{font-family:ui-monospace,monospace}
.kv-top-item{display:inline-flex;align-items:center;gap:6px;white-space:pre}
.kv-bar{display:inline-block;height:0.7em;background:#7aa7f0;border-radius:3px}
</style>"""


def token_strip_html(
    token_texts: Sequence[str], n_prompt: int, top_k: Sequence[TopToken], top_caption: str, *, lecture: bool = False,
    names: tuple[str, str] | None = None,
) -> str:
    """Prompt and generated tokens as chips (the newest highlighted) and the top-5 of the current step.

    Bars are scaled to the most likely token; the probabilities are printed beside them. Prompt chips have a dashed
    border, generated ones a solid one, the newest a bold one (not the colour alone). `names` (prompt, generated):
    the strip said as text to a screen reader, in order (the chips, one per token or byte run, are hidden from it).
    """
    chips = []
    last = len(token_texts) - 1
    for c in byte_run_chips(token_texts):  # a run of byte tokens is one chip showing its characters
        i = c.stop - 1
        kind = "prompt" if i < n_prompt else ("newest gen" if i == last else "gen")
        chips.append(f'<span class="kv-chip {kind}" title="position {c.positions}" data-tokens="{c.stop - c.start}">'
                     f'{html.escape(visible(c.text))}</span>')
    top = max((t.prob for t in top_k), default=1.0) or 1.0
    # One line of five (token, probability, bar): the lesson's charts stay in view on a 720 px projector.
    items = "".join(
        f'<span class="kv-top-item"><b>{html.escape(visible(t.text))}</b> {t.prob:.3f}'
        f'<span class="kv-bar" style="width:{max(1, round(t.prob / top * (40 if lecture else 80)))}px"></span></span>'
        for t in top_k
    )
    size = "19px" if lecture else "15px"
    # On a projector the caption leads the row of five (one line, not two): the chart below stays on screen.
    caption = html.escape(top_caption)
    caption, row = ("", f"<span>{caption}</span>{items}") if lecture else (caption, items)
    said, hidden = "", ""
    if names:
        parts = [f"{names[0]}: {spoken(''.join(token_texts[:n_prompt]))}"]
        if len(token_texts) > n_prompt:
            parts.append(f"{names[1]}: {spoken(''.join(token_texts[n_prompt:]))}")
        said, hidden = f'<p style="{SR_ONLY}">{html.escape(" — ".join(parts))}</p>', ' aria-hidden="true"'
    return (
        f'{STRIP_CSS}<div style="--kv-size:{size}">{said}<div class="kv-strip"{hidden}>{"".join(chips)}</div>'
        f'<div class="kv-top">{caption}<div class="kv-top-row">{row}</div></div></div>'
    )


class ModelKey(NamedTuple):
    """The sidebar settings a generation was started with (a later change must not apply to it silently)."""

    model: str
    dtype: str
    device: str
    hf_model: str
    shape: object  # the custom shape (model "random"), else None
    engine: str = "auto"  # which engine runs a Hugging Face choice


def changed_settings(started: ModelKey | None, now: ModelKey) -> list[str]:
    """Which settings differ from those the generation was started with ([] when none did)."""
    if started is None:
        return []
    return [name for name in ModelKey._fields if getattr(started, name) != getattr(now, name)]


def achieved_rate(times: Sequence[float], window: int = 17) -> float | None:
    """Steps per second over the last `window` step times (None until 8 steps say something)."""
    recent = list(times)[-window:]
    if len(recent) < 8 or recent[-1] <= recent[0]:
        return None
    return (len(recent) - 1) / (recent[-1] - recent[0])


def play_beats(next_due: float | None, now: float, period: float, max_catch_up: int = 1) -> tuple[int, float]:
    """Play's schedule: how many steps are due at `now`, and when the next one is.

    A beat counts as due up to 0.3 period early (timer ticks jitter). At most `max_catch_up` steps run at once: one,
    so that every redraw shows one new token (a late tick shows its step late, and the page says it is behind, rather
    than several tokens appearing at once); further behind than that, the schedule restarts from now.
    """
    nxt = now if next_due is None else next_due
    due = 0
    while nxt <= now + 0.3 * period and due < max_catch_up:
        due += 1
        nxt += period
    if nxt < now:
        nxt = now + period
    return due, nxt


def presets(section: str, first: str, n: int = 3) -> list[str]:
    """A page's example prompts `<section>.preset_1..n`, in the language `first` first, then the other language's."""
    return [t(f"{section}.preset_{i}", language) for language in sorted(LANGS, key=lambda x: x != first)
            for i in range(1, n + 1)]


def can_step(gen: object | None, stale: bool = False) -> bool:
    """Whether Step (and Play) may run a pass on `gen`: one is started, not finished, its cache still held (a hosted
    demo frees an idle one) and the sidebar not changed since it started."""
    return gen is not None and not gen.done and not stale and getattr(gen, "cache", True) is not None


def play_warning(rate: float | None, period: float, late_for: float) -> str | None:
    """Which warning Play earns: "play_behind" when the steps it really ran (`rate`, per second) fall under 90 % of
    the asked one (1 / period); before the rate can say it, "play_late" for 3 s after a beat came a whole period
    late (`late_for`: seconds since); else none."""
    if rate is not None and rate < 0.9 / period:
        return "play_behind"
    return "play_late" if late_for < 3.0 else None


def check_verdict(within_rounding: bool, same_token: bool) -> str:
    """The cache-vs-recompute check's verdict: logits beyond rounding, else the same greedy token or not."""
    return "check_beyond" if not within_rounding else "check_same" if same_token else "check_differs"
