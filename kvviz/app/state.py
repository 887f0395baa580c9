"""The one registry of session-state keys. Every key a page keeps across reruns is declared once, with its default,
under the page's prefix, its name in kvviz/app/navigation.py (`memory_`, `paged_`, `serving_` ...): a widget is
never read before its key is seeded, two pages cannot reuse a key by accident, and idle freeing and the tests can
list every key a page owns.

Lives here: PageState (one page's keys: seed, get, set, pop, reset, key), page_state (declare a page's keys), REGISTRY.
Does not: import torch or hold anything but the session's own values."""
from __future__ import annotations

import copy
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import streamlit as st


@dataclass(frozen=True)
class PageState:
    """One page's session keys, `<prefix>_<name>`, each with the default it starts from."""

    prefix: str
    defaults: dict[str, Any]

    def key(self, name: str) -> str:
        if name not in self.defaults:
            raise KeyError(f"{self.prefix}: no session key {name!r} declared (declared: {sorted(self.defaults)})")
        return f"{self.prefix}_{name}"

    def seed(self, state: MutableMapping[str, Any] | None = None) -> None:
        """Put every declared key that is missing in the session, at its default (a fresh copy of a list or dict)."""
        state = st.session_state if state is None else state
        for name, default in self.defaults.items():
            if self.key(name) not in state:
                state[self.key(name)] = copy.deepcopy(default)

    def get(self, name: str, state: MutableMapping[str, Any] | None = None) -> Any:
        state = st.session_state if state is None else state
        key = self.key(name)
        return state[key] if key in state else copy.deepcopy(self.defaults[name])

    def set(self, name: str, value: Any, state: MutableMapping[str, Any] | None = None) -> None:
        (st.session_state if state is None else state)[self.key(name)] = value

    def pop(self, name: str, state: MutableMapping[str, Any] | None = None) -> Any:
        """Take the value out of the session (its default where it is missing): a flag read once."""
        state = st.session_state if state is None else state
        return state.pop(self.key(name), copy.deepcopy(self.defaults[name]))

    def reset(self, *names: str, state: MutableMapping[str, Any] | None = None) -> None:
        """Back to the defaults: the names given, or every key of the page."""
        for name in names or tuple(self.defaults):
            self.set(name, copy.deepcopy(self.defaults[name]), state)


REGISTRY: dict[str, PageState] = {}  # prefix -> the page's keys; one per process, filled as pages import


def page_state(prefix: str, **defaults: Any) -> PageState:
    """Declare a page's keys once (at the top of its page or view); declaring the same prefix again with other keys
    is an error, so two pages cannot share a prefix."""
    known = REGISTRY.get(prefix)
    if known is not None and set(known.defaults) != set(defaults):
        raise ValueError(f"session prefix {prefix!r} is declared twice with different keys")
    REGISTRY[prefix] = PageState(prefix, dict(defaults))
    return REGISTRY[prefix]
