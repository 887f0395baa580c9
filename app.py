"""Home: the decode loop as a diagram, the model in use, and a link into every page."""
import streamlit as st

from kvviz.app import ui
from kvviz.charts.decode import decode_loop_dot

settings = ui.page_setup("home.title")
st.title(ui.tr("home.title"))
titles = [ui.tr("home.loop_title"), ui.tr("home.model_title"), ui.tr("home.pages_title")]
show = ui.ideas(titles, "home")  # in lecture mode, one idea per screen

if 0 in show:
    st.write(ui.tr("home.summary"))
    st.subheader(titles[0])
    steps = [ui.tr(f"home.loop_{i}") for i in range(1, 7)]
    st.graphviz_chart(decode_loop_dot(steps, ui.tr("home.loop_repeat"), lecture=settings.lecture), width="stretch")
    st.caption(ui.tr("home.loop_caption"))

if 1 in show:
    st.subheader(titles[1])
    # The shipped model and a custom shape are described from their config alone: the first page a visitor
    # opens loads no weights and imports no torch. A Hugging Face model's description comes with loading it.
    spec = ui.settings_spec(settings)
    if spec is None:
        backend = ui.get_backend(settings)
        spec = backend.spec if backend is not None else None
    if spec is not None:
        ui.model_caption(spec)

if 2 in show:
    st.subheader(titles[2])
    for path, key in ui.NAV[1:]:
        if (ui.ROOT / path).exists():  # pages still being built are not linked yet
            st.page_link(path, label=ui.tr(key))
            st.caption(ui.tr("home.page_" + key.removeprefix("nav.")))

ui.preload_engine()  # the page is drawn: torch and the engine load in the background for the next one
