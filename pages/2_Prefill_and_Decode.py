"""Prefill & Decode: one request measured as whole repeated runs; TTFT, TPOT and T = TTFT + (N−1)·TPOT checked.

The model is timed in quiet (kvviz.engine.timing): while a chunk of passes runs nothing is drawn, the
garbage collector is paused and torch's threads are fixed; the page draws after each chunk. The first screen
needs no model (kvviz.app.models.model_spec): it loads when the request first runs. Every figure shown is one run's,
the median run by T, the one drawn; the range over all runs stands beside it. kvviz.app.views.prefill draws the
request's results (and, in a lecture room, publishes them and draws a follower's page from them);
kvviz.lessons.prefill_decode says what they show.
"""
import streamlit as st

from kvviz.app.hosted import tokens_within
from kvviz.app.language import tr
from kvviz.app.lecture import ideas, intro_box, lecture_head, settings_box
from kvviz.app.models import get_backend, limit, model_caption, model_spec, preload_engine
from kvviz.app.navigation import page_of
from kvviz.app.room.explore import page_settings
from kvviz.app.room.follow import room_part
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.timing import noise_indicator
from kvviz.app.views.prefill import (
    PD,
    PHASES_IDEA,
    TICK_S,
    controls,
    follow,
    live,
    phases,
    start,
    start_request,
    stop,
)
from kvviz.lessons.prefill_decode import default_request

PAGE = page_of(__file__)
settings = page_setup("prefill.title")
lecture = settings.lecture
st.title(tr("prefill.title"))
# A follower: the lecturer's runs and ideas, no model here; the lecturer: an open room's link and QR code.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
spec = model_spec(settings)
if spec is None:
    st.stop()

# In lecture mode one idea per screen: the stepper under the title, then the introduction and the request's
# controls in one row (none on the table of phases, which takes the whole screen).
titles = [tr(f"prefill.idea_{k}") for k in ("run", "numbers", "formula", "phases")]
shown = ideas(titles, "prefill")  # all four, or in lecture mode one
measuring_idea = not lecture or shown != [PHASES_IDEA]
if measuring_idea:
    head = lecture_head(widths=(2, 3))
    with head[0], intro_box():
        st.write(tr("prefill.intro"))
        model_caption(spec)
        noise_indicator(lambda: get_backend(settings), "prefill")  # the model, loaded when the check first needs it

# What the results were measured on: a different model (or dtype, device, shape) must not inherit them.
model = ((settings.model, settings.hf_model, settings.dtype, settings.device, spec.name, spec.n_layers,
          spec.n_kv_heads, spec.d_head, spec.n_params), f"{spec.name} ({settings.dtype}, {settings.device})")
max_len = spec.max_context
max_new = limit(settings, "max_new_tokens", max_len - 1)  # a hosted demo caps it
# A default request whose cache fits a hosted demo's KV budget: a first click on Run is never refused.
default = default_request(max_len, max_new, tokens_within(settings.hosted, spec, settings.dtype, max_len))

if not measuring_idea:  # the table of phases: no controls (each number box keeps its last valid value)
    request = (0, 0, 0)
elif lecture:  # the settings behind one button beside Run and Stop: the idea keeps the screen
    with head[1]:
        where, b1, b2 = st.columns([3, 3, 2], vertical_alignment="center")
    with where, settings_box():
        share_button(lecture)  # behind the settings button, as on Reusing Past K/V
        request = controls(max_len, max_new, default)
else:
    request = controls(max_len, max_new, default)
    b1, b2, _ = st.columns([1, 1, 4])

start_request(settings, request, model)
running = PD.get("running")
if measuring_idea:
    b1.button(tr("prefill.run"), on_click=start, type="primary", disabled=running, key="prefill_run")
    b2.button(tr("prefill.stop"), on_click=stop, disabled=not running, key="prefill_stop")



def tick() -> None:
    live(shown, model, lecture, room, page_settings(settings, "prefill"))


st.fragment(tick, run_every=TICK_S if running else None)()  # on every idea: measuring never waits on the stepper
if PHASES_IDEA in shown:
    phases(lecture)
preload_engine()  # the page is drawn: torch and the engine load in the background for the first run
