"""How fast, and how steadily, this machine runs right now, as the pages that time the model show it:

- `noise_indicator()`: the CPU load always, and on request the spread of identical passes (engine.timing), the
  model loaded only then;
- `record_timing()`: the server's own time per step, appended to $KVVIZ_TIMING_LOG for bench/ (off unless set);
- `draw_then_measure()`: one tick of a fragment that measures while it runs (a sweep, a request, a compression run).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from kvviz.app.language import tr

if TYPE_CHECKING:
    from kvviz.engine.backends.base import Backend


def noise_indicator(model: Callable[[], Backend | None], key: str) -> None:
    """How noisy this machine is right now: the CPU load always, and on request the spread of identical passes
    (of the model `model()` gives: it is loaded then, so the page draws this without torch)."""
    from kvviz.engine.machine import cpu_load

    state = f"_noise_{key}"

    def probe() -> None:  # in the callback: before anything of the rerun is drawn
        from kvviz.engine.timing import noise_probe

        backend = model()
        if backend is not None:
            st.session_state[state] = noise_probe(backend)

    c1, c2 = st.columns([5, 1])
    noise = st.session_state.get(state)
    load = cpu_load()
    load_text = tr("timing.load", load=f"{load[0]:.1f}", cores=load[1]) if load else tr("timing.load_unknown")
    if noise is None:
        c1.caption(tr("timing.noise_idle", load=load_text))
    else:
        c1.caption(tr(f"timing.noise_{noise.level}", load=load_text, n=noise.n_passes,
                      p50=f"{noise.p50_s * 1e3:.2f} ms", p90=f"{noise.p90_s * 1e3:.2f} ms",
                      ratio=f"{noise.p90_over_p50:.2f}"))
    c2.button(tr("timing.check_noise"), on_click=probe, key=f"{state}_button", help=tr("timing.check_noise_help"))


SEND_S = 0.05  # a tick's pause between drawing and measuring: the server sends what was drawn before the model works


def draw_then_measure(draw: Callable[[], object], measure: Callable[[], object]) -> None:
    """One tick of a fragment that measures while it runs: draw where the work stands, pause while the server sends
    it, then measure in quiet. In this order, not measure-then-draw: a tick that measures for a second always finds
    the next tick waiting (the browser asks every `run_every`), and Streamlit drops a fragment run's elements not yet
    sent when the next run of that fragment starts (ForwardMsgQueue.clear at script start), so a progress bar drawn
    last in the tick never reached the browser and stood at 0 until the run ended."""
    draw()
    time.sleep(SEND_S)
    measure()


def record_timing(event: str, **fields: float | int | str) -> None:
    """Append one JSON line {event, session, t, **fields} to $KVVIZ_TIMING_LOG, so a benchmark can read the
    server's own time per step (not the browsers'). Nothing happens when the variable is unset."""
    path = os.environ.get("KVVIZ_TIMING_LOG")
    if not path:
        return
    ctx = get_script_run_ctx()
    line = json.dumps({"event": event, "session": ctx.session_id if ctx else None, "t": time.time(), **fields})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
