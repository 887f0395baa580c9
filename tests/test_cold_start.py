"""Issue 13, cold start: the first page a visitor opens (Home) imports no torch, and describes the model it
would load exactly as the loaded model describes itself."""
import subprocess
import sys
from pathlib import Path

from kvviz.engine.config import DecoderConfig
from kvviz.engine.device import available_devices
from kvviz.engine.device_names import likely_devices
from kvviz.engine.loading import load_backend
from kvviz.engine.shape import native_spec, random_name, shipped_spec

ROOT = Path(__file__).resolve().parents[1]

# The page's own imports are checked with the background preload held back (it would import torch right after).
HOME = """
import sys, threading
from streamlit.testing.v1 import AppTest
held = []
start = threading.Thread.start
threading.Thread.start = lambda self: held.append(self.name) if self.name == "kvviz-preload" else start(self)
at = AppTest.from_file("app.py", default_timeout=60).run()
assert not at.exception, at.exception
assert held == ["kvviz-preload"], held
captions = [c.value for c in at.caption if "layers" in c.value]
print("torch" in sys.modules, "transformers" in sys.modules, captions[0])
"""


def test_home_draws_the_model_caption_without_importing_torch():
    out = subprocess.run([sys.executable, "-c", HOME], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_loaded, transformers_loaded, caption = out.stdout.strip().split(" ", 2)
    assert (torch_loaded, transformers_loaded) == ("False", "False")
    spec = load_backend("tiny").spec
    assert spec.name in caption and f"{spec.n_params:,}" in caption and f"d_head {spec.d_head}" in caption


def test_descriptions_without_weights_equal_the_loaded_models():
    assert shipped_spec() == load_backend("tiny").spec
    cfg = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=1, d_ff=128, vocab_size=300, max_seq_len=64)
    assert native_spec(cfg, random_name(cfg)) == load_backend("random", shape=cfg).spec


def test_likely_devices_is_torchs_answer_once_torch_is_imported():
    assert likely_devices() == available_devices()  # torch is imported in this process
    probe = "import sys; from kvviz.engine.device_names import likely_devices; d = likely_devices(); " \
            "print('torch' in sys.modules, d[0])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "cpu"], out.stderr[-2000:]
