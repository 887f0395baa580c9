"""What the Speculative Decoding page draws beyond its settings and buttons: the session keys it keeps (`SPEC`), and
per idea the step (`step_view`: the strip of accepted and rejected drafts, the drafts' table, the target's cache grid
through verify and rollback, a draft model's own grid), the acceptance (`acceptance_view`) and the speed
(`speed_view`: measured here, bounded on a GPU). Imports the engine (torch): the page imports it after its first
screen is drawn."""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from kvviz.app.language import tr
from kvviz.app.state import page_state
from kvviz.app.views.decode import grid_html
from kvviz.app.widgets import chart, run_download, table
from kvviz.charts import speculative as charts
from kvviz.engine.spec.decoding import SpeculativeGeneration
from kvviz.engine.spec.measure import gpu_prediction
from kvviz.engine.tokenizer import chip_labels
from kvviz.kv.hardware import HARDWARE
from kvviz.lessons import decode_view, spec_view
from kvviz.lessons.run_record import spec_record

# The keys the page keeps besides its widgets': the generation, Play, the stepper's last press applied, the prompt
# and the draft's settings (kept across a visit to another page), the draft it was started with and its prompt (for
# Measure), the last measurement, an error to say once, whether Play's timer runs.
SPEC = page_state("spec", gen=None, playing=False, served=0, prompt=None, method="ngram", temperature=0.0,
                  draft_model="layers", measured=None, factory=None, prompt_used=None, error=None, timer_on=False)
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


def draw(gen: SpeculativeGeneration, status, shown: set[str], *, lecture: bool, measure: Callable[[], None],
         device: str) -> None:  # noqa: ANN001 - where the status line goes
    """The ideas shown (on a projector one): the step, the acceptance, the speed."""
    last, stats = gen.events[-1], gen.stats
    if lecture and "step" in shown:  # on a projector this idea's line beside the buttons is its bytes (step_view)
        step_view(gen, status, lecture=lecture)
        return
    status.caption(tr("spec.status", n_prompt=len(gen.prompt_ids), n_gen=gen.n_generated, passes=gen.target_passes,
                   plain=gen.plain_passes, rolled=gen.rollback_tokens, mal=f"{stats.mean_acceptance_length:.2f}",
                   step_ms=f"{last.seconds * 1e3:.1f}") + (" " + tr("spec.done") if gen.done else ""))
    if "step" in shown:
        step_view(gen, st, lecture=lecture)
    if "acceptance" in shown:
        acceptance_view(gen, lecture=lecture)
    if "speed" in shown:
        speed_view(gen, measure=measure, device=device)


def step_view(gen: SpeculativeGeneration, bytes_line, *, lecture: bool) -> None:  # noqa: ANN001 - where it goes
    last = gen.events[-1]
    texts = decode_view.token_texts(gen.backend.tokenizer, gen.token_ids)
    names = texts_of(gen, last.drafted)
    legend = tr(f"spec.{spec_view.strip_legend(last)}", drafted=len(last.drafted), accepted=last.accepted,
                k1=len(last.drafted) + 1, rolled=last.rolled_back)
    st.html(spec_view.step_strip_html(texts, len(gen.prompt_ids), last, names, legend, lecture=lecture))
    if last.drafted and not lecture:
        import pandas as pd  # ~1,000 modules with pyarrow: not in the first run (nothing drafted yet)

        rows = spec_view.draft_rows(last, names)
        df = pd.DataFrame([{tr("spec.col_i"): r["i"], tr("spec.col_position"): r["position"],
                            tr("spec.col_token"): r["token"],
                            tr("spec.col_p"): f"{r['p']:.3f}",
                            tr("spec.col_q"): "—" if r["q"] is None else f"{r['q']:.3f}",
                            tr("spec.col_kept"): tr("spec.kept_yes" if r["kept"] else "spec.kept_no")} for r in rows])
        st.dataframe(df, hide_index=True)
    shared = gen.draft.shared_layers
    grid = spec_view.cache_grid(gen.events, shared)
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
    st.html(grid_html(
        grid.written, labels, title=tr("spec.grid_title", n=last.cache_lengths[0], rolled=last.rolled_back),
        x_title=tr("spec.position"), hover=tr("spec.grid_hover"), legend=short if lecture else legend,
        legend_help=legend, legend_kinds=kinds, kinds=grid.kinds, title_help=explained if lecture else "",
        lecture=lecture, keep=(shared - 1, shared) if shared else ()))
    if gen.draft.cache is not None:
        draft_grid(gen, labels, lecture=lecture)
    if shared and not lecture:
        st.caption(explained)


def draft_grid(gen: SpeculativeGeneration, labels: list[str], *, lecture: bool) -> None:
    """A separate draft model's own cache, cropped too (on a projector in an expander, its title the label)."""
    last = gen.events[-1]
    own = spec_view.cache_grid(gen.events, own_lengths=True)
    title = tr("spec.draft_grid_title", name=getattr(gen.draft, "name", ""), n=last.draft_lengths[0],
               rolled=last.draft_rolled_back)
    with st.expander(title) if lecture else st.container():
        st.html(grid_html(
            own.written, labels, title=title, x_title=tr("spec.position"), hover=tr("spec.grid_hover"),
            legend=[tr(f"spec.legend_{k}") for k in ("prefill", "step", "newest")], prefix="D", lecture=lecture))
        st.caption(tr("spec.draft_bytes", live=f"{last.draft_live_bytes:,}",
                      formula=f"{last.draft_formula_bytes:,}"))


def acceptance_view(gen: SpeculativeGeneration, *, lecture: bool) -> None:
    stats = gen.stats
    m = st.columns(4)
    m[0].metric(tr("spec.m_mal"), f"{stats.mean_acceptance_length:.2f}", help=tr("spec.m_mal_help"))
    m[1].metric(tr("spec.m_passes"), f"{gen.target_passes} / {gen.plain_passes}", help=tr("spec.m_passes_help"))
    m[2].metric(tr("spec.m_rolled"), gen.rollback_tokens, help=tr("spec.m_rolled_help"))
    m[3].metric(tr("spec.m_draft_kv"), f"{max(e.draft_peak_formula_bytes for e in gen.events):,} B",
                help=tr("spec.m_draft_kv_help", after=f"{gen.events[-1].draft_formula_bytes:,}"))
    if len(gen.events) < 2:
        st.info(tr("spec.no_steps"))
        return
    left, right = st.columns([3, 2])
    with left:
        series = spec_view.acceptance_series(gen.events)
        labels = {k: tr(f"spec.c_{k}") for k in ("accepted", "rejected", "emitted", "mean_length", "step", "tokens")}
        chart(charts.acceptance_figure(series, labels | {"title": tr("spec.c_acceptance_title")}, lecture=lecture),
              "spec_acceptance")
    with right:
        # On a projector the bytes chart is folded under this one, so the idea keeps one screen.
        chart(charts.per_position_figure(stats.acceptance_rate_per_pos, {
            "position": tr("spec.c_draft_position"), "rate": tr("spec.c_rate"),
            "title": tr("spec.c_per_position_title", drafts=stats.num_drafts)}, lecture=lecture, lecture_height=290),
            "spec_per_position")
    ev = gen.events
    with right.expander(tr("spec.c_bytes_title")) if lecture else st.container():
        chart(charts.bytes_figure(
            [e.index for e in ev], [e.peak_live_bytes for e in ev], [e.live_bytes for e in ev],
            [e.formula_bytes for e in ev], [e.draft_live_bytes for e in ev],
            {k: tr(f"spec.c_{k}") for k in charts.BYTES_LABELS}
            | {"title": tr("spec.c_bytes_title")}, lecture=lecture), "spec_bytes")


def speed_view(gen: SpeculativeGeneration, *, measure: Callable[[], None], device: str) -> None:
    st.caption(tr("spec.speed_help"))
    c1, c2 = st.columns([2, 3])
    c1.button(tr("spec.measure", repeats=MEASURE_REPEATS), on_click=measure, key="spec_btn_measure",
              help=tr("spec.measure_help"))
    gpu = c2.selectbox(tr("spec.gpu"), [n for n, h in HARDWARE.items() if h.memory_kind != "given"],
                       key="spec_gpu")
    measured = SPEC.get("measured")
    run = measured.spec if measured is not None else gen
    pred = gpu_prediction(run, HARDWARE[gpu]) if run.n_generated > 1 else None
    rows = []
    if measured is not None and measured.tpot_s and measured.tpot_plain_s:
        rows.append({tr("spec.col_where"): tr("spec.here", device=device),
                     tr("spec.col_plain"): spec_view.spread_ms(measured.tpot_plain_s),
                     tr("spec.col_spec"): spec_view.spread_ms(measured.tpot_s),
                     tr("spec.col_speedup"): f"{measured.speedup:.2f}×"})
    if pred is not None:
        plain_us, spec_us = spec_view.per_token_us(pred, run.n_generated)
        rows.append({tr("spec.col_where"): tr("spec.roofline", gpu=gpu), tr("spec.col_plain"): f"{plain_us:.1f} µs",
                     tr("spec.col_spec"): f"{spec_us:.1f} µs", tr("spec.col_speedup"): f"{pred.speedup:.2f}×"})
    if rows:
        table(rows, "spec_speed")
    if measured is None:
        st.info(tr("spec.measure_first"))
    else:
        same = measured.tokens_equal_plain
        st.caption(tr("spec.same_tokens" if same else "spec.sampled" if same is None else "spec.not_same"))
    if pred is not None:
        st.caption(tr("spec.roofline_help", ratio=f"{pred.verify_over_decode:.2f}", gpu=gpu))
