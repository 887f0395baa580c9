"""Every CLI command with --json, run as an unprivileged user with a fresh HOME, a checkout it cannot write and no
apt-get or dpkg on its PATH (tests/guest.py): stdout is one JSON document (the first run included: the held-out
text ships with the package, nothing is fetched or printed before the JSON), and nothing is written outside HOME's
cache and the temp directory. Skipped, with the reason, where this test cannot create a user (not root)."""
import json
import time

import pytest

from kvviz.cli import build_parser
from kvviz.engine.user_cache import cache_root
from tests.guest import guest

# Each command with arguments small enough for a CI machine (the shipped model, a few tokens); {tmp}: the user's
# temp directory. serve-bench needs a live server: refused in one line, with nothing on stdout.
COMMANDS = {
    # int8: kvviz's int8 kernel is built with the C compiler into HOME's cache, nowhere else
    "generate": ["--prompt", "The cache keeps", "--max-new-tokens", "4", "--weights", "int8"],
    "sweep": ["prompt-length", "--lengths", "8,16", "--new-tokens", "2", "--repeats", "1"],
    "memory": ["--preset", "Llama-3.1-8B", "--tokens", "4096"],
    "capacity": ["--preset", "Llama-3.1-8B", "--gpu", "H100 SXM"],
    "presets": [],
    "prefix-demo": ["--requests", "2", "--new-tokens", "2"],
    "offload-demo": ["--repeats", "1", "--tier-repeats", "1"],
    "handoff": ["--new-tokens", "2"],
    "compress": ["--method", "window", "--budget", "64", "--tokens", "128", "--seq-len", "128"],
    "speculate": ["--prompt", "The cache keeps the keys and values", "--max-new-tokens", "6", "--repeats", "1"],
    "fetch-model": ["smollm2"],  # where SmolLM2 was fetched before, linked into HOME's cache: no download
    "export-hf": ["--out", "{tmp}/hf"],
    "export-gguf": ["--out", "{tmp}/kvviz-tiny.gguf"],
    "serve-bench": ["--url", "http://127.0.0.1:9", "--requests", "1"],
    "serve": ["--hosted", "--dry-run"],
    # no publisher there: a JSON line a second, the summary, then one line on stderr
    "kv-events": ["--endpoint", "tcp://127.0.0.1:9", "--seconds", "2", "--quiet-after", "1"],
}


def test_every_command_is_listed():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)


@pytest.fixture(scope="module")
def user():
    with guest(models_from=cache_root() / "models") as g:
        yield g


def test_every_command_prints_json_alone_as_another_user_without_apt(user):
    assert user.run(["sh", "-c", "command -v apt-get dpkg || echo none"]).stdout.strip() == "none"
    assert user.run(["sh", "-c", f"touch {user.checkout}/x 2>/dev/null || echo refused"]).stdout.strip() == "refused"
    probe = user.home / "written-outside-the-cache"  # the scan must see a file written where none may be
    assert user.run(["touch", str(probe)]).returncode == 0
    took = {}
    for name, args in COMMANDS.items():
        if name == "fetch-model" and not (user.home / ".cache" / "kvviz" / "models").is_dir():
            print("fetch-model: no model fetched before to link into HOME's cache (it would download): not run")
            continue
        argv = ["python", "-m", "kvviz", name, *[a.format(tmp=user.tmp) for a in args], "--json"]
        start = time.monotonic()
        out = user.run(argv, timeout=900)
        took[name] = round(time.monotonic() - start, 1)
        assert "Traceback" not in out.stderr, f"{name}: {out.stderr[-2000:]}"
        assert not any(w in out.stdout + out.stderr for w in ("apt-get", "dpkg")), f"{name}: {out.stderr[-500:]}"
        if name == "serve-bench":  # no server there: one line on stderr, nothing on stdout
            assert out.returncode != 0 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
            continue
        if name == "kv-events":  # JSON Lines: each state, then the summary; the hint, then how it ended
            rows = [json.loads(row) for row in out.stdout.splitlines()]  # every line one JSON document
            assert out.returncode != 0 and len(rows) >= 2 and rows[-1]["status"] == "unreachable", out.stdout
            assert out.stderr.splitlines()[-1] == "kvviz: error: no KV events arrived", out.stderr
            continue
        assert out.returncode == 0, f"{name}: exit {out.returncode}: {out.stderr[-2000:]}"
        doc = json.loads(out.stdout)  # the whole of stdout is one JSON document
        if name == "generate":
            assert doc["int8_kernel"]["why_not"] is None, doc["int8_kernel"]
            assert list((user.home / ".cache" / "kvviz" / "kernels").glob("int8_gemv-*.so")), "built elsewhere"
    print(f"\nseconds per command, as {user.user}: {took}")
    user.end_processes()
    assert user.written() == [str(probe)]  # nothing but the probe outside HOME's cache and the temp directory
