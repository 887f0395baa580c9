"""Last activity per browser session, so a hosted demo can free the KV caches of sessions left idle.

A KV cache is request-local (it lives in one session's state), but the server's memory is shared: a
visitor who walks away must not keep theirs forever. No streamlit here and no references held: the
registry keeps session ids and times only, and the caller says how to find a live session's state.

- `SessionRegistry` (and `REGISTRY`, the server's one): each session's last activity, and which were freed;
- `generations_in()`: the Generations a session's state holds; `free_generation()`: drop one's KV cache.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from kvviz.engine.generation import Generation


def generations_in(state: Any) -> list[Generation]:
    """The Generations a session holds at the top level of its state (a mapping, or Streamlit's SessionState)."""
    items = state.filtered_state if hasattr(state, "filtered_state") else state
    return [v for v in items.values() if isinstance(v, Generation)] if isinstance(items, Mapping) else []


def free_generation(gen: Generation) -> bool:
    """Drop a Generation's KV cache and end it, so a later step() says 'finished' rather than
    decoding without its past. True when a cache was freed."""
    if gen.cache is None:
        return False
    gen.cache = None
    gen.max_new_tokens = max(1, gen.n_generated)  # done from now on: step() raises InputError("finished")
    return True


class SessionRegistry:
    """Thread-safe: Streamlit runs every session's script in its own thread."""

    def __init__(self) -> None:
        self._last_active: dict[str, float] = {}
        self._freed: set[str] = set()
        self._lock = threading.Lock()

    def touch(self, session_id: str, now: float) -> None:
        with self._lock:
            self._last_active[session_id] = now

    def last_active(self, session_id: str) -> float | None:
        return self._last_active.get(session_id)

    def sweep(self, now: float, idle_timeout_s: float, state_of: Callable[[str], Any | None]) -> int:
        """Free the caches of live sessions idle past the timeout; forget sessions `state_of` no longer
        finds (closed or disconnected). Returns the number of caches freed."""
        with self._lock:
            freed = 0
            for sid, last in list(self._last_active.items()):
                if now - last <= idle_timeout_s:
                    continue
                state = state_of(sid)
                if state is None:
                    del self._last_active[sid]
                    continue
                n = sum(free_generation(g) for g in generations_in(state))
                if n:
                    self._freed.add(sid)
                    freed += n
            return freed

    def pop_freed(self, session_id: str) -> bool:
        """True once after this session's caches were freed (so its page can say why)."""
        with self._lock:
            if session_id in self._freed:
                self._freed.discard(session_id)
                return True
            return False

    def __len__(self) -> int:
        return len(self._last_active)


REGISTRY = SessionRegistry()  # one per server process, shared by every session
