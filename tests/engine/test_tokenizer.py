"""The shipped byte-level BPE: exact round trips of any UTF-8 text and readable token pieces."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvviz.engine.config import DecoderConfig
from kvviz.engine.loading import shipped_tokenizer, tokenizer_for
from kvviz.engine.shape import TINY_DIR
from kvviz.engine.tokenizer import BPETokenizer, ByteTokenizer, byte_run_chips, chip_labels
from kvviz.training.corpus import Document
from kvviz.training.train import train_tokenizer

TEXTS = [
    "def split(self, sep=None, maxsplit=-1):\n    Return a list of the words in the string.",
    "안녕하세요, 키-값 캐시! 한국어 문장도 그대로 돌아옵니다.",
    "emoji 🎉👩‍👩‍👧 and flags 🇰🇷, math ∑ x² ≠ y",
    "control \x00\x01\x07\x1b[0m\t tab\r\n crlf \x7f \u200b zero-width",
    "<|endoftext|> literal special token inside text",
    "  leading and trailing spaces   \n\n\n",
    "",
]


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return shipped_tokenizer()


def test_shipped_vocabulary(tok):
    assert tok.vocab_size == 8192
    assert tok.eos_id == 0 and tok.token_text(0) == "<|endoftext|>"


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # Each token is a byte string; together they are exactly the UTF-8 of the text.
    pieces = [tok.token_bytes(i) or tok.token_text(i).encode() for i in ids]
    assert b"".join(pieces) == text.encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_any_unicode(text):
    tok = shipped_tokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_bpe_compresses_english(tok):
    text = TEXTS[0]
    assert len(tok.encode(text)) < len(text.encode()) / 2.5  # about 3 bytes a token on this code-like line
    prose = "A list is a sequence of values that"
    assert [tok.token_text(i) for i in tok.encode(prose)] == [
        "A", "␣list", "␣is", "␣a", "␣sequence", "␣of", "␣values", "␣that"]


def test_korean_words_are_tokens(tok):
    """Trained on Korean prose: syllables and whole words are tokens, at most one token per Korean character."""
    pieces = [tok.token_text(i) for i in tok.encode("이 명령을 사용하면 현재 문서의")]
    assert pieces == ["이", "␣명령을", "␣사용하면", "␣현재", "␣문서의"]
    from kvviz.training.prose import KOREAN

    n_tokens = sum(len(tok.encode(p)) for p in KOREAN)
    n_chars = sum(len(p) for p in KOREAN)
    assert n_tokens / n_chars <= 0.76  # 490 tokens for 651 characters of prose in no corpus (0.753)


def test_token_text_is_readable(tok):
    pieces = [tok.token_text(i) for i in tok.encode("def split(self):\n    Return a list")]
    assert pieces[:2] == ["def", "␣split"]  # a visible space, not GPT-2's 'Ġ'
    assert "␣list" in pieces and any(p.startswith("↵") for p in pieces)
    assert not any("Ġ" in p or "Ċ" in p for p in pieces)
    # Control characters and a rare Korean syllable split across byte tokens show as their bytes,
    # and the token strip joins the run back into the syllable.
    assert [tok.token_text(i) for i in tok.encode("\x07")] == ["<0x07>"]
    rare = [tok.token_text(i) for i in tok.encode("옛")]
    assert "".join(rare) == "<0xEC><0x98><0x9B>" and len(rare) == 2
    assert [c.text for c in byte_run_chips(rare)] == ["옛"]
    assert tok.token_text(10_000) == "⟨10000⟩"  # beyond the vocabulary (a larger random model)


def test_random_shapes_use_bpe_when_it_fits():
    assert tokenizer_for(DecoderConfig(vocab_size=8192)) is shipped_tokenizer()
    assert tokenizer_for(DecoderConfig(vocab_size=32000)) is shipped_tokenizer()
    assert isinstance(tokenizer_for(DecoderConfig(vocab_size=4096)), ByteTokenizer)  # too small for the BPE
    small = tokenizer_for(DecoderConfig(vocab_size=300))
    assert isinstance(small, ByteTokenizer) and small.vocab_size == 300


def test_tokenizer_training_is_deterministic(tmp_path):
    docs = [Document(f"d{i}", f"Return the {w} of x.\n\n    def f{i}(self, {w}):") for i, w in
            enumerate(["sum", "product", "length", "items", "keys", "values"] * 20)]
    a = train_tokenizer(docs, 300, tmp_path / "a" / "tokenizer.json")
    train_tokenizer(docs, 300, tmp_path / "b" / "tokenizer.json")
    assert a.vocab_size == 300 and a.eos_id == 0
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    assert a.decode(a.encode("Return the sum")) == "Return the sum"


def test_shipped_files_exist():
    assert (TINY_DIR / "tokenizer.json").is_file()


def test_byte_runs_become_one_chip_per_character_run():
    # A byte tokenizer splits each Korean syllable into three tokens; chips show the syllables.
    byte = ByteTokenizer()
    texts = [byte.token_text(i) for i in byte.encode("옛날 a")]
    assert texts[:3] == ["<0xEC>", "<0x98>", "<0x9B>"]
    chips = byte_run_chips(texts)
    assert [(c.start, c.stop, c.text) for c in chips] == [(0, 3, "옛"), (3, 6, "날"), (6, 7, " "), (7, 8, "a")]
    # A BPE token can end inside one character and start the next: the run spans until the bytes complete.
    assert [(c.start, c.stop, c.text) for c in byte_run_chips(["␣<0xEC>", "<0x98><0x9B>날", "!"])] == [
        (0, 2, "␣옛날"), (2, 3, "!")]
    # Generation cut inside a character (a decode strip's newest tokens): the partial character as a tokenizer
    # viewer shows it, one chip over the run so far; stray continuation bytes and control bytes keep their texts.
    assert [(c.start, c.stop, c.text) for c in byte_run_chips(["a", "<0xEC>", "<0x98>"])] == [(0, 1, "a"),
                                                                                            (1, 3, "\ufffd")]
    assert [c.text for c in byte_run_chips(["␣날<0xEC>"])] == ["␣날\ufffd"]
    assert chip_labels(["<0xEC>", "<0x98>"]) == ["\ufffd 1/2", "\ufffd 2/2"]
    assert [c.text for c in byte_run_chips(["<0x98>", "b"])] == ["<0x98>", "b"]
    assert [c.text for c in byte_run_chips(["<0x07>", "<0xED><0x95><0x9C><0x07>"])] == ["<0x07>", "한<0x07>"]
    # Every token lies in exactly one chip, in order.
    assert chip_labels(texts) == ["옛 1/3", "옛 2/3", "옛 3/3", "날 1/3", "날 2/3", "날 3/3", " ", "a"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_chips_cover_every_token_and_spell_the_text(text):
    byte = ByteTokenizer()
    texts = [byte.token_text(i) for i in byte.encode(text)]
    chips = byte_run_chips(texts)
    assert [i for c in chips for i in range(c.start, c.stop)] == list(range(len(texts)))
    printable = all(ch.isprintable() for ch in text)
    if printable:
        assert "".join(c.text for c in chips) == text  # no <0xNN> left where the bytes form characters


def test_the_sidebars_default_custom_shape_reads_words_not_bytes():
    from kvviz.app.sidebar import DEFAULTS

    tok = tokenizer_for(DEFAULTS["kv_shape"])
    assert tok is shipped_tokenizer()
    assert len(tok.encode("옛날 옛적에")) < len("옛날 옛적에".encode())  # fewer tokens than UTF-8 bytes
