"""kvviz.serving.worker: the typed state a page keeps, and a real worker process that fails, is read and closed."""
import time

from kvviz.serving.llamacpp import free_port
from kvviz.serving.worker import FINAL, Worker, WorkerState, poll


def test_state_from_what_the_process_writes():
    state = WorkerState.from_dict({"kind": "bench", "status": "running", "result": {"error": None}})
    assert not state.final and state.failure() is None and state.error is None
    failed = WorkerState.from_dict({"kind": "bench", "status": "failed",
                                    "result": {"error": {"key": "serving.stream_cut", "params": {}}}})
    assert failed.final and failed.failure().key == "serving.stream_cut"  # the run's own error, kept in its result
    assert {WorkerState("prefix", s).final for s in FINAL} == {True}
    assert poll(None, failed) == (None, failed)  # no worker: the last state stays


def test_a_worker_against_a_closed_port_fails_and_is_closed():
    url = f"http://127.0.0.1:{free_port()}"
    worker = Worker.prefix(url, "m", timeout_s=5.0, prefix_tokens=16, repeats=1, block_size=None)
    directory = worker.dir
    deadline = time.monotonic() + 120
    state = None
    while worker is not None and time.monotonic() < deadline:
        worker, state = poll(worker, state)
        time.sleep(0.2)
    assert worker is None and isinstance(state, WorkerState)
    assert state.kind == "prefix" and state.status == "failed"
    assert state.failure().key == "serving.unreachable" and url in state.failure().message("en")
    assert not directory.exists()  # its files removed once its final state was read
