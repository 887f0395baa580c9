"""kvviz's float32 one-row kernel (kvviz/engine/kernels/f32_gemv.c): where it builds (AVX2 and FMA) prepack() packs a
float32 matrix into its layout and linear() multiplies one row there, to float32 rounding of the float64 product;
more rows go to F.linear on the parts; where it does not build, torch's packed kernels run and why_not() says why."""
import pytest
import torch
import torch.nn.functional as F

from kvviz.engine.kernels import build
from kvviz.engine.kernels import f32 as f32_kernel
from kvviz.engine.model import PackedWeight, linear, prepack
from kvviz.engine.timing import torch_threads
from kvviz.engine.tolerance import agreement, magnitude


@pytest.fixture
def built():
    if (why := f32_kernel.why_not()) is not None:
        pytest.skip(why)


# n = 7 and 97: a last group of 8 rows padded with zero rows; 96 × 64: whole groups; 576 × 1536: SmolLM2's down
# projection, more groups than one thread's task (4) on either thread count.
@pytest.mark.parametrize("n,k", [(96, 64), (7, 600), (97, 1536), (576, 1536)])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_row_is_the_float64_product_to_float32_rounding(built, n, k, threads):
    gen = torch.Generator().manual_seed(n + k)
    w, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    with torch_threads(threads):
        packed = prepack(w[: n // 3 or 1], w[n // 3 or 1:])  # given in parts, as fused Q/K/V is
        x = torch.randn(1, 1, k, generator=gen) * torch.linspace(0.1, 10, k)
        ours = linear(x, packed, bias)
    assert isinstance(packed, PackedWeight) and packed.kernel == "kvviz" and packed.shape == (n, k)
    assert packed.w.numel() == -(-n // 8) * 8 * k  # the packed copy, padded to whole groups
    assert all(p.data_ptr() == w.data_ptr() + i * (n // 3 or 1) * k * 4 for i, p in enumerate(packed.parts))
    ref = x.double() @ w.double().T + bias.double()
    assert ours.dtype == torch.float32 and ours.shape == (1, 1, n)
    verdict = agreement((ours.double() - ref).abs().max(), torch.float32, magnitude(ref), k)
    assert verdict.within, verdict


def test_more_rows_are_f_linears_and_k_off_the_vector_width_is_torchs(built):
    """More than one row (prefill, a batch) or a row that needs a gradient goes to F.linear on the plain matrix, bit
    for bit; a matrix whose K is not a multiple of 8 is left to torch's kernels."""
    w = torch.nn.Parameter(torch.randn(64, 96, generator=torch.Generator().manual_seed(1)))
    packed = prepack(w)
    assert packed.kernel == "kvviz" and packed.parts[0].data_ptr() == w.data_ptr()
    odd = prepack(torch.randn(5, 13))
    assert not isinstance(odd, PackedWeight) or odd.kernel != "kvviz"
    x = torch.randn(2, 3, 96, generator=torch.Generator().manual_seed(2))
    assert torch.equal(linear(x, packed), F.linear(x, w.detach()))
    g, h = (torch.randn(1, 96, generator=torch.Generator().manual_seed(3)).requires_grad_() for _ in range(2))
    linear(g, packed).sum().backward()
    F.linear(h, w.detach()).sum().backward()
    assert torch.equal(g.grad, h.grad)


def test_without_avx2_torchs_packed_kernels_run_and_say_why(monkeypatch):
    monkeypatch.setattr(build, "vector_flags", lambda: [])
    f32_kernel._library.cache_clear()
    try:
        assert f32_kernel.why_not() == "kvviz's float32 kernel needs AVX2 and FMA, which this CPU's torch does not run"
        packed = prepack(torch.randn(64, 96))
        assert not isinstance(packed, PackedWeight) or packed.kernel in ("mkl", "onednn")
    finally:
        f32_kernel._library.cache_clear()
    assert f32_kernel.why_not("cuda:0") == "kvviz's float32 kernel runs on CPUs, not cuda:0"

