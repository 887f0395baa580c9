"""kvviz's int8 matrix kernel (int8_gemv.c): built once per machine with its C compiler into the user's cache, loaded
with ctypes, and called by model.linear() for every int8 matrix on a CPU. Where it cannot be built (no C compiler,
the build fails, the cache cannot be written) linear() calls torch's weight-only kernel instead and `why_not()` says
why in one line, as the compiled step does (kvviz.engine.compiled).

It multiplies integers, as llama.cpp does: the activations enter as int16 per block of 256 (int8_gemv.c says why);
torch's _weight_int8pack_mm turns every weight into a float first and, on an AVX2 CPU, runs a step's int8 matrices
at about half this speed (bench/gemv_paths.py --int8).
"""
from __future__ import annotations

import ctypes
import functools
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

SOURCE = "int8_gemv.c"
BLOCK = 256  # activations per int16 scale (int8_gemv.c's BLOCK)


def compiler() -> str | None:
    """The C compiler a build uses: $CC where set, else the first of cc, gcc and clang on PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((found for name in names if (found := shutil.which(name))), None)


def vector_flags() -> list[str]:
    """-mavx2 -mfma where torch's own CPU dispatch runs AVX2 or AVX-512 code on this CPU (so the CPU has both), else
    none: the plain loop, which any CPU runs."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return ["-mavx2", "-mfma"] if x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else []


def _build(cc: str, source: bytes, flags: list[str], out: Path) -> None:
    """Compiles to a temporary name beside `out`, then renames it: a process loading `out` never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / SOURCE
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


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str | None]:
    """The built kernel, or None and why not. Built once per source, compiler and flags (the file's name says which),
    so a second process, or a second user of the same cache, loads it at once."""
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc or clang, or $CC) to build kvviz's int8 kernel"
    source = resources.files("kvviz.engine.kernels").joinpath(SOURCE).read_bytes()
    flags = vector_flags()
    key = hashlib.sha256(b"\0".join([source, cc.encode(), " ".join(flags).encode(), platform.machine().encode()]))
    path = cache_root() / "kernels" / f"int8_gemv-{key.hexdigest()[:16]}.so"
    try:
        if not path.exists():
            _build(cc, source, flags, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return None, f"kvviz's int8 kernel did not build or load: {first}"[:200]
    fn = lib.kvviz_int8_linear
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib, None


def why_not(device: torch.device | str | None = None) -> str | None:
    """None where kvviz's int8 kernel multiplies the int8 matrices (a CPU; `device` None: this machine's CPU), else
    why torch's weight-only kernel does."""
    if device is not None and torch.device(device).type != "cpu":
        return f"kvviz's int8 kernel runs on CPUs, not {device}"
    return _library()[1]


def name(device: torch.device | str | None = None) -> str:
    """Which kernel multiplies the int8 matrices on `device`, for a run's record."""
    return "kvviz int8 kernel (activations int16 per block of 256)" if why_not(device) is None \
        else "torch _weight_int8pack_mm"


def product(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., K] (any float dtype) times the int8 matrix q [N, K] with its bfloat16 row scales: [..., N] float32.
    Call only where why_not() is None. Kept lean (no reshape, no copy of a float32 contiguous x): a compiled step
    calls it ~120 times a token, and each microsecond here is ~0.1 ms of a step."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    k, n = x.shape[-1], q.shape[0]
    y = x.new_empty((*x.shape[:-1], n))
    if _library()[0].kvviz_int8_linear(x.data_ptr(), x.numel() // k, q.data_ptr(), scale.data_ptr(), y.data_ptr(),
                                       n, k, torch.get_num_threads()):
        raise MemoryError(f"kvviz's int8 kernel could not allocate {x.numel() // k} × {k} int16 activations")
    return y
