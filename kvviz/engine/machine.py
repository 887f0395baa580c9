"""What this machine is doing right now, without torch (a page shows it before any model is loaded)."""
from __future__ import annotations

import os


def cpu_load() -> tuple[float, int] | None:
    """(1-minute load average, cores this process may use), or None where the OS has no load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return load, cores
