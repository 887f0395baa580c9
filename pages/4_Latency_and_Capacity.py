"""Latency & Capacity: sweeps on the real engine (prompt length, cache, batch, dtype) and roofline bounds.

The first screen needs no model: its settings come from the model's description, and the model loads when a
sweep starts (kvviz.app.models.model_spec). In lecture mode each sweep, and the roofline, is one idea per screen.
kvviz.app.views.latency draws each sweep's panel and the roofline (and, in a lecture room, publishes them and draws a
follower's page from them); kvviz.lessons.latency says what they show.
"""
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import ideas, intro_box, lecture_head
from kvviz.app.models import model_caption, model_spec, preload_engine
from kvviz.app.navigation import page_of
from kvviz.app.room.explore import page_settings
from kvviz.app.room.follow import room_part
from kvviz.app.shell import page_setup
from kvviz.app.timing import noise_indicator
from kvviz.app.views.latency import IDEAS, SWEEPS, LatencyPage, follow, roofline, room_view, sweep_panel

PAGE = page_of(__file__)
settings = page_setup("latency.title")
lecture = settings.lecture
st.title(tr("latency.title"))
# A follower: the lecturer's sweeps and roofline, no model here; the lecturer: an open room's link and QR code.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
spec = model_spec(settings)
if spec is None:
    st.stop()

# In lecture mode one idea per screen: the stepper under the title, then the introduction and the idea's controls
# in one row.
shown = [IDEAS[i] for i in ideas([tr(f"latency.idea_{n}") for n in IDEAS], "latency")] if lecture else []
page = LatencyPage(settings, spec, lecture_head(widths=(2, 3)))
with page.head[0], intro_box():
    st.write(tr("latency.intro"))
    model_caption(spec)
    noise_indicator(page.load, "latency")

# ---- five tabs, or in lecture mode the idea on screen (the roofline's three parts apart) ----------------------
roof = None  # the roofline's inputs, where it is drawn
if lecture:
    for name in shown:
        if name in SWEEPS:
            sweep_panel(page, name)
        else:
            roof = roofline(page, (name.removeprefix("roof_"),))
else:
    names = (*SWEEPS, "roofline")
    for name, tab in zip(names, st.tabs([tr(f"latency.tab_{n}") for n in names]), strict=True):
        with tab:
            if name == "roofline":
                roof = roofline(page)
            else:
                sweep_panel(page, name)
# a lecture room's followers draw the same, and may take the settings into their own session
if room is not None:
    room.publish(room_view(shown if lecture else list(IDEAS), roof, spec.name), explore=page_settings(settings,
                                                                                                      "latency"))
preload_engine()  # the page is drawn: torch and the engine load in the background for the first sweep
