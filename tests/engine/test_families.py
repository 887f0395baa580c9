"""Issue 12's families, each a tiny random transformers model saved here: through the Hugging Face backend, the
CLI and the decode page, the live cache equals the one formula exactly (or, where transformers stores more than
the architecture needs, both numbers are reported and the factor explained)."""
import json
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    FalconConfig,
    Gemma2Config,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
)

from kvviz.cli import main
from kvviz.engine.backends.hf import load_hf_backend
from kvviz.engine.generation import Generation
from kvviz.kv.formula import kv_footprint
from tests.engine.test_hf_backend import SMALL, byte_bpe

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "the cache holds keys and values"
W = 4  # a small window, so a short prompt already slides
DENSE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, max_position_embeddings=64, **SMALL)
FAMILIES = {
    # name: (config, (attention kind, KV heads, sliding layers))
    "llama_gqa": (LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, **DENSE), ("GQA", 2, 0)),
    "qwen2_max_window_layers": (Qwen2Config(num_hidden_layers=3, num_key_value_heads=2, use_sliding_window=True,
                                            sliding_window=W, max_window_layers=1, **DENSE), ("GQA", 2, 2)),
    "qwen2_no_window": (Qwen2Config(num_hidden_layers=3, num_key_value_heads=2, use_sliding_window=False,
                                    sliding_window=W, max_window_layers=1, **DENSE), ("GQA", 2, 0)),
    "mistral_window": (MistralConfig(num_hidden_layers=2, num_key_value_heads=1, sliding_window=W, **DENSE),
                       ("MQA", 1, 2)),
    "gemma2_alternating": (Gemma2Config(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, sliding_window=W,
                                        **DENSE), ("GQA", 2, 2)),
    "falcon_multi_query": (FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
                                        new_decoder_architecture=False, **SMALL), ("MQA", 1, 0)),
    "falcon_new_architecture": (FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                             num_kv_heads=2, new_decoder_architecture=True, **SMALL), ("GQA", 2, 0)),
    "gpt2": (GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, **SMALL), ("MHA", 4, 0)),
    "deepseek_mla": (DeepseekV3Config(hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                      v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                      topk_group=1, first_k_dense_replace=1, max_position_embeddings=64, **SMALL),
                     ("MLA", 4, 0)),
}
# transformers' Falcon with new_decoder_architecture caches K/V already repeated to every query head.
STORED_HEADS = {"falcon_new_architecture": 4}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    tokenizer, out = byte_bpe(), {}
    for name, (config, _) in FAMILIES.items():
        torch.manual_seed(3)
        path = tmp_path_factory.mktemp(name)
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[name] = path
    return out


@pytest.mark.parametrize("name", list(FAMILIES))
def test_live_cache_equals_the_formula(saved, name):
    backend = load_hf_backend(str(saved[name]), device="cpu")
    kind, n_kv, n_sliding = FAMILIES[name][1]
    spec = backend.spec
    assert (spec.attention_kind, spec.n_kv_heads, spec.n_sliding_layers) == (kind, n_kv, n_sliding)
    gen = Generation(backend, max_new_tokens=6, stop_at_eos=False)
    for event in gen.run(PROMPT):
        n = event.position + 1
        assert event.formula_bytes == kv_footprint(spec, n, 1, "float32").total
        k, _ = backend.layer_kv(gen.cache, 0)
        stored = STORED_HEADS.get(name, 1 if spec.is_mla else n_kv)
        if not spec.is_mla:
            assert k.shape[1] == stored
        if name in STORED_HEADS:
            assert event.live_bytes * n_kv == event.formula_bytes * stored
        else:
            assert event.live_bytes == event.formula_bytes, (name, n)
    if n_sliding:
        assert min(gen.events[-1].cache_lengths) == W - 1  # a window keeps W − 1 past tokens
        assert gen.events[-1].formula_bytes < kv_footprint(spec.with_params(None, "unknown"), n, 1,
                                                           "float32").per_token * n


@pytest.mark.parametrize("name", ["falcon_new_architecture", "qwen2_max_window_layers", "deepseek_mla"])
def test_cli_reports_tensor_and_formula_bytes(saved, name, capsys):
    assert main(["generate", "--model", str(saved[name]), "--prompt", PROMPT, "--max-new-tokens", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    n = r["prompt_tokens"] + len(r["token_ids"]) - 1  # the last token is emitted, not yet cached
    spec = load_hf_backend(str(saved[name]), device="cpu").spec
    assert r["formula_bytes"] == kv_footprint(spec, n, 1, "float32").total
    factor = STORED_HEADS.get(name, spec.n_kv_heads) / spec.n_kv_heads
    assert r["cache_live_bytes"] == factor * r["formula_bytes"]


@pytest.mark.parametrize("name", ["falcon_new_architecture", "falcon_multi_query", "gemma2_alternating"])
def test_decode_and_memory_pages_open(saved, name):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = str(saved[name])
    at.run()
    at.switch_page("pages/1_Reusing_Past_KV.py").run()
    at.text_area(key="_w_reuse_prompt").set_value(PROMPT)
    at.button(key="reuse_btn_prefill").click().run()
    at.session_state["reuse_stepper"] = {"events": [[at.session_state["reuse_served"] + 1, "step"]]}  # one Step click
    at.run()
    assert not at.exception, at.exception
    at.switch_page("pages/3_Memory_Footprint.py").run()
    assert not at.exception, at.exception
    if name in STORED_HEADS:
        assert any("repeated for all 4 query heads" in i.value and "2× the formula" in i.value for i in at.info)
    else:
        assert any("equal the formula exactly" in s.value for s in at.success)
