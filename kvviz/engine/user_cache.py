"""Where kvviz keeps what it makes once per user (fetched models, built kernels, corpus sources): the user's cache,
never beside the package or anywhere else (a checkout or site-packages may not be writable)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """~/.cache/kvviz, or KVVIZ_CACHE_DIR (a hosted deployment points it at its own volume)."""
    return Path(os.environ.get("KVVIZ_CACHE_DIR") or Path.home() / ".cache" / "kvviz")
