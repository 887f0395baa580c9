"""Issue 13, cold start: the first page a visitor opens (Home) imports no torch, and describes the model it
would load exactly as the loaded model describes itself."""
import subprocess
import sys
from pathlib import Path

import pytest

from kvviz.engine.config import DecoderConfig
from kvviz.engine.device import available_devices
from kvviz.engine.device_names import likely_devices
from kvviz.engine.loading import load_backend
from kvviz.engine.shape import native_spec, random_name, shipped_spec
from kvviz.i18n import t

ROOT = Path(__file__).resolve().parents[2]

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


# A page drawn while the background preload is importing torch: "torch" is in sys.modules from the import's start,
# and `import torch` there waits on the import lock until the import ends. A module whose import waits to be released
# stands in for torch.
MID_IMPORT = """
import importlib.abc, importlib.util, sys, threading, time
release = threading.Event()


class Slow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "torch" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        release.wait(30)


sys.meta_path.insert(0, Slow())
from kvviz.engine import device_names
device_names.available_devices = lambda: ["torch-answer"]
threading.Thread(target=lambda: __import__("torch"), daemon=True).start()  # the preload's import
while "torch" not in sys.modules:
    time.sleep(0.01)
mid = device_names.likely_devices()
release.set()
while not device_names.imported("torch"):
    time.sleep(0.01)
print(mid[0], device_names.likely_devices()[0])
"""


def test_a_page_drawn_while_torch_is_still_importing_does_not_wait_for_it():
    out = subprocess.run([sys.executable, "-c", MID_IMPORT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    # mid-import: the guess from the installed build (torch's answer would have waited on the lock); once
    # imported: torch's own answer
    assert out.stdout.split() == ["cpu", "torch-answer"], out.stderr[-2000:]


# torch cannot be imported here: whatever a page draws before it needs the engine is its first screen.
BEFORE_TORCH = """
import json, sys, threading


class NoTorch:  # `import torch` raises ImportError (and "torch" stays out of sys.modules)
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not importable in this test")


sys.meta_path.insert(0, NoTorch())
from streamlit.delta_generator import DeltaGenerator
from streamlit.testing.v1 import AppTest
HEAVY = ("torch", "transformers", "pandas", "pyarrow")
at_title = []  # the heavy packages imported when the page's title (its h1) is drawn
enqueue = DeltaGenerator._enqueue


def note_title(self, delta_type, element_proto, *args, **kwargs):
    if not at_title and delta_type == "heading" and element_proto.tag == "h1":
        at_title.append(sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY)))
    return enqueue(self, delta_type, element_proto, *args, **kwargs)


DeltaGenerator._enqueue = note_title
start = threading.Thread.start
threading.Thread.start = lambda self: None if self.name == "kvviz-preload" else start(self)
at = AppTest.from_file("app.py", default_timeout=60)
at.session_state["kv_lecture"] = sys.argv[2] == "lecture"
at.switch_page(sys.argv[1]).run()
texts = [e.value for e in (*at.markdown, *at.caption)]
print(json.dumps({"titles": [e.value for e in at.title], "texts": texts, "n_buttons": len(at.button),
                  "errors": [str(e.value) for e in at.exception], "heavy_at_title": at_title}))
"""

MODEL_PAGES = [("pages/1_Reusing_Past_KV.py", "reuse.title", "reuse.lead"),
               ("pages/5_Training_Prefill_Decode.py", "training.title", "training.intro"),
               ("pages/8_Compressing_the_Cache.py", "compression.title", "compression.intro"),
               ("pages/9_Paged_Blocks.py", "paged.title", "paged.intro"),
               ("pages/10_Speculative_Decoding.py", "spec.title", "spec.lead"),
               ("pages/11_Moving_the_Cache.py", "moving.title", "moving.intro"),
               ("pages/12_Attention_Patterns.py", "heads.title", "heads.intro")]


@pytest.mark.parametrize("mode", ["page", "lecture"])
@pytest.mark.parametrize("page, title, intro", MODEL_PAGES)
def test_a_page_that_runs_the_model_draws_its_title_and_introduction_before_importing_torch(page, title, intro, mode):
    """Issue 29.10: a page opened directly on a fresh server imported torch (~2.5 s here) before drawing anything.
    Now its title, its introduction and (in lecture mode) its idea stepper come first; then, under a spinner, the
    engine and the model. With torch made unimportable the page must still have drawn them, and then stopped at
    the engine's import (and nowhere earlier)."""
    import json

    out = subprocess.run([sys.executable, "-c", BEFORE_TORCH, page, mode], cwd=ROOT, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    drawn = json.loads(out.stdout.strip().splitlines()[-1])
    assert drawn["titles"] == [t(title, "en")]
    intro_text = t(intro, "en")
    assert any(intro_text in text for text in drawn["texts"]), drawn["texts"]
    assert len(drawn["errors"]) == 1 and "torch" in drawn["errors"][0], drawn["errors"]
    # Issue 38.12: nor pandas and pyarrow (~1,000 modules, imported at the top of four pages) before the title
    assert drawn["heavy_at_title"] == [[]], drawn["heavy_at_title"]
    if mode == "lecture" and page != MODEL_PAGES[0][0]:  # the stepper's ← and → (the decode page is one demo)
        assert drawn["n_buttons"] >= 2


@pytest.mark.parametrize("page", ["app.py", "pages/2_Prefill_and_Decode.py", "pages/4_Latency_and_Capacity.py",
                                  "pages/6_Check.py", "pages/7_Serving_Engine.py"])
def test_a_page_without_a_model_draws_its_title_before_any_dataframe_library(page):
    """Issue 38.12: pandas and pyarrow (~1,000 modules) were imported before the Serving page's title (and four model
    pages', above); torch is not importable here and none of these pages needs it for its first screen."""
    import json

    out = subprocess.run([sys.executable, "-c", BEFORE_TORCH, page, "page"], cwd=ROOT, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["heavy_at_title"] == [[]]


@pytest.mark.parametrize("mode", ["page", "lecture"])
def test_the_memory_page_draws_whole_without_torch(mode):
    """The Memory page's arithmetic needs no model (kvviz.lessons.memory, kvviz.app.views.memory): with torch made
    unimportable it draws everything, the formula's exact bytes included, and loads the model only on Run here."""
    import json

    out = subprocess.run([sys.executable, "-c", BEFORE_TORCH, "pages/3_Memory_Footprint.py", mode], cwd=ROOT,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    drawn = json.loads(out.stdout.strip().splitlines()[-1])
    assert drawn["errors"] == [] and drawn["titles"] == [t("memory.title", "en")]
    assert drawn["heavy_at_title"] == [[]]
    # the default scenario, Llama-3.1-8B at 4,096 tokens, one request: 2 · 32 · 4096 · 8 · 128 · 2 B
    assert any("536,870,912 B" in text for text in drawn["texts"]), drawn["texts"]


STEPPER = """
import sys
from streamlit.testing.v1 import AppTest

SCRIPT = ("from kvviz.app.widgets import own_html, stepper\\n"
          "stepper('Step', key='s', served=0, disabled=False, buttons={'b': 'reset'}, keys={'p': 'toggle_play'})\\n"
          "own_html('<p>x</p>', key='h')")
at = AppTest.from_string(SCRIPT, default_timeout=60).run()
assert not at.exception, at.exception
print(sorted({m.split(".")[0] for m in sys.modules} & {"numpy", "pandas", "pyarrow"}))
"""


def test_the_stepper_imports_no_dataframe_library():
    """Issue 38.12: Streamlit scans a component's dict data for dataframes, importing numpy, pandas and pyarrow: the
    Step button alone put ~1,000 modules (9-12 % of the import time) into the first run of Reusing Past K/V and
    Speculative Decoding. Its data now travels as a list (as the token strip's and the cache grid's HTML do)."""
    out = subprocess.run([sys.executable, "-c", STEPPER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


PRELOAD = """
import sys, threading
from streamlit.testing.v1 import AppTest

seen = []  # when torch's import begins: the threads then alive


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(sorted(t.name for t in threading.enumerate() if t.is_alive()))


sys.meta_path.insert(0, Watch())
at = AppTest.from_file("app.py", default_timeout=60).run()
assert not at.exception, at.exception
next(t for t in threading.enumerate() if t.name == "kvviz-preload").join()
print("torch" in sys.modules, [n for n in seen[0] if n.startswith("ScriptRunner")], threading.current_thread().name)
"""


def test_the_engine_preload_begins_after_the_script_run_that_asked():
    """Issue 38.12: Home, Memory, Prefill & Decode and Latency start the engine's background import on their last
    line; it held the interpreter while their run finished. It now waits for the session's script thread to end:
    when torch's import begins no script thread is alive, and it does complete."""
    out = subprocess.run([sys.executable, "-c", PRELOAD], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "[]", "MainThread"], (out.stdout, out.stderr[-2000:])


FIRST_RUN = """
import sys, threading
from streamlit.testing.v1 import AppTest
start = threading.Thread.start
threading.Thread.start = lambda self: None if self.name == "kvviz-preload" else start(self)
at = AppTest.from_file("app.py", default_timeout=180)
at.switch_page(sys.argv[1]).run()
assert not at.exception, at.exception
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "pandas", "pyarrow"}))
"""


@pytest.mark.parametrize("page", ["pages/1_Reusing_Past_KV.py", "pages/10_Speculative_Decoding.py"])
def test_a_decode_pages_first_run_imports_torch_but_no_dataframe_library(page):
    """Issue 38.12: a decode page's first run (title to model loaded, nothing generated yet) imported pandas and
    pyarrow besides torch: 9-12 % of its import time, for a table drawn only after a step (and Streamlit's scan of the
    Step button's data). It imports torch only."""
    out = subprocess.run([sys.executable, "-c", FIRST_RUN, page], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['torch']"
