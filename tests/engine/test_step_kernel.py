"""kvviz's C decode step (kvviz/engine/kernels/step.c), beyond what tests/engine/test_compiled.py checks of it as the
compiled step's "kernels" mode: it follows the model's matrices when they change under it, leaves to the uncompiled
step what it does not run (a batch, a bfloat16 cache), and where it cannot run says why in one line and the CPU's
compiled step is inductor's."""
import pytest
import torch

from kvviz.engine.compiled import CompiledStep, mode_for
from kvviz.engine.generation import Generation
from kvviz.engine.kernels import f32 as f32_kernel
from kvviz.engine.kernels import step as step_kernel
from kvviz.engine.loading import load_backend
from kvviz.engine.timing import torch_threads
from kvviz.engine.tolerance import agreement, magnitude

PROMPT = "Once upon a time there was a little"


@pytest.fixture
def backend():
    b = load_backend("tiny", device="cpu")
    if (why := step_kernel.why_not(b.model)) is not None:
        pytest.skip(why)
    return b


def decode(backend, n: int = 6, **kw) -> Generation:
    gen = Generation(backend, max_new_tokens=n, stop_at_eos=False, **kw)
    with torch_threads(1):
        gen.run(PROMPT)
    return gen


def test_new_matrices_under_the_same_step_are_the_ones_multiplied(backend):
    """fuse() again on the compiled model (int8 matrices where float32 ones were): the step's plan of pointers is
    made again, so its logits are the int8 model's, not the freed float32 matrices'."""
    assert backend.compile().mode == "kernels"
    decode(backend)
    backend.model.fuse("int8")
    ours = decode(backend)
    ref = decode(load_backend("tiny", device="cpu", weights="int8"))
    assert ours.generated == ref.generated
    d = backend.spec.d_model
    assert agreement(float((ours.last_logits - ref.last_logits).abs().max()), torch.bfloat16,
                     magnitude(ref.last_logits), d).within


def test_a_batch_runs_uncompiled_with_the_same_tokens(backend):
    """Two rows: step.c runs one; the step is the uncompiled one (same tokens as a model never compiled)."""
    step = backend.compile("kernels")
    gen = Generation(backend, max_new_tokens=4, stop_at_eos=False, batch_size=2)
    ref = Generation(load_backend("tiny", device="cpu"), max_new_tokens=4, stop_at_eos=False, batch_size=2)
    with torch_threads(1):
        gen.run(PROMPT)
        ref.run(PROMPT)
    assert gen.generated == ref.generated and not step.compiles and step.why_not is None


def test_where_it_cannot_run_it_says_why_and_the_cpu_compiles_with_inductor(monkeypatch):
    """A bfloat16 model; a head size off the vector width is covered by why_not's own check; float32 matrices on
    torch's kernels (kvviz's float32 kernel not built): one line each, and the CPU's mode is inductor's."""
    bf16 = load_backend("tiny", device="cpu", dtype="bfloat16")
    assert step_kernel.why_not(bf16.model) == "kvviz's C decode step runs float32 models on CPUs"
    assert mode_for(torch.device("cpu"), bf16.model) == "inductor"
    monkeypatch.setattr(f32_kernel, "_library", lambda: (None, "no C compiler (cc, gcc or clang, or $CC)"))
    torch_packed = load_backend("tiny", device="cpu")
    why = step_kernel.why_not(torch_packed.model)
    assert why.startswith("kvviz's C decode step multiplies with kvviz's kernels only") and "\n" not in why
    assert CompiledStep(torch_packed.model, torch.device("cpu")).mode == "inductor"
    step = CompiledStep(torch_packed.model, torch.device("cpu"), "kernels")
    assert step.why_not == why
    gen = Generation(torch_packed, max_new_tokens=2, stop_at_eos=False)
    gen.prefill(PROMPT)
    with torch.inference_mode():
        assert step(torch.tensor([[gen.generated[0][-1]]]), gen.cache, capture=False) is None


def test_without_a_compiler_it_says_why(monkeypatch, backend):
    monkeypatch.setattr(step_kernel, "_library", lambda: (None, "no C compiler (cc, gcc or clang, or $CC) to build "
                                                                "kvviz's C decode step"))
    assert step_kernel.why_not(backend.model).startswith("no C compiler")
    assert mode_for(torch.device("cpu"), backend.model) == "inductor"


def test_cli_compiles_a_batch_with_inductor(backend, capsys):
    """`generate --compile --batch 2` on a CPU: the C step runs one row, so the batch's step is inductor's graph, with
    the tokens of the run without --compile."""
    from kvviz.cli import main

    args = ["generate", "--model", "tiny", "--device", "cpu", "--prompt", PROMPT, "--max-new-tokens", "4",
            "--batch", "2"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--compile"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == plain.splitlines()[0]
    assert "compiled step (inductor): first step" in out.splitlines()[-1]


def test_a_model_changed_under_the_step_runs_uncompiled_and_says_why(backend):
    """train() after compiling drops the fused matrices the plan pointed into: the next step runs uncompiled on the
    parameters (the tokens of a model never compiled), and why_not says why in one line."""
    step = backend.compile("kernels")
    decode(backend)
    backend.model.train().eval()
    assert backend.model.head_weight is None  # the fused copies are gone
    ours = decode(backend)
    assert ours.generated == decode(load_backend("tiny", device="cpu")).generated
    assert step.why_not.startswith("kvviz's C decode step multiplies with kvviz's kernels only: a matrix not packed")


def test_two_threads_give_the_uncompiled_steps_tokens(backend):
    """On two threads step.c shares the attention heads out as the kernels share rows: the uncompiled step's tokens
    and logits within float32 rounding, the attention rows too."""
    backend.compile("kernels")
    ref_backend = load_backend("tiny", device="cpu")
    with torch_threads(2):
        ours, ref = (Generation(b, max_new_tokens=8, stop_at_eos=False, capture_attention=True)
                     for b in (backend, ref_backend))
        ours.prefill(PROMPT)
        ref.prefill(PROMPT)
        while not ours.done:
            a, b = ours.step(), ref.step()
            assert agreement(float((ours.last_logits - ref.last_logits).abs().max()), torch.float32,
                             magnitude(ref.last_logits), backend.spec.d_model).within
            for ra, rb in zip(a.attention, b.attention, strict=True):
                assert abs(ra - rb).max() <= 1e-5
    assert ours.generated == ref.generated and backend.compiled.compiles[True].first_step_s > 0


def test_a_width_off_the_vector_width_gives_the_uncompiled_steps_numbers():
    """d_model 60 (not a multiple of 8; int8 matrices take any K, so step.c runs it): its norms' sums of squares
    read the 60 entries and no further, so the logits are the uncompiled step's and the tokens equal."""
    from kvviz.engine.config import DecoderConfig

    cfg = DecoderConfig(n_layers=2, d_model=60, n_heads=4, n_kv_heads=2, d_head=16, d_ff=100, vocab_size=300,
                        max_seq_len=64)
    compiled, ref = (load_backend("random", shape=cfg, weights="int8", device="cpu") for _ in range(2))
    if (why := step_kernel.why_not(compiled.model)) is not None:
        pytest.skip(why)
    assert compiled.compile().mode == "kernels"
    with torch_threads(1):
        ours, theirs = (Generation(b, max_new_tokens=6, stop_at_eos=False) for b in (compiled, ref))
        ids = list(range(1, 9))
        ours.prefill(ids)
        theirs.prefill(ids)
        while not ours.done:
            ours.step()
            theirs.step()
            assert agreement(float((ours.last_logits - theirs.last_logits).abs().max()), torch.bfloat16,
                             magnitude(theirs.last_logits), cfg.d_ff).within
    assert ours.generated == theirs.generated and compiled.compiled.compiles[False].first_step_s > 0


def test_a_compression_cache_is_left_to_the_uncompiled_step(backend):
    """Compression's caches evict or quantize: a compiled step takes none of them (CompiledStep.usable), whether it is
    the backend's (compile()) or a generation's own, and the pass is the uncompiled one's."""
    from kvviz.compression.caches import EvictingCache

    ids = torch.tensor([backend.tokenizer.encode(PROMPT)])
    step = CompiledStep(backend.model, backend.device, "kernels")

    def new_cache() -> EvictingCache:
        return EvictingCache(backend.spec, 1, torch.float32, torch.device("cpu"))

    cache = new_cache()
    plain = backend.forward(ids, cache, capture_attention=False, all_logits=False).logits
    assert step(ids[:, -1:], cache, capture=False) is None
    backend.compile("kernels")
    again = new_cache()
    assert torch.equal(backend.forward(ids, again, capture_attention=False, all_logits=False).logits, plain)
    nxt = plain[:, -1].argmax(-1, keepdim=True)
    ours = backend.forward(nxt, again, capture_attention=False, all_logits=False).logits
    assert step.compiles == {} and backend.compiled.compiles == {}
    backend.compiled = None
    assert torch.equal(ours, backend.forward(nxt, cache, capture_attention=False, all_logits=False).logits)
