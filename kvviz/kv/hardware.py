"""Accelerators for roofline bounds and capacity planning, and the links a KV cache moves over: each number with its
source (kvviz/kv/hardware.toml).

Memory is one device's total as the device reports it to CUDA (what torch.cuda.mem_get_info() and vLLM's
"total_gpu_memory" show), not the marketed decimal size; None where it is unknown (Apple's unified memory comes in
several sizes). Bandwidth in bytes/s; peak is dense 16-bit tensor FLOP/s (no structured-sparsity doubling).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("hardware.toml")


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth_bytes_per_s: float
    peak_flops: float  # dense bf16/fp16 FLOP/s
    memory_bytes: int | None = None
    memory_kind: str = "cuda"  # "cuda": as CUDA reports it; "nvidia-smi": the larger nvidia-smi total; "given"
    memory_source: str = ""
    bandwidth_source: str = ""
    flops_source: str = ""
    nvidia_smi_total_mib: int | None = None

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from memory- to compute-bound."""
        return self.peak_flops / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Link:
    """A path K/V bytes take: host↔GPU (PCIe), GPU↔GPU (NVLink), machine↔machine (a network), disk→host."""

    name: str
    kind: str  # host | gpu | network | disk
    bandwidth_bytes_per_s: float  # one direction, nominal
    bandwidth_source: str = ""

    def seconds(self, n_bytes: float) -> float:
        return n_bytes / self.bandwidth_bytes_per_s


def _load(table: str, cls: type) -> dict:
    rows = tomllib.loads(TABLE.read_text(encoding="utf-8"))[table]
    keep = set(cls.__dataclass_fields__)
    return {r["name"]: cls(**{k: v for k, v in r.items() if k in keep}) for r in rows}


HARDWARE: dict[str, Hardware] = _load("device", Hardware)
LINKS: dict[str, Link] = _load("link", Link)
