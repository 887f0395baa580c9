"""Training · Prefill · Decode: one masked parallel pass equals prefill + decode; why causality allows the cache.
kvviz.app.views.training draws ideas 1–4 on a native model (and, in a lecture room, publishes their numbers and draws a
follower's page from them); kvviz.lessons.causal runs them."""
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import ideas, intro_box, lecture_head
from kvviz.app.models import get_backend, loading_engine
from kvviz.app.navigation import page_of
from kvviz.app.room.explore import page_settings
from kvviz.app.room.follow import room_part
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.views.training import EXPLORED, follow, native_sections, phase_section, room_view

PAGE = page_of(__file__)
settings = page_setup("training.title")
lecture = settings.lecture
head = lecture_head(tr("training.title"))
with head[0], intro_box():  # on a projector folded away: the presenter says it
    st.write(tr("training.intro"))
# A follower: the lecturer's numbers, drawn read-only, no model here; the lecturer: an open room's link.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
titles = [tr(f"training.{s}_title") for s in ("s1", "s1b", "s2", "s3", "s4")]
show = ideas(titles, "training")
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.engine.model import Decoder
    backend = get_backend(settings)

native = isinstance(getattr(backend, "model", None), Decoder)
view = room_view(show)  # what a lecture room's followers draw: no run without kvviz's own model
if backend is not None and not native:
    st.info(tr("training.needs_native"))
if native and set(show) & {0, 1, 2, 3}:
    view = native_sections(backend, settings, show, titles, head[1])
elif lecture:
    with head[1]:
        share_button(lecture)  # no settings on this idea: the button stands alone

if 4 in show:
    phase_section(titles[4])
if room is not None:  # and "Explore from here"
    room.publish(view, explore=page_settings(settings, "training", also=EXPLORED))
