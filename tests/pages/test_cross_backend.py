"""Pages and backends together: the decode page on a Hugging Face model chosen by path, the shipped model
exported with export-hf and run by both backends, and the Memory page reading the decode page's live cache."""
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from kvviz.cli import main
from kvviz.engine.backends.hf import HFBackend
from kvviz.engine.config import DecoderConfig
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend

ROOT = Path(__file__).resolve().parents[2]
HOME, REUSE, MEMORY = str(ROOT / "app.py"), "pages/1_Reusing_Past_KV.py", "pages/3_Memory_Footprint.py"
PROMPT = "Return the number of items in the list"


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-hf")
    assert main(["export-hf", "--out", str(out)]) == 0
    return out


def test_shipped_model_same_tokens_and_cache_in_both_backends(tiny_hf):
    native = load_backend("tiny", device="cpu")
    hf = load_backend(str(tiny_hf), device="cpu", engine="hf")  # a transformers directory on transformers
    assert isinstance(hf, HFBackend)
    runs = []
    for backend in (native, hf):
        gen = Generation(backend, max_new_tokens=24, stop_at_eos=False)
        gen.run(PROMPT)
        runs.append(gen)
    a, b = runs
    assert a.prompt_ids == b.prompt_ids
    assert a.generated == b.generated
    assert [e.cache_lengths for e in a.events] == [e.cache_lengths for e in b.events]
    assert [e.live_bytes for e in a.events] == [e.live_bytes for e in b.events]
    assert (a.last_logits - b.last_logits).abs().max().item() <= 1e-4


def _chart(at: AppTest, key: str) -> dict:
    return next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if c.proto.id.endswith("-" + key))


def test_decode_page_on_a_hf_model_selected_by_path(tiny_hf):
    at = AppTest.from_file(HOME, default_timeout=120)
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = str(tiny_hf)
    at.session_state["kv_engine"] = "hf"  # transformers, not kvviz's decoder (which auto would choose)
    at.run()
    at.switch_page(REUSE).run()
    at.text_area(key="_w_reuse_prompt").set_value(PROMPT)
    at.button(key="reuse_btn_prefill").click().run()
    for _ in range(3):  # the Step button sends its running click count
        at.session_state["reuse_stepper"] = {"events": [[at.session_state["reuse_served"] + 1, "step"]]}
        at.run()
    at.session_state["reuse_tab"] = "attention"
    at.run()
    assert not at.exception and not at.error
    gen = at.session_state["reuse_gen"]
    assert isinstance(gen.backend, HFBackend)
    n_prompt = len(gen.prompt_ids)
    assert gen.events[-1].cache_lengths == [n_prompt + 3] * 4
    rows = np.array(_chart(at, "reuse_attn")["data"][0]["z"], dtype=float)
    assert rows.shape == (8, n_prompt + 3)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-5)
    # K and V · 4 layers · positions · 2 KV heads · d_head 24 · 4 bytes (float32)
    assert gen.events[-1].live_bytes == gen.events[-1].formula_bytes == 2 * 4 * (n_prompt + 3) * 2 * 24 * 4


def test_memory_page_shows_the_decode_pages_live_cache():
    at = AppTest.from_file(HOME, default_timeout=120)
    at.session_state["kv_model"] = "random"
    at.session_state["kv_shape"] = DecoderConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96,
                                                 vocab_size=256, max_seq_len=64)
    at.run()
    at.switch_page(REUSE).run()
    at.text_area(key="_w_reuse_prompt").set_value("Hello KV")
    at.button(key="reuse_btn_prefill").click().run()
    at.session_state["reuse_stepper"] = {"events": [[at.session_state["reuse_served"] + 1, "step"]]}
    at.run()
    live = at.session_state["reuse_gen"].events[-1].live_bytes
    assert live == 2 * 2 * 9 * 2 * 16 * 4  # 2 layers · 9 positions · 2 KV heads · d_head 16 · float32, K and V
    at.switch_page(MEMORY).run()
    assert not at.exception
    assert "**Decode page's generation** — random L2 H4/2 d16: B=1, L=2, n=9" in " ".join(m.value for m in at.markdown)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Measured (tensor bytes)"] == metrics["Formula"] == f"{live:,} B"
