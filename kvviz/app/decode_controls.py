"""DecodeController: the one Prefill / Step / Play / Reset controller both stepping pages use (Reusing Past K/V,
Speculative Decoding): the presses served in order, the buttons and the Step stepper, Play's timer and its schedule,
the warning when Play falls behind, and the replay an "Explore from here" asks for."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import streamlit as st

from kvviz.app.language import tr
from kvviz.app.room.explore import take_replay
from kvviz.app.state import PageState
from kvviz.app.timing import record_timing
from kvviz.app.widgets import pending_actions, stepper

# The session keys a stepping page declares for its controller (page_state), with these defaults.
CONTROL_KEYS = {"playing": False, "served": 0, "timer_on": False, "play_times": [], "play_next": None,
                "play_late": -1e9}


@dataclass(frozen=True)
class DecodeController:
    """A stepping page's controls. `state`: the page's keys (its prefix is the page's name: the buttons' keys
    `<name>_btn_<action>`, the stepper's `<name>_stepper`, the labels in locale section `<name>`); `prefill`,
    `step` (one pass; False when none was taken), `reset`: the page's own actions; `can_step`: whether Step and Play
    may run a pass now (a run is started, not finished, on the settings it started with); `period`: seconds
    between Play's beats (may be a callable: a speed the page's slider sets)."""

    state: PageState
    prefill: Callable[[], Any]
    step: Callable[[], bool]
    reset: Callable[[], Any]
    can_step: Callable[[], bool]
    period: float | Callable[[], float]

    @property
    def name(self) -> str:
        return self.state.prefix

    @property
    def playing(self) -> bool:
        return bool(self.state.get("playing"))

    def beat_s(self) -> float:
        return float(self.period() if callable(self.period) else self.period)

    def play(self, on: bool) -> None:
        """Play or Pause. Set, never toggled: a click can reach the server twice when a timed fragment run
        coalesces with it; a new Play starts its schedule afresh."""
        self.state.set("playing", on)
        self.state.set("play_times", [])
        self.state.set("play_next", None)

    def timer(self) -> float | None:
        """Play's timer for this full run's fragment (`st.fragment(run_every=...)`): the beat while playing a run
        that can step, else None. A run that cannot step stops Play here, and it stays stopped (a sidebar changed
        back does not replay by itself). A fragment rerun keeps the timer it was registered with, so settle()
        reruns the whole page when it must start or stop."""
        if self.playing and not self.can_step():
            self.state.set("playing", False)
        self.state.set("timer_on", self.playing)
        return self.beat_s() if self.playing else None

    def serve(self) -> None:
        """Every press the stepper logged past `<name>_served`, applied once and in order, before the controls are
        drawn (so they show the result): Prefill is off while playing, Play needs a step to take, a Step waits
        while playing; can_step is asked again before each press (the one before may have started or reset a run)."""
        for number, action in pending_actions(f"{self.name}_stepper", self.state.get("served")):
            playing, can_step = self.playing, self.can_step()
            if action == "prefill" and not playing:
                self.prefill()
            elif action == "reset":
                self.reset()
            elif action in ("play", "pause", "toggle_play"):
                on = not playing if action == "toggle_play" else action == "play"
                if can_step or not on:
                    self.play(on)
            elif action == "step" and can_step and not playing:
                self.step()
            self.state.set("served", number)

    def row(self, b: list, *, prefill_disabled: bool, step_help: str, shown: int) -> None:
        """The controls in `b[0:4]`: Prefill, the Step stepper, Play or Pause, Reset. Streamlit's buttons give the
        look (and AppTest its clicks); in the browser the stepper catches their clicks into its log."""
        name, playing, can_step = self.name, self.playing, self.can_step()
        b[0].button(tr(f"{name}.prefill"), on_click=self.prefill, disabled=prefill_disabled, type="primary",
                    key=f"{name}_btn_prefill")
        with b[1]:
            stepper(tr(f"{name}.step"), key=f"{name}_stepper", served=self.state.get("served"),
                    disabled=not can_step or playing, help=step_help,
                    buttons={f"{name}_btn_{a}": a for a in ("prefill", "play", "pause", "reset")},
                    keys={"p": "toggle_play", "r": "reset"}, shown=shown, playing=playing,
                    behind=tr(f"{name}.play_jump"))
        if playing:
            b[2].button(tr(f"{name}.pause"), on_click=self.play, args=(False,), key=f"{name}_btn_pause",
                        icon=":material/pause:")
        else:
            b[2].button(tr(f"{name}.play"), on_click=self.play, args=(True,), disabled=not can_step,
                        key=f"{name}_btn_play", icon=":material/play_arrow:")
        b[3].button(tr(f"{name}.reset"), on_click=self.reset, key=f"{name}_btn_reset")

    def beat(self) -> None:
        """Play's tick. Play keeps a schedule (one step every period from its start), not "a period since the last
        step": a timer tick that comes late or early still lands on its beat, so jitter does not lose beats. At
        most one step per redraw: a late tick shows its step late (and warn() says so), never several at once."""
        if not (self.playing and self.can_step()):
            return
        from kvviz.lessons import decode_view  # imports the engine (torch): not before the page's first screen

        now, period = time.monotonic(), self.beat_s()
        before = self.state.get("play_next")
        due, nxt = decode_view.play_beats(before, now, period)
        self.state.set("play_next", nxt)
        record_timing(f"{self.name}_play_tick", due=due, late_s=0.0 if before is None else now - before)
        if before is not None and now - before > period:  # a whole beat late: the machine is behind right now
            self.state.set("play_late", now)
        times = self.state.get("play_times")
        for _ in range(due):
            if self.step():
                times.append(now)
        self.state.set("play_times", times[-21:])

    def settle(self) -> None:
        """After the beat: Play stops by itself when the run can take no more steps (finished, freed, stale); the
        whole page reruns when the timer must start or stop."""
        if self.playing and not self.can_step():
            self.state.set("playing", False)
        if self.playing != bool(self.state.get("timer_on")):
            st.rerun(scope="app")

    def warn(self) -> None:
        """While playing: a warning when the steps really taken fall behind the asked rate, or a beat came late."""
        if not self.playing:
            return
        from kvviz.lessons import decode_view  # imports the engine (torch): not before the page's first screen

        period = self.beat_s()
        rate = decode_view.achieved_rate(self.state.get("play_times"))
        warning = decode_view.play_warning(rate, period, time.monotonic() - self.state.get("play_late"))
        if warning == "play_behind":
            st.warning(tr(f"{self.name}.play_behind", rate=f"{rate:.1f}", asked=f"{1 / period:g}"))
        elif warning == "play_late":  # before the rate says it
            st.warning(tr(f"{self.name}.play_late", asked=f"{1 / period:g}"))

    def replay(self) -> None:
        """"Explore from here": the lecturer's run, prefilled and stepped to the lecturer's step in this session
        (a refused prefill is said by the page's live view)."""
        steps = take_replay()
        if steps is None:
            return
        self.prefill()
        for _ in range(int(steps)):
            if not self.step():
                break
