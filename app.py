"""Home: the decode loop and the model in use."""
import streamlit as st

from kvviz import ui

settings = ui.page_setup("home.title")
st.title(ui.tr("home.title"))
st.write(ui.tr("home.summary"))
backend = ui.get_backend(settings)
if backend is not None:
    ui.model_caption(backend)
