"""How far two computations of the same numbers may differ by floating-point rounding alone: every "equal",
"unchanged" or "rounding only" verdict the app shows is computed against this one tolerance.

Two paths that multiply in different orders (a parallel pass and step-by-step decode, a cache and a recomputation)
round differently. Their results differ by
- the rounding of each result to the dtype: a few units in the last place, ROUNDING_ULPS · eps(dtype) · |x|, and
- the accumulation of a dot product of n terms in another order: about √n · eps_acc · |x|, where sums run in at
  least float32 (CPU and GPU kernels accumulate bfloat16/float16 products in float32),
with |x| the largest magnitude of the values compared and eps = torch.finfo(dtype).eps (2⁻²³ for float32,
2⁻⁷ for bfloat16, 2⁻¹⁰ for float16). Measured on the shipped and random models
(tests/engine/test_tolerance.py), rounding alone stays under 0.8 of it (0.54 at most: the shipped model's float32
cached logits against a recomputation; 0.35 in bfloat16); a bidirectional model's drift is more than 100 times above
it in float32. The result's own rounding is counted as 6 ULPs: a one-row product through MKL's packed sgemm
(model.prepack) lands 2-3× as far from the float64 product as oneDNN's or F.linear's (still well under
√n·eps·|x|), and a random two-layer Qwen2 with large biases (tests/engine/test_real_model.py) decoded through it
reached 1.04 of the tolerance at 4 ULPs, 0.92 at 6.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROUNDING_ULPS = 6  # the result's own rounding, on either path, and its propagation through a few layers


def eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps)


def rounding_tolerance(dtype: torch.dtype, magnitude: float, n_terms: int = 1) -> float:
    """The largest difference rounding explains between two computations, in `dtype`, of values up to
    `magnitude` in size, each a sum of up to `n_terms` products (a model's d_model)."""
    out = eps(dtype)
    acc = min(out, eps(torch.float32))
    return abs(magnitude) * (ROUNDING_ULPS * out + math.sqrt(max(n_terms, 1)) * acc)


def magnitude(*tensors: torch.Tensor) -> float:
    """The largest |value| over every tensor given (the scale the rounding is relative to)."""
    return max((float(t.detach().abs().max()) for t in tensors if t.numel()), default=0.0)


@dataclass(frozen=True)
class Agreement:
    """A measured difference judged against the rounding tolerance it is stated with."""

    diff: float
    tolerance: float

    @property
    def exact(self) -> bool:
        return self.diff == 0.0

    @property
    def within(self) -> bool:
        return self.diff <= self.tolerance


def agreement(diff: float, dtype: torch.dtype, magnitude: float, n_terms: int = 1) -> Agreement:
    return Agreement(float(diff), rounding_tolerance(dtype, magnitude, n_terms))
