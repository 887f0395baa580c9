"""Training · Prefill · Decode: one masked parallel pass equals prefill + decode; why causality allows the cache."""
import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import idea_title, ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import check_request, get_backend, loading_engine, model_caption
from kvviz.app.shell import page_setup
from kvviz.app.url_state import int_in, one_of, url_state
from kvviz.app.widgets import chart, persisted, table
from kvviz.charts import training as charts
from kvviz.engine.tokenizer import chip_labels
from kvviz.errors import InputError

settings = page_setup("training.title")
lecture = settings.lecture
head = lecture_head(tr("training.title"))
with head[0], intro_box():  # on a projector folded away: the presenter says it
    st.write(tr("training.intro"))
titles = [tr(f"training.{s}_title") for s in ("s1", "s1b", "s2", "s3", "s4")]
show = ideas(titles, "training")
with loading_engine():  # the first screen is drawn: now torch and the model
    import pandas as pd  # ~1,000 modules with pyarrow: after the first screen

    from kvviz.engine import tolerance
    from kvviz.engine.model import Decoder
    from kvviz.lessons import causal
    backend = get_backend(settings)


def model_key() -> tuple:
    # Weights are a pure function of these settings (seeded init or a fixed checkpoint).
    return backend.spec, str(backend.dtype), str(backend.device)


@st.cache_data(max_entries=16, show_spinner=False)
def drift(_model: Decoder, key: tuple, ids: tuple[int, ...], is_causal: bool) -> causal.PastDrift:
    return causal.past_kv_drift(_model, list(ids), causal=is_causal)


@st.cache_resource(max_entries=8, show_spinner=False)  # read-only tensors derived from shared weights
def passes(_model: Decoder, key: tuple, ids: tuple[int, ...], n_prompt: int) -> tuple[causal.KVPass, causal.KVPass]:
    return causal.run_parallel(_model, list(ids)), causal.run_sequential(_model, list(ids), n_prompt)


@st.cache_data(max_entries=16, show_spinner=False)
def attention(_model: Decoder, key: tuple, ids: tuple[int, ...], layer: int) -> causal.AttentionRows:
    return causal.attention_rows(_model, list(ids), layer)


def pair() -> tuple:
    """Two charts side by side (in lecture mode in halves, so both fit one screen)."""
    return st.columns(2 if lecture else [2, 3])


def phase_table() -> pd.DataFrame:
    columns = ["phase", "inputs", "computation", "stored", "latency"]
    rows = [[tr(f"training.table_{phase}_{col}") for col in columns] for phase in ("training", "prefill", "decode")]
    return pd.DataFrame(rows, columns=[tr(f"training.table_col_{col}") for col in columns])


model = getattr(backend, "model", None)
native = isinstance(model, Decoder)
if backend is not None and not native:
    st.info(tr("training.needs_native"))

def fmt(x: float) -> str:
    return f"{x:.2e}"


def text_settings() -> tuple[list[int], int] | InputError:
    """The text and the decode steps (in lecture mode behind the settings button): the token ids and the steps, or
    why they cannot run (said on the page, never inside a closed popover)."""
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
    ids = backend.tokenizer.encode(text)[: causal.MAX_DEMO_TOKENS]
    if len(ids) < 2:
        return InputError("training.too_short", n_tokens=len(ids), min_len=2)
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


def native_sections() -> None:
    """Sections 1–4 (they read K/V inside the layers); a text too short to run says so and skips only them."""
    with head[1], settings_box(tr("training.settings")):
        chosen = text_settings()
    if isinstance(chosen, InputError):
        show_error(chosen)
        return  # not st.stop(): the comparison table below still belongs on the page
    ids, steps = chosen
    n_prompt = len(ids) - steps
    tokens = chip_labels([backend.tokenizer.token_text(i) for i in ids])  # byte runs as their characters
    key, ids_t = model_key(), tuple(ids)
    dtype, n_terms = backend.dtype, backend.spec.d_model  # the tolerance's precision and dot-product length
    dtype_name = str(dtype).removeprefix("torch.")
    layer_options = list(range(backend.spec.n_layers))
    # 0-based on every page, as the model's own tensor names count them (model.layers.0)
    layer_label = {i: tr("training.layer_n", layer=i) for i in layer_options}.get

    if {0, 1} & set(show):
        par, seq = passes(model, key, ids_t, n_prompt)
        result = causal.compare_passes(par, seq, n_prompt)
        agree = result.agreements(dtype, n_terms)
    if 0 in show:
        idea_title(titles[0])
        if not lecture:  # said aloud on a projector
            left, right = st.columns(2)
            left.markdown(tr("training.parallel_text", n_tokens=len(ids)))
            right.markdown(tr("training.sequential_text", n_prompt=n_prompt, steps=steps))
            m = st.columns(4)
            m[0].metric(tr("training.max_dk"), fmt(agree["K"].diff))
            m[1].metric(tr("training.max_dv"), fmt(agree["V"].diff))
            m[2].metric(tr("training.max_dlogits"), fmt(agree["logits"].diff))
            same = sum(a == b for a, b in zip(result.parallel_argmax, result.sequential_argmax, strict=True))
            m[3].metric(tr("training.argmax_agree"), f"{same} / {len(ids)}")
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
            result.logits_max_diff, n_prompt, tol, title=tr("training.logits_title"), x_title=tr("training.position"),
            y_title=tr("training.max_dlogits"), prefill_name=tr("training.prefill_positions"),
            decode_name=tr("training.decode_positions"), tolerance_name=tr("training.tolerance", tol=fmt(tol)),
            lecture=lecture), key="training_logits_diff")
        prefill, decode = result.logits_max_diff[:n_prompt], result.logits_max_diff[n_prompt:]
        note = "within" if max(result.logits_max_diff) <= tol else "beyond"
        st.caption(tr(f"training.logits_note_{note}", n_exact=sum(d == 0 for d in prefill), n_prefill=len(prefill),
                      prefill_max=fmt(max(prefill)), decode_max=fmt(max(decode)), tol=fmt(tol))
                   + ("" if lecture else " " + tr("training.tolerance_rule", eps=fmt(tolerance.eps(dtype)),
                                                  dtype=dtype_name)))

    if 1 in show:
        idea_title(titles[1])
        # On a projector the K/V take the whole width; the mask they follow is the next idea's.
        mask_col, kv_col = (None, st.container()) if lecture else pair()
        if mask_col is not None:
            with mask_col:
                chart(charts.mask_figure(tokens, True, title=tr("training.mask_title"),
                                         key_axis=tr("training.key_axis"), query_axis=tr("training.query_axis"),
                                         allowed=tr("training.allowed"), masked=tr("training.masked"),
                                         lecture=lecture), key="training_mask")
        with kv_col:
            s1, s2, s3 = st.columns(3)
            layer = s1.selectbox(tr("training.layer"), layer_options, index=len(layer_options) - 1,
                                 format_func=layer_label, key="s1_layer")
            head_ = s2.selectbox(tr("training.kv_head"), range(backend.spec.n_kv_heads), key="s1_head")
            which = s3.radio(tr("training.tensor"), ["K", "V"], horizontal=True, key="s1_tensor")
            pick = (lambda p: p.keys) if which == "K" else (lambda p: p.values)
            chart(charts.kv_side_by_side(
                pick(par)[layer][head_].numpy(), pick(seq)[layer][head_].numpy(), tokens,
                titles=[tr("training.from_parallel", t=which), tr("training.from_sequential", t=which),
                        tr("training.abs_diff")],
                position_axis=tr("training.position"), dim_axis=tr("training.dim"), lecture=lecture),
                key="training_kv")
        if not lecture:  # on a projector the verdict of idea 1 gives the largest difference
            with st.expander(tr("training.by_layer")):
                table(pd.DataFrame({
                    tr("training.layer"): list(layer_options),
                    tr("training.max_dk"): [f"{d:.3e}" for d in result.k_max_diff],
                    tr("training.max_dv"): [f"{d:.3e}" for d in result.v_max_diff],
                }), key="training_kv_diff_by_layer")

    if 2 in show:
        idea_title(titles[2])
        if not lecture:
            st.markdown(tr("training.s2_text"))
        # On a projector the switch sits beside its verdict (one screen); on the page above it.
        switch, said = st.columns([1, 3], vertical_alignment="center") if lecture else (st.container(),) * 2
        mode = persisted(switch.radio, url_state("attn", "causal", one_of(["causal", "bidirectional"])),
                         tr("training.attention_mode"), options=["causal", "bidirectional"],
                         format_func={m: tr(f"training.mode_{m}") for m in ("causal", "bidirectional")}.get,
                         horizontal=not lecture, label_visibility="collapsed" if lecture else "visible")
        both = [drift(model, key, ids_t, c) for c in (True, False)]
        d = both[0] if mode == "causal" else both[1]
        verdicts = d.kv_agreements(dtype, n_terms)
        y_max = max(max(x.k_max_diff + x.v_max_diff) for x in both)
        first = 1  # every layer after the first (0-based, as the model's own tensor names count them)
        if not lecture:  # the verdict below gives the largest change and its limit
            m = st.columns(3)
            m[0].metric(tr("training.layer1_change"), fmt(max(d.k_max_diff[0], d.v_max_diff[0])))
            m[1].metric(tr("training.upper_change", first=first),
                        fmt(max(d.k_max_diff[first:] + d.v_max_diff[first:], default=0.0)))
            m[2].metric(tr("training.past_logits_change"), fmt(d.logits_max_diff))
        changed = [a for a in verdicts if not a.within]
        mode_name = tr(f"training.mode_{mode}")
        if not changed:
            largest = max(verdicts, key=lambda a: a.diff)  # the number in the metrics above, with its layer's limit
            said.success(tr("training.causal_verdict", mode=mode_name, n_past=d.n_past, change=fmt(largest.diff),
                            tol=fmt(largest.tolerance)))
        else:
            largest = max(changed, key=lambda a: a.diff)
            said.error(tr("training.bidirectional_verdict", mode=mode_name, n_past=d.n_past, n_changed=len(changed),
                          n_layers=len(verdicts), change=f"{largest.diff:.3g}", tol=fmt(largest.tolerance)))
        mask_col, drift_col = pair()
        with mask_col:
            chart(charts.mask_figure(tokens, mode == "causal", title=tr(f"training.mask_{mode}"),
                                     key_axis=tr("training.key_axis"), query_axis=tr("training.query_axis"),
                                     allowed=tr("training.allowed"), masked=tr("training.masked"), lecture=lecture),
                  key="training_mode_mask")
        with drift_col:
            chart(charts.drift_figure(d.k_max_diff, d.v_max_diff, y_max, [a.tolerance for a in verdicts],
                                      title=tr("training.drift_title"), x_title=tr("training.layer"),
                                      y_title=tr("training.drift_axis"), k_name=tr("training.past_k"),
                                      v_name=tr("training.past_v"),
                                      tolerance_name=tr("training.tolerance_per_layer"), lecture=lecture),
                  key="training_drift")
        first = [x.kv_agreements(dtype, n_terms)[0] for x in both]  # layer 1, with and without the mask
        values = dict(causal=fmt(first[0].diff), bidirectional=fmt(first[1].diff),
                      tol=fmt(max(a.tolerance for a in first)))
        state = "exact" if all(a.exact for a in first) else "within" if all(a.within for a in first) else "beyond"
        if not lecture:  # the presenter says why layer 0 never moves
            st.caption(tr("training.layer1_note", layer1=tr(f"training.layer1_{state}", **values)))

    if 3 in show:
        idea_title(titles[3])
        if not lecture:
            st.markdown(tr("training.s3_text"))
        a1, a2, a3 = st.columns([1, 1, 3], vertical_alignment="bottom")
        layer = a1.selectbox(tr("training.layer"), layer_options, format_func=layer_label, key="s3_layer")
        head_ = a2.selectbox(tr("training.q_head"), range(backend.spec.n_heads), key="s3_head")
        rows = attention(model, key, ids_t, layer)
        n = len(ids)
        a3.caption(tr("training.rows_line", n=n, diff=fmt(rows.row_max_diff)))
        full_col, row_col = pair()
        with full_col:
            chart(charts.attention_figure(rows.full[head_].numpy(), tokens,
                                          title=tr("training.attn_title", layer=layer, head=head_),
                                          key_axis=tr("training.key_axis"), query_axis=tr("training.query_axis"),
                                          new_row=tr("training.new_row"), past_rows=tr("training.past_rows"),
                                          lecture=lecture), key="training_attention")
        with row_col:
            chart(charts.decode_row_figure(rows.decode_row[head_].numpy(), rows.full[head_, -1].numpy(), tokens,
                                           title=tr("training.row_title"), x_title=tr("training.key_axis"),
                                           decode_name=tr("training.decode_row"), full_name=tr("training.full_row"),
                                           lecture=lecture), key="training_decode_row")


if native and set(show) & {0, 1, 2, 3}:
    native_sections()

if 4 in show:
    idea_title(titles[4])
    table(phase_table(), key="training_prefill_decode", prose=True)
    st.caption(tr("training.table_note"))
