#!/usr/bin/env bash
# vLLM's own KV cache manager as a test reference (tests/engine/paged/test_vllm_reference.py): the vLLM wheel
# without its dependencies into build/vllm-ref/, outside the main environment, plus the light pure modules that
# `import vllm.v1.core.kv_cache_manager` pulls in (pinned). The test stubs only xgrammar and llguidance, which that
# import names but never calls. Skipped once installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${VLLM_REF_VERSION:-0.34.0}"
DEST="build/vllm-ref"
if [ -f "$DEST/.installed-$VERSION" ]; then
  echo "vLLM $VERSION reference already installed: $DEST"; exit 0
fi
rm -rf "$DEST"
mkdir -p "$DEST"
pip install -q --no-deps --target "$DEST" "vllm==$VERSION" \
  pyzmq==27.3.0 msgspec==0.23.0 cachetools==8.0.2 cbor2==6.3.0 pybase64==1.5.1 uvloop==0.23.0 \
  aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 \
  frozenlist==1.8.0
touch "$DEST/.installed-$VERSION"
echo "installed vLLM $VERSION reference into $DEST"
