"""Moving the Cache: offload tiers and reuse across requests, TTFT loading vs recomputing, the break-even for real
deployments, and the prefill→decode handoff (kvviz workers and llama.cpp). kvviz.app.views.moving draws each idea;
kvviz.lessons.moving lays out its tables."""
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import idea_title, ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import get_backend, loading_engine, model_caption, shipped_for_hf
from kvviz.app.shell import page_setup
from kvviz.app.views.moving import break_even_view, deployment, handoff_view, requests_view, store_section, ttft_view

settings = page_setup("moving.title")
lecture = settings.lecture
head = lecture_head(tr("moving.title"))
with head[0]:
    about = intro_box()
with about:
    st.write(tr("moving.intro"))
settings = shipped_for_hf(settings, "moving.hf_note")  # the store copies into kvviz's own cache
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
if lecture:
    with box:
        model_caption(backend.spec)

demo = store_section(box, backend, settings.hosted)
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
    break_even_view(dep, box, backend, lecture)
if "handoff" in shown:
    idea_title(tr("moving.idea_handoff"), small=True)
    handoff_view(dep, box, backend, settings)
with about if lecture else st.expander(tr("moving.rules_title")):  # on a projector with the introduction, folded
    if lecture:
        st.markdown(f"**{tr('moving.rules_title')}**")
    st.markdown(tr("moving.rules"))
