"""The compiled decode step (kvviz.engine.compiled) on the shipped model, in each CPU mode (inductor's graph; kvviz's
C step, kernels/step.c), built once for the module: its logits equal the uncompiled step's and a recomputation's
within the rounding tolerance, its tokens equal, its attention rows and cache bytes the same, speculative rollback
unchanged; where it cannot compile it runs uncompiled and says why."""
import pytest
import torch

from kvviz.engine.compiled import CompiledStep, missing_compiler, mode_for
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend
from kvviz.engine.spec.decoding import SpeculativeGeneration
from kvviz.engine.spec.drafts import EarlyExitDraft, NgramDraft
from kvviz.engine.spec.ngram import NgramConfig
from kvviz.engine.timing import torch_threads
from kvviz.engine.tolerance import agreement, magnitude

PROMPTS = ("Once upon a time there was a little", "The cat sat on the mat. The cat sat on the")
REPETITIVE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with torch_threads(1):  # the graph is built for the thread count it runs with
        yield


@pytest.fixture(scope="module")
def eager():
    return load_backend("tiny", device="cpu")


@pytest.fixture(scope="module", params=["inductor", "kernels"])
def compiled(request):
    """The shipped model with its step compiled once in each mode, for every test in this module."""
    backend = load_backend("tiny", device="cpu")
    step = backend.compile(request.param)
    if step.why_not is not None:
        pytest.skip(f"cannot compile here: {step.why_not}")
    assert step.warm_up() is not None, step.why_not
    return backend


def within(a: torch.Tensor, b: torch.Tensor, d_model: int) -> bool:
    return agreement(float((a - b).abs().max()), torch.float32, magnitude(a, b), d_model).within


def run(backend, prompt: str, n: int = 12, **kw) -> Generation:
    gen = Generation(backend, max_new_tokens=n, stop_at_eos=False, **kw)
    gen.prefill(prompt)
    return gen


def test_compiled_steps_equal_uncompiled_and_recomputed(eager, compiled):
    d = compiled.spec.d_model
    for prompt in PROMPTS:  # two prompt lengths, two cache sizes: the same graph (compiled once, below)
        a, b = run(eager, prompt), run(compiled, prompt)
        while not b.done:
            a.step()
            b.step()
            assert within(a.last_logits, b.last_logits, d)
            diff, cached_tok, fresh_tok = b.cache_vs_recompute()
            assert cached_tok == fresh_tok
            assert agreement(diff, torch.float32, magnitude(b.last_logits), d).within
        assert a.generated == b.generated
        # The same per-layer reads, lengths and bytes the pages draw.
        assert b.events[-1].cache_lengths == a.events[-1].cache_lengths
        assert b.events[-1].live_bytes == a.events[-1].live_bytes == b.events[-1].formula_bytes
        assert b.events[-1].allocated_bytes == a.events[-1].allocated_bytes
        for layer in range(compiled.spec.n_layers):
            ka, va = eager.layer_kv(a.cache, layer)
            kb, vb = compiled.layer_kv(b.cache, layer)
            assert ka.shape == kb.shape and within(ka, kb, d) and within(va, vb, d)
    step = compiled.compiled
    assert step.why_not is None and len(step.compiles) == 1  # one graph for every position and size
    # on CPU inductor's graph returns the attention rows too; kvviz's C step writes them only when asked
    assert step.compiles[step.mode == "inductor"].first_step_s > 0


def test_compiled_step_calls_kvviz_float32_kernel(compiled, monkeypatch):
    """Where kvviz's float32 kernel built, the compiled graph keeps it (kvviz::f32_linear) for every matrix: four a
    layer inside the graph and the LM head after it; prefill's many rows go to F.linear, all but its last position's
    LM head. kvviz's C step calls the kernel from C: no product through Python in a step."""
    from kvviz.engine.kernels import f32 as f32_kernel

    if (why := f32_kernel.why_not()) is not None:
        pytest.skip(why)
    calls = []
    product = f32_kernel.product
    monkeypatch.setattr(f32_kernel, "product", lambda *a: calls.append(1) or product(*a))
    gen = run(compiled, PROMPTS[0], n=2)
    assert len(calls) == 1
    calls.clear()
    gen.step()
    assert len(calls) == (4 * compiled.spec.n_layers + 1 if compiled.compiled.mode == "inductor" else 0)


def test_attention_rows_equal_uncompiled(eager, compiled):
    a, b = run(eager, PROMPTS[0], 6, capture_attention=True), run(compiled, PROMPTS[0], 6, capture_attention=True)
    while not b.done:
        ea, eb = a.step(), b.step()
        for ra, rb in zip(ea.attention, eb.attention, strict=True):
            assert ra.shape == rb.shape == (compiled.spec.n_heads, ea.position + 1)
            assert abs(ra - rb).max() <= 1e-5 and abs(rb.sum(axis=-1) - 1).max() <= 1e-5


def test_speculative_rollback_unchanged(eager, compiled):
    """Greedy speculation on the compiled step: plain decoding's tokens, the cache cropped to the same lengths and
    values (an n-gram draft: the compiled step writes after each crop; an early exit: layers of unequal lengths,
    which the compiled step leaves to the uncompiled one)."""
    plain = Generation(eager, max_new_tokens=16, stop_at_eos=False)
    plain.run(REPETITIVE)
    for draft in (NgramDraft(NgramConfig(1, 3)), EarlyExitDraft(2)):
        gen = SpeculativeGeneration(compiled, draft, k=3, max_new_tokens=16, stop_at_eos=False)
        gen.run(REPETITIVE)
        assert gen.generated == plain.generated[0]
        assert gen.rollback_tokens > 0
        assert gen.cache.lengths == plain.cache.lengths
        for layer in range(compiled.spec.n_layers):
            assert within(gen.cache.keys(layer), plain.cache.keys(layer), compiled.spec.d_model)


def test_cli_generate_compile(eager, capsys):
    """`generate --compile`: the same tokens as without it, and one line with the compile's cost in the mode this
    CPU takes (kvviz's C step where it builds)."""
    from kvviz.cli import main

    args = ["generate", "--model", "tiny", "--device", "cpu", "--prompt", PROMPTS[0], "--max-new-tokens", "6"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--compile"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == plain.splitlines()[0]  # the text
    assert f"compiled step ({mode_for(eager.device, eager.model)}): first step" in out.splitlines()[-1]


def test_no_compiler_runs_uncompiled_and_says_why(eager, monkeypatch):
    from torch._inductor import config

    monkeypatch.setattr(config.cpp, "cxx", ("no-such-c++",))
    step = CompiledStep(eager.model, torch.device("cpu"), "inductor")
    assert step.why_not == missing_compiler(torch.device("cpu"))
    assert "no C++ compiler (no-such-c++)" in step.why_not
    gen = run(eager, PROMPTS[0], 3)
    with torch.inference_mode():
        assert step(torch.tensor([[gen.generated[0][-1]]]), gen.cache, capture=False) is None
    assert gen.cache.length == len(gen.prompt_ids)  # nothing written, nothing counted


def test_failed_compile_falls_back_and_says_why(monkeypatch):
    """A compiler that fails (every run of it exits 1), no cached build to reuse: the step runs uncompiled, its
    tokens those of the uncompiled model, and the reason is one line."""
    from torch._inductor import config

    monkeypatch.setattr(config.cpp, "cxx", ("false",))
    monkeypatch.setattr(config, "force_disable_caches", True)
    torch._dynamo.reset()  # no graph compiled earlier in this process either
    backend = load_backend("tiny", device="cpu")
    step = backend.compile("inductor")
    assert step.why_not is None  # a compiler is there: the failure shows only when it runs
    gen = run(backend, PROMPTS[1], 3)
    try:
        while not gen.done:
            gen.step()
    finally:
        torch._dynamo.reset()
    assert step.why_not is not None and "\n" not in step.why_not
    assert step.compiles[True].why_not == step.why_not and step.compiles[True].first_step_s is None
    ref = Generation(load_backend("tiny", device="cpu"), max_new_tokens=3, stop_at_eos=False)
    ref.run(PROMPTS[1])
    assert gen.generated == ref.generated


@pytest.mark.parametrize("mode", ["inductor", "kernels"])
def test_int8_compiled_step_calls_kvviz_int8_kernel_and_equals_uncompiled(mode, monkeypatch):
    from kvviz.engine.kernels import int8 as int8_kernel

    if (why := int8_kernel.why_not()) is not None:
        pytest.skip(why)
    eager8, compiled8 = (load_backend("tiny", device="cpu", weights="int8") for _ in range(2))
    step = compiled8.compile(mode)
    if step.why_not is not None:
        pytest.skip(f"cannot compile here: {step.why_not}")
    assert step.warm_up() is not None, step.why_not
    calls = []
    product = int8_kernel.product
    monkeypatch.setattr(int8_kernel, "product", lambda *a: calls.append(1) or product(*a))
    a, b = run(eager8, PROMPTS[0]), run(compiled8, PROMPTS[0])
    while not b.done:
        a.step()
        calls.clear()
        b.step()
        # the four matrices of every layer inside the graph (kvviz::int8_linear), the LM head after it; kvviz's C
        # step calls the kernel from C
        assert len(calls) == (4 * compiled8.spec.n_layers + 1 if mode == "inductor" else 0)
        # The graph's fused norms round in another order, and an activation on the edge of an int16 step then rounds
        # the other way: a step of 2⁻¹⁵ of its block's largest, held (as tests/engine/test_quantized.py holds int8's
        # cached and recomputed logits) to bfloat16's precision
        diff = float((a.last_logits - b.last_logits).abs().max())
        assert agreement(diff, torch.bfloat16, magnitude(a.last_logits), compiled8.spec.d_model).within
    assert a.generated == b.generated and step.why_not is None
