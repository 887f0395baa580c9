"""Attention patterns: attention sinks (why StreamingLLM keeps the first tokens) and induction heads (copying).
kvviz.lessons.heads measures them on the model; kvviz.app.views.heads draws each idea from its numbers, which a
lecture room's followers get too."""
from __future__ import annotations

import numpy as np
import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import demo_seed, idea_title, ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import get_backend, loading_engine, model_caption
from kvviz.app.navigation import page_of
from kvviz.app.room.explore import page_settings
from kvviz.app.room.follow import room_part
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.state import page_state
from kvviz.app.url_state import one_of, url_state
from kvviz.app.views.heads import follow, idea_titles, induction, induction_numbers, sink_numbers, sinks
from kvviz.app.widgets import number_in_range, persisted
from kvviz.errors import InputError
from kvviz.training.prose import PROSE

PAGE = page_of(__file__)
settings = page_setup("heads.title")
state = page_state("heads", custom_text="")  # the other keys are number boxes and the link's, seeded where drawn
state.seed()
lecture = settings.lecture
head = lecture_head(tr("heads.title"))
with head[0], intro_box():  # on a projector folded away: the presenter says it
    st.write(tr("heads.intro"))
# A follower: the ideas on the lecturer's screen, from the lecturer's model's numbers; the lecturer: an open room.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
titles = idea_titles()
show = ideas(titles, "heads")
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.lessons import heads
    backend = get_backend(settings)
TEXTS = ("en", "ko", "custom")


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
    share_button(lecture)
    model_caption(backend.spec)
    inputs = st.container()

published = {"shown": show, "model": backend.spec.name}  # what a lecture room's followers draw
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
    if source == "custom" and not text.strip():  # nothing typed yet: what to do, not an error
        st.info(tr("heads.custom_hint", min_len=16), icon=":material/edit_note:")
    elif len(ids) < 16:
        show_error(InputError("heads.too_short", n_tokens=len(ids), min_len=16))
    else:
        rows = scores(backend, model_key(), tuple(ids), tuple(heads.random_tokens(backend, 50, 0)))
        published["sinks"] = sink_numbers(heads.grid(rows, "first"), len(ids), heads.uniform_first_share(len(ids)))
        sinks(published["sinks"], lecture)

if 1 in show:
    idea_title(titles[1], small=True)
    c1, c2 = inputs.columns(2)
    n_random = int(number_in_range(c1, tr("heads.n_random"), 10, min(200, (backend.spec.max_context or 400) // 2),
                                      50, "heads_n_random", help=tr("heads.n_random_help")))
    seed = int(number_in_range(c2, tr("heads.seed"), 0, 10**6, 0, "heads_seed"))
    repeat = heads.random_tokens(backend, n_random, demo_seed(seed))
    published["induction"] = induction_numbers(study(backend, model_key(), tuple(repeat)),
                                               copying(backend, model_key()))
    induction(published["induction"], lecture)
# "Explore from here": the lecturer's model and boxes, the seed as this run used it (lecture mode pins it)
explore = page_settings(settings, "heads", keep=("custom_text",), also=("kv_url_text",))
if 1 in show:
    explore["heads_seed"] = float(demo_seed(seed))
if room is not None:
    room.publish(published, explore=explore)
