"""Tokenizers: byte-level for the presets, or the model directory's `tokenizer.json`.

Byte-level (a directory without tokenizer.json, and every preset): a string's UTF-8 bytes are
its ids (0..255); `encode` adds nothing. Every id decodes to non-empty, visible text, so a client
that counts chunks with empty text as "no content" (AIPerf) sees one for every token:
- bytes decode as UTF-8; a byte that can never complete a character (a stray continuation byte,
  C0, C1, F5..FF, a lead byte followed by a byte that cannot continue it, or one cut off at the
  end of a reply) renders as `<|xHH|>`, two lowercase hex digits, e.g. `<|xff|>`;
- the EOS id (256 on tiny and cpu) renders as `<|eos|>`, any other id >= 256 as `<|tN|>`, e.g.
  `<|t300|>`. These ids count as special: `decode(ids, skip_special_tokens=True)` drops them.
Chat (byte-level), deliberately simple: one "<|role|>\\ncontent\\n" block per message, then the
assistant header, e.g. "<|system|>\\nYou are terse.\\n<|user|>\\nHello\\n<|assistant|>\\n".

tokenizer.json (the `tokenizers` library): `encode(text, add_special_tokens=True)` as
transformers' and vLLM's text prompts; chat prompts through the directory's chat template
(`chat_template.jinja`, else `tokenizer_config.json` `chat_template`), rendered as transformers
renders it (engine/models/chat_template.py); a directory without one refuses chat (ChatTemplateError).
An id the tokenizer does not know (the model's vocabulary is often larger) renders as `<|tN|>`.

Reply text (`reply_text`, and IncrementalDetokenizer for streams, which always agree): byte
presets show every id as above; tokenizer.json skips special tokens, as vLLM's replies do.
IncrementalDetokenizer emits an id's text as soon as it is decidable and never half a character:
bytes through a UTF-8 state machine, tokenizer.json through vLLM's prefix-window diff (hold back
while the text decoded so far ends in U+FFFD). The harness sends token ids and needs none of this.
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.models.chat_template import ChatTemplateError, compile_template, render
from engine.config import ConfigError

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def chat_text(messages: list[dict]) -> str:
    parts = [f"<|{m.get('role', 'user')}|>\n{m.get('content', '')}\n" for m in messages]
    return "".join(parts) + "<|assistant|>\n"


def _bad_byte(b: int) -> str:
    return f"<|x{b:02x}|>"


def _utf8_length(lead: int) -> int:
    """Bytes in the character `lead` starts; 0 when it can start none."""
    return 1 if lead < 0x80 else 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else \
        4 if 0xF0 <= lead <= 0xF4 else 0


def _continues(lead: int, index: int, b: int) -> bool:
    """Whether `b` may be byte `index` (1-based after the lead) of a character started by `lead`
    (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF)."""
    lo, hi = 0x80, 0xBF
    if index == 1:
        lo, hi = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(lead, (lo, hi))
    return lo <= b <= hi


class Utf8Stream:
    """Bytes in, text out as soon as it is decidable: a complete character at its last byte, a
    byte that cannot be part of one as `<|xHH|>` as soon as that is certain."""

    def __init__(self):
        self.pending = bytearray()

    def push(self, b: int) -> str:
        out = ""
        if self.pending:
            if _continues(self.pending[0], len(self.pending), b):
                self.pending.append(b)
                if len(self.pending) < _utf8_length(self.pending[0]):
                    return ""
                text = self.pending.decode("utf-8")
                self.pending.clear()
                return text
            out = self.flush()  # the pending bytes can never complete: b starts afresh
        n = _utf8_length(b)
        if n == 1:
            return out + chr(b)
        if n == 0:
            return out + _bad_byte(b)
        self.pending.append(b)
        return out

    def flush(self) -> str:
        text = "".join(_bad_byte(b) for b in self.pending)
        self.pending.clear()
        return text


class ByteTokenizer:
    name = "bytes"

    def __init__(self, vocab_size: int = 512, eos_token_id: int = 256):
        self.vocab_size, self.eos_token_id = vocab_size, eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))  # there is nothing special to add

    def id_text(self, token_id: int) -> str:
        """The visible text of a non-byte id."""
        return "<|eos|>" if token_id == self.eos_token_id else f"<|t{token_id}|>"

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        stream, out = Utf8Stream(), []
        for i in ids:
            if 0 <= i < 256:
                out.append(stream.push(i))
            elif not skip_special_tokens:
                out += [stream.flush(), self.id_text(i)]
        out.append(stream.flush())
        return "".join(out)

    def reply_text(self, ids) -> str:
        return self.decode(ids)

    def decode_bytes(self, ids) -> bytes:
        return bytes(i for i in ids if 0 <= i < 256)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        return self.encode(chat_text(messages))


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_chat_template(model_dir: Path, tok_cfg: dict) -> str | None:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    source = tok_cfg.get("chat_template")
    json_file = model_dir / "chat_template.json"
    if source is None and json_file.is_file():
        source = json.loads(json_file.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(source, list):  # named templates: the one called "default"
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    return source if isinstance(source, str) else None


class HFTokenizer:
    name = "tokenizer.json"

    def __init__(self, model_dir: Path, eos_token_id: int):
        from tokenizers import Tokenizer
        model_dir = Path(model_dir)
        where = f"--model {model_dir}"
        try:
            self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            cfg_file = model_dir / "tokenizer_config.json"
            tok_cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
            legacy = model_dir / "special_tokens_map.json"
            specials = json.loads(legacy.read_text(encoding="utf-8")) if legacy.is_file() else {}
            template = _read_chat_template(model_dir, tok_cfg)
        except Exception as e:  # OSError, bad JSON; tokenizers raises a bare Exception on a bad file
            raise ConfigError(f"{where}: cannot read its tokenizer ({str(e).splitlines()[0] if str(e) else e!r})") from None
        specials.update({k: v for k, v in tok_cfg.items() if k in SPECIAL_NAMES})
        self.special_tokens = {k: t for k, v in specials.items() if k in SPECIAL_NAMES and (t := _token_text(v))}
        self.vocab_size, self.eos_token_id = self.tok.get_vocab_size(with_added_tokens=True), eos_token_id
        self.chat_template_source = template
        try:
            self.template = compile_template(template) if template is not None else None
        except Exception as e:  # jinja2.TemplateSyntaxError and the sandbox's refusals
            raise ConfigError(f"{where}: its chat template does not compile ({e})") from None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def known(self, token_id: int) -> bool:
        return self.tok.id_to_token(token_id) is not None

    def id_text(self, token_id: int) -> str:
        return f"<|t{token_id}|>"

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Runs of known ids through the tokenizer; an unknown id is `<|tN|>` and splits runs."""
        out, run = [], []
        for i in ids:
            if self.known(i):
                run.append(i)
                continue
            out += [self.tok.decode(run, skip_special_tokens=skip_special_tokens) if run else "", self.id_text(i)]
            run = []
        out.append(self.tok.decode(run, skip_special_tokens=skip_special_tokens) if run else "")
        return "".join(out)

    def reply_text(self, ids) -> str:
        return self.decode(ids, skip_special_tokens=True)

    def decode_bytes(self, ids) -> bytes:
        return self.decode(ids).encode("utf-8")

    def chat_text(self, messages: list[dict]) -> str:
        if self.template is None:
            raise ChatTemplateError("this model directory has no chat template (chat_template.jinja, or "
                                    "chat_template in tokenizer_config.json): send a text prompt to /v1/completions")
        return render(self.template, messages, self.special_tokens)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        return self.encode(self.chat_text(messages), add_special_tokens=False)


class IncrementalDetokenizer:
    """Stream text for one reply: `push` each id as it comes, `flush` once at the end. The pieces
    joined equal the tokenizer's `reply_text(ids)`."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = self.read = 0  # tokenizer.json: the window [prefix, read) already emitted
        self.utf8 = Utf8Stream()

    def push(self, token_id: int) -> str:
        """New text, never half a character ("" while the id's text is not yet decidable)."""
        if isinstance(self.tok, ByteTokenizer):
            if 0 <= token_id < 256:
                return self.utf8.push(token_id)
            return self.utf8.flush() + self.tok.id_text(token_id)
        if not self.tok.known(token_id):  # a barrier, as in reply_text: finish the run first
            text = self.flush() + self.tok.id_text(token_id)
            self.ids, self.prefix, self.read = [], 0, 0
            return text
        self.ids.append(token_id)
        return self._diff(final=False)

    def flush(self) -> str:
        """What is still held back, emitted as it decodes (a cut-off character stays visible)."""
        if isinstance(self.tok, ByteTokenizer):
            return self.utf8.flush()
        return self._diff(final=True)

    def _diff(self, final: bool) -> str:
        before = self.tok.reply_text(self.ids[self.prefix:self.read])  # no unknown ids here: one run
        now = self.tok.reply_text(self.ids[self.prefix:])
        if len(now) <= len(before) or (now.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return now[len(before):]


def load_tokenizer(model_dir: Path | None, vocab_size: int, eos_token_id: int):
    """The directory's tokenizer.json when it has one, else byte-level."""
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        try:
            return HFTokenizer(Path(model_dir), eos_token_id)
        except ImportError:
            raise ConfigError(f"--model {model_dir} has a tokenizer.json, but the 'tokenizers' package "
                              "is not installed (pip install tokenizers)") from None
    return ByteTokenizer(vocab_size, eos_token_id)
