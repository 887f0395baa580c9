"""What the Speculative Decoding page draws beyond its settings and buttons: the session keys it keeps (`SPEC`), and per
idea the step (`step_view`: the strip of accepted and rejected drafts, the drafts' table, the target's cache grid
through verify and rollback, a draft model's own grid), the acceptance (`acceptance_view`) and the speed
(`speed_view`: measured here, bounded on a GPU), each drawn from the run's texts and numbers (`Run`), which a lecture
room's followers get (`draw` returns them, `follow` draws a follower's page from them). Imports the engine (torch):
the page imports it after its first screen is drawn."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import streamlit as st

from kvviz.app.a11y import announce
from kvviz.app.decode_controls import CONTROL_KEYS
from kvviz.app.language import tr
from kvviz.app.room.explore import explore_from
from kvviz.app.room.view import RoomView
from kvviz.app.state import page_state
from kvviz.app.views.reuse import grid_html
from kvviz.app.widgets import chart, own_html, run_download, table
from kvviz.charts import speculative as charts
from kvviz.engine.spec.decoding import SpecEvent, SpecStats, SpeculativeGeneration
from kvviz.engine.spec.measure import gpu_prediction
from kvviz.engine.tokenizer import chip_labels
from kvviz.kv.hardware import HARDWARE
from kvviz.lessons import decode_view, spec_view
from kvviz.lessons.run_record import spec_record

# The keys the page keeps besides its widgets': the generation, Play, the stepper's last press applied, the prompt
# and the draft's settings (kept across a visit to another page), the draft it was started with and its prompt (for
# Measure), the last measurement, an error to say once, whether Play's timer runs.
# started: the settings the run was prefilled with, as JSON (what "Explore from here" replays a follower's run from);
# seed: a follower's, taken from the lecturer's run by "Explore from here" (None: demo_seed's)
SPEC = page_state("spec", gen=None, prompt=None, method="ngram", temperature=0.0, draft_model="layers", measured=None,
                  factory=None, prompt_used=None, error=None, started=None, seed=None, **CONTROL_KEYS)
# The page's own keys that are its settings (persisted boxes, the seed), which "Explore from here" takes; the preset
# box is not (its options are in the UI's language).
EXPLORED = {"keep": ("prompt", "method", "temperature", "draft_model", "seed"), "skip": ("spec_preset",)}
MEASURE_REPEATS = 3


def texts_of(gen: SpeculativeGeneration, ids) -> dict[int, str]:  # noqa: ANN001 - any iterable of ids
    return {i: decode_view.token_texts(gen.backend.tokenizer, [i])[0] for i in set(ids)}


def download(where, gen: SpeculativeGeneration | None, *, compact: bool) -> None:  # noqa: ANN001 - a container
    """"Download this run" for the steps shown now."""
    if gen is None or not gen.events:
        run_download(where, "spec_download", "kvviz-speculative-run.html", None, compact=compact)
        return
    n = len(gen.events)
    settings = {"prompt": gen.backend.tokenizer.decode(gen.prompt_ids), "method": SPEC.get("method"), "k": gen.k,
                "draft": getattr(gen.draft, "name", None) or type(gen.draft).__name__,
                "max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature, "seed": gen.seed}
    run_download(where, "spec_download", f"kvviz-speculative-{gen.backend.spec.name}-{n}-steps.html",
                 lambda: spec_record(gen, settings, n_steps=n), (n, 0), compact=compact)


@dataclass
class Run:
    """A run as the page draws it: the lecturer's generation (`of`), or a lecture room follower's copy of it
    (`from_json`): texts and numbers, no model and no cache."""

    texts: list[str]  # every token's text, the prompt's first
    n_prompt: int
    names: dict[int, str]  # the text of every token a draft proposed
    events: list[SpecEvent]
    stats: SpecStats
    n_generated: int
    target_passes: int
    plain_passes: int
    rollback_tokens: int
    done: bool
    shared_layers: int  # the target's first layers an early exit shares as its draft
    draft_model: str | None  # a separate draft model's name (it keeps its own cache); None: none

    @classmethod
    def of(cls, gen: SpeculativeGeneration) -> Run:
        draft = gen.draft
        return cls(decode_view.token_texts(gen.backend.tokenizer, gen.token_ids), len(gen.prompt_ids),
                   texts_of(gen, (d for e in gen.events for d in e.drafted)), gen.events, gen.stats, gen.n_generated,
                   gen.target_passes, gen.plain_passes, gen.rollback_tokens, gen.done, draft.shared_layers,
                   None if draft.cache is None else getattr(draft, "name", ""))

    def to_json(self) -> dict:
        return {**asdict(self), "names": [[i, text] for i, text in self.names.items()]}

    @classmethod
    def from_json(cls, d: dict) -> Run:
        return cls(**{**d, "names": {i: text for i, text in d["names"]},
                      "events": [SpecEvent(**e) for e in d["events"]], "stats": SpecStats(**d["stats"])})


def draw(gen: SpeculativeGeneration, status, shown: set[str], *, lecture: bool, measure: Callable[[], None],
         device: str) -> dict:  # noqa: ANN001 - where the status line goes
    """The ideas shown (on a projector one): the step, the acceptance, the speed. Returns what a lecture room's
    followers draw of them (`follow`): the run's texts and numbers, and the speed's."""
    run = Run.of(gen)
    show(run, status, shown, lecture=lecture)
    speed = speed_view(gen, measure=measure, device=device) if "speed" in shown else None
    return {"shown": sorted(shown), "n_steps": gen.events[-1].index, "run": run.to_json(), "speed": speed}


def show(run: Run, status, shown: set[str], *, lecture: bool) -> None:  # noqa: ANN001 - where the status line goes
    """The step and the acceptance, from `run` (the lecturer's, or a room follower's copy)."""
    last, stats = run.events[-1], run.stats
    if lecture and "step" in shown:  # on a projector this idea's line beside the buttons is its bytes (step_view)
        step_view(run, status, lecture=lecture)
        return
    status.caption(tr("spec.status", n_prompt=run.n_prompt, n_gen=run.n_generated, passes=run.target_passes,
                   plain=run.plain_passes, rolled=run.rollback_tokens, mal=f"{stats.mean_acceptance_length:.2f}",
                   step_ms=f"{last.seconds * 1e3:.1f}") + (" " + tr("spec.done") if run.done else ""))
    if "step" in shown:
        step_view(run, st, lecture=lecture)
    if "acceptance" in shown:
        acceptance_view(run, lecture=lecture)


def step_view(run: Run, bytes_line, *, lecture: bool) -> None:  # noqa: ANN001 - where it goes
    last = run.events[-1]
    texts, names = run.texts, run.names
    legend = tr(f"spec.{spec_view.strip_legend(last)}", drafted=len(last.drafted), accepted=last.accepted,
                k1=len(last.drafted) + 1, rolled=last.rolled_back)
    own_html(spec_view.step_strip_html(texts, run.n_prompt, last, names, legend, lecture=lecture), key="spec_strip")
    announce(legend)  # the step's result said to a screen reader (drafted, kept, rejected), as on Reusing Past K/V
    if last.drafted and not lecture:
        import pandas as pd  # ~1,000 modules with pyarrow: not in the first run (nothing drafted yet)

        rows = spec_view.draft_rows(last, names)
        df = pd.DataFrame([{tr("spec.col_i"): r["i"], tr("spec.col_position"): r["position"],
                            tr("spec.col_token"): r["token"],
                            tr("spec.col_p"): f"{r['p']:.3f}",
                            tr("spec.col_q"): "—" if r["q"] is None else f"{r['q']:.3f}",
                            tr("spec.col_kept"): tr("spec.kept_yes" if r["kept"] else "spec.kept_no")} for r in rows])
        st.dataframe(df, hide_index=True)
    shared = run.shared_layers
    grid = spec_view.cache_grid(run.events, shared)
    labels = decode_view.position_labels(chip_labels(texts[:-1] + [names[d] for d in grid.rejected_ids]))
    kinds = spec_view.grid_legend(shared)
    legend = [tr(f"spec.legend_{k}", last=shared - 1) for k in kinds]
    # On a projector the legend keeps one line (the short words, the page's as tooltips) and the early exit's
    # explanation is the title's tooltip: the step idea keeps one 1280×720 screen.
    short = [tr(f"spec.legend_{k}_short", last=shared - 1) if k in ("draft", "rejected") else text
             for k, text in zip(kinds, legend, strict=True)]
    explained = tr("spec.shared_caption", m=shared, last=shared - 1) if shared else ""
    verdict = tr("spec.bytes_equal" if last.live_bytes == last.formula_bytes else "spec.bytes_differ")
    bytes_line.caption(tr("spec.bytes_line", peak=f"{last.peak_live_bytes:,}", live=f"{last.live_bytes:,}",
                          formula=f"{last.formula_bytes:,}", allocated=f"{last.allocated_bytes:,}", verdict=verdict))
    # On a projector a deep model's grid keeps the layers either side of the early exit (the lesson's boundary), and a
    # draft model's own grid is folded right under it (two grids overran 720 px).
    own_html(grid_html(
        grid.written, labels, title=tr("spec.grid_title", n=last.cache_lengths[0], rolled=last.rolled_back),
        x_title=tr("spec.position"), hover=tr("spec.grid_hover"), legend=short if lecture else legend,
        legend_help=legend, legend_kinds=kinds, kinds=grid.kinds, title_help=explained if lecture else "",
        lecture=lecture, keep=(shared - 1, shared) if shared else ()), key="spec_grid")
    if run.draft_model is not None:
        draft_grid(run, labels, lecture=lecture)
    if shared and not lecture:
        st.caption(explained)


def draft_grid(run: Run, labels: list[str], *, lecture: bool) -> None:
    """A separate draft model's own cache, cropped too (on a projector in an expander, its title the label)."""
    last = run.events[-1]
    own = spec_view.cache_grid(run.events, own_lengths=True)
    title = tr("spec.draft_grid_title", name=run.draft_model, n=last.draft_lengths[0],
               rolled=last.draft_rolled_back)
    with st.expander(title) if lecture else st.container():
        own_html(grid_html(
            own.written, labels, title=title, x_title=tr("spec.position"), hover=tr("spec.grid_hover"),
            legend=[tr(f"spec.legend_{k}") for k in ("prefill", "step", "newest")], prefix="D", lecture=lecture),
            key="spec_draft_grid")
        st.caption(tr("spec.draft_bytes", live=f"{last.draft_live_bytes:,}",
                      formula=f"{last.draft_formula_bytes:,}"))


def acceptance_view(run: Run, *, lecture: bool) -> None:
    stats = run.stats
    m = st.columns(4)
    m[0].metric(tr("spec.m_mal"), f"{stats.mean_acceptance_length:.2f}", help=tr("spec.m_mal_help"))
    m[1].metric(tr("spec.m_passes"), f"{run.target_passes} / {run.plain_passes}", help=tr("spec.m_passes_help"))
    m[2].metric(tr("spec.m_rolled"), run.rollback_tokens, help=tr("spec.m_rolled_help"))
    m[3].metric(tr("spec.m_draft_kv"), f"{max(e.draft_peak_formula_bytes for e in run.events):,} B",
                help=tr("spec.m_draft_kv_help", after=f"{run.events[-1].draft_formula_bytes:,}"))
    if len(run.events) < 2:
        st.info(tr("spec.no_steps"))
        return
    left, right = st.columns([3, 2])
    with left:
        series = spec_view.acceptance_series(run.events)
        labels = {k: tr(f"spec.c_{k}") for k in ("accepted", "rejected", "emitted", "mean_length", "step", "tokens")}
        chart(charts.acceptance_figure(series, labels | {"title": tr("spec.c_acceptance_title")}, lecture=lecture),
              "spec_acceptance")
    with right:
        # On a projector the bytes chart is folded under this one, so the idea keeps one screen.
        chart(charts.per_position_figure(stats.acceptance_rate_per_pos, {
            "position": tr("spec.c_draft_position"), "rate": tr("spec.c_rate"),
            "title": tr("spec.c_per_position_title", drafts=stats.num_drafts)}, lecture=lecture, lecture_height=290),
            "spec_per_position")
    ev = run.events
    with right.expander(tr("spec.c_bytes_title")) if lecture else st.container():
        chart(charts.bytes_figure(
            [e.index for e in ev], [e.peak_live_bytes for e in ev], [e.live_bytes for e in ev],
            [e.formula_bytes for e in ev], [e.draft_live_bytes for e in ev],
            {k: tr(f"spec.c_{k}") for k in charts.BYTES_LABELS}
            | {"title": tr("spec.c_bytes_title")}, lecture=lecture), "spec_bytes")


def speed_view(gen: SpeculativeGeneration, *, measure: Callable[[], None], device: str) -> dict:
    """Measure and the GPU to bound it on, then the speed's table (`speed_table`); returns its numbers."""
    st.caption(tr("spec.speed_help"))
    c1, c2 = st.columns([2, 3])
    c1.button(tr("spec.measure", repeats=MEASURE_REPEATS), on_click=measure, key="spec_btn_measure",
              help=tr("spec.measure_help"))
    gpu = c2.selectbox(tr("spec.gpu"), [n for n, h in HARDWARE.items() if h.memory_kind != "given"],
                       key="spec_gpu")
    measured = SPEC.get("measured")
    run = measured.spec if measured is not None else gen
    pred = gpu_prediction(run, HARDWARE[gpu]) if run.n_generated > 1 else None
    speed = {"device": device, "gpu": gpu, "here": None, "same": None, "roofline": None}
    if measured is not None:
        speed["same"] = measured.tokens_equal_plain
        if measured.tpot_s and measured.tpot_plain_s:
            speed["here"] = [spec_view.spread_ms(measured.tpot_plain_s), spec_view.spread_ms(measured.tpot_s),
                             measured.speedup]
    if pred is not None:
        speed["roofline"] = [*spec_view.per_token_us(pred, run.n_generated), pred.speedup, pred.verify_over_decode]
    speed_table(speed, measured=measured is not None)
    return speed | {"measured": measured is not None}


def speed_table(speed: dict, *, measured: bool) -> None:
    """Plain against speculative per token, measured here and bounded on the GPU (the lecturer's page's numbers, or
    a room follower's copy)."""
    rows = []
    if speed["here"] is not None:
        plain, spec, speedup = speed["here"]
        rows.append({tr("spec.col_where"): tr("spec.here", device=speed["device"]), tr("spec.col_plain"): plain,
                     tr("spec.col_spec"): spec, tr("spec.col_speedup"): f"{speedup:.2f}×"})
    roof = speed["roofline"]
    if roof is not None:
        rows.append({tr("spec.col_where"): tr("spec.roofline", gpu=speed["gpu"]),
                     tr("spec.col_plain"): f"{roof[0]:.1f} µs", tr("spec.col_spec"): f"{roof[1]:.1f} µs",
                     tr("spec.col_speedup"): f"{roof[2]:.2f}×"})
    if rows:
        table(rows, "spec_speed")
    if not measured:
        st.info(tr("spec.measure_first"))
    else:
        same = speed["same"]
        st.caption(tr("spec.same_tokens" if same else "spec.sampled" if same is None else "spec.not_same"))
    if roof is not None:
        st.caption(tr("spec.roofline_help", ratio=f"{roof[3]:.2f}", gpu=speed["gpu"]))


# ---- a lecture room --------------------------------------------------------------------------------------------
def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Speculative Decoding: the lecturer's run at its step, the ideas on the lecturer's
    screen (all of them when the lecturer is not in lecture mode), in this session's language; no model runs here,
    no button or box of this session's is drawn."""
    explore_from(view, "spec", steps=view["n_steps"], help_key="room.explore_help", **EXPLORED)
    shown = set(view["shown"])
    show(Run.from_json(view["run"]), st, shown, lecture=lecture)
    if "speed" in shown:
        st.caption(tr("spec.speed_help"))
        speed_table(view["speed"], measured=view["speed"]["measured"])
