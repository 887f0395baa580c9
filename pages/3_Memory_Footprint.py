"""Memory Footprint: M_KV = 2·B·L·n·H_kv·d_head·bytes with every factor shown, real presets, any config.json,
the capacity planner, and the live cache's measured bytes beside the formula. kvviz.lessons.memory computes what
is shown; kvviz.app.views.memory draws each part; this page lays the parts out (in lecture mode one idea per
screen). In a lecture room the lecturer's page publishes its scenario (room_view) and a follower's page is drawn from
it (follow)."""

import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.lecture import intro_box, lecture_head, lecture_tabs, screen_part, settings_box
from kvviz.app.models import preload_engine
from kvviz.app.navigation import page_of
from kvviz.app.room.follow import room_part
from kvviz.app.room.share import share_button
from kvviz.app.shell import page_setup
from kvviz.app.views.memory import (
    MEM,
    compare,
    follow,
    formula,
    growth,
    keep_in_url,
    live,
    model_source,
    paged,
    planner,
    planner_settings,
    room_view,
    scenario_inputs,
    seed_buttons,
    seed_from_url,
    start_up_logs,
)
from kvviz.errors import InputError
from kvviz.kv.formula import kv_footprint, weight_bytes
from kvviz.lessons.memory import lecture_screens

PAGE = page_of(__file__)
settings = page_setup("memory.title")
lecture = settings.lecture
head = lecture_head(tr("memory.title"))
with head[0], intro_box():
    st.write(tr("memory.intro"))
# A follower: the lecturer's scenario and screen, and nothing of this session's below; the lecturer: an open room.
room = room_part(PAGE, lambda view: follow(view, lecture=lecture), lecture=lecture)
seed_from_url()

# The formula, then the tabs; in lecture mode one of them per screen, the scenario's inputs behind one button
# (the capacity tab's paged blocks a screen of their own, its planner and start-up logs two).
sections, screens, cap_screens = lecture_screens(lecture)
top, tab_cmp, tab_growth, tab_cap, *tab_paged, tab_live = lecture_tabs(
    [tr(f"memory.{s}") for s in sections], "memory", first_on_page=True,
    screens=[(i, tr(f"memory.{s}")) for i, s in screens] if lecture else None)
tab_paged = tab_paged[0] if tab_paged else tab_cap
if lecture:
    with head[1]:
        left = settings_box(tr("memory.settings"))
    seeds, right = left, top
else:
    with top:
        seeds = st.container()
        left, right = st.columns([1, 2])
with seeds:
    share_button(lecture)  # behind the settings button, as on Reusing Past K/V
    seed_buttons()
with left:
    spec = model_source()
    tokens, batch, kv_dtype_name, w_dtype_name = scenario_inputs()

if spec is None:
    st.stop()
MEM.set("last_spec", spec)
try:
    fp = kv_footprint(spec, tokens, batch, kv_dtype_name)
except InputError as exc:  # a llama.cpp block format this head size is not whole blocks of (llama.cpp refuses it too)
    show_error(exc)
    st.stop()
weights = weight_bytes(spec.n_params, w_dtype_name)  # None: unknown, and nothing below pretends otherwise

with right:
    formula(spec, fp, weights, w_dtype_name, lecture)
with tab_cmp:
    compare(spec, kv_dtype_name, lecture)
with tab_growth:
    growth(spec, fp, weights, kv_dtype_name, lecture)
with tab_cap:
    # In lecture mode two screens: the planner (its inputs behind one button, the answer beside it, how it was
    # computed folded) and how it did on real start-up logs.
    planner_box = screen_part("memory", cap_screens[0], "planner")
    logs_box = screen_part("memory", cap_screens[1], "logs")
with planner_box, settings_box(tr("memory.cap_settings")):  # in lecture mode behind one button
    choice = planner_settings(spec)
with planner_box:
    plan = planner(spec, choice, weights, tokens, kv_dtype_name, w_dtype_name, lecture)
with logs_box:
    start_up_logs(lecture)
with tab_paged:
    paged(fp, plan, lecture)
with tab_live:
    live(settings)

keep_in_url()  # the scenario back into the link, so the link reproduces it
if room is not None:  # a lecture room's followers draw the same scenario and screen
    room.publish(room_view(spec, choice))
preload_engine()  # the page is drawn: torch and the engine load in the background for Run here
