"""Accelerator presets for roofline bounds and capacity planning (user-editable in the app).

Figures are vendor datasheet numbers: memory as marketed (decimal GB), bandwidth in bytes/s, and peak
*dense* 16-bit tensor FLOP/s (no structured-sparsity doubling).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_flops: float  # dense bf16/fp16 FLOP/s

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from memory- to compute-bound."""
        return self.peak_flops / self.bandwidth_bytes_per_s


GB, TB, TFLOPS = 10**9, 10**12, 10**12

HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware("H100 SXM", 80 * GB, 3.35 * TB, 989 * TFLOPS),
        Hardware("H200", 141 * GB, 4.8 * TB, 989 * TFLOPS),
        Hardware("A100 80GB", 80 * GB, 2.039 * TB, 312 * TFLOPS),
        Hardware("L4", 24 * GB, 0.3 * TB, 121 * TFLOPS),
        Hardware("RTX 4090", 24 * GB, 1.008 * TB, 165 * TFLOPS),
        Hardware("Apple M3 Max", 128 * GB, 0.4 * TB, 28 * TFLOPS),
        Hardware("Generic CPU", 64 * GB, 0.05 * TB, 1 * TFLOPS),
    )
}
