"""kvviz's float32 one-row kernel (f32_gemv.c): built once per machine into the user's cache (kernels.build) where the
CPU runs AVX2 and FMA; prepack() packs a float32 matrix into its layout (pack()) and model.linear() multiplies one row
at a time there (a decode step at batch 1). Elsewhere (no AVX2, no C compiler, a failed build) prepack() keeps
torch's packed kernels, MKL's and oneDNN's, and `why_not()` says why in one line.

Measured on SmolLM2's step (bench/gemv_paths.py): a step's float32 matrices at about the rate of a plain read of the
same bytes, on one thread and on two; torch's best packed kernel is 1.1× (one thread) and 1.5× (two) as slow.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from kvviz.engine.kernels import build

SOURCE = "f32_gemv.c"
ROWS = 8  # rows per group of the packed layout (f32_gemv.c's ROWS)


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str | None]:
    """The built kernel (kernels.build), or None and why not."""
    flags = build.vector_flags()
    if not flags:  # f32_gemv.c is AVX2 code only; torch's packed kernels run elsewhere (no plain loop was measured)
        return None, "kvviz's float32 kernel needs AVX2 and FMA, which this CPU's torch does not run"
    lib, why = build.load(SOURCE, "kvviz's float32 kernel", flags)
    if lib is not None:
        lib.kvviz_f32_linear.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int]
        lib.kvviz_f32_pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        lib.kvviz_f32_linear.restype = lib.kvviz_f32_pack.restype = None
    return lib, why


def why_not(device: torch.device | str | None = None) -> str | None:
    """None where kvviz's float32 kernel multiplies one row by a float32 matrix (a CPU; `device` None: this machine's
    CPU), else why torch's kernels do."""
    if device is not None and torch.device(device).type != "cpu":
        return f"kvviz's float32 kernel runs on CPUs, not {device}"
    return _library()[1]


def pack(w: torch.Tensor) -> torch.Tensor:
    """The float32 matrix w [N, K] (K a multiple of 8) in the kernel's layout: ceil(N / 8) groups of 8 rows, 8 × K
    floats each (f32_gemv.c). Call only where why_not() is None."""
    n, k = w.shape
    w = w.contiguous()
    p = w.new_empty(-(-n // ROWS), ROWS * k)
    _library()[0].kvviz_f32_pack(w.data_ptr(), p.data_ptr(), n, k)
    return p


def product(x: torch.Tensor, p: torch.Tensor, n: int) -> torch.Tensor:
    """One float32 row x (any shape of K entries, contiguous) times the matrix of N rows that pack() made p of: x's
    shape with N for K. Call only where why_not() is None. Kept lean, as int8.product is: a step calls it ~120 times."""
    k = x.shape[-1]
    y = x.new_empty((*x.shape[:-1], n))
    _library()[0].kvviz_f32_linear(x.data_ptr(), p.data_ptr(), y.data_ptr(), n, k, torch.get_num_threads())
    return y
