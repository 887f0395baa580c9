"""Building kvviz's C kernels: once per machine, with its C compiler, into the user's cache, loaded with ctypes.
Each kernel's module (int8, f32) says which source it builds with which flags and what runs where it cannot."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import torch

from kvviz.engine.user_cache import cache_root


def compiler() -> str | None:
    """The C compiler a build uses: $CC where set, else the first of cc, gcc and clang on PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((found for name in names if (found := shutil.which(name))), None)


def vector_flags() -> list[str]:
    """-mavx2 -mfma where torch's own CPU dispatch runs AVX2 or AVX-512 code on this CPU (so the CPU has both), else
    none: the plain loop, which any CPU runs."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return ["-mavx2", "-mfma"] if x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else []


def _build(cc: str, source: bytes, name: str, flags: list[str], out: Path) -> None:
    """Compiles to a temporary name beside `out`, then renames it: a process loading `out` never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / name
        src.write_bytes(source)
        built = Path(tmp) / out.name
        base = [cc, "-O3", "-shared", "-fPIC", *flags, str(src), "-o", str(built), "-lm"]
        # With OpenMP where the compiler has it: the kernel then shares torch's thread pool (torch ships
        # libgomp.so.1, and the loader reuses the copy torch loaded); without, one thread.
        for cmd in (base[:3] + ["-fopenmp"] + base[3:], base):
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if run.returncode == 0:
                os.replace(built, out)
                return
        raise RuntimeError(next((line for line in run.stderr.splitlines() if line.strip()), "no message"))


def load(name: str, what: str, flags: list[str]) -> tuple[ctypes.CDLL | None, str | None]:
    """The kernel built from kvviz/engine/kernels/`name` with `flags`, or None and why not (one line naming `what`).
    Built once per source, compiler and flags (the file's name says which), so a second process, or a second user of
    the same cache, loads it at once."""
    cc = compiler()
    if cc is None:
        return None, f"no C compiler (cc, gcc or clang, or $CC) to build {what}"
    source = resources.files("kvviz.engine.kernels").joinpath(name).read_bytes()
    key = hashlib.sha256(b"\0".join([source, cc.encode(), " ".join(flags).encode(), platform.machine().encode()]))
    path = cache_root() / "kernels" / f"{Path(name).stem}-{key.hexdigest()[:16]}.so"
    try:
        if not path.exists():
            _build(cc, source, name, flags, path)
        return ctypes.CDLL(str(path)), None
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return None, f"{what} did not build or load: {first}"[:200]
