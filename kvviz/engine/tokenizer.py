"""Tokenizers behind one small protocol: encode, decode, and a readable text for each token."""
from __future__ import annotations

import codecs
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
        ch = bytes([token_id]).decode("utf-8", errors="replace")
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


def _hex_bytes(err: UnicodeDecodeError) -> tuple[str, int]:
    return "".join(f"<0x{b:02X}>" for b in err.object[err.start : err.end]), err.end


codecs.register_error("kvviz_hex", _hex_bytes)
def _codepoint(c: str) -> str:
    return f"<0x{ord(c):02X}>" if ord(c) < 0x80 else f"<U+{ord(c):04X}>"


# Whitespace made visible, so a student sees where one token ends and the next begins.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


class BPETokenizer:
    """A byte-level BPE from a `tokenizers` tokenizer.json: any UTF-8 text round-trips exactly."""

    def __init__(self, path: str | Path, eos_token: str = EOS_TOKEN) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.path = Path(path)
        self._tok = HFTokenizer.from_file(str(self.path))
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_id = self._tok.token_to_id(eos_token)
        self._special = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        self._texts: dict[int, str] = {}

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        # Special tokens stay in the text, so decode(encode(s)) == s even when s contains them.
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The raw bytes of a token, or None for a special token."""
        piece = self._tok.id_to_token(token_id)
        if piece is None or token_id in self._special:
            return None
        return bytes(_BYTE_OF_CHAR[c] for c in piece)

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
