"""Training · Prefill · Decode: one masked parallel pass equals prefill + decode; why causality allows the cache.
kvviz.app.views.training draws ideas 1–4 on a native model; kvviz.lessons.causal runs them."""
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import idea_title, ideas, intro_box, lecture_head
from kvviz.app.models import get_backend, loading_engine
from kvviz.app.shell import page_setup
from kvviz.app.views.training import native_sections, phase_table
from kvviz.app.widgets import table

settings = page_setup("training.title")
head = lecture_head(tr("training.title"))
with head[0], intro_box():  # on a projector folded away: the presenter says it
    st.write(tr("training.intro"))
titles = [tr(f"training.{s}_title") for s in ("s1", "s1b", "s2", "s3", "s4")]
show = ideas(titles, "training")
with loading_engine():  # the first screen is drawn: now torch and the model
    from kvviz.engine.model import Decoder
    backend = get_backend(settings)

native = isinstance(getattr(backend, "model", None), Decoder)
if backend is not None and not native:
    st.info(tr("training.needs_native"))
if native and set(show) & {0, 1, 2, 3}:
    native_sections(backend, settings, show, titles, head[1])

if 4 in show:
    idea_title(titles[4])
    table(phase_table(), key="training_prefill_decode", prose=True)
    st.caption(tr("training.table_note"))
