"""Home: the decode loop as a diagram, the model in use, and a link into every page."""
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import idea_title, ideas
from kvviz.app.models import model_caption, model_spec, preload_engine
from kvviz.app.navigation import page_map
from kvviz.app.shell import page_setup
from kvviz.charts.decode import decode_loop_dot

settings = page_setup("home.title")
st.title(tr("home.title"))
titles = [tr("home.loop_title"), tr("home.model_title"), tr("home.pages_title")]
show = ideas(titles, "home")  # in lecture mode, one idea per screen

if 0 in show:
    st.write(tr("home.summary"))
    idea_title(titles[0], small=True)
    steps = [tr(f"home.loop_{i}") for i in range(1, 7)]
    st.graphviz_chart(decode_loop_dot(steps, tr("home.loop_repeat"), lecture=settings.lecture), width="stretch")
    st.caption(tr("home.loop_caption"))

if 1 in show:
    idea_title(titles[1], small=True)
    # The shipped model and a custom shape are described from their config alone: the first page a visitor
    # opens loads no weights and imports no torch. A Hugging Face model's description comes with loading it.
    spec = model_spec(settings)
    if spec is not None:
        model_caption(spec)

if 2 in show:
    idea_title(titles[2], small=True)
    page_map(compact=settings.lecture)  # the sidebar's sections, each page with what it shows

preload_engine()  # the page is drawn: torch and the engine load in the background for the next one
