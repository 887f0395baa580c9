"""`python -m kvviz serve --hosted`: the command it runs and the caps it reads, the one-line errors of a bad start,
the Dockerfile's command and torch pin, the Spaces header. The started app in a real browser:
tests/browser/test_hosted_browser.py."""
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from kvviz.app.hosted import HostedCaps
from kvviz.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _dry(capsys, *argv):
    assert main(["serve", *argv, "--dry-run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_hosted_start_reads_the_caps_and_binds_loopback_unless_asked(capsys, monkeypatch):
    for name in ("PORT", "STREAMLIT_SERVER_ADDRESS", "KVVIZ_HOSTED", "KVVIZ_SERVE_ALLOW"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVVIZ_MAX_LAYERS", "3")
    r = _dry(capsys, "--hosted")
    assert r["env"] == {"KVVIZ_HOSTED": "1"} and r["hosted"] is True
    assert r["caps"] == json.loads(json.dumps(asdict(replace(HostedCaps(), max_layers=3))))
    assert r["serve_allow"] == [] and r["url"] == "http://127.0.0.1:8501"
    cmd = r["command"]
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == ROOT / "app.py" and r["cwd"] == str(ROOT)
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert flags == {"--server.headless": "true", "--server.port": "8501", "--server.address": "127.0.0.1",
                     "--browser.gatherUsageStats": "false", "--server.disconnectedSessionTTL": "30"}
    monkeypatch.setenv("PORT", "7860")
    monkeypatch.setenv("STREAMLIT_SERVER_ADDRESS", "0.0.0.0")  # what the Dockerfile sets
    assert _dry(capsys, "--hosted")["url"] == "http://0.0.0.0:7860"
    assert _dry(capsys, "--port", "9001", "--address", "127.0.0.1")["url"] == "http://127.0.0.1:9001"
    monkeypatch.delenv("KVVIZ_MAX_LAYERS")
    assert _dry(capsys)["caps"] is None  # without --hosted (and no KVVIZ_HOSTED): the local app


@pytest.mark.parametrize("argv, env, words", [
    (["--port", "http"], {}, "--port 'http' is not a port number"),
    (["--port", "70000"], {}, "--port '70000' is not a port number"),
    ([], {"PORT": "eighty"}, "$PORT 'eighty' is not a port number"),
    (["--hosted"], {"KVVIZ_MAX_BATCH": "lots"}, "KVVIZ_MAX_BATCH = ‘lots’ is not valid"),
])
def test_a_bad_start_is_one_line(argv, env, words):
    out = subprocess.run([sys.executable, "-m", "kvviz", "serve", *argv], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("kvviz: error: ")
    assert words in out.stderr and out.stderr.count("\n") == 1


# ---- the Dockerfile: what this machine can check without a docker daemon ----------------------------------------
def _dockerfile() -> list[tuple[str, str]]:
    lines = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    return [tuple(line.strip().split(None, 1)) for line in lines if line.strip() and not line.strip().startswith("#")]


def test_the_dockerfile_starts_the_serve_command_this_file_runs():
    instructions = _dockerfile()
    cmd = [args for op, args in instructions if op == "CMD"]
    assert len(cmd) == 1 and json.loads(cmd[0]) == ["python", "-m", "kvviz", "serve", "--hosted"]
    env = " ".join(args for op, args in instructions if op == "ENV")
    assert "STREAMLIT_SERVER_ADDRESS=0.0.0.0" in env and "PORT=7860" in env and "HF_HUB_OFFLINE=1" in env
    expose = [args for op, args in instructions if op == "EXPOSE"]
    assert expose == ["7860"]
    run = " ".join(args for op, args in instructions if op == "RUN")
    pin = next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch=="))
    assert f"{pin}+cpu" in run and "download.pytorch.org/whl/cpu" in run  # the CPU wheel of the pinned torch
    assert "python -m kvviz fetch-model smollm2" in run  # the model is in the image: no visitor waits on it
    assert instructions[0][0] == "FROM" and instructions[0][1].startswith("python:3.11-slim")


def test_the_spaces_header_in_deploy_md_is_valid_front_matter():
    text = (ROOT / "docs" / "deploy.md").read_text()
    block = re.search(r"```yaml\n---\n(.*?)\n---\n```", text, re.S).group(1)
    header = dict(line.split(": ", 1) for line in block.splitlines())
    assert header["sdk"] == "docker" and header["app_port"] == "7860"  # the Dockerfile's EXPOSE and PORT
    for name in ("KVVIZ_HOSTED", "KVVIZ_SERVE_ALLOW", "KVVIZ_CACHE_DIR", "PORT", "STREAMLIT_SERVER_ADDRESS",
                 *("KVVIZ_" + f.upper() for f in asdict(HostedCaps()))):
        assert f"`{name}`" in text, name  # every setting is in the recipe


def test_compose_runs_the_image_with_its_rooms_in_redis():
    """compose.yaml: the Dockerfile's image (port 7860) with KVVIZ_ROOM_STORE naming the Redis service beside it."""
    import yaml

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    app, redis = compose["app"], compose["redis"]
    assert app["build"] == "." and app["ports"] == ["7860:7860"] and "redis" in app["depends_on"]
    url = app["environment"]["KVVIZ_ROOM_STORE"]
    assert url == "redis://redis:6379/0" and redis["image"].startswith("redis:")
    from kvviz.room.store import RedisStore, store_from_env

    assert isinstance(store_from_env({"KVVIZ_ROOM_STORE": url}), RedisStore)  # a URL the app takes (not dialled)


def test_lecture_listens_on_the_network_and_prints_the_address_phones_open(capsys, monkeypatch):
    """`serve --lecture`: every interface, the machine's network address (never loopback) and its QR code."""
    from kvviz.cli.serve import show_serve
    from kvviz.room.network import is_loopback, network_address

    for name in ("PORT", "STREAMLIT_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    r = _dry(capsys, "--lecture")
    flags = dict(zip(r["command"][5::2], r["command"][6::2], strict=True))
    assert flags["--server.address"] == "0.0.0.0" and r["lecture"] is True
    found = network_address()
    assert r["network_url"] == (None if found is None else f"http://{found}:8501")
    if found is not None:
        assert not is_loopback(found)
        show_serve(r)
        out = capsys.readouterr().out
        assert f"Network URL (phones on the same network): http://{found}:8501" in out
        assert "http://localhost:8501/?lecture=1" in out and "█" in out  # the QR code, drawn in the terminal
    assert _dry(capsys, "--lecture", "--address", "127.0.0.1")["network_url"] is None  # loopback: no phone
    assert _dry(capsys)["network_url"] is None and _dry(capsys)["lecture"] is False
