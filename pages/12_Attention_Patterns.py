"""Attention patterns: attention sinks (why StreamingLLM keeps the first tokens) and induction heads (copying)."""
from __future__ import annotations

import numpy as np
import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import demo_seed, idea_title, ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import get_backend, loading_engine, model_caption
from kvviz.app.shell import page_setup
from kvviz.app.state import page_state
from kvviz.app.url_state import one_of, url_state
from kvviz.app.widgets import chart, number_in_range, persisted
from kvviz.charts import heads as charts
from kvviz.errors import InputError
from kvviz.training.prose import PROSE

settings = page_setup("heads.title")
state = page_state("heads", custom_text="")  # the other keys are number boxes and the link's, seeded where drawn
state.seed()
lecture = settings.lecture
head = lecture_head(tr("heads.title"))
with head[0], intro_box():  # on a projector folded away: the presenter says it
    st.write(tr("heads.intro"))
titles = [tr("heads.sinks_title"), tr("heads.induction_title")]
show = ideas(titles, "heads")
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.lessons import heads
    backend = get_backend(settings)
TEXTS = ("en", "ko", "custom")
THRESHOLD = 0.3  # prefix matching above this names a head an induction head here (a stated cut, not a law)


def model_key() -> tuple:
    return backend.spec, str(backend.dtype), str(backend.device), backend.kind


@st.cache_data(max_entries=16, show_spinner=False)
def scores(_backend, key: tuple, ids: tuple[int, ...], repeat: tuple[int, ...]) -> list[heads.HeadScores]:
    return heads.head_scores(_backend, list(ids), repeat=list(repeat))


@st.cache_data(max_entries=16, show_spinner=False)
def study(_backend, key: tuple, repeat: tuple[int, ...]) -> heads.RepeatStudy:
    return heads.repeat_study(_backend, list(repeat))


@st.cache_data(max_entries=8, show_spinner=False)
def copying(_backend, key: tuple) -> np.ndarray | None:
    model = getattr(_backend, "model", None)
    return heads.copying_scores(model) if _backend.kind == "native" else None  # reads the decoder's weights


if backend is None:
    st.stop()
with head[1], settings_box(tr("heads.settings")):  # this idea's inputs; on a projector behind one button
    model_caption(backend.spec)
    inputs = st.container()

if 0 in show:
    idea_title(titles[0], small=True)
    c1, c2 = inputs.columns([1, 2])
    with c1:
        source = persisted(st.radio, url_state("text", "en", one_of(TEXTS)), tr("heads.text"),
                              options=TEXTS, format_func={s: tr(f"heads.text_{s}") for s in TEXTS}.get, horizontal=True)
        cap = min(1024, (backend.spec.max_context or 1024) - 1)
        n_max = int(number_in_range(st, tr("heads.max_tokens"), 16, cap, min(512, cap), "heads_max_tokens",
                                       help=tr("heads.max_tokens_help")))
    with c2:
        if source == "custom":
            text = persisted(st.text_area, state.key("custom_text"), tr("heads.custom_text"), height=120,
                                max_chars=8000)
        else:
            text = "\n\n".join(PROSE[source])
            st.caption(tr("heads.prose_caption"))
    ids = backend.tokenizer.encode(text)[:n_max]
    if len(ids) < 16:
        show_error(InputError("heads.too_short", n_tokens=len(ids), min_len=16))
    else:
        rows = scores(backend, model_key(), tuple(ids), tuple(heads.random_tokens(backend, 50, 0)))
        share = heads.grid(rows, "first")
        uniform = heads.uniform_first_share(len(ids))
        n_sinks = int((share > 0.5).sum())
        m1, m2, m3 = st.columns(3)
        m1.metric(tr("heads.metric_sink_heads"), f"{n_sinks} / {share.size}", help=tr("heads.metric_sink_heads_help"))
        m2.metric(tr("heads.metric_mean_share"), f"{share.mean():.1%}",
                  help=tr("heads.metric_mean_share_help", uniform=f"{uniform:.1%}", n=len(ids)))
        m3.metric(tr("heads.metric_uniform"), f"{uniform:.1%}", help=tr("heads.metric_uniform_help", n=len(ids)))
        left, right = st.columns(2 if lecture else [3, 2])  # abreast on a projector too: one screen
        with left:
            chart(charts.sink_heatmap(
                share, title=tr("heads.sink_heatmap_title", n=len(ids)), x_title=tr("heads.axis_head"),
                y_title=tr("heads.axis_layer"), hover=tr("heads.sink_hover"), lecture=lecture), "heads_sinks")
        with right:
            chart(charts.layer_profile(
                share, uniform, title=tr("heads.profile_title"), x_title=tr("heads.axis_layer"),
                y_title=tr("heads.axis_share"), mean_name=tr("heads.profile_mean"), max_name=tr("heads.profile_max"),
                uniform_name=tr("heads.profile_uniform"), lecture=lecture), "heads_profile")
        if not lecture:  # on a projector the metrics above say it, and the presenter reads it out
            st.caption(tr("heads.sinks_reading_strong" if n_sinks else "heads.sinks_reading_none", n_sinks=n_sinks,
                          share=f"{share.mean():.1%}", uniform=f"{uniform:.1%}"))

if 1 in show:
    idea_title(titles[1], small=True)
    c1, c2 = inputs.columns(2)
    n_random = int(number_in_range(c1, tr("heads.n_random"), 10, min(200, (backend.spec.max_context or 400) // 2),
                                      50, "heads_n_random", help=tr("heads.n_random_help")))
    seed = int(number_in_range(c2, tr("heads.seed"), 0, 10**6, 0, "heads_seed"))
    repeat = heads.random_tokens(backend, n_random, demo_seed(seed))
    rl = study(backend, model_key(), tuple(repeat))
    prefix = rl.prefix_matching
    ov = copying(backend, model_key())
    named = int(((prefix > THRESHOLD) & ((ov > 0) if ov is not None else True)).sum())
    m1, m2, m3, m4 = st.columns(4)
    m1.metric(tr("heads.metric_first_copy"), f"{rl.first_copy:.2f}", help=tr("heads.metric_loss_help"))
    m2.metric(tr("heads.metric_second_copy"), f"{rl.second_copy:.2f}", delta=f"{-rl.drop:+.2f}",
              delta_color="inverse")
    m3.metric(tr("heads.metric_induction_heads"), f"{named} / {prefix.size}",
              help=tr("heads.metric_induction_heads_help", threshold=THRESHOLD))
    m4.metric(tr("heads.metric_best_prefix"), f"{prefix.max():.2f}",
              help=tr("heads.metric_best_prefix_help", layer=int(prefix.argmax() // prefix.shape[1]),
                      head=int(prefix.argmax() % prefix.shape[1])))
    left, right = st.columns(2)
    with left:
        chart(charts.repeat_loss_chart(rl.losses, n_random, title=tr("heads.loss_title", n=n_random),
                                          x_title=tr("heads.axis_position"), y_title=tr("heads.axis_loss"),
                                          boundary=tr("heads.second_copy"), lecture=lecture), "heads_loss")
    with right:
        chart(charts.induction_scatter(prefix, ov, title=tr("heads.scatter_title"), x_title=tr("heads.axis_prefix"),
                                          y_title=tr("heads.axis_copying"), threshold=THRESHOLD,
                                          hover=tr("heads.scatter_hover"), lecture=lecture), "heads_induction")
    if ov is None:
        st.caption(tr("heads.copying_unknown"))
    if not lecture:  # on a projector the metrics above say it
        # drop > 0: the second copy is cheaper; below 0 it costs more, said as such (never "-0.04 less")
        cost = "heads.induction_cheaper" if rl.drop >= 0 else "heads.induction_dearer"
        st.caption(tr(cost, drop=f"{abs(rl.drop):.2f}") + " "
                   + tr("heads.induction_reading", named=named, threshold=THRESHOLD))
