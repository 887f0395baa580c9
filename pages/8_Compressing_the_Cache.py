"""Compressing the Cache: eviction, quantization and head sharing run in the real decode loop, bytes vs quality.
kvviz.app.views.compression draws each part (and, in a lecture room, publishes the measured rows and draws a
follower's page from them); kvviz.compression.quality measures it."""
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import get_backend, loading_engine, model_caption
from kvviz.app.navigation import page_of
from kvviz.app.room.explore import page_settings
from kvviz.app.room.follow import room_part
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.views.compression import (
    LINKED,
    choices,
    follow,
    measured,
    method_name,
    positions_view,
    progress,
    room_view,
    run_buttons,
    tradeoff_view,
)

PAGE = page_of(__file__)

settings = page_setup("compression.title")
lecture = settings.lecture
head = lecture_head(tr("compression.title"), widths=(3, 4))
with head[0], intro_box():
    st.write(tr("compression.intro"))
# A follower: the lecturer's measured rows, drawn read-only, no model here; the lecturer: an open room's link.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
titles = [tr("compression.s1_title"), tr("compression.s2_title"), tr("compression.s3_title")]
show = ideas(titles, "compression")
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.compression.caches import dtype_name
    from kvviz.engine.model import Decoder
    backend = get_backend(settings)
if backend is None:
    st.stop()
native = isinstance(getattr(backend, "model", None), Decoder)
with head[1]:  # on a projector one row: the settings behind a button, the run button beside it
    controls = st.container(horizontal=True, vertical_alignment="center") if lecture else st.container()
with controls:
    box = settings_box()
with box:
    share_button(lecture)  # behind the settings button, as on Reusing Past K/V
    model_caption(backend.spec)
if not native:
    (st if lecture else box).info(tr("compression.native_needed"))

chosen = choices(box, backend, native=native, hosted=settings.hosted, lecture=lecture)
running = run_buttons(controls, backend, chosen, lecture=lecture)
progress(backend, running)
stored = measured(backend, chosen.request)
run_dtype = dtype_name(backend.dtype)
shape = {"model": backend.spec.name, "run_dtype": run_dtype, "d_head": backend.spec.d_head,
         "n_layers": backend.spec.n_layers}
explore = page_settings(settings, "compression", also=LINKED)  # the lecturer's model and boxes, for "Explore from here"
if stored is None:
    if room is not None:  # followers: waiting, or measuring
        room.publish(room_view(show, None, {}, running=running, **shape), explore=explore)
    st.stop()
seq_len = stored[0][3]  # what the figures below describe is the run's, not the controls'
full_row, rows = stored[1][0], stored[1][1:]
names = [method_name(r) for r in rows]  # read now: a widget may format its options after this run
picks = {}  # the lecturer's choices the figures are drawn with: a room's followers draw theirs with them
if 0 in show:
    picks |= tradeoff_view(full_row, rows, names, seq_len, run_dtype=run_dtype, d_head=backend.spec.d_head,
                           lecture=lecture)
if 1 in show or 2 in show:
    picks |= positions_view(full_row, rows, names, seq_len, set(show), n_layers=backend.spec.n_layers,
                            lecture=lecture)
if room is not None:
    room.publish(room_view(show, stored, picks, running=running, **shape), explore=explore, picks=picks)
