"""What a hosted deployment allows for Hugging Face models: an allow-list and a size cap (pure, no torch).

Configured by environment variables (`KVVIZ_HF_ALLOWLIST` comma-separated, `KVVIZ_HF_MAX_PARAMS` like
`500M` or `1.5e9`) or by `.streamlit/secrets.toml` (`hf_allowlist`, `hf_max_params`); an environment
variable wins over the secret of the same setting. Unset means unrestricted (a local install).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvviz.errors import InputError

ENV_ALLOWLIST = "KVVIZ_HF_ALLOWLIST"
ENV_MAX_PARAMS = "KVVIZ_HF_MAX_PARAMS"
SECRET_ALLOWLIST = "hf_allowlist"
SECRET_MAX_PARAMS = "hf_max_params"
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}


@dataclass(frozen=True)
class HFPolicy:
    allowlist: tuple[str, ...] | None = None  # None = any model; else only these hub ids / directories
    max_params: int | None = None  # None = any size


OPEN_POLICY = HFPolicy()  # any model, any size: the CLI and a local app


def parse_params(text: str | int | float) -> int:
    """'135M' -> 135_000_000; '1.5e9', '2B', 500 also accepted."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMbBgG]?)\s*", str(text))
        if not match:
            raise InputError("hf.bad_max_params", value=text)
        value = float(match[1]) * _SUFFIX[match[2].upper()]
    if value <= 0:
        raise InputError("hf.bad_max_params", value=text)
    return int(value)


def _allowlist(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(s for s in (str(item).strip() for item in items) if s)


def policy_from(env: Mapping[str, str], secrets: Mapping[str, Any] | None = None) -> HFPolicy:
    secrets = secrets or {}
    allow = env.get(ENV_ALLOWLIST) or secrets.get(SECRET_ALLOWLIST)
    cap = env.get(ENV_MAX_PARAMS) or secrets.get(SECRET_MAX_PARAMS)
    return HFPolicy(
        allowlist=_allowlist(allow) if allow else None,
        max_params=parse_params(cap) if cap else None,
    )


def _same_dir(a: str, b: str) -> bool:
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.is_dir() and pb.is_dir() and pa.resolve() == pb.resolve()


def check_allowed(name: str, policy: HFPolicy) -> None:
    """Refuse a model outside the allow-list (hub ids match exactly; directories by resolved path)."""
    if policy.allowlist is None:
        return
    if name in policy.allowlist or any(_same_dir(name, allowed) for allowed in policy.allowlist):
        return
    raise InputError("hf.not_allowed", name=name, allowed=", ".join(policy.allowlist))


def check_size(name: str, n_params: int, policy: HFPolicy) -> None:
    """Refuse a model over the size cap before its weights are read."""
    if policy.max_params is not None and n_params > policy.max_params:
        raise InputError("hf.too_big", name=name, n_params=f"{n_params:,}", max_params=f"{policy.max_params:,}")
