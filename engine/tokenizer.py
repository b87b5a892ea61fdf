"""Tokenizers. Byte-level by default: a string's UTF-8 bytes are its ids (0..255); ids >= 256
(EOS and the rest of a small vocabulary) decode to "". If the model directory has a
`tokenizer.json` and the `tokenizers` package imports, that tokenizer is used instead.

Chat template (both tokenizers), deliberately simple and documented here:

    <|system|>\\nYou are terse.\\n<|user|>\\nHello\\n<|assistant|>\\n

one "<|role|>\\ncontent\\n" block per message, ending with the assistant header; the model's reply
follows it. The harness sends token ids and never depends on this.
"""
from __future__ import annotations

from pathlib import Path


def chat_text(messages: list[dict]) -> str:
    parts = [f"<|{m.get('role', 'user')}|>\n{m.get('content', '')}\n" for m in messages]
    return "".join(parts) + "<|assistant|>\n"


class ByteTokenizer:
    name = "bytes"

    def __init__(self, vocab_size: int = 512, eos_token_id: int = 256):
        self.vocab_size, self.eos_token_id = vocab_size, eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def decode_bytes(self, ids) -> bytes:
        return bytes(i for i in ids if 0 <= i < 256)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        return self.encode(chat_text(messages))


class HFTokenizer:
    name = "tokenizer.json"

    def __init__(self, path: Path, eos_token_id: int):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(str(path))
        self.vocab_size, self.eos_token_id = self.tok.get_vocab_size(), eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids))

    def decode_bytes(self, ids) -> bytes:
        return self.decode(ids).encode("utf-8")

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        return self.encode(chat_text(messages))


def load_tokenizer(model_dir: Path | None, vocab_size: int, eos_token_id: int):
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        try:
            return HFTokenizer(Path(model_dir) / "tokenizer.json", eos_token_id)
        except ImportError:
            pass
    return ByteTokenizer(vocab_size, eos_token_id)
