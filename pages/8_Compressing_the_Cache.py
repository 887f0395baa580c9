"""Compressing the Cache: eviction, quantization and head sharing run in the real decode loop, bytes vs quality."""
import hashlib

import pandas as pd
import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import ideas, intro_box
from kvviz.app.models import get_backend, model_caption
from kvviz.app.shell import page_setup
from kvviz.app.url_state import one_of, url_state
from kvviz.app.widgets import chart, persisted, table
from kvviz.charts import compression as charts
from kvviz.compression import quality
from kvviz.compression.eviction import SNAPKV_KERNEL, SNAPKV_WINDOW, STREAMING_SINKS
from kvviz.compression.runner import Method, kivi_group
from kvviz.engine.model import Decoder
from kvviz.errors import InputError
from kvviz.units import format_binary

settings = page_setup("compression.title")
lecture = settings.lecture
st.title(tr("compression.title"))
with intro_box():
    st.write(tr("compression.intro"))
backend = get_backend(settings)
if backend is None:
    st.stop()
model_caption(backend.spec)
native = isinstance(getattr(backend, "model", None), Decoder)
if not native:
    st.info(tr("compression.native_needed"))

SOURCES = ("held_out", "own")
max_len = backend.spec.max_context
lengths = [n for n in (128, 256, 512) if n <= max_len] or [max_len]
c1, c2, c3, c4 = st.columns([2, 1, 1, 2])
source = persisted(c1.radio, url_state("text", "held_out", one_of(SOURCES)), tr("compression.text_source"),
                   options=SOURCES, format_func={s: tr(f"compression.text_{s}") for s in SOURCES}.get,
                   horizontal=True)
TOKENS = [256, 512] if settings.hosted is not None else [256, 512, 1024, 2048]  # a shared demo runs less


seq_len = persisted(c2.selectbox, url_state("seq", lengths[min(1, len(lengths) - 1)], one_of(lengths, int)),
                    tr("compression.seq_len"), options=lengths, help=tr("compression.seq_len_help"))
n_tokens = persisted(c3.selectbox, url_state("tokens", 512, one_of(TOKENS, int)), tr("compression.n_tokens"),
                     options=TOKENS)
shares = c4.multiselect(tr("compression.budgets"), [0.25, 0.5], default=[0.25, 0.5], key="cc_budgets",
                        format_func=lambda s: f"{s:.0%}", help=tr("compression.budgets_help"))
own = ""
if source == "own":
    own = st.text_area(tr("compression.own_text"), key="cc_own_text", height=120, max_chars=200_000)

budgets = sorted({max(SNAPKV_WINDOW + 1, round(s * seq_len)) for s in shares})
methods = quality.all_methods(budgets, native=native, n_kv_heads=backend.spec.n_kv_heads)
n_prompt = seq_len // 2
view_steps = tuple(sorted({round(f * (seq_len - n_prompt - 1)) for f in (0, 0.25, 0.5, 0.75, 1)}))
text_id = hashlib.sha1(own.encode()).hexdigest() if source == "own" else "held_out"
request = (backend.spec, str(backend.dtype), text_id, seq_len, n_tokens, tuple(budgets))

if st.button(tr("compression.run"), type="primary", key="cc_run"):
    bar = st.progress(0.0, text=tr("compression.running"))
    try:
        text = own if source == "own" else quality.held_out_text()
        with quality.torch_threads(1 if backend.device.type == "cpu" else None):
            rows = quality.evaluate(backend, [Method("full"), *methods], text, seq_len=seq_len, n_tokens=n_tokens,
                                    view_steps=view_steps, progress=lambda d, t: bar.progress(d / t))
        st.session_state.kv_compress = (request, rows)
    except InputError as exc:
        show_error(exc)
    bar.empty()

stored = st.session_state.get("kv_compress")
if stored is None or stored[0] != request:
    st.stop()
rows = stored[1]
full_row, rows = rows[0], rows[1:]
data = [r.to_dict() for r in rows]

titles = [tr("compression.s1_title"), tr("compression.s2_title"), tr("compression.s3_title")]
show = ideas(titles, "compression")
if 0 in show:
    st.header(tr("compression.s1_title"))
    st.caption(tr("compression.s1_caption", n_predicted=full_row.n_predicted, n_chunks=full_row.n_predicted // (
        seq_len - n_prompt), seq_len=seq_len, n_prompt=n_prompt, full_ppl=f"{full_row.full_perplexity:.3f}",
        full_bytes=format_binary(full_row.full_kv_bytes)))
    metric = st.radio(tr("compression.metric"), ["kl", "top1"], horizontal=True, key="cc_metric",
                      format_func={m: tr(f"compression.metric_{m}") for m in ("kl", "top1")}.get)
    fams = {f: tr(f"compression.family_{f}") for f in charts.FAMILY_COLORS}
    chart(charts.tradeoff_figure(data, metric=metric, family_names=fams, x_title=tr("compression.chart_x"),
                                 y_title=tr(f"compression.chart_{metric}"),
                                 title=tr("compression.chart_saved_title"), lecture=lecture), "compression_tradeoff")
    results = pd.DataFrame({
        tr("compression.table_method"): [tr("compression.full")] + [r["label"] for r in data],
        tr("compression.table_ppl"): [round(full_row.full_perplexity, 3)] + [round(r["perplexity"], 3) for r in data],
        tr("compression.table_kl"): [0.0] + [round(r["kl_divergence"], 5) for r in data],
        tr("compression.table_top1"): [1.0] + [round(r["top1_agreement"], 4) for r in data],
        tr("compression.table_bytes"): [full_row.full_kv_bytes] + [r["kv_bytes"] for r in data],
        tr("compression.table_formula"): [full_row.formula_bytes] + [r["formula_bytes"] for r in data],
        tr("compression.table_saved"): ["0%"] + [f"{r['memory_saved']:.1%}" for r in data],
    })
    table(results, "compression_table")
    with st.expander(tr("compression.notes_title")):
        st.markdown(tr("compression.notes", sinks=STREAMING_SINKS, window=SNAPKV_WINDOW, kernel=SNAPKV_KERNEL,
                       group=kivi_group(backend.spec.d_head), residual=Method("int4").residual))

if 1 in show or 2 in show:
    d1, d2, d3 = st.columns(3)
    step = d1.select_slider(tr("compression.s2_step"), options=list(view_steps), value=view_steps[-1],
                            key="cc_step")
    layer = d2.selectbox(tr("compression.s2_layer"), range(backend.spec.n_layers), key="cc_layer")
    view_full = full_row.views[step]
    position = view_full.position
    if 1 in show:
        st.header(tr("compression.s2_title"))
        st.caption(tr("compression.s2_caption", step=step, position=position))
        labels = [tr("compression.full")] + [r.label for r in rows]
        shares_ = [charts.kept_share(r.views[step].kept[layer], position + 1) for r in [full_row, *rows]]
        chart(charts.kept_strip_figure(labels, shares_, x_title=tr("compression.chart_strip_x"),
                                       title=tr("compression.chart_strip_title", layer=layer, step=step),
                                       lecture=lecture), "compression_strip")
    if 2 in show:
        st.header(tr("compression.s3_title"))
        pick = d3.selectbox(tr("compression.s3_method"), range(len(rows)), format_func=lambda i: rows[i].label,
                            key="cc_attn_method")
        st.caption(tr("compression.s3_caption"))
        v = rows[pick].views[step]
        chart(charts.attention_row_figure(
            charts.attention_by_position(view_full.kept[layer], view_full.attention[layer]),
            charts.attention_by_position(v.kept[layer], v.attention[layer]),
            full_name=tr("compression.full"), comp_name=rows[pick].label, x_title=tr("compression.chart_strip_x"),
            y_title=tr("compression.chart_attn_y"), title=tr("compression.chart_attn_title", layer=layer, step=step),
            lecture=lecture), "compression_attention")
