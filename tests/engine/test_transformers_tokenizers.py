"""A transformers directory's prompt ids are AutoTokenizer's, whatever its tokenizer: BPE, WordLevel, Unigram,
with and without added special tokens and a chat template. Each directory is built here offline with the
`tokenizers` library beside a tiny random Llama, and the native decoder's greedy tokens equal generate()'s."""
import json
import string

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from kvviz.engine.chat import chat_prompt
from kvviz.engine.generation import Generation
from kvviz.engine.loading import load_backend

TEXTS = ("kv cache test", "the cache holds keys and values", "a <|im_start|> in the middle", "  two  spaces\n")
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHARS = sorted(set(string.ascii_lowercase + " \n▁"))


def _word_level() -> tuple[Tokenizer, dict]:
    """Characters and a few words, split into single characters: transformers' LlamaTokenizer class replaces
    that pre-tokenizer with its own Metaspace one (the issue's 13 ids against AutoTokenizer's 11)."""
    vocab = {w: i for i, w in enumerate(["[UNK]", "<s>", "</s>", *CHARS, "kv", "cache"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return tok, {"tokenizer_class": "LlamaTokenizer", "unk_token": "[UNK]", "bos_token": "<s>", "eos_token": "</s>"}


def _bpe_with_bos() -> tuple[Tokenizer, dict]:
    """Byte-level BPE whose post-processor puts a BOS in front (Llama 3 style), with chat special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the cache holds keys and values of every past position"] * 10, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                 "chat_template": TEMPLATE}


def _unigram() -> tuple[Tokenizer, dict]:
    """A sentencepiece-style Unigram with Metaspace, an added special token and a chat template."""
    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("▁the", -2.0), ("▁cache", -2.5), ("▁kv", -3.0),
              ("s", -4.0), ("▁", -3.5), *[(c, -6.0) for c in CHARS if c not in " ▁"]]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return tok, {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "eos_token": "</s>",
                 "chat_template": TEMPLATE}


KINDS = {"wordlevel-split": _word_level, "bpe-bos-special": _bpe_with_bos, "unigram-metaspace": _unigram}


def _save(kind: str, path):  # noqa: ANN001
    tok, config = KINDS[kind]()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=None,
        eos_token_id=None, initializer_range=0.5))
    model.save_pretrained(path)
    return model.eval()


@pytest.fixture(scope="module", params=list(KINDS))
def saved(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, _save(request.param, path)


def test_prompt_ids_equal_autotokenizers(saved):
    kind, path, _ = saved
    auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    native = load_backend(str(path), device="cpu", engine="native")
    hf = load_backend(str(path), device="cpu", engine="hf")
    assert native.kind == "native" and hf.kind == "hf"
    for text in TEXTS:
        expected = auto(text).input_ids
        assert native.tokenizer.encode(text) == hf.tokenizer.encode(text) == expected, (kind, text)
    if kind == "wordlevel-split":
        # tokenizer.json read alone splits into every character (13 ids); LlamaTokenizer's own Metaspace pipeline,
        # which transformers builds, does not: what kvviz read before and why its greedy tokens then differed
        alone = Tokenizer.from_file(str(path / "tokenizer.json")).encode("kv cache test").ids
        assert len(alone) == 13 and alone != auto("kv cache test").input_ids
    template = getattr(native.tokenizer, "chat_template", None)
    assert template == auto.chat_template
    if template is not None:
        text = chat_prompt(template, "kv cache test")
        rendered = auto.apply_chat_template([{"role": "user", "content": "kv cache test"}], tokenize=False,
                                            add_generation_prompt=True)
        assert text == rendered
        assert native.tokenizer.encode(text) == auto(rendered).input_ids
        assert auto.convert_tokens_to_ids("<|im_start|>") in native.tokenizer.encode(text)  # one special token


def test_greedy_tokens_equal_generate(saved):
    kind, path, model = saved
    auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    ids = auto("kv cache test").input_ids
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
    backend = load_backend(str(path), device="cpu", engine="native")
    gen = Generation(backend, max_new_tokens=6, stop_at_eos=False)
    gen.run(backend.tokenizer.encode("kv cache test"))
    assert gen.generated[0] == expected, kind


def test_bad_tokenizer_is_one_line(tmp_path):
    _save("bpe-bos-special", tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    from kvviz.errors import InputError

    with pytest.raises(InputError) as e:
        load_backend(str(tmp_path), device="cpu", engine="native")
    assert e.value.key == "model.corrupt_file" and "tokenizer.json" in str(e.value)

