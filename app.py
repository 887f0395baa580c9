"""Home: the decode loop as a diagram, the model in use, and a link into every page."""
import streamlit as st

from kvviz.app import ui
from kvviz.charts.decode import decode_loop_dot

settings = ui.page_setup("home.title")
st.title(ui.tr("home.title"))
st.write(ui.tr("home.summary"))

st.subheader(ui.tr("home.loop_title"))
steps = [ui.tr(f"home.loop_{i}") for i in range(1, 7)]
st.graphviz_chart(decode_loop_dot(steps, ui.tr("home.loop_repeat"), lecture=settings.lecture), width="stretch")
st.caption(ui.tr("home.loop_caption"))

st.subheader(ui.tr("home.model_title"))
backend = ui.get_backend(settings)
if backend is not None:
    ui.model_caption(backend)

st.subheader(ui.tr("home.pages_title"))
for path, key in ui.NAV[1:]:
    if (ui.ROOT / path).exists():  # pages still being built are not linked yet
        st.page_link(path, label=ui.tr(key))
        st.caption(ui.tr("home.page_" + key.removeprefix("nav.")))
