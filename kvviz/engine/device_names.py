"""The device and dtype names the UI offers, known without importing torch (~1 s): the first page a
visitor opens draws its sidebar before any model is loaded. Only available_devices (torch's own answer) imports
torch, when called; kvviz.engine.device builds on this module, never the other way round."""
from __future__ import annotations

import importlib.metadata
import platform
import sys
from pathlib import Path

DTYPE_NAMES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda", "mps")
WEIGHTS = ("float", "int8")  # the native decoder's matrices: in the model's dtype, or int8 per output channel


def likely_devices() -> list[str]:
    """The devices a model can run on here. Once torch is imported (a model was loaded) this is torch's own
    answer; before that, what the installed build and the machine say: a CUDA build of torch (its version has
    no "+cpu") with an NVIDIA driver loaded, or Apple silicon. A wrong guess is caught when a model loads
    (resolve_device says the device is missing), and the next page draw uses torch's answer."""
    if imported("torch"):
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


def imported(name: str) -> bool:
    """Whether module `name` has finished importing. A module is in sys.modules from the moment its import begins:
    while the app's background preload imports torch (~2 s), `import torch` elsewhere waits on the import lock, so a
    page drawn then (its sidebar, before its title) would wait with it. `__spec__._initializing` is the flag
    importlib itself keeps on a module until its code has run (importlib._bootstrap._find_and_load checks it)."""
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


def available_devices() -> list[str]:
    """torch's own answer: the devices this process can run on (imports torch; kvviz.engine.device re-exports it)."""
    import torch

    found = ["cpu"]
    if torch.cuda.is_available():
        found.append("cuda")
    if torch.backends.mps.is_available():
        found.append("mps")
    return found
