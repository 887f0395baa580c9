"""Start and stop tests/serving/vllm_standin_server.py (an OpenAI-compatible server whose prefix cache is vLLM's own
KVCacheManager, publishing with vLLM's ZmqEventPublisher), and wait until a subscriber's first batch is through."""
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from kvviz.serving.llamacpp import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "build" / "vllm-ref"
SERVER = Path(__file__).with_name("vllm_standin_server.py")
VERSION = "0.34.0"  # scripts/install_vllm_ref.sh
INSTALLED = (REF / f".installed-{VERSION}").exists()


@contextmanager
def standin_server(block_size: int = 4, num_blocks: int = 24, algo: str = "sha256"):
    """Yields (base URL, events endpoint, replay endpoint); the server is stopped after."""
    cfg = {"port": free_port(), "events_port": free_port(), "replay_port": free_port(), "block_size": block_size,
           "num_blocks": num_blocks, "algo": algo}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REF), str(ROOT)]), VLLM_LOGGING_LEVEL="ERROR")
    env.pop("PYTHONHASHSEED", None)  # vLLM's own seed for sha256
    proc = subprocess.Popen([sys.executable, str(SERVER), json.dumps(cfg)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{cfg['port']}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            try:
                if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the stand-in server did not start"
            time.sleep(0.3)
        yield url, f"tcp://127.0.0.1:{cfg['events_port']}", f"tcp://127.0.0.1:{cfg['replay_port']}"
    finally:
        stop_process(proc)


def wake(url: str, watch) -> None:  # noqa: ANN001 - a kvviz.serving.kv_watch.Watch
    """Empty batches until the watch has one: ZMQ's PUB reads a new subscription only as it sends."""
    assert watch.wait_connected(10)
    deadline = time.monotonic() + 10
    while watch.sub.received == 0:
        httpx.post(f"{url}/standin/wake")
        time.sleep(0.1)
        assert time.monotonic() < deadline, "no batch reached the subscriber"


def caught_up(url: str, watch, timeout_s: float = 10) -> dict:  # noqa: ANN001
    """The server's hits once every batch it published is folded into the watch's tree."""
    server = httpx.get(f"{url}/standin/hits").json()
    deadline = time.monotonic() + timeout_s
    while watch.tree.batches < server["seq"] + 1:
        assert time.monotonic() < deadline, "the watch did not fold every batch"
        time.sleep(0.05)
    return server
