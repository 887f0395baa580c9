#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source distribution of llama-cpp-python on PyPI (it vendors llama.cpp).
# Into build/llama.cpp/ (git-ignored); skipped when the binary is already there. Used by .ci/run and the tests in
# tests/serving/test_llamacpp.py. Takes ~5-6 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="build/llama.cpp"
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
cmake -S "$SRC" -B "$ROOT/cmake" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON >/dev/null
nice -n 10 cmake --build "$ROOT/cmake" --target llama-server -j "$JOBS"
mkdir -p "$ROOT/bin"
cp "$ROOT/cmake/bin/llama-server" "$BIN"
"$BIN" --version 2>&1 | head -3 || true
echo "built $BIN"
