"""What the Training · Prefill · Decode page draws, idea by idea, on a native model: the text and its decode steps
(`text_settings`, kept in the link), then `native_sections`: one masked parallel pass equals prefill + decode
(`equal_section`), their K/V side by side (`kv_section`), why the causal mask allows the cache (`mask_section`),
the one attention row a decode step computes (`attention_section`); and the table that compares the three phases
(`phase_table`). The runs (kvviz.lessons.causal) are cached per model and text (`passes`, `drift`, `attention`);
torch is imported inside the functions: the page imports this module before its first screen is drawn."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import idea_title, settings_box
from kvviz.app.models import check_request, model_caption
from kvviz.app.room.explore import explore_from
from kvviz.app.room.share import share_button
from kvviz.app.room.view import RoomView
from kvviz.app.sidebar import Settings
from kvviz.app.url_state import int_in, one_of, url_state
from kvviz.app.widgets import chart, persisted, table
from kvviz.charts import training as charts
from kvviz.engine.tokenizer import chip_labels
from kvviz.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from kvviz.engine.model import Decoder
    from kvviz.lessons import causal


def fmt(x: float) -> str:
    return f"{x:.2e}"


@st.cache_data(max_entries=16, show_spinner=False)
def drift(_model: Decoder, key: tuple, ids: tuple[int, ...], is_causal: bool) -> causal.PastDrift:
    from kvviz.lessons import causal

    return causal.past_kv_drift(_model, list(ids), causal=is_causal)


@st.cache_resource(max_entries=8, show_spinner=False)  # read-only tensors derived from shared weights
def passes(_model: Decoder, key: tuple, ids: tuple[int, ...], n_prompt: int) -> tuple[causal.KVPass, causal.KVPass]:
    from kvviz.lessons import causal

    return causal.run_parallel(_model, list(ids)), causal.run_sequential(_model, list(ids), n_prompt)


@st.cache_data(max_entries=16, show_spinner=False)
def attention(_model: Decoder, key: tuple, ids: tuple[int, ...], layer: int) -> causal.AttentionRows:
    from kvviz.lessons import causal

    return causal.attention_rows(_model, list(ids), layer)


def phase_table() -> pd.DataFrame:
    import pandas as pd  # ~1,000 modules with pyarrow: not before the page's title

    columns = ["phase", "inputs", "computation", "stored", "latency"]
    rows = [[tr(f"training.table_{phase}_{col}") for col in columns] for phase in ("training", "prefill", "decode")]
    return pd.DataFrame(rows, columns=[tr(f"training.table_col_{col}") for col in columns])


@dataclass
class Run:
    """The text the sections run on one model, and what every section needs of it: the lecturer's page's (with its
    `backend`), or a lecture room follower's copy (`from_json`, no model)."""

    ids: tuple[int, ...]
    tokens: list[str]  # byte runs as their characters
    steps: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int  # the tolerance's dot-product length (its precision: dtype)
    dtype: str  # the model's dtype, as torch names it ("float32")
    lecture: bool
    backend: Any = None  # a NativeBackend; None on a room follower's page

    @classmethod
    def of(cls, backend: Any, ids: tuple[int, ...], steps: int, lecture: bool) -> Run:
        spec = backend.spec
        return cls(ids, chip_labels([backend.tokenizer.token_text(i) for i in ids]), steps, spec.n_layers,
                   spec.n_heads, spec.n_kv_heads, spec.d_model, str(backend.dtype).removeprefix("torch."), lecture,
                   backend)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("backend", "lecture")}

    @classmethod
    def from_json(cls, d: dict, lecture: bool) -> Run:
        return cls(**{**d, "ids": tuple(d["ids"])}, lecture=lecture)

    @property
    def model(self) -> Decoder:
        return self.backend.model

    @property
    def key(self) -> tuple:
        # Weights are a pure function of these settings (seeded init or a fixed checkpoint).
        return self.backend.spec, str(self.backend.dtype), str(self.backend.device)

    @property
    def n_prompt(self) -> int:
        return len(self.ids) - self.steps

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    @property
    def n_terms(self) -> int:
        return self.d_model

    @property
    def layers(self) -> list[int]:
        return list(range(self.n_layers))

    def layer_label(self, layer: int) -> str:
        # 0-based on every page, as the model's own tensor names count them (model.layers.0)
        return tr("training.layer_n", layer=layer)

    def pair(self) -> tuple:
        """Two charts side by side (in lecture mode in halves, so both fit one screen)."""
        return st.columns(2 if self.lecture else [2, 3])

    def mask_chart(self, is_causal: bool, title: str, key: str) -> None:
        chart(charts.mask_figure(self.tokens, is_causal, title=title, key_axis=tr("training.key_axis"),
                                 query_axis=tr("training.query_axis"), allowed=tr("training.allowed"),
                                 masked=tr("training.masked"), lecture=self.lecture), key=key)


def _array(values: list, dtype: str) -> Any:
    """A published matrix as the lecturer's page drew it (the same dtype: the same chart)."""
    import numpy as np

    return np.asarray(values, dtype=dtype)


def text_settings(backend: Any, settings: Settings) -> tuple[list[int], int] | InputError:
    """The text and the decode steps (in lecture mode behind the settings button): the token ids and the steps, or
    why they cannot run (said on the page, never inside a closed popover)."""
    from kvviz.lessons import causal

    c1, c2, c3 = st.columns([2, 3, 2])
    with c1:
        preset = persisted(st.selectbox, url_state("preset", "cat", one_of([*causal.PRESETS, "custom"])),
                           tr("training.preset"), options=[*causal.PRESETS, "custom"],
                           format_func={p: tr(f"training.preset_{p}") for p in [*causal.PRESETS, "custom"]}.get)
    with c2:
        if preset == "custom":
            text = persisted(st.text_input, url_state("text", causal.PRESETS["cat"]), tr("training.custom_text"),
                             max_chars=400)
        else:
            text = causal.PRESETS[preset]
            st.text_input(tr("training.text"), value=text, disabled=True)
    try:
        ids = causal.demo_ids(backend.tokenizer, text)
    except InputError as exc:
        return exc
    steps_key = url_state("steps", 8, int_in(1, causal.MAX_DEMO_TOKENS - 1))
    st.session_state[steps_key] = min(st.session_state[steps_key], len(ids) - 1)  # a shorter text allows fewer
    with c3:
        steps = persisted(st.slider, steps_key, tr("training.steps"), min_value=1, max_value=len(ids) - 1,
                          help=tr("training.steps_help"))
    st.caption(tr("training.token_caption", n_tokens=len(ids), n_prompt=len(ids) - steps, steps=steps,
                  max_tokens=causal.MAX_DEMO_TOKENS))
    model_caption(backend.spec)
    try:  # a hosted demo's caps hold here too: this page runs the model over the whole text
        check_request(settings, backend, batch=1, prompt_tokens=len(ids) - steps, max_new_tokens=steps)
    except InputError as exc:
        return exc
    return ids, steps


def equal_section(run: Run, title: str, result: causal.ParallelVsSequential, agree: dict) -> None:
    """Idea 1: the parallel pass and prefill + decode give the same K/V and logits, up to rounding."""
    from kvviz.engine import tolerance

    idea_title(title)
    if not run.lecture:  # said aloud on a projector
        left, right = st.columns(2)
        left.markdown(tr("training.parallel_text", n_tokens=len(run.ids)))
        right.markdown(tr("training.sequential_text", n_prompt=run.n_prompt, steps=run.steps))
        m = st.columns(4)
        m[0].metric(tr("training.max_dk"), fmt(agree["K"].diff))
        m[1].metric(tr("training.max_dv"), fmt(agree["V"].diff))
        m[2].metric(tr("training.max_dlogits"), fmt(agree["logits"].diff))
        m[3].metric(tr("training.argmax_agree"), f"{result.same_argmax} / {len(run.ids)}")
    beyond = [name for name, a in agree.items() if not a.within]
    if not beyond:
        st.success(tr("training.equal", dk=fmt(agree["K"].diff), dv=fmt(agree["V"].diff),
                      dlogits=fmt(agree["logits"].diff), tk=fmt(agree["K"].tolerance),
                      tv=fmt(agree["V"].tolerance), tlogits=fmt(agree["logits"].tolerance)))
    else:
        worst = agree[beyond[0]]
        st.warning(tr("training.not_equal", what=tr(f"training.what_{beyond[0]}"), diff=fmt(worst.diff),
                      tol=fmt(worst.tolerance)))
    tol = agree["logits"].tolerance
    chart(charts.logits_diff_figure(
        result.logits_max_diff, run.n_prompt, tol, title=tr("training.logits_title"), x_title=tr("training.position"),
        y_title=tr("training.max_dlogits"), prefill_name=tr("training.prefill_positions"),
        decode_name=tr("training.decode_positions"), tolerance_name=tr("training.tolerance", tol=fmt(tol)),
        lecture=run.lecture), key="training_logits_diff")
    note = result.logits_note(tol)
    dtype = run.torch_dtype
    st.caption(tr(f"training.logits_note_{note['note']}", n_exact=note["n_exact"], n_prefill=note["n_prefill"],
                  prefill_max=fmt(note["prefill_max"]), decode_max=fmt(note["decode_max"]), tol=fmt(tol))
               + ("" if run.lecture else " " + tr("training.tolerance_rule", eps=fmt(tolerance.eps(dtype)),
                                                  dtype=str(dtype).removeprefix("torch."))))


def kv_section(run: Run, title: str, result: causal.ParallelVsSequential, par: causal.KVPass | None,
               seq: causal.KVPass | None, picks: dict | None = None) -> dict:
    """Idea 2: one layer's and head's K or V from both paths, side by side, and their difference. `picks`: the
    layer, head and tensor with both matrices, as a room follower got them from the lecturer (no box of the
    follower's); None: the boxes. Returns what was drawn."""
    idea_title(title)
    # On a projector the K/V take the whole width; the mask they follow is the next idea's.
    mask_col, kv_col = (None, st.container()) if run.lecture else run.pair()
    if mask_col is not None:
        with mask_col:
            run.mask_chart(True, tr("training.mask_title"), "training_mask")
    with kv_col:
        if picks is None:
            s1, s2, s3 = st.columns(3)
            layer = s1.selectbox(tr("training.layer"), run.layers, index=len(run.layers) - 1,
                                 format_func=run.layer_label, key="s1_layer")
            head_ = s2.selectbox(tr("training.kv_head"), range(run.n_kv_heads), key="s1_head")
            which = s3.radio(tr("training.tensor"), ["K", "V"], horizontal=True, key="s1_tensor")
            pick = (lambda p: p.keys) if which == "K" else (lambda p: p.values)
            a, b = pick(par)[layer][head_].numpy(), pick(seq)[layer][head_].numpy()
            picks = {"layer": layer, "head": head_, "which": which, "parallel": a.tolist(),
                     "sequential": b.tolist(), "dtype": str(a.dtype)}
        else:
            which = picks["which"]
            a, b = _array(picks["parallel"], picks["dtype"]), _array(picks["sequential"], picks["dtype"])
        chart(charts.kv_side_by_side(
            a, b, run.tokens,
            titles=[tr("training.from_parallel", t=which), tr("training.from_sequential", t=which),
                    tr("training.abs_diff")],
            position_axis=tr("training.position"), dim_axis=tr("training.dim"), lecture=run.lecture),
            key="training_kv")
    if not run.lecture:  # on a projector the verdict of idea 1 gives the largest difference
        with st.expander(tr("training.by_layer")):
            table({
                tr("training.layer"): run.layers,
                tr("training.max_dk"): [f"{d:.3e}" for d in result.k_max_diff],
                tr("training.max_dv"): [f"{d:.3e}" for d in result.v_max_diff],
            }, key="training_kv_diff_by_layer")
    return picks


def mask_section(run: Run, title: str, both: list[causal.PastDrift], mode: str | None = None) -> str:
    """Idea 3: append one token; under the causal mask the past K/V stay, without it they move above layer 0.
    `both`: the drift with the mask and without; `mode`: the one a room follower got from the lecturer (no switch
    of the follower's); None: the switch. Returns the mode drawn."""
    from kvviz.lessons import causal

    idea_title(title)
    if not run.lecture:
        st.markdown(tr("training.s2_text"))
    # On a projector the switch sits beside its verdict (one screen); on the page above it.
    switch, said = st.columns([1, 3], vertical_alignment="center") if run.lecture else (st.container(),) * 2
    if mode is None:
        mode = persisted(switch.radio, url_state("attn", "causal", one_of(["causal", "bidirectional"])),
                         tr("training.attention_mode"), options=["causal", "bidirectional"],
                         format_func={m: tr(f"training.mode_{m}") for m in ("causal", "bidirectional")}.get,
                         horizontal=not run.lecture, label_visibility="collapsed" if run.lecture else "visible")
    d = both[0] if mode == "causal" else both[1]
    verdicts = d.kv_agreements(run.torch_dtype, run.n_terms)
    y_max = max(max(x.k_max_diff + x.v_max_diff) for x in both)
    first = 1  # every layer after the first (0-based, as the model's own tensor names count them)
    if not run.lecture:  # the verdict below gives the largest change and its limit
        m = st.columns(3)
        m[0].metric(tr("training.layer1_change"), fmt(d.max_change(0, 1)))
        m[1].metric(tr("training.upper_change", first=first), fmt(d.max_change(first)))
        m[2].metric(tr("training.past_logits_change"), fmt(d.logits_max_diff))
    changed, largest = causal.drift_verdict(verdicts)  # the number in the metrics above, with its layer's limit
    mode_name = tr(f"training.mode_{mode}")
    if not changed:
        said.success(tr("training.causal_verdict", mode=mode_name, n_past=d.n_past, change=fmt(largest.diff),
                        tol=fmt(largest.tolerance)))
    else:
        said.error(tr("training.bidirectional_verdict", mode=mode_name, n_past=d.n_past, n_changed=len(changed),
                      n_layers=len(verdicts), change=f"{largest.diff:.3g}", tol=fmt(largest.tolerance)))
    mask_col, drift_col = run.pair()
    with mask_col:
        run.mask_chart(mode == "causal", tr(f"training.mask_{mode}"), "training_mode_mask")
    with drift_col:
        chart(charts.drift_figure(d.k_max_diff, d.v_max_diff, y_max, [a.tolerance for a in verdicts],
                                  title=tr("training.drift_title"), x_title=tr("training.layer"),
                                  y_title=tr("training.drift_axis"), k_name=tr("training.past_k"),
                                  v_name=tr("training.past_v"), tolerance_name=tr("training.tolerance_per_layer"),
                                  lecture=run.lecture), key="training_drift")
    layer0 = [x.kv_agreements(run.torch_dtype, run.n_terms)[0] for x in both]  # with and without the mask
    values = dict(causal=fmt(layer0[0].diff), bidirectional=fmt(layer0[1].diff),
                  tol=fmt(max(a.tolerance for a in layer0)))
    if not run.lecture:  # the presenter says why layer 0 never moves
        st.caption(tr("training.layer1_note", layer1=tr(f"training.layer1_{causal.overall(layer0)}", **values)))
    return mode


def attention_section(run: Run, title: str, picks: dict | None = None) -> dict:
    """Idea 4: the full causal attention matrix next to the one row the last decode step computes. `picks`: the
    layer and head with their rows, as a room follower got them from the lecturer (no box of the follower's); None:
    the boxes and the model. Returns what was drawn."""
    idea_title(title)
    if not run.lecture:
        st.markdown(tr("training.s3_text"))
    a1, a2, a3 = st.columns([1, 1, 3], vertical_alignment="bottom")
    if picks is None:
        layer = a1.selectbox(tr("training.layer"), run.layers, format_func=run.layer_label, key="s3_layer")
        head_ = a2.selectbox(tr("training.q_head"), range(run.n_heads), key="s3_head")
        rows = attention(run.model, run.key, run.ids, layer)
        full, decode_row = rows.full[head_].numpy(), rows.decode_row[head_].numpy()
        picks = {"layer": layer, "head": head_, "full": full.tolist(), "decode_row": decode_row.tolist(),
                 "dtype": str(full.dtype), "row_max_diff": rows.row_max_diff}
    else:
        layer, head_ = picks["layer"], picks["head"]
        full, decode_row = _array(picks["full"], picks["dtype"]), _array(picks["decode_row"], picks["dtype"])
    a3.caption(tr("training.rows_line", n=len(run.ids), diff=fmt(picks["row_max_diff"])))
    full_col, row_col = run.pair()
    with full_col:
        chart(charts.attention_figure(full, run.tokens, title=tr("training.attn_title", layer=layer, head=head_),
                                      key_axis=tr("training.key_axis"), query_axis=tr("training.query_axis"),
                                      new_row=tr("training.new_row"), past_rows=tr("training.past_rows"),
                                      lecture=run.lecture), key="training_attention")
    with row_col:
        chart(charts.decode_row_figure(decode_row, full[-1], run.tokens,
                                       title=tr("training.row_title"), x_title=tr("training.key_axis"),
                                       decode_name=tr("training.decode_row"), full_name=tr("training.full_row"),
                                       lecture=run.lecture), key="training_decode_row")
    return picks


def native_sections(backend: Any, settings: Settings, show: list[int], titles: list[str], settings_at: Any) -> dict:
    """Ideas 1–4 (they read K/V inside the layers); a text too short to run says so and skips only them. Returns
    what a lecture room's followers draw of them (`room_view`)."""
    from kvviz.lessons import causal

    with settings_at, settings_box(tr("training.settings")):
        share_button(settings.lecture)  # behind the settings button, as on Reusing Past K/V
        chosen = text_settings(backend, settings)
    if isinstance(chosen, InputError):
        show_error(chosen)
        return room_view(show)  # not st.stop(): the comparison table below still belongs on the page
    ids, steps = chosen
    run = Run.of(backend, tuple(ids), steps, settings.lecture)
    view = room_view(show, run)
    if {0, 1} & set(show):
        par, seq = passes(run.model, run.key, run.ids, run.n_prompt)
        result = causal.compare_passes(par, seq, run.n_prompt)
        view["result"] = asdict(result)
        if 0 in show:
            equal_section(run, titles[0], result, result.agreements(backend.dtype, run.n_terms))
        if 1 in show:
            view["kv"] = kv_section(run, titles[1], result, par, seq)
    if 2 in show:
        both = [drift(run.model, run.key, run.ids, c) for c in (True, False)]
        view["drift"] = [asdict(d) for d in both]
        view["mode"] = mask_section(run, titles[2], both)
    if 3 in show:
        view["attention"] = attention_section(run, titles[3])
    return view


# ---- a lecture room --------------------------------------------------------------------------------------------
# The page's boxes (kept in the link, or under the ideas' own keys), which "Explore from here" takes.
EXPLORED = ("kv_url_preset", "kv_url_text", "kv_url_steps", "kv_url_attn", "s1_layer", "s1_head", "s1_tensor",
            "s3_layer", "s3_head")


def room_view(show: list[int], run: Run | None = None) -> dict:
    """What a lecture room's followers draw of this page, as JSON: the ideas on screen, the text's tokens and the
    model's shape (None: nothing to run, a text refused or a model that is not kvviz's own), then per idea shown its
    numbers (native_sections adds them): the passes' differences, the K/V and attention rows on the lecturer's
    screen, the drift with and without the mask."""
    return {"shown": list(show), "run": None if run is None else run.to_json()}


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Training · Prefill · Decode: the lecturer's numbers, the ideas on the lecturer's
    screen (all of them when the lecturer is not in lecture mode), in this session's language; no model runs here,
    no box of this session's is drawn."""
    from kvviz.lessons import causal

    explore_from(view, "training", also=EXPLORED, help_key="room.explore_page_help")
    titles = [tr(f"training.{s}_title") for s in ("s1", "s1b", "s2", "s3", "s4")]
    shown = set(view["shown"])
    if view["run"] is None and shown & {0, 1, 2, 3}:
        st.info(tr("room.waiting_run"))
    elif view["run"] is not None:
        run = Run.from_json(view["run"], lecture)
        st.caption(tr("training.token_caption", n_tokens=len(run.ids), n_prompt=run.n_prompt, steps=run.steps,
                      max_tokens=causal.MAX_DEMO_TOKENS))
        if "result" in view:
            result = causal.ParallelVsSequential(**view["result"])
            if 0 in shown:
                equal_section(run, titles[0], result, result.agreements(run.torch_dtype, run.n_terms))
            if 1 in shown:
                kv_section(run, titles[1], result, None, None, view["kv"])
        if 2 in shown:
            mask_section(run, titles[2], [causal.PastDrift(**d) for d in view["drift"]], view["mode"])
        if 3 in shown:
            attention_section(run, titles[3], view["attention"])
    if 4 in shown:
        phase_section(titles[4])


def phase_section(title: str) -> None:
    """Idea 5: the table that compares training, prefill and decode."""
    idea_title(title)
    table(phase_table(), key="training_prefill_decode", prose=True)
    st.caption(tr("training.table_note"))
