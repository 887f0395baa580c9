"""Tokenizers behind one small protocol: encode, decode, and a readable text for each token."""
from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kvviz.errors import InputError

EOS_TOKEN = "<|endoftext|>"  # separates documents in training; BOS and EOS of the shipped model


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_text(self, token_id: int) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255: lets a random-init model of any vocabulary take any text.

    Ids above 255 (a random model's larger vocabulary) have no text and show as ⟨id⟩.
    """

    eos_id = None

    def __init__(self, vocab_size: int = 256) -> None:
        if vocab_size < 256:
            raise InputError("byte_vocab", value=vocab_size)
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        out, pending = [], bytearray()
        for i in ids:
            if i < 256:
                pending.append(i)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            out.append(f"⟨{i}⟩")
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_text(self, token_id: int) -> str:
        if token_id >= 256:
            return f"⟨{token_id}⟩"
        ch = bytes([token_id]).decode("utf-8", errors="kvviz_hex")  # a byte of a multi-byte character: <0xEC>
        return ch if ch.isprintable() else f"<0x{token_id:02X}>"


def _byte_level_decoding() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each of the 256 bytes is one printable character ('Ġ' = space)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF_CHAR = _byte_level_decoding()
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _hex_bytes(err: UnicodeDecodeError) -> tuple[str, int]:
    return "".join(f"<0x{b:02X}>" for b in err.object[err.start : err.end]), err.end


codecs.register_error("kvviz_hex", _hex_bytes)
def _codepoint(c: str) -> str:
    return f"<0x{ord(c):02X}>" if ord(c) < 0x80 else f"<U+{ord(c):04X}>"


# Whitespace made visible, so a student sees where one token ends and the next begins.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


class BPETokenizer:
    """A `tokenizers` tokenizer (the shipped byte-level BPE, where any UTF-8 text round-trips exactly; or a
    transformers directory's, whatever its model: BPE, WordLevel, Unigram)."""

    def __init__(self, source: str | Path | object, eos_token: str = EOS_TOKEN, *, eos_id: int | None = None,
                 chat_template: str | None = None) -> None:
        """source: a tokenizer.json path, or a tokenizers.Tokenizer built in memory (from a GGUF's vocabulary)."""
        from tokenizers import Tokenizer as HFTokenizer

        self._tok = source if isinstance(source, HFTokenizer) else HFTokenizer.from_file(str(Path(source)))
        self.vocab_size = self._tok.get_vocab_size()
        # The model's own stop token where its config names one (SmolLM2-Instruct ends a turn with <|im_end|>).
        self.eos_id = eos_id if eos_id is not None else self._tok.token_to_id(eos_token)
        self.chat_template = chat_template  # Jinja, as transformers' tokenizer_config.json holds it
        self._special = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        self._texts: dict[int, str] = {}
        # BOS goes in front only where the tokenizer's own post-processor puts it (Llama 2 style), as
        # HFTokenizer decides; a byte-level vocabulary keeps its raw bytes, a sentencepiece one its ▁ pieces.
        with_special = self._tok.encode("a", add_special_tokens=True).ids
        self._bos = with_special[0] if with_special[:1] != self._tok.encode("a", add_special_tokens=False).ids[:1] \
            else None
        self._byte_level = "ByteLevel" in self._tok.to_str()

    def to_json(self) -> str:
        """The tokenizer as a tokenizer.json text (what the exports write)."""
        return self._tok.to_str()

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self._bos, *ids] if self._bos is not None else ids

    def decode(self, ids: list[int]) -> str:
        # Special tokens stay in the text, so decode(encode(s)) == s even when s contains them.
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The raw bytes of a token, or None for a special token."""
        piece = self._tok.id_to_token(token_id)
        if piece is None or token_id in self._special:
            return None
        if self._byte_level:
            return bytes(_BYTE_OF_CHAR[c] for c in piece)
        if m := _BYTE_PIECE.fullmatch(piece):  # sentencepiece's byte fallback
            return bytes([int(m.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def token_text(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self._readable(token_id)
        return self._texts[token_id]

    def _readable(self, token_id: int) -> str:
        raw = self.token_bytes(token_id)
        if raw is None:
            return self._special.get(token_id, f"⟨{token_id}⟩")
        # Part of a multi-byte character (a Korean syllable split across tokens) shows as <0xEA> bytes.
        text = raw.decode("utf-8", errors="kvviz_hex")
        return "".join(_VISIBLE.get(c) or (c if c.isprintable() else _codepoint(c)) for c in text)


# --- Chips: a run of byte tokens shown as the characters it forms ------------------------------------

_HEX = re.compile(r"<0x([0-9A-Fa-f]{2})>")
MAX_RUN = 8  # a UTF-8 character has at most 4 bytes; a longer incomplete run is not one character


@dataclass(frozen=True)
class Chip:
    """Tokens start..stop-1 drawn as one chip with this text."""

    start: int
    stop: int
    text: str

    @property
    def positions(self) -> str:
        """Its positions as a tooltip says them: "7", or "7–9" for a run of three tokens."""
        return str(self.start) if self.stop - self.start == 1 else f"{self.start}–{self.stop - 1}"


def _raw(text: str) -> bytes:
    """A token's readable text back to bytes: `<0xNN>` markers are raw bytes, everything else its UTF-8."""
    out, pos = bytearray(), 0
    for m in _HEX.finditer(text):
        out += text[pos : m.start()].encode("utf-8")
        out.append(int(m.group(1), 16))
        pos = m.end()
    return bytes(out + text[pos:].encode("utf-8"))


def _split_char(text: str) -> bool:
    """Does this token text carry a byte of a multi-byte character (a `<0x80>`..`<0xFF>` marker)?"""
    return any(int(m.group(1), 16) >= 0x80 for m in _HEX.finditer(text))


def _incomplete(raw: bytes) -> bool:
    """True when raw is valid UTF-8 except that its last character is cut short."""
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError as err:
        return err.end == len(raw) and err.reason == "unexpected end of data"


def byte_run_chips(token_texts: Sequence[str]) -> list[Chip]:
    """Group readable token texts into chips: a run of tokens that splits characters into bytes becomes one chip
    showing those characters ("<0xEC><0x98>" + "<0x9B>날" → one chip "옛날" over two tokens).

    Works on the texts every tokenizer here shows (`<0xNN>` for a byte of an incomplete character: the
    shipped BPE, the byte tokenizer, and byte-fallback vocabularies of transformers models). A run cut short at
    the end (the text so far ends inside a character) shows its partial character as "�", as tokenizer viewers do;
    bytes that are not UTF-8 at all keep their tokens' own texts.
    """
    chips: list[Chip] = []
    i, n = 0, len(token_texts)
    while i < n:
        if not _split_char(token_texts[i]):
            chips.append(Chip(i, i + 1, token_texts[i]))
            i += 1
            continue
        raw, j = _raw(token_texts[i]), i + 1
        while _incomplete(raw) and j < n and j - i < MAX_RUN:
            raw += _raw(token_texts[j])
            j += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if not _incomplete(raw):  # not UTF-8 (a stray continuation byte): each token as it is
                chips.extend(Chip(k, k + 1, token_texts[k]) for k in range(i, j))
                i = j
                continue
            # Cut short at the end (a decode step stopped inside a character): the run so far, its partial
            # character as one U+FFFD, as a tokenizer viewer shows it, never a bare <0xEC>.
            text = raw.decode("utf-8", errors="replace")
        chips.append(Chip(i, j, "".join(c if c.isprintable() or c in _VISIBLE.values() else _codepoint(c)
                                        for c in text)))
        i = j
    return chips


def chip_labels(token_texts: Sequence[str]) -> list[str]:
    """One label per token (for a per-position axis): a token inside a byte run shows the characters the run
    forms and which part of the run it is ("옛날 1/2", "옛날 2/2"), never a bare `<0xEC>`."""
    labels: list[str] = []
    for c in byte_run_chips(token_texts):
        n = c.stop - c.start
        labels.extend([c.text] if n == 1 else [f"{c.text} {k}/{n}" for k in range(1, n + 1)])
    return labels
