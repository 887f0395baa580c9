#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source distribution of llama-cpp-python on PyPI (it vendors llama.cpp).
# Into build/llama.cpp/ (git-ignored; LLAMA_BUILD_ROOT moves it); skipped when the binary is already there. Used by
# .ci/run and the tests in tests/serving/test_llamacpp.py. Takes ~5-6 minutes on 2 cores.
# It builds for this machine's CPU (GGML_NATIVE=ON), then tries that build on a real model
# (scripts/probe_llama_server.py: SmolLM2's Q4_1 GGUF, else the shipped model as Q8_0): a native build can die with
# "Illegal instruction" on a CPU that advertises more than it runs (a VM's AVX-512/AMX), at the first quantized
# product rather than at start-up. If it dies, it builds again portable (GGML_NATIVE=OFF, AVX2/FMA/F16C) and tries
# that. The log's last lines say which build was kept; build/llama.cpp/KEPT says it too.
# LLAMA_BUILD_NATIVE=0 builds the portable one only.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="${LLAMA_BUILD_ROOT:-build/llama.cpp}"
BIN="$ROOT/bin/llama-server"
JOBS="${LLAMA_BUILD_JOBS:-2}"
if [ -x "$BIN" ]; then
  echo "llama-server already built: $BIN"; exit 0
fi
# While it runs, .building holds this script's PID: the llama-server tests wait for it (tests/conftest.py) and the
# rest of the suite runs meanwhile. A failed build leaves .failed, so those tests fail rather than skip.
mkdir -p "$ROOT/sdist"
rm -f "$ROOT/.failed"
echo $$ > "$ROOT/.building"
trap 'status=$?; rm -f "$ROOT/.building"; [ $status -eq 0 ] || touch "$ROOT/.failed"' EXIT
if [ ! -f "$ROOT/sdist/llama_cpp_python-$VERSION.tar.gz" ]; then
  pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$ROOT/sdist"
fi
rm -rf "$ROOT/src" && mkdir -p "$ROOT/src"
tar -xzf "$ROOT/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$ROOT/src" --strip-components=1
SRC="$ROOT/src/vendor/llama.cpp"
PYTHON="${PYTHON:-python3}"

build() {  # build DIR NATIVE [cmake flags...]: llama-server into $ROOT/DIR
  local dir="$1" native="$2"; shift 2
  cmake -S "$SRC" -B "$ROOT/$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE="$native" "$@" >/dev/null
  nice -n 10 cmake --build "$ROOT/$dir" --target llama-server -j "$JOBS"
}

# The portable build: what every x86-64 CPU of the last decade runs (the issue's VM ran it), no AVX-512 or AMX.
PORTABLE=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF
          -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
kept=""
if [ "${LLAMA_BUILD_NATIVE:-1}" != "0" ]; then
  build cmake ON
  set +e
  "$PYTHON" scripts/probe_llama_server.py "$ROOT/cmake/bin/llama-server"
  probe=$?
  set -e
  if [ $probe -eq 0 ]; then
    kept="native (GGML_NATIVE=ON): it ran a model on this CPU"; out="$ROOT/cmake/bin/llama-server"
  elif [ $probe -eq 2 ]; then
    kept="native (GGML_NATIVE=ON), not tried: no model to try it on"; out="$ROOT/cmake/bin/llama-server"
  else
    echo "the native build died on this CPU: building the portable one (GGML_NATIVE=OFF, AVX2)"
  fi
fi
if [ -z "$kept" ]; then
  build cmake-portable OFF "${PORTABLE[@]}"
  "$PYTHON" scripts/probe_llama_server.py "$ROOT/cmake-portable/bin/llama-server" || true
  kept="portable (GGML_NATIVE=OFF, AVX2/FMA/F16C)"; out="$ROOT/cmake-portable/bin/llama-server"
fi
mkdir -p "$ROOT/bin"
cp "$out" "$BIN"
echo "$kept" > "$ROOT/KEPT"
"$BIN" --version 2>&1 | head -3 || true
echo "built $BIN"
echo "kept: $kept"
