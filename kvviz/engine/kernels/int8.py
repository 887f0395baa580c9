"""kvviz's int8 matrix kernel (int8_gemv.c): built once per machine with its C compiler into the user's cache
(kernels.build), and called by model.linear() for every int8 matrix on a CPU. Where it cannot be built (no C compiler,
the build fails, the cache cannot be written) linear() calls torch's weight-only kernel instead and `why_not()` says
why in one line, as the compiled step does (kvviz.engine.compiled).

It multiplies integers, as llama.cpp does: the activations enter as int16 per block of 256 (int8_gemv.c says why);
torch's _weight_int8pack_mm turns every weight into a float first and, on an AVX2 CPU, runs a step's int8 matrices
at about half this speed (bench/gemv_paths.py --int8).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from kvviz.engine.kernels import build
from kvviz.engine.kernels.build import vector_flags  # any CPU: the plain loop where there is no AVX2

SOURCE = "int8_gemv.c"
BLOCK = 256  # activations per int16 scale (int8_gemv.c's BLOCK)


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str | None]:
    """The built kernel (kernels.build), or None and why not."""
    lib, why = build.load(SOURCE, "kvviz's int8 kernel", vector_flags())
    if lib is not None:
        fn = lib.kvviz_int8_linear
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        fn.restype = ctypes.c_int
    return lib, why


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
