"""Hosted-demo mode: caps that keep one small shared CPU machine usable for every visitor.

On when the environment sets KVVIZ_HOSTED=1, or `.streamlit/secrets.toml` has `hosted = true` or a
`[hosted]` table (whose keys override the caps). Each cap can also be set by an environment variable,
KVVIZ_<FIELD> (KVVIZ_MAX_LAYERS=4, KVVIZ_HF_ALLOW="org/a,org/b"). No streamlit here: kvviz.app.models passes the
secrets in, so every check is a pure function that raises InputError("hosted....").

- `HostedCaps` and `load_caps()`: the caps in force, or None when the app is not hosted; `hub_ids()`: the
  allow-list's Hugging Face hub ids (a fetched model such as smollm2 is a sidebar choice of its own);
- `check_shape()`, `check_hf_model()`, `check_params()`: what model a visitor may load; `check_weights_fit()` with
  `available_memory_bytes()`: whether this machine can hold a custom shape's weights at all;
- `check_request()` (`check_batch()`, `check_new_tokens()`, `check_kv_budget()`) and `check_sweep()`: what one
  request or sweep may ask for; `check_offload_store()`: the offload tiers one session may hold;
- `max_rooms`, `max_room_followers`: lecture rooms, enforced by the room store (kvviz.room.store);
- `points_within()`, `batches_within()`, `tokens_within()`: the pages' defaults cut to fit the caps, so a
  visitor's first click on a default is never refused.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from kvviz.engine.config import DecoderConfig
from kvviz.engine.shape import parameter_count
from kvviz.errors import InputError
from kvviz.kv.formula import KVSpec, kv_footprint, weight_bytes
from kvviz.units import format_binary

ENV_SWITCH = "KVVIZ_HOSTED"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}
# A hub id is [owner/]name of letters, digits, '.', '_' and '-'; anything else may be a file-system path.
_HUB_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class HostedCaps:
    """Limits per request and per session, sized for a 2-vCPU host with a few GiB of memory."""

    max_params: int = 150_000_000  # SmolLM2-135M fits; the shipped and custom models are far smaller
    max_layers: int = 8
    max_d_model: int = 512
    max_new_tokens: int = 64
    max_batch: int = 4
    max_sweep_points: int = 8
    kv_budget_bytes: int = 64 * 2**20  # one session's KV cache, by the formula
    idle_timeout_s: int = 600  # a session idle this long has its KV cache freed
    offload_store_bytes: int = 32 * 2**20  # one session's offload tiers, memory and disk together
    # Lecture rooms: a follower only draws (no model), but each polls once or twice a second; a room of sixty and
    # four rooms at once is about what 240 page views cost. With Redis the rooms cap counts every replica's rooms
    # together.
    max_rooms: int = 4
    max_room_followers: int = 60
    # Models a visitor may choose: names fetch-model knows (offered when the deployment fetched them) and hub ids.
    hf_allow: tuple[str, ...] = ("smollm2", "HuggingFaceTB/SmolLM2-135M")


def hub_ids(caps: HostedCaps) -> tuple[str, ...]:
    """The allow-list's Hugging Face hub ids (a fetched model's name is its own sidebar choice)."""
    from kvviz.engine.fetch import MODELS

    return tuple(m for m in caps.hf_allow if m not in MODELS)


def _flag(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE | _FALSE:
        return text in _TRUE
    raise InputError("hosted.bad_setting", name=name, value=value)


def _cap_value(name: str, kind: type, value: object) -> Any:
    if kind is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise InputError("hosted.bad_setting", name=name, value=value)
        return tuple(str(i).strip() for i in items if str(i).strip())
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InputError("hosted.bad_setting", name=name, value=value) from None
    if number <= 0:
        raise InputError("hosted.bad_setting", name=name, value=value)
    return number


def load_caps(env: Mapping[str, str], secrets: Mapping[str, Any] | None = None) -> HostedCaps | None:
    """The caps in force, or None when this is not a hosted demo. Env vars win over secrets."""
    table = (secrets or {}).get("hosted")
    if ENV_SWITCH in env:
        on = _flag(ENV_SWITCH, env[ENV_SWITCH])
    else:
        on = isinstance(table, Mapping) or (table is not None and _flag("hosted", table))
    if not on:
        return None
    overrides: dict[str, Any] = {}
    for f in fields(HostedCaps):
        kind = tuple if f.name == "hf_allow" else int
        if isinstance(table, Mapping) and f.name in table:
            overrides[f.name] = _cap_value(f.name, kind, table[f.name])
        env_name = "KVVIZ_" + f.name.upper()
        if env_name in env:
            overrides[f.name] = _cap_value(env_name, kind, env[env_name])
    return replace(HostedCaps(), **overrides)


def available_memory_bytes() -> int | None:
    """Memory the OS could give this process now (Linux MemAvailable); None where it cannot say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_weights_fit(cfg: DecoderConfig, dtype: str, available: int | None) -> None:
    """Refuse a custom shape whose weights would take more than half the free memory (hosted or not):
    building it would swap or get the server killed, for every visitor."""
    need = weight_bytes(parameter_count(cfg), dtype)
    if available is not None and need > available // 2:
        raise InputError("hosted.too_big", need=format_binary(need), available=format_binary(available))


def _at_most(key: str, value: int, limit: int) -> None:
    if value > limit:
        raise InputError(key, limit=limit, value=value)


def check_params(n_params: int, caps: HostedCaps) -> None:
    if n_params > caps.max_params:
        raise InputError("hosted.params", limit=f"{caps.max_params:,}", value=f"{n_params:,}")


def check_shape(cfg: DecoderConfig, caps: HostedCaps) -> None:
    """A custom shape the host can hold: layers, width, and then the whole parameter count."""
    _at_most("hosted.layers", cfg.n_layers, caps.max_layers)
    _at_most("hosted.d_model", cfg.d_model, caps.max_d_model)
    check_params(parameter_count(cfg), caps)


def check_hf_model(name: str, caps: HostedCaps) -> None:
    """Only allow-listed hub ids: never a file-system path typed into the UI."""
    allowed = ", ".join(caps.hf_allow) or "—"
    if name in caps.hf_allow:
        return
    if not _HUB_ID.fullmatch(name) or ".." in name:
        raise InputError("hosted.no_paths", name=name, allowed=allowed)
    raise InputError("hosted.not_allowed", name=name, allowed=allowed)


def check_new_tokens(n: int, caps: HostedCaps) -> None:
    _at_most("hosted.new_tokens", n, caps.max_new_tokens)


def check_batch(n: int, caps: HostedCaps) -> None:
    _at_most("hosted.batch", n, caps.max_batch)


def check_sweep(n_points: int, caps: HostedCaps) -> None:
    _at_most("hosted.sweep_points", n_points, caps.max_sweep_points)


def check_kv_budget(caps: HostedCaps, spec: KVSpec, *, batch: int, n_tokens: int, dtype: str) -> int:
    """The formula's bytes for this request's cache, refused past the per-session budget; returns them."""
    need = kv_footprint(spec, n_tokens, batch, dtype).total
    if need > caps.kv_budget_bytes:
        raise InputError("hosted.kv_budget", need=format_binary(need), budget=format_binary(caps.kv_budget_bytes),
                         batch=batch, n_tokens=n_tokens)
    return need


def check_request(
    caps: HostedCaps, spec: KVSpec, *, batch: int, prompt_tokens: int, max_new_tokens: int, dtype: str
) -> int:
    """Everything a prefill asks of the host, checked before any memory is allocated; returns KV bytes."""
    check_batch(batch, caps)
    check_new_tokens(max_new_tokens, caps)
    return check_kv_budget(caps, spec, batch=batch, n_tokens=prompt_tokens + max_new_tokens, dtype=dtype)


def check_offload_store(caps: HostedCaps, memory_bytes: int, disk_bytes: int) -> None:
    """The offload tiers a session asks for, memory and disk together, within its cap (checked before any write)."""
    need = memory_bytes + disk_bytes
    if need > caps.offload_store_bytes:
        raise InputError("hosted.offload_store", need=format_binary(need),
                         budget=format_binary(caps.offload_store_bytes))


# ---- defaults that fit the caps: a visitor's first click on a default is never refused ----------------------
def points_within(caps: HostedCaps | None, points: int) -> int:
    """How many points a default sweep may have: `points`, or fewer under the cap."""
    return points if caps is None else min(points, caps.max_sweep_points)


def batches_within(caps: HostedCaps | None, batches: Sequence[int]) -> list[int]:
    """The default batch sizes the cap allows (every one of them without a cap)."""
    return [b for b in batches if caps is None or b <= caps.max_batch][:points_within(caps, len(batches))]


def tokens_within(caps: HostedCaps | None, spec: KVSpec, dtype: str, limit: int, *, batch: int = 1) -> int:
    """The most tokens per request, up to `limit`, whose KV cache (by the formula, for `batch` requests) fits the
    session's budget: where a default prompt or context may reach."""
    if caps is None:
        return limit
    lo, hi = 0, limit  # the cache never shrinks as tokens are added: the largest n within the budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv_footprint(spec, mid, batch, dtype).total <= caps.kv_budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo
