"""Moving the Cache: offload tiers and reuse across requests, TTFT loading vs recomputing, the break-even for real
deployments, and the prefill→decode handoff (kvviz workers and llama.cpp). kvviz.app.views.moving draws each idea;
kvviz.lessons.moving lays out its tables; in a lecture room each idea's numbers are published and a follower's page is
drawn from them (views/moving.py room_view, follow)."""
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import idea_title, ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import get_backend, loading_engine, model_caption, shipped_for_hf
from kvviz.app.navigation import page_of
from kvviz.app.room.explore import page_settings
from kvviz.app.room.follow import room_part
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.views.moving import (
    break_even_view,
    deployment,
    follow,
    handoff_view,
    requests_view,
    room_view,
    store_section,
    store_state,
    ttft_view,
)

PAGE = page_of(__file__)

settings = page_setup("moving.title")
lecture = settings.lecture
head = lecture_head(tr("moving.title"))
with head[0]:
    about = intro_box()
with about:
    st.write(tr("moving.intro"))
settings = shipped_for_hf(settings, "moving.hf_note")  # the store copies into kvviz's own cache
# A follower: the lecturer's numbers, drawn read-only, no model here; the lecturer: an open room's link.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
IDEAS = ("tiers", "ttft", "break_even", "handoff")
shown = {IDEAS[i] for i in ideas([tr(f"moving.idea_{name}") for name in IDEAS], "moving")}
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.engine.backends.native import NativeBackend
    backend = get_backend(settings)
if not isinstance(backend, NativeBackend):
    st.stop()
if not lecture:  # on a projector behind the settings button
    model_caption(backend.spec)
with head[1]:  # on a projector one button holds the store's settings, the deployment's and the links
    box = settings_box()
with box:
    share_button(lecture)  # behind the settings button, as on Reusing Past K/V
if lecture:
    with box:
        model_caption(backend.spec)

demo = store_section(box, backend, settings.hosted)
parts = {}  # each idea's numbers, as drawn: what a lecture room's followers draw
if demo is not None:
    parts["store"] = store_state(demo)
if demo is not None and "tiers" in shown:
    idea_title(tr("moving.idea_tiers"), small=True)
    requests_view(demo, lecture)
if demo is not None and "ttft" in shown:
    idea_title(tr("moving.idea_ttft"), small=True)
    ttft_view(demo, backend, lecture)
# On a projector the deployment is chosen behind the settings button, whichever idea is on screen.
dep = deployment(box) if lecture else deployment(st) if shown & {"break_even", "handoff"} else None
if dep is not None and "break_even" in shown:
    idea_title(tr("moving.idea_break_even"), small=True)
    parts["links"] = break_even_view(dep, box, backend, lecture)
if "handoff" in shown:
    idea_title(tr("moving.idea_handoff"), small=True)
    parts["handoff"] = handoff_view(dep, box, backend, settings)
with about if lecture else st.expander(tr("moving.rules_title")):  # on a projector with the introduction, folded
    if lecture:
        st.markdown(f"**{tr('moving.rules_title')}**")
    st.markdown(tr("moving.rules"))
if room is not None:
    room.publish(room_view(shown, parts, dep, backend.spec.name, str(backend.device)),
                 explore=page_settings(settings, "moving"))
