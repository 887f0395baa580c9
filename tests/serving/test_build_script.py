"""scripts/build_llama_server.sh keeps what runs on this CPU: a native build that dies on a real model (as one did
with "Illegal instruction" on a VM advertising AVX-512/AMX) is replaced by the portable build, and the log and
KEPT say which was kept. cmake is stood in for (the real build takes 5-6 minutes): the native "build" is a program
that dies of SIGILL, the portable one this machine's real llama-server, tried by scripts/probe_llama_server.py on a
real model (SmolLM2's Q4_1 GGUF where fetched, else the shipped model as Q8_0)."""
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stub_cmake(folder: Path, server: Path) -> None:
    (folder / "cmake").write_text(f"""#!/bin/sh
if [ "$1" = "--build" ]; then
  mkdir -p "$2/bin"
  case "$2" in
    *cmake-portable) ln -sf {server} "$2/bin/llama-server" ;;
    *) printf '#!/bin/sh\\nkill -ILL $$\\n' > "$2/bin/llama-server"; chmod +x "$2/bin/llama-server" ;;
  esac
fi
""")
    (folder / "cmake").chmod(0o755)


@pytest.mark.llama_server
def test_a_native_build_that_dies_is_replaced_by_the_portable_one(tmp_path):
    from kvviz.serving.llamacpp import binary

    stubs, build = tmp_path / "bin", tmp_path / "llama.cpp"
    stubs.mkdir()
    _stub_cmake(stubs, binary())
    (build / "sdist").mkdir(parents=True)
    (tmp_path / "pkg" / "vendor" / "llama.cpp").mkdir(parents=True)
    with tarfile.open(build / "sdist" / "llama_cpp_python-0.3.36.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "pkg", arcname="llama_cpp_python-0.3.36")
    env = {"PATH": f"{stubs}:/usr/local/bin:/usr/bin:/bin", "LLAMA_BUILD_ROOT": str(build),
           "LLAMA_CPP_PYTHON_VERSION": "0.3.36", "HOME": str(Path.home()), "PYTHON": sys.executable}
    out = subprocess.run(["bash", "scripts/build_llama_server.sh"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "died on" in log and "killed by SIGILL" in log  # the native build, tried on a real model, died
    assert "the native build died on this CPU: building the portable one" in log
    assert log.strip().endswith("kept: portable (GGML_NATIVE=OFF, AVX2/FMA/F16C)")
    assert (build / "KEPT").read_text().startswith("portable")
    assert (build / "bin" / "llama-server").is_file() and not (build / ".failed").exists()
