"""Both room stores under the same tests: in-process, and Redis on a real `redis-server` this session starts on a
free loopback port (no disk: `--save '' --appendonly no`) and stops after."""
import contextlib
import shutil
import subprocess
import time

import pytest

from kvviz.room.store import MemoryStore, RedisStore
from kvviz.serving.llamacpp import free_port


class Clock:
    """A clock the test moves by hand: expiry without sleeping."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def redis_server():
    """A real redis-server on a free loopback port, no disk; yields (its URL, its process) and stops it after."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is missing: .ci/run installs it (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not answer on its port")
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url():
    with redis_server() as (url, _):
        yield url


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture(params=["memory", "redis"])
def store(request, clock):
    if request.param == "memory":
        return MemoryStore(clock)
    store = RedisStore(request.getfixturevalue("redis_url"), clock)
    store._redis.flushdb()  # each test starts from an empty database
    return store
