"""The GPU table: totals as the device reports them (not marketed decimal sizes) and datasheet figures, each with
its source (kvviz/kv/hardware.toml)."""
import pytest

from kvviz.kv.hardware import HARDWARE

GIB, MIB = 2**30, 2**20


def test_the_issue_list_is_covered():
    for name in ("H100 SXM", "H100 PCIe", "H200", "A100 40GB", "A100 80GB", "L40S", "L4", "A10", "RTX 3090",
                 "RTX 4090"):
        hw = HARDWARE[name]
        assert hw.memory_bytes and hw.memory_source and hw.bandwidth_source and hw.flops_source, name


@pytest.mark.parametrize("name, cuda_total, smi_mib, marketed_gb", [
    ("H100 SXM", 85_045_477_376, 81559, 80),  # deviceQuery "85045477376 bytes"; nvidia-smi "81559MiB"
    ("A100 40GB", 42_298_834_944, 40960, 40),  # deviceQuery "42298834944 bytes"; nvidia-smi "40960MiB"
    ("H200", round(139.72 * GIB), 143771, 141),  # vLLM "total_gpu_memory (139.72GiB)"; nvidia-smi "143771MiB"
    ("RTX 3090", round(23.58 * GIB), 24576, 24),  # vLLM "total_gpu_memory=23.58GiB"
])
def test_device_reported_totals(name, cuda_total, smi_mib, marketed_gb):
    hw = HARDWARE[name]
    assert hw.memory_bytes == cuda_total and hw.memory_kind == "cuda"
    assert hw.nvidia_smi_total_mib == smi_mib
    # what CUDA reports is nvidia-smi's total less the driver's reserve: below it, and never the marketed 10⁹ size
    assert hw.memory_bytes < smi_mib * MIB
    assert hw.memory_bytes != marketed_gb * 10**9


def test_a_total_known_only_from_nvidia_smi_says_so():
    assert HARDWARE["H100 PCIe"].memory_kind == "nvidia-smi"
    assert HARDWARE["H100 PCIe"].memory_bytes == 81559 * MIB


@pytest.mark.parametrize("name, bandwidth, tflops", [
    ("H100 SXM", 3.35e12, 989.4),  # H100 datasheet: 3.35 TB/s, 1,979 TFLOPS FP16 with sparsity
    ("A100 80GB", 2.039e12, 312),  # A100 datasheet: 2,039 GB/s, 312 TFLOPS FP16 dense
    ("L4", 0.3e12, 121),  # L4 datasheet: 300 GB/s, 242 TFLOPS FP16 with sparsity
    ("RTX 4090", 1.008e12, 165.2),  # Ada whitepaper appendix A
])
def test_datasheet_figures(name, bandwidth, tflops):
    hw = HARDWARE[name]
    assert hw.bandwidth_bytes_per_s == bandwidth and hw.peak_flops == pytest.approx(tflops * 1e12)


def test_m3_max_is_not_twice_the_third_party_figure():
    """Issue 12 item 8: Apple publishes none; third-party pages give 14–16 TFLOPS fp16 for the 40-core GPU."""
    m3 = HARDWARE["Apple M3 Max (40-core GPU)"]
    assert 14e12 <= m3.peak_flops <= 16.5e12
    assert m3.memory_bytes is None and m3.memory_kind == "unknown"  # 36–128 GB models: unknown, never a default
