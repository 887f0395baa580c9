"""Who may connect where: the hosted demo's server allow-list, the API key's sources, the caps. No streamlit.

On a hosted demo visitors pick a base URL from KVVIZ_SERVE_ALLOW (comma-separated) or `serve_allow` in
.streamlit/secrets.toml; there is no free-form URL, so nobody can make the host fetch an internal address.
The API key comes from KVVIZ_SERVE_API_KEY / `serve_api_key`, or a password field; it is never shown.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvviz.errors import InputError
from kvviz.serving.bench import Limits
from kvviz.serving.client import normalize_base_url

ENV_ALLOW, SECRET_ALLOW = "KVVIZ_SERVE_ALLOW", "serve_allow"
ENV_KEY, SECRET_KEY = "KVVIZ_SERVE_API_KEY", "serve_api_key"
HOSTED_TIMEOUT_S = 30.0
HOSTED_LIMITS = dict(max_requests=16, max_concurrency=8, max_prompt_tokens=2048)


def allowlist(env: Mapping[str, str], secrets: Mapping[str, Any]) -> tuple[str, ...]:
    """The normalized base URLs a hosted demo may connect to (the environment wins over secrets)."""
    raw = env.get(ENV_ALLOW, secrets.get(SECRET_ALLOW, ()))
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    return tuple(dict.fromkeys(normalize_base_url(str(u)) for u in items if str(u).strip()))


def check_url(url: str, allowed: tuple[str, ...]) -> str:
    base = normalize_base_url(url)
    if base not in allowed:
        raise InputError("serving.not_allowed", url=base)
    return base


def api_key(env: Mapping[str, str], secrets: Mapping[str, Any]) -> str | None:
    return env.get(ENV_KEY) or secrets.get(SECRET_KEY) or None


def limits(max_sweep_points: int | None = None, max_new_tokens: int | None = None) -> Limits:
    """The default caps, or a hosted demo's (its sweep-point and token caps, and smaller request counts)."""
    if max_sweep_points is None:
        return Limits()
    return Limits(max_points=max_sweep_points, max_tokens=max_new_tokens or Limits().max_tokens, **HOSTED_LIMITS)
