"""What the compression tests share: one torch thread, and the shipped model."""
import pytest

from kvviz.engine.loading import load_backend
from kvviz.engine.timing import torch_threads


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # hundreds of one-token passes through a 4-layer model: one thread is fastest and spares a shared machine
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny():
    return load_backend("tiny", device="cpu")
