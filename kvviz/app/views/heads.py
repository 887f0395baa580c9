"""What the Attention Patterns page draws: the sinks idea (`sinks`) and the induction idea (`induction`), each from
plain numbers (`sink_numbers`, `induction_numbers`: what the page draws, and what a lecture room's followers get),
and a room follower's page (`follow`). The numbers come from kvviz.lessons.heads on the lecturer's (or this
visitor's) model; nothing here imports torch, so a follower draws them without it."""
from __future__ import annotations

import numpy as np
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import idea_title
from kvviz.app.room.explore import explore_from
from kvviz.app.room.view import RoomView
from kvviz.app.widgets import chart
from kvviz.charts import heads as charts

THRESHOLD = 0.3  # prefix matching above this names a head an induction head here (a stated cut, not a law)


def idea_titles() -> list[str]:
    """The page's two ideas, in this session's language."""
    return [tr("heads.sinks_title"), tr("heads.induction_title")]


def sink_numbers(share: np.ndarray, n_tokens: int, uniform: float) -> dict:
    """The share of attention on position 0 per [layer, head] over a text of `n_tokens`, and what even attention
    would give (`uniform`), as JSON."""
    return {"share": share.tolist(), "n": n_tokens, "uniform": uniform}


def sinks(view: dict, lecture: bool) -> None:
    """Attention sinks: how many heads put most of their attention on the first token, the heatmap and each
    layer's profile."""
    share, uniform, n = np.asarray(view["share"], dtype=float), view["uniform"], view["n"]
    n_sinks = int((share > 0.5).sum())
    m1, m2, m3 = st.columns(3)
    m1.metric(tr("heads.metric_sink_heads"), f"{n_sinks} / {share.size}", help=tr("heads.metric_sink_heads_help"))
    m2.metric(tr("heads.metric_mean_share"), f"{share.mean():.1%}",
              help=tr("heads.metric_mean_share_help", uniform=f"{uniform:.1%}", n=n))
    m3.metric(tr("heads.metric_uniform"), f"{uniform:.1%}", help=tr("heads.metric_uniform_help", n=n))
    left, right = st.columns(2 if lecture else [3, 2])  # abreast on a projector too: one screen
    with left:
        chart(charts.sink_heatmap(
            share, title=tr("heads.sink_heatmap_title", n=n), x_title=tr("heads.axis_head"),
            y_title=tr("heads.axis_layer"), hover=tr("heads.sink_hover"), lecture=lecture), "heads_sinks")
    with right:
        chart(charts.layer_profile(
            share, uniform, title=tr("heads.profile_title"), x_title=tr("heads.axis_layer"),
            y_title=tr("heads.axis_share"), mean_name=tr("heads.profile_mean"), max_name=tr("heads.profile_max"),
            uniform_name=tr("heads.profile_uniform"), lecture=lecture), "heads_profile")
    if not lecture:  # on a projector the metrics above say it, and the presenter reads it out
        st.caption(tr("heads.sinks_reading_strong" if n_sinks else "heads.sinks_reading_none", n_sinks=n_sinks,
                      share=f"{share.mean():.1%}", uniform=f"{uniform:.1%}"))


def induction_numbers(study, copying: np.ndarray | None) -> dict:  # noqa: ANN001 - a lessons.heads.RepeatStudy
    """Random tokens seen twice: each position's loss, each head's prefix matching and OV copying score (None:
    unknown for this backend), and the two copies' mean losses, as JSON."""
    return {"n_random": study.n_random, "losses": list(study.losses), "prefix": study.prefix_matching.tolist(),
            "copying": None if copying is None else copying.tolist(), "first_copy": study.first_copy,
            "second_copy": study.second_copy, "drop": study.drop}


def induction(view: dict, lecture: bool) -> None:
    """Induction heads: the loss on each copy, the heads named by prefix matching and copying."""
    prefix, n_random, drop = np.asarray(view["prefix"], dtype=float), view["n_random"], view["drop"]
    ov = None if view["copying"] is None else np.asarray(view["copying"], dtype=float)
    named = int(((prefix > THRESHOLD) & ((ov > 0) if ov is not None else True)).sum())
    m1, m2, m3, m4 = st.columns(4)
    m1.metric(tr("heads.metric_first_copy"), f"{view['first_copy']:.2f}", help=tr("heads.metric_loss_help"))
    m2.metric(tr("heads.metric_second_copy"), f"{view['second_copy']:.2f}", delta=f"{-drop:+.2f}",
              delta_color="inverse")
    m3.metric(tr("heads.metric_induction_heads"), f"{named} / {prefix.size}",
              help=tr("heads.metric_induction_heads_help", threshold=THRESHOLD))
    m4.metric(tr("heads.metric_best_prefix"), f"{prefix.max():.2f}",
              help=tr("heads.metric_best_prefix_help", layer=int(prefix.argmax() // prefix.shape[1]),
                      head=int(prefix.argmax() % prefix.shape[1])))
    left, right = st.columns(2)
    with left:
        chart(charts.repeat_loss_chart(view["losses"], n_random, title=tr("heads.loss_title", n=n_random),
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
        cost = "heads.induction_cheaper" if drop >= 0 else "heads.induction_dearer"
        st.caption(tr(cost, drop=f"{abs(drop):.2f}") + " " + tr("heads.induction_reading", named=named,
                                                                   threshold=THRESHOLD))


def follow(view: RoomView, *, lecture: bool) -> None:
    """A lecture room follower's Attention Patterns: the ideas on the lecturer's screen (both when the lecturer is
    not in lecture mode), drawn from the lecturer's model's numbers in this session's language; no model here."""
    explore_from(view, "heads", keep=("custom_text",), also=("kv_url_text",), help_key="room.explore_page_help")
    st.caption(tr("room.lecturers_model", model=view["model"]))
    names = idea_titles()
    for i, (key, draw) in enumerate((("sinks", sinks), ("induction", induction))):
        if i not in view["shown"]:
            continue
        idea_title(names[i], small=True)
        if view.get(key) is None:  # the lecturer's text is too short to measure (said on the lecturer's screen)
            st.info(tr("room.waiting_run"))
        else:
            draw(view[key], lecture)
