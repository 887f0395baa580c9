"""kvviz's int8 kernel (kvviz/engine/kernels/int8_gemv.c): built with this machine's C compiler, it gives the product of
the int8 matrix and the activations rounded as it states (int16 per block of 256) to float32 rounding, stays within
the stated bound of the unrounded activations' product, and where it cannot be built linear() runs torch's kernel and
says why."""
import pytest
import torch

from kvviz.engine.kernels import build
from kvviz.engine.kernels import f32 as f32_kernel
from kvviz.engine.kernels import int8 as int8_kernel
from kvviz.engine.model import Int8Weight, linear
from kvviz.engine.timing import torch_threads
from kvviz.engine.tolerance import agreement, magnitude


def rounded_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's rounding, written again in torch: per block of 256, d = max|x| / 32767 and xq = round(x · 32767 /
    max|x|), both in float32 (int8_gemv.c quantize_row). Returns xq [..., K] and each entry's d."""
    blocks = x.split(int8_kernel.BLOCK, dim=-1)
    amax = [b.abs().amax(dim=-1, keepdim=True) for b in blocks]
    xq = torch.cat([torch.round(b * (32767.0 / a)) for b, a in zip(blocks, amax, strict=True)], dim=-1)
    d = torch.cat([(a / 32767.0).expand_as(b) for b, a in zip(blocks, amax, strict=True)], dim=-1)
    return xq, d


@pytest.fixture
def built():
    if (why := int8_kernel.why_not()) is not None:
        pytest.skip(why)


# k = 64: the AVX2 loop in one block; 600: three blocks, the last of 88 columns (not a multiple of 16: the plain
# loop); 1,536: six blocks (SmolLM2's down projection). n = 7 and 97 leave rows past the last group of four.
@pytest.mark.parametrize("n,k", [(96, 64), (7, 600), (97, 1536)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_multiplies_the_activations_it_states_exactly_to_float32_rounding(built, n, k, threads):
    gen = torch.Generator().manual_seed(n + k)
    q = Int8Weight.quantize(torch.randn(n, k, generator=gen))
    x = torch.randn(3, k, generator=gen) * torch.linspace(0.1, 10, k)  # blocks of unequal scale
    with torch_threads(threads):
        ours = int8_kernel.product(x, q.q, q.scale)
    xq, d = rounded_activations(x)
    # integer products, exact in float64, each block scaled by its d, the row by its scale
    ref = torch.zeros(3, n, dtype=torch.float64)
    for b0 in range(0, k, int8_kernel.BLOCK):
        sl = slice(b0, b0 + int8_kernel.BLOCK)
        ref += (xq[:, sl].double() @ q.q[:, sl].double().T) * d[:, b0:b0 + 1].double()
    ref *= q.scale.double()
    assert ours.dtype == torch.float32 and ours.shape == (3, n)
    assert agreement((ours.double() - ref).abs().max(), torch.float32, magnitude(ref), k).within


def test_the_kernel_stays_within_half_an_activation_step_of_the_unrounded_product(built):
    """The stated bound: each activation moves by at most half its block's step d / 2, so each output by at most
    Σ_i |w_i| · d_i / 2 (w the dequantized row), plus float32 rounding."""
    gen = torch.Generator().manual_seed(7)
    q = Int8Weight.quantize(torch.randn(64, 576, generator=gen))
    x = torch.randn(2, 576, generator=gen)
    x[:, 3] = 40.0  # an outlier: its block's step is 40 / 32767
    _, d = rounded_activations(x)
    w = q.dequantize().double()
    bound = (d.double() / 2) @ w.abs().T
    exact = x.double() @ w.T
    ours = linear(x, q).double()
    slack = agreement(0, torch.float32, magnitude(exact), 576).tolerance
    assert bool(((ours - exact).abs() <= bound + slack).all())
    assert float((ours - exact).abs().max()) > 0  # the rounding is there: the bound is what is checked


def test_without_the_kernel_linear_runs_torchs_and_says_why(monkeypatch):
    monkeypatch.setattr(int8_kernel, "_library", lambda: (None, "no C compiler (cc, gcc or clang, or $CC)"))
    assert int8_kernel.why_not().startswith("no C compiler")
    assert int8_kernel.name() == "torch _weight_int8pack_mm"
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(0))
    q = Int8Weight.quantize(w)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1))
    # torch's kernel == the matmul of the dequantized matrix with x in bfloat16 (its input), to bfloat16 rounding
    ours, ref = linear(x, q), x.bfloat16().float() @ q.dequantize().T
    assert ours.dtype == torch.float32 and ours.shape == (3, 5, 96)
    assert agreement((ours - ref).abs().max(), torch.bfloat16, magnitude(ours, ref), 64).within


def test_on_another_device_torchs_kernel_runs_and_the_record_says_why():
    assert int8_kernel.why_not("cuda:0") == "kvviz's int8 kernel runs on CPUs, not cuda:0"
    assert int8_kernel.name("cuda:0") == "torch _weight_int8pack_mm"


@pytest.mark.parametrize("kernel,what", [(int8_kernel, "int8"), (f32_kernel, "float32")])
def test_a_compiler_that_fails_leaves_one_line_and_no_file(monkeypatch, tmp_path, kernel, what):
    """Either kernel's build (kernels.build)."""
    if kernel is f32_kernel and not build.vector_flags():
        pytest.skip("no AVX2: the float32 kernel is not built here")
    monkeypatch.setenv("CC", "false")  # a compiler that exits 1 with no message
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    kernel._library.cache_clear()
    try:
        why = kernel.why_not()
    finally:
        kernel._library.cache_clear()
    assert why == f"kvviz's {what} kernel did not build or load: no message", why
    assert list((tmp_path / "kernels").iterdir()) == []  # the build's temporary folder went with it


def test_the_built_kernel_is_kept_in_the_cache_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    int8_kernel._library.cache_clear()
    try:
        if (why := int8_kernel.why_not()) is not None:
            pytest.skip(why)
        built = list((tmp_path / "kernels").iterdir())
        int8_kernel._library.cache_clear()
        assert int8_kernel.why_not() is None
        assert list((tmp_path / "kernels").iterdir()) == built and len(built) == 1  # loaded, not built again
    finally:
        int8_kernel._library.cache_clear()


def test_the_plain_loop_other_cpus_build_gives_the_vector_loops_products(monkeypatch, tmp_path):
    """Built without -mavx2 (what an ARM laptop or an older x86 builds): the plain C loop, the same rounding, the same
    integer sums; only the float32 sums of the blocks run in another order."""
    gen = torch.Generator().manual_seed(3)
    q = Int8Weight.quantize(torch.randn(37, 576, generator=gen))
    x = torch.randn(2, 576, generator=gen)
    if int8_kernel.why_not() is not None:
        pytest.skip(int8_kernel.why_not())
    vector = int8_kernel.product(x, q.q, q.scale)
    monkeypatch.setattr(int8_kernel, "vector_flags", lambda: [])
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    int8_kernel._library.cache_clear()
    try:
        assert int8_kernel.why_not() is None
        plain = int8_kernel.product(x, q.q, q.scale)
    finally:
        int8_kernel._library.cache_clear()
    assert agreement((plain - vector).abs().max(), torch.float32, magnitude(vector), 576).within


def test_a_nan_or_an_infinity_in_the_activations_gives_nan_not_a_number_that_looks_right(built):
    q = Int8Weight.quantize(torch.randn(9, 576, generator=torch.Generator().manual_seed(5)))
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(6))
    x[0, 300], x[1, 5] = float("nan"), float("inf")  # row 0's second block, row 1's first
    y = int8_kernel.product(x, q.q, q.scale)
    assert bool(y[:2].isnan().all()) and bool(y[2].isfinite().all())
