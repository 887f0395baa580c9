#!/usr/bin/env bash
# NVIDIA's kvpress, the reference the eviction parity test (tests/compression/test_kvpress_parity.py) runs.
# kvpress 0.5.5 needs transformers < 5.3 (5.2.0 pinned) while kvviz runs a newer one, so it gets a venv of its own that reuses
# the system's torch (--system-site-packages; torch is not downloaded again). Skipped once installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${KVVIZ_KVPRESS_VENV:-build/kvpress-venv}"
VERSION="${KVPRESS_VERSION:-0.5.5}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('kvpress') == '$VERSION'" 2>/dev/null; then
  echo "kvpress $VERSION already installed: $VENV"; exit 0
fi
python -m venv --system-site-packages "$VENV"
TORCH="$(python -c 'import torch; print(torch.__version__)')"
# Pin torch to the one already installed so pip keeps it instead of fetching another.
"$VENV/bin/pip" install -q "kvpress==$VERSION" "transformers==5.2.0" "torch==$TORCH"
"$VENV/bin/python" -c "import kvpress, torch, transformers; print('kvpress', kvpress.__file__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
