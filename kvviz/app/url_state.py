"""Settings kept in the link, so a shared URL reproduces what its sender saw.

- `url_state()`: one setting read from `?key=` once per session and mirrored back on every run;
- the parsers a link's values pass (`int_in`, `float_in`, `one_of`, `parse_bool`): a link is never trusted;
- the memory calculator's scenario (`DEFAULTS`, `read_query()`, `scenario_query()`, `scenario_in()`,
  `query_changes()`): read_query() checks every value the way the widgets would; a malformed one falls back to its
  default and is reported, never raised; scenario_in() reads it back from the widgets, query_changes() says what the
  link must set and drop to carry it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import streamlit as st

from kvviz.app.language import tr
from kvviz.errors import InputError
from kvviz.kv.formats import KV_DTYPES
from kvviz.kv.hardware import HARDWARE
from kvviz.kv.presets import PRESETS
from kvviz.kv.vllm_profile import ENTRIES, READ

# The vLLM releases the planner was read against, newest first; "any" plans over all of them (a range).
VLLM_VERSIONS = ("any", *(".".join(map(str, v)) for v in reversed(READ)))

DEFAULTS: dict[str, Any] = {
    "src": "preset",
    "preset": "Llama-3.1-8B",
    "layers": 32,
    "heads": 32,
    "kv_heads": 8,
    "d_head": 128,
    "params_b": 8.03,
    "tokens": 4096,
    "batch": 1,
    "kv_dtype": "bfloat16",
    "w_dtype": "bfloat16",
    "gpu": "H100 SXM",
    "n_gpus": 1,
    "frac": 0.9,
    "lengths": "37, 120, 900, 1500, 3000, 4096",
    "block": 16,
    # the capacity planner's serving flags (0 / "any": the version's default, or a range over them)
    "engine": "vllm",
    "vllm": "any",
    "entry": "any",
    "mbt": 0,
    "seqs": 0,
    "eager": False,
    "sgl_frac": 0.0,
}


T = TypeVar("T")


# URL parsers: each accepts what its widget would, else raises ValueError (a link's value is never trusted).
def int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not lo <= value <= hi:
            raise ValueError(text)
        return value

    return parse


def float_in(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not lo <= value <= hi:  # also rejects nan
            raise ValueError(text)
        return value

    return parse


def one_of(choices: Mapping | tuple | list, cast: Callable[[str], T] = str) -> Callable[[str], T]:
    """A parser that accepts one of `choices` (read with `cast`, e.g. int for a list of lengths)."""
    def parse(text: str) -> T:
        value = cast(text)  # int("x") raises ValueError, as a value not in the choices does
        if value not in choices:
            raise ValueError(text)
        return value

    return parse


def parse_bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _url_text(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def url_state(key: str, default: T, parse: Callable[[str], T] = str, *, state: str | None = None) -> str:
    """Keep a setting in the link: seeded from `?key=` once per session, then mirrored back on every run.

    Returns the session_state key that holds the value (`state`, or `kv_url_<key>`); give it to
    `persisted(widget, state_key, label, ...)`. A value equal to `default` is left out of the URL.
    A value the parser rejects is dropped with a warning and the default kept.
    """
    state = state or f"kv_url_{key}"
    read: set[str] = st.session_state.setdefault("_kv_url_read", set())
    if state not in read:
        read.add(state)  # the link is read when it is opened; afterwards the widgets lead
        raw = st.query_params.get(key)
        if raw is not None:
            try:
                st.session_state[state] = parse(raw)
            except (ValueError, InputError):
                st.warning(tr("lecture.bad_url_param", name=key, value=raw))
    st.session_state.setdefault(state, default)
    value = st.session_state[state]
    if value == default:
        if key in st.query_params:
            del st.query_params[key]
    elif st.query_params.get(key) != _url_text(value):
        st.query_params[key] = _url_text(value)
    return state


# Bounds match the page's widgets, so a link can never put a widget out of its range.
PARSERS: dict[str, Callable[[str], Any]] = {
    "src": one_of(("preset", "custom", "upload")),
    "preset": one_of(PRESETS),
    "layers": int_in(1, 1000),
    "heads": int_in(1, 1024),
    "kv_heads": int_in(1, 1024),
    "d_head": int_in(1, 4096),
    "params_b": float_in(0.001, 10_000.0),
    "tokens": int_in(1, 10_000_000),
    "batch": int_in(1, 100_000),
    "kv_dtype": one_of(KV_DTYPES),
    "w_dtype": one_of(KV_DTYPES),
    "gpu": one_of(HARDWARE),
    "n_gpus": int_in(1, 64),
    "frac": float_in(0.1, 1.0),
    "lengths": str,
    "block": int_in(1, 4096),
    "engine": one_of(("vllm", "sglang")),
    "vllm": one_of(VLLM_VERSIONS),
    "entry": one_of(("any", *ENTRIES)),
    "mbt": int_in(0, 1_000_000),
    "seqs": int_in(0, 100_000),
    "eager": parse_bool,
    "sgl_frac": float_in(0.0, 1.0),
}
CUSTOM_KEYS = ("layers", "heads", "kv_heads", "d_head", "params_b")


def read_query(query: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The scenario in a URL's query (defaults for what it leaves out) and the `key=value`s it got wrong."""
    values, bad = dict(DEFAULTS), []
    for key, parse in PARSERS.items():
        if key not in query:
            continue
        try:
            values[key] = parse(query[key])
        except ValueError:
            bad.append(f"{key}={query[key]!r}")
    return values, bad


def scenario_query(values: Mapping[str, Any]) -> dict[str, str]:
    """The query parameters that reproduce a scenario (only the model fields its source uses)."""
    skip = set(CUSTOM_KEYS) if values.get("src") != "custom" else {"preset"}
    if values.get("src") == "upload":
        skip.add("preset")
    return {k: str(v) for k, v in values.items() if k in PARSERS and k not in skip}


def scenario_in(state: Mapping[str, Any], prefix: str = "memory_") -> dict[str, Any]:
    """The scenario the page's widgets (`<prefix><name>`) hold: a number box's last valid value, never one it
    refused (number_in_range keeps it under `_valid_<key>`); names no widget holds yet are left out."""
    return {name: state.get(f"_valid_{prefix}{name}", state[f"{prefix}{name}"]) for name in DEFAULTS
            if f"{prefix}{name}" in state}


def query_changes(query: Mapping[str, str], wanted: Mapping[str, str],
                  keep: tuple[str, ...] = ("lang", "lecture", "room")) -> tuple[dict[str, str], set[str]]:
    """What a link's query must change to read `wanted`: (the values to set, the keys to drop); `keep` are the
    app's own settings, never dropped (`room`: a follower exploring on their own keeps the way back)."""
    return {k: v for k, v in wanted.items() if query.get(k) != v}, set(query) - set(wanted) - set(keep)
