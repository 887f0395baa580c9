"""kvviz from Python (a notebook, a script): `Session` loads a model, runs prefill and decode steps one pass at a
time, and gives back the figures the pages draw and the numbers behind them.

    from kvviz import Session
    s = Session("tiny")                 # or "smollm2" (after `python -m kvviz fetch-model smollm2`), or a path
    s.prefill("The capital of France is")
    s.step(4)
    s.cache_grid()                      # the per-layer cache, as Reusing Past K/V draws it
    s.attention_row(layer=0)            # the newest query's attention per head, GQA groups outlined
    s.cache_bytes()                     # live vs allocated bytes per pass, with the formula's
    s.memory()                          # the cache against the weights over context lengths (Memory Footprint)
    s.numbers()                         # plain data: a dict of lists and numbers, JSON-ready, no pandas

No new computation lives here: the run is kvviz.engine.generation.Generation, the figures are kvviz.charts' own
functions called with the arguments the pages pass, titles in `lang` (en or ko). The cache grid is HTML, as on the
page (a Plotly heatmap loses sub-pixel cells); `CacheGrid` shows itself in Jupyter and keeps its data.
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from kvviz.charts import decode as decode_charts
from kvviz.charts.memory import cache_vs_weights_figure
from kvviz.engine.generation import Generation, StepEvent
from kvviz.engine.loading import load_backend
from kvviz.engine.tokenizer import chip_labels
from kvviz.errors import InputError
from kvviz.i18n import LANGS, t
from kvviz.kv.formula import weight_bytes
from kvviz.lessons import decode_view
from kvviz.lessons.memory import growth_curves
from kvviz.units import format_binary


@dataclass(frozen=True)
class CacheGrid:
    """The cache grid: `written[layer][position]` is the pass that wrote it (0 = prefill); `html` is what the page
    draws. Jupyter shows the HTML; `str()` gives it for a file."""

    written: list[list[int]]
    labels: list[str]
    html: str

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.html


def _step_numbers(e: StepEvent) -> dict:
    return {
        "phase": e.phase, "index": e.index, "position": e.position, "n_input_tokens": e.n_input_tokens,
        "token_id": e.token_id, "token_text": e.token_text, "seconds": e.seconds,
        "cache_lengths": list(e.cache_lengths), "cache_live_bytes": e.live_bytes,
        "cache_allocated_bytes": e.allocated_bytes, "formula_bytes": e.formula_bytes, "attn_scores": e.attn_scores,
        "top_k": [{"token_id": k.token_id, "text": k.text, "prob": k.prob} for k in e.top_k],
    }


class Session:
    """One model and one request's decode, stepped from Python. Greedy by default, as `kvviz generate`."""

    def __init__(self, model: str = "tiny", *, max_new_tokens: int = 32, dtype: str = "float32", device: str = "cpu",
                 temperature: float = 0.0, seed: int = 0, lang: str = "en") -> None:
        if lang not in LANGS:
            raise InputError("notebook.bad_lang", given=lang, choices=", ".join(LANGS))
        self.lang = lang
        self.backend = load_backend(model, dtype=dtype, device=device, seed=seed)
        self._settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        self.gen = self._new_generation()

    def _new_generation(self) -> Generation:
        # capture_attention: attention_row() draws the newest query's row, as the decode page does.
        return Generation(self.backend, capture_attention=True, **self._settings)

    def _tr(self, key: str, **values: object) -> str:
        return t(key, self.lang, **values)

    # ---- the run ---------------------------------------------------------------------------------------------
    def prefill(self, prompt: str | list[int]) -> dict:
        """Run the prompt in one pass (a new request: it replaces the previous run, which a refused prompt keeps) and
        emit the first token; returns that pass's numbers."""
        gen = self._new_generation()
        event = gen.prefill(prompt)
        self.gen = gen
        return _step_numbers(event)

    def step(self, n: int = 1) -> dict:
        """`n` decode steps (fewer when the run ends: the token budget or end-of-sequence); the last one's numbers."""
        if n < 1:
            raise InputError("notebook.bad_steps", n=n)
        for _ in range(n):
            event = self.gen.step()
            if self.gen.done:
                break
        return _step_numbers(event)

    def run(self, prompt: str | list[int]) -> dict:
        """Prefill and decode to the end; the whole run's numbers."""
        self.prefill(prompt)
        while not self.gen.done:
            self.gen.step()
        return self.numbers()

    @property
    def done(self) -> bool:
        return self.gen.done

    def _require_run(self) -> list[StepEvent]:
        if not self.gen.events:
            raise InputError("prefill_first")
        return self.gen.events

    # ---- plain data ------------------------------------------------------------------------------------------
    def numbers(self) -> dict:
        """The run as plain data; the keys `kvviz generate --json` prints mean the same here, plus the model's
        shape and every pass (`steps`)."""
        events = self._require_run()
        spec, last = self.backend.spec, events[-1]
        return {
            "model": spec.name, "engine": self.backend.kind, "device": str(self.backend.device),
            "dtype": str(self.backend.dtype).removeprefix("torch."),
            "n_layers": spec.n_layers, "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads, "d_head": spec.d_head,
            "prompt_tokens": len(self.gen.prompt_ids), "prompt_ids": list(self.gen.prompt_ids),
            "token_ids": list(self.gen.generated[0]), "text": self.gen.text, "done": self.gen.done,
            "ttft_s": self.gen.ttft_s, "tpot_s": self.gen.tpot_s, "step_seconds": [e.seconds for e in events],
            "cache_live_bytes": last.live_bytes, "cache_allocated_bytes": last.allocated_bytes,
            "formula_bytes": last.formula_bytes, "steps": [_step_numbers(e) for e in events],
        }

    # ---- the pages' figures ----------------------------------------------------------------------------------
    def _labels(self) -> tuple[list[str], list[str]]:
        texts = decode_view.token_texts(self.backend.tokenizer, self.gen.token_ids)
        return texts, decode_view.position_labels(chip_labels(texts))

    def cache_grid(self) -> CacheGrid:
        """Which pass wrote each cached position, per layer, K and V rows (Reusing Past K/V, Cache growth)."""
        events = self._require_run()
        _, labels = self._labels()
        written = decode_view.written_at(events)
        html = decode_charts.cache_grid_html(
            written, labels, title=self._tr("reuse.growth_chart", n=events[-1].cache_lengths[0]),
            x_title=self._tr("reuse.position"), hover=self._tr("reuse.growth_hover"),
            legend=(self._tr("reuse.legend_prefill"), self._tr("reuse.legend_steps"),
                    self._tr("reuse.legend_newest")),
            layer_names=[f"L{i}" for i in range(len(written))])
        return CacheGrid(written, labels, html)

    def attention_row(self, layer: int = 0) -> go.Figure:
        """The newest query's attention over every cached position, one row per query head (Reusing Past K/V)."""
        events = self._require_run()
        spec = self.backend.spec
        if not 0 <= layer < spec.n_layers:
            raise InputError("notebook.bad_layer", layer=layer, last=spec.n_layers - 1)
        texts, labels = self._labels()
        rows = events[-1].attention[layer]
        return decode_charts.attention_figure(
            rows, labels, decode_view.head_labels(spec.n_heads, spec.n_kv_heads),
            decode_view.kv_head_of(spec.n_heads, spec.n_kv_heads),
            title=self._tr("reuse.attn_chart", layer=layer, token=decode_view.visible(texts[rows.shape[1] - 1])),
            x_title=self._tr("reuse.position"))

    def cache_bytes(self) -> go.Figure:
        """Live (from the tensors) and allocated bytes after each pass, beside the formula's (Reusing Past K/V)."""
        ev = self._require_run()
        return decode_charts.cache_bytes_figure(
            [e.index for e in ev], [e.live_bytes for e in ev], [e.allocated_bytes for e in ev],
            [e.formula_bytes for e in ev], title=self._tr("reuse.bytes_chart"), x_title=self._tr("reuse.pass"),
            y_title=self._tr("reuse.bytes"),
            names=(self._tr("reuse.live"), self._tr("reuse.allocated"), self._tr("reuse.formula")))

    def memory(self, *, batch: int = 1, n_tokens: int | None = None, kv_dtype: str | None = None) -> go.Figure:
        """This model's cache against its weights over context lengths, for 1, 8, 32 and `batch` requests (Memory
        Footprint). `n_tokens`: the context marked (default: this run's, else the model's context); `kv_dtype`:
        the cache's storage (default: the model's dtype)."""
        spec = self.backend.spec
        dtype = str(self.backend.dtype).removeprefix("torch.")
        kv_dtype = kv_dtype or dtype
        weights = weight_bytes(spec.n_params, dtype)
        if weights is None:
            raise InputError("notebook.no_params", model=spec.name)
        if n_tokens is None:
            n_tokens = self.gen.events[-1].position + 1 if self.gen.events else spec.max_context
        curves = growth_curves(spec, weights, batch, n_tokens, kv_dtype)
        return cache_vs_weights_figure(
            curves, weights, title=self._tr("memory.growth_title"), x_title=self._tr("memory.tokens"),
            y_title=self._tr("memory.gib_axis"),
            weights_label=self._tr("memory.weights_label", weights=format_binary(weights)),
            batch_label=self._tr("memory.batch_label"), crossing_label=self._tr("memory.crossing_label"))
