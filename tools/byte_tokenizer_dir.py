"""Write a `tokenizer.json` (+ tokenizer_config.json with a chat template) that tokenizes exactly
as the byte-level presets do, for clients that need a tokenizer of their own to count or make
prompts (AIPerf, GuideLLM, `vllm bench serve --tokenizer DIR`):

    python -m tools.byte_tokenizer_dir OUT_DIR [--preset cpu]

Text encodes to its UTF-8 bytes (ids 0..255: a byte-level BPE without merges), the EOS id is the
special token `<|eos|>` and every other id up to the vocabulary is `<|tN|>`, as the engine shows
them. The chat template renders the presets' simple format ("<|role|>\\ncontent\\n" per message,
then "<|assistant|>\\n"). One difference: a text that contains "<|eos|>" or "<|tN|>" literally is
that special token here and bytes in the engine.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# Expressions, not literal text: Jinja drops a template's final newline.
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|' + message.role + '|>\\n' + message.content + '\\n' }}"
                 "{% endfor %}{{ '<|assistant|>\\n' }}")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the ByteLevel pre-tokenizer uses."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def write_byte_tokenizer(out, vocab_size: int = 512, eos_token_id: int = 256) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    if not 256 <= eos_token_id < vocab_size <= 65_536:
        raise ValueError("a byte tokenizer needs 256 <= eos < vocab <= 65536 (the tiny and cpu presets)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    names = ["<|eos|>" if i == eos_token_id else f"<|t{i}|>" for i in range(256, vocab_size)]
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|eos|>", "bos_token": None,
           "model_max_length": 40_960, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return out


def main() -> None:
    from engine.models.presets import PRESETS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--preset", default="cpu", choices=["tiny", "cpu"])
    a = ap.parse_args()
    cfg = PRESETS[a.preset]
    print(write_byte_tokenizer(a.out, cfg.vocab_size, cfg.eos_token_id))


if __name__ == "__main__":
    main()
