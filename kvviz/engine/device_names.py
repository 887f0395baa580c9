"""The device and dtype names the UI offers, known without importing torch (~1 s): the first page a
visitor opens draws its sidebar before any model is loaded."""
from __future__ import annotations

import importlib.metadata
import platform
import sys
from pathlib import Path

DTYPE_NAMES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda", "mps")


def likely_devices() -> list[str]:
    """The devices a model can run on here. Once torch is imported (a model was loaded) this is torch's own
    answer; before that, what the installed build and the machine say: a CUDA build of torch (its version has
    no "+cpu") with an NVIDIA driver loaded, or Apple silicon. A wrong guess is caught when a model loads
    (resolve_device says the device is missing), and the next page draw uses torch's answer."""
    if "torch" in sys.modules:
        from kvviz.engine.device import available_devices

        return available_devices()
    found = ["cpu"]
    try:
        cpu_build = "+cpu" in importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        cpu_build = True
    if not cpu_build and Path("/proc/driver/nvidia/version").exists():
        found.append("cuda")
    if sys.platform == "darwin" and platform.machine() == "arm64":
        found.append("mps")
    return found
