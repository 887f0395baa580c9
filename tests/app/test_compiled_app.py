"""KVVIZ_COMPILE=1: the app's model runs its compiled decode step, compiled once under a spinner, and the sidebar says
what the compile cost (kvviz.app.models); tests/engine/test_compiled.py checks the compiled step's numbers."""
import json
import os
import subprocess
import sys
from pathlib import Path

from kvviz.i18n import t

ROOT = Path(__file__).resolve().parents[2]

RUN = """
import json
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("app.py", default_timeout=600)
at.switch_page("pages/1_Reusing_Past_KV.py").run()
assert not at.exception, at.exception
captions = [c.value for c in at.sidebar.caption]
from kvviz.app import models
backend = models._cached_backend("tiny", "float32", at.session_state["kv_device"], None)
step = backend.compiled
print(json.dumps({"captions": captions, "why_not": step.why_not, "compiles": len(step.compiles), "mode": step.mode,
                  "first_step_s": next(iter(step.compiles.values())).first_step_s}))
"""


def test_compiled_step_in_the_app_says_what_it_cost():
    env = {**os.environ, "KVVIZ_COMPILE": "1", "KVVIZ_TORCH_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["why_not"] is None and r["compiles"] == 1 and r["first_step_s"] > 0
    # inductor's graph on a CPU, not kvviz's C step, which runs one row of a float32 model (kvviz.app.models says why)
    assert r["mode"] == "inductor"
    expected = t("common.compiled_caption", "en", mode="inductor", seconds=f"{r['first_step_s']:.1f}")
    assert expected in r["captions"], r["captions"]

