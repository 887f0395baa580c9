"""Tokenizers behind one small protocol: encode, decode, and a readable text for each token."""
from __future__ import annotations

from typing import Protocol

from .errors import InputError


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
