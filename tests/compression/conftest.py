"""What the compression tests share: one torch thread, and the shipped model."""
import pytest
import torch

from kvviz.engine.loading import load_backend


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # hundreds of one-token passes through a 4-layer model: one thread is fastest and spares a shared machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    return load_backend("tiny", device="cpu")
