"""The Hugging Face backend on tiny random models saved to a temporary directory (no network)."""
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertModel,
    DeepseekV3Config,
    GPT2Config,
    LlamaConfig,
    LlamaForCausalLM,
    MambaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from kvviz.cli import main
from kvviz.engine.backends.hf import HFBackend, load_hf_backend
from kvviz.engine.backends.hf_policy import HFPolicy, check_allowed, check_size, parse_params, policy_from
from kvviz.engine.config import DecoderConfig
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend, random_backend
from kvviz.errors import InputError
from tests.kv.kvref import textbook_bytes

APP = str(Path(__file__).resolve().parents[2] / "app.py")
VOCAB = 320
PROMPT = "the cache holds keys"
SMALL = dict(vocab_size=VOCAB, bos_token_id=None, eos_token_id=0, pad_token_id=0, initializer_range=0.2)
CONFIGS = {
    "llama": LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, **SMALL),  # GQA
    "qwen2": Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=1, max_position_embeddings=64, **SMALL),  # MQA, q/k/v biases
    "gpt2": GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, **SMALL),  # MHA, learned positions
}


def byte_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer small enough for a 320-token model; any text encodes."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the cache holds keys and values of every past position"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Each config as a random-init model directory with a tokenizer, as save_pretrained() writes it."""
    tokenizer = byte_bpe()
    out = {}
    for kind, config in CONFIGS.items():
        torch.manual_seed(1)
        path = tmp_path_factory.mktemp(kind)
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[kind] = path
    return out


def real_cache_bytes(cache) -> int:
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_greedy_tokens_equal_transformers_generate(saved, kind):
    backend = load_hf_backend(str(saved[kind]), device="cpu")
    assert isinstance(backend, HFBackend)
    gen = Generation(backend, max_new_tokens=12)
    events = gen.run(PROMPT)
    ids = torch.tensor([gen.prompt_ids])
    reference = AutoModelForCausalLM.from_pretrained(saved[kind]).eval()
    expected = reference.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
    assert gen.generated[0] == expected
    assert len(set(expected)) > 3  # a real continuation, not one repeated token

    # Cache bytes: the real tensors, the memory formula for this config, and what the event reports.
    c = CONFIGS[kind]
    n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    d_head = c.hidden_size // c.num_attention_heads
    n_cached = len(gen.prompt_ids) + 11
    assert events[-1].cache_lengths == [n_cached] * c.num_hidden_layers
    formula = textbook_bytes(1, c.num_hidden_layers, n_cached, n_kv, d_head, 4)
    assert events[-1].live_bytes == real_cache_bytes(gen.cache) == formula == events[-1].formula_bytes
    assert events[-1].allocated_bytes == formula  # a DynamicCache holds exactly what it caches
    assert backend.layer_kv(gen.cache, 1)[0].shape == (1, n_kv, n_cached, d_head)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_attention_rows_cover_the_prefix_and_sum_to_one(saved, kind):
    backend = load_hf_backend(str(saved[kind]), device="cpu")
    gen = Generation(backend, max_new_tokens=5, capture_attention=True)
    ev = gen.prefill(PROMPT)
    n_prompt = len(gen.prompt_ids)
    for k in range(1, 5):
        ev = gen.step()
        assert len(ev.attention) == CONFIGS[kind].num_hidden_layers
        for row in ev.attention:
            assert row.shape == (4, n_prompt + k)
            assert abs(row.sum(-1) - 1).max() < 1e-5
    plain = Generation(backend, max_new_tokens=5)
    plain.run(PROMPT)
    assert plain.generated == gen.generated  # eager (rows shown) and SDPA passes agree
    diff, cached_tok, fresh_tok = gen.cache_vs_recompute()
    assert diff < 1e-4 and cached_tok == fresh_tok


def test_arch_facts_come_from_the_config(saved):
    a = load_hf_backend(str(saved["qwen2"]), device="cpu").spec
    assert (a.n_layers, a.n_heads, a.n_kv_heads, a.d_head, a.d_model) == (3, 4, 1, 16, 64)
    assert (a.vocab_size, a.max_context, a.attention_kind) == (VOCAB, 64, "MQA")
    assert a.name == f"{saved['qwen2'].name} (qwen2)"
    reference = AutoModelForCausalLM.from_pretrained(saved["qwen2"])
    assert a.n_params == reference.num_parameters()
    g = load_hf_backend(str(saved["gpt2"]), device="cpu").spec
    assert (g.n_heads, g.n_kv_heads, g.d_head, g.max_context, g.attention_kind) == (4, 4, 16, 64, "MHA")


def test_bfloat16_cache_bytes(saved):
    backend = load_hf_backend(str(saved["llama"]), dtype="bfloat16", device="cpu")
    gen = Generation(backend, max_new_tokens=3)
    ev = gen.run(PROMPT)[-1]
    n = len(gen.prompt_ids) + 2
    assert ev.live_bytes == real_cache_bytes(gen.cache) == textbook_bytes(1, 2, n, 2, 16, 2) == ev.formula_bytes


def test_tokenizer_round_trip_and_token_text(saved):
    tok = load_hf_backend(str(saved["gpt2"]), device="cpu").tokenizer
    ids = tok.encode("keys and values\n")
    assert tok.decode(ids) == "keys and values\n"
    assert tok.eos_id == 0 and tok.vocab_size <= VOCAB
    assert tok.token_text(tok.encode("\n")[0]) == "\\n"  # readable, not an invisible newline
    # Issue 19 #18: the model's vocabulary (320) is wider than the tokenizer's: those ids are ⟨id⟩, never "None".
    assert [tok.token_text(i) for i in (tok.vocab_size, VOCAB - 1)] == [f"⟨{tok.vocab_size}⟩", f"⟨{VOCAB - 1}⟩"]


def test_context_end_is_a_clear_error(saved):
    backend = load_hf_backend(str(saved["gpt2"]), device="cpu")
    gen = Generation(backend, max_new_tokens=100)
    gen.run(list(range(1, 60)))
    assert len(gen.token_ids) == 64  # the engine stops at GPT-2's 64 learned positions
    with pytest.raises(InputError) as err:
        backend.forward(torch.tensor([list(range(65))]), None, capture_attention=False, all_logits=False)
    assert err.value.key == "sequence_too_long"


def save_tiny(config, path: Path) -> str:
    torch.manual_seed(2)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    byte_bpe().save_pretrained(path)
    return str(path)


def test_sliding_window_cache_keeps_only_the_window(tmp_path):
    config = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, sliding_window=6, max_position_embeddings=64, **SMALL)
    backend = load_hf_backend(save_tiny(config, tmp_path), device="cpu")
    gen = Generation(backend, max_new_tokens=10, capture_attention=True)
    ev = gen.run(PROMPT)[-1]
    reference = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([gen.prompt_ids])
    assert gen.generated[0] == reference.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:].tolist()
    assert ev.cache_lengths == [5, 5]  # window − 1 positions kept, not the whole prefix
    assert ev.live_bytes == real_cache_bytes(gen.cache) == textbook_bytes(1, 2, 5, 2, 16, 4) == ev.formula_bytes


def test_mla_caches_the_compressed_latent(tmp_path):
    config = DeepseekV3Config(hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
                              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
                              num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                              max_position_embeddings=64, **SMALL)
    backend = load_hf_backend(save_tiny(config, tmp_path), device="cpu")
    assert backend.spec.is_mla and backend.spec.attention_kind == "MLA"
    gen = Generation(backend, max_new_tokens=4, capture_attention=True)
    ev = gen.run(PROMPT)[-1]
    n = len(gen.prompt_ids) + 3
    # One shared latent (kv_lora_rank) plus one RoPE key (qk_rope_head_dim) per token and layer, float32.
    assert ev.live_bytes == real_cache_bytes(gen.cache) == 2 * n * (16 + 8) * 4
    assert ev.formula_bytes == ev.live_bytes  # the MLA formula L·n·(kv_lora_rank + qk_rope_head_dim)·bytes
    assert ev.attention[0].shape == (4, n)


def test_a_model_without_attention_has_no_kv_cache(tmp_path):
    config = MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=4)
    with pytest.raises(InputError) as err:
        load_hf_backend(save_tiny(config, tmp_path), device="cpu")
    assert err.value.key == "hf.no_kv_cache" and "mamba" in str(err.value)


# ---- the native decoder and the HF backend on the same weights ----------------------------------------
def test_native_decoder_saved_as_hf_llama_matches_native_backend(tmp_path):
    cfg = DecoderConfig(n_layers=3, d_model=64, n_heads=8, n_kv_heads=2, d_ff=128, vocab_size=VOCAB, max_seq_len=64)
    native = random_backend(cfg, seed=7)
    state = {k: v.contiguous() for k, v in native.model.state_dict().items()}
    hf_cfg = LlamaConfig(**cfg.to_hf_dict())
    assert set(state) == set(LlamaForCausalLM(hf_cfg).state_dict())  # tensor names map one to one
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    hf_cfg.save_pretrained(tmp_path)
    byte_bpe().save_pretrained(tmp_path)
    hf = load_backend(str(tmp_path), device="cpu", engine="hf")
    assert hf.kind == "hf"

    prompt = [5, 17, 200, 3, 99, 42]
    a = Generation(native, max_new_tokens=16, capture_attention=True, stop_at_eos=False)
    b = Generation(hf, max_new_tokens=16, capture_attention=True, stop_at_eos=False)
    ea, eb = a.run(prompt), b.run(prompt)
    assert a.generated == b.generated and len(set(a.generated[0])) > 3
    assert [e.cache_lengths for e in ea] == [e.cache_lengths for e in eb]
    assert [e.live_bytes for e in ea] == [e.live_bytes for e in eb]
    assert torch.allclose(a.last_logits, b.last_logits, atol=1e-4)
    for row_a, row_b in zip(ea[-1].attention, eb[-1].attention, strict=True):
        assert abs(row_a - row_b).max() < 1e-5
    assert hf.spec.n_params == native.spec.n_params


# ---- errors a user can cause ----------------------------------------------------------------------------
def expect_error(key: str, name: str, **kwargs) -> InputError:
    with pytest.raises(InputError) as err:
        load_hf_backend(name, device="cpu", **kwargs)
    assert err.value.key == key, str(err.value)
    assert "\n" not in str(err.value) and err.value.message("ko") != str(err.value)
    return err.value


def test_a_path_with_no_model(tmp_path):
    expect_error("hf.no_model", str(tmp_path))
    (tmp_path / "notes.txt").write_text("x")
    expect_error("hf.no_model", str(tmp_path / "notes.txt"))
    expect_error("hf.no_such_path", str(tmp_path / "missing"))
    expect_error("hf.empty_name", "  ")
    expect_error("hf.bad_name", "not a model!")


def test_config_without_weights_or_tokenizer(saved, tmp_path):
    CONFIGS["llama"].save_pretrained(tmp_path)
    expect_error("hf.no_weights", str(tmp_path))
    AutoModelForCausalLM.from_config(CONFIGS["llama"]).save_pretrained(tmp_path)
    expect_error("hf.no_tokenizer", str(tmp_path))


def test_an_encoder_is_not_a_causal_lm(tmp_path):
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)
    BertModel(config).save_pretrained(tmp_path)
    err = expect_error("hf.not_causal", str(tmp_path))
    assert "BertModel" in str(err)


def test_a_hub_id_while_offline():
    err = expect_error("hf.offline", "kvviz-test/absent-model")
    assert "local directory" in str(err)


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory"), MemoryError(),
                                 RuntimeError("DefaultCPUAllocator: not enough memory: you tried... out of memory")])
def test_out_of_memory_load(saved, monkeypatch, exc):
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    expect_error("hf.out_of_memory", str(saved["llama"]))


def test_cli_generate_with_hf_directory(saved, capsys):
    assert main(["generate", "--model", str(saved["llama"]), "--prompt", PROMPT, "--max-new-tokens", "4",
                 "--device", "cpu", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    gen = Generation(load_hf_backend(str(saved["llama"]), device="cpu"), max_new_tokens=4)
    gen.run(PROMPT)
    assert out["token_ids"] == gen.generated[0] and out["cache_live_bytes"] == out["formula_bytes"] > 0
    assert main(["generate", "--model", "kvviz-test/absent-model", "--prompt", "hi", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvviz: error:") and "offline" in err and err.count("\n") == 1


# ---- a hosted deployment's limits -------------------------------------------------------------------------
def test_policy_parsing():
    assert parse_params("135M") == 135_000_000 and parse_params("1.5e9") == 1_500_000_000
    assert parse_params("2B") == 2 * 10**9 and parse_params(500) == 500
    for bad in ("lots", "-5", "0"):
        with pytest.raises(InputError):
            parse_params(bad)
    p = policy_from({"KVVIZ_HF_ALLOWLIST": "gpt2, Qwen/Qwen2.5-0.5B ,", "KVVIZ_HF_MAX_PARAMS": "600M"},
                    {"hf_allowlist": ["other"], "hf_max_params": 10})
    assert p == HFPolicy(("gpt2", "Qwen/Qwen2.5-0.5B"), 600_000_000)  # the environment wins
    assert policy_from({}, {"hf_allowlist": ["a/b"], "hf_max_params": "1K"}) == HFPolicy(("a/b",), 1000)
    assert policy_from({}) == HFPolicy(None, None)


def test_allowlist_and_size_cap(saved):
    path = str(saved["llama"])
    check_allowed("anything", HFPolicy())
    check_allowed(path + "/", HFPolicy((path,)))  # the same directory, spelled differently
    err = expect_error("hf.not_allowed", path, policy=HFPolicy(("gpt2",)))
    assert "gpt2" in str(err)
    n_params = load_hf_backend(path, device="cpu", policy=HFPolicy((path,), 10**6)).spec.n_params
    assert n_params < 10**6
    err = expect_error("hf.too_big", path, policy=HFPolicy(None, n_params - 1))
    assert f"{n_params:,}" in str(err)
    with pytest.raises(InputError):
        check_size("m", 11, HFPolicy(None, 10))


# ---- the app on a saved HF model ----------------------------------------------------------------------------
def test_app_runs_on_a_saved_hf_model(saved):
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = str(saved["llama"])
    at.run()
    assert not at.exception and not at.error
    caption = " ".join(c.value for c in at.caption)
    assert f"{saved['llama'].name} (llama)" in caption and "4/2 heads (GQA)" in caption and "d_head 16" in caption


@pytest.mark.parametrize("lang, word", [("en", "offline"), ("ko", "오프라인")])
def test_app_says_why_a_model_cannot_load(lang, word):
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["lang"] = lang
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = "kvviz-test/absent-model"
    at.run()
    assert not at.exception
    assert word in at.error[0].value


def test_app_honours_the_allowlist(saved, monkeypatch):
    monkeypatch.setenv("KVVIZ_HF_ALLOWLIST", "HuggingFaceTB/SmolLM2-135M")
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = str(saved["gpt2"])
    at.run()
    assert not at.exception and "SmolLM2-135M" in at.error[0].value and not model_captions(at)


def test_app_reads_limits_from_secrets(saved):
    at = AppTest.from_file(APP, default_timeout=60)
    at.secrets["hf_max_params"] = "1K"
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = str(saved["qwen2"])
    at.run()
    assert not at.exception and "at most 1,000" in at.error[0].value and not model_captions(at)


def test_app_asks_for_a_model_name():
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "hf"
    at.run()
    assert not at.exception and not at.error and "hub id" in at.info[0].value


def model_captions(at) -> list[str]:  # noqa: ANN001 - an AppTest
    """The sidebar model's architecture caption(s): present only when a model loaded."""
    return [c.value for c in at.caption if " parameters" in c.value and "d_head" in c.value]


def test_a_model_that_failed_is_not_retried_until_the_choice_changes(monkeypatch, saved):
    """Issue 19 #3: offline, a failed hub id was looked up again (23 s) on every rerun of every page."""
    import kvviz.engine.backends.hf as hf

    calls = []
    real = hf.load_hf_backend

    def counting(name, **kwargs):  # noqa: ANN001, ANN202 - the real loader, counted
        calls.append(name)
        return real(name, **kwargs)

    monkeypatch.setattr(hf, "load_hf_backend", counting)
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["kv_model"] = "hf"
    at.session_state["kv_hf_model"] = "kvviz-test/absent-model"
    at.run()
    assert calls == ["kvviz-test/absent-model"] and "offline" in at.error[0].value
    at.switch_page("pages/6_Check.py").run()  # another page, the same session
    at.switch_page("app.py").run()
    assert not at.exception and calls == ["kvviz-test/absent-model"]  # remembered: not tried again
    assert "offline" in at.error[0].value and "not tried again" in " ".join(c.value for c in at.caption)
    at.session_state["kv_dtype"] = "bfloat16"  # a changed choice is tried
    at.run()
    assert calls == ["kvviz-test/absent-model"] * 2
    at.session_state["kv_hf_model"] = str(saved["gpt2"])  # an architecture only transformers runs
    at.run()
    assert not at.exception and not at.error and calls[-1] == str(saved["gpt2"])
