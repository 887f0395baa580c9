"""A follower's "Explore from here" and the way back: model_settings and page_settings (what a lecturer's view
carries: the sidebar's model and the page's boxes), explore_from (a view's settings, only the page's own keys, taken
into this session), explore (take them, and the step to replay to), explore_button, take_replay (that step, once),
follow_again_button (back to the lecture)."""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

import streamlit as st

from kvviz.app.language import tr
from kvviz.app.room.session import ROOM
from kvviz.app.room.view import RoomView
from kvviz.app.state import REGISTRY
from kvviz.engine.config import DecoderConfig

# A pasted text (Compressing the Cache takes 200,000 characters) would travel in every view the page publishes, to
# every follower, and a long Korean one would pass the store's limit on a view (room.store.MAX_SNAPSHOT_BYTES):
# longer texts are not carried for "Explore from here".
SHARED_TEXT_CHARS = 20_000
MODEL_KEYS = ("kv_model", "kv_dtype", "kv_device", "kv_hf_model", "kv_engine", "kv_shape")  # the sidebar's model


def model_settings(s: object) -> dict:
    """The sidebar's model settings of `s` (a Settings, or the ModelKey a run started with), as JSON: what a
    lecturer's view carries so that "Explore from here" runs the follower's page on the lecturer's model."""
    shape = s.shape if s.model == "random" else None
    return {"kv_model": s.model, "kv_dtype": s.dtype, "kv_device": s.device, "kv_hf_model": s.hf_model,
            "kv_engine": s.engine, "kv_shape": None if shape is None else dataclasses.asdict(shape)}


def _plain(value: object) -> bool:
    # A box's value (a number, a text, a choice, a list of choices); a button's True/False and objects are not.
    scalar = (int, float, str)
    return (isinstance(value, scalar) and not isinstance(value, bool)) or (
        isinstance(value, list) and all(isinstance(v, scalar) and not isinstance(v, bool) for v in value))


def _page_keys(items: Iterable[tuple[str, object]], prefix: str, keep: Collection[str], also: Collection[str],
               skip: Collection[str]) -> dict:
    """The keys of `items` that are this page's boxes: under `prefix` (or named in `also`: a box kept in the link),
    a plain value, not in `skip` (a box whose options are in the UI's language), and not one of the page's own state
    keys (page_state's: runs, flags, counters) unless `keep` names it (a box persisted under it)."""
    own = set(REGISTRY[prefix].defaults) - set(keep) if prefix in REGISTRY else set()
    return {key: value for key, value in items if _plain(value) and key not in skip and (key in also or (
        key.startswith(f"{prefix}_") and key.removeprefix(f"{prefix}_") not in own))}


def page_settings(settings: object, prefix: str, keep: Collection[str] = (), also: Collection[str] = (),
                  skip: Collection[str] = ()) -> dict:
    """What a lecturer's view carries for "Explore from here", as JSON: the sidebar's model (model_settings) and the
    page's boxes as they stand (see _page_keys), but a text longer than SHARED_TEXT_CHARS: that box keeps the
    follower's own text."""
    boxes = _page_keys(st.session_state.items(), prefix, keep, also, skip)
    return {**model_settings(settings), **{key: value for key, value in boxes.items()
                                          if not (isinstance(value, str) and len(value) > SHARED_TEXT_CHARS)}}


def explore_from(view: RoomView, prefix: str, keep: Collection[str] = (), also: Collection[str] = (),
                 skip: Collection[str] = (), steps: object = None,
                 help_key: str = "room.explore_settings_help") -> None:
    """A follower's "Explore from here" for a view that carries `explore` (the lecturer's page_settings): the
    model's keys and the page's boxes only are taken (a key of another page, of the room or of a run is never set
    from the store), each then checked by the page as any entry is; `steps`: the lecturer's step to replay to."""
    run = view.explore
    if isinstance(run, Mapping):
        model = {key: run[key] for key in MODEL_KEYS if key in run}
        explore_button({**model, **_page_keys(run.items(), prefix, keep, also, skip)}, steps, help_key=help_key)


def explore(settings: Mapping[str, object], steps: object = None) -> None:
    """Take the lecturer's run into this session: the lecturer's settings (sidebar keys, model_settings', and the
    page's own) set before the next rerun draws the widgets, each then checked by its page as any entry is, and the
    step to replay to (see `take_replay`; None: a page with no run to replay, its settings are all it takes)."""
    for key, value in settings.items():
        if key == "kv_shape":  # a custom shape travels as JSON; None: not the random model, this session's kept
            if value is not None:
                st.session_state[key] = DecoderConfig(**value)
            continue
        st.session_state[key] = value
    ROOM.set("explore", True)
    ROOM.set("replay", steps)


def explore_button(settings: Mapping[str, object], steps: object = None, help_key: str = "room.explore_help",
                   ) -> None:
    """A follower's "Explore from here": `explore` with the lecturer's settings (and step) when pressed."""
    st.button(tr("room.explore"), key="room_btn_explore", help=tr(help_key), icon=":material/explore:",
              on_click=explore, args=(settings, steps))


def take_replay() -> object:
    """The lecturer's step an "Explore from here" asks this session to reach, once (a step count; a page's own
    record of how it got there, such as Paged Blocks' requests and step)."""
    return ROOM.pop("replay")


def follow_again_button() -> None:
    """While exploring: back to the lecture (this session's own run stays, unused, until it is reset)."""
    if ROOM.get("explore") and st.query_params.get("room"):
        st.button(tr("room.follow_again"), key="room_btn_follow_again", icon=":material/groups:", type="primary",
                  on_click=lambda: ROOM.set("explore", False))
