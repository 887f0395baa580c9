"""Device and dtype choice, device-synchronized timing and memory readings (CUDA paths included)."""
from __future__ import annotations

import torch

from kvviz.engine.device_names import DEVICES, DTYPE_NAMES, available_devices
from kvviz.errors import InputError

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise InputError("unknown_dtype", name=name, choices=", ".join(DTYPES)) from None


def resolve_device(name: str = "auto") -> torch.device:
    if name not in DEVICES:
        raise InputError("unknown_device", name=name, choices=", ".join(DEVICES))
    if name == "auto":
        return torch.device(available_devices()[1] if len(available_devices()) > 1 else "cpu")  # CUDA first
    if name not in available_devices():
        raise InputError("no_device", name=name)
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so a wall-clock reading covers finished work only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def device_memory_allocated(device: torch.device) -> int | None:
    """Bytes the framework's allocator holds on the device; None where there is no such reading (CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    if device.type == "mps":
        return int(torch.mps.current_allocated_memory())
    return None
