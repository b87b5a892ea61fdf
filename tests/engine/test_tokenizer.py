"""Tokenizers: byte presets show every id; tokenizer.json directories encode, decode and render
chat prompts as transformers does; streams detokenize incrementally and agree with whole replies."""
import json
import random

import pytest

from engine.models.chat_template import ChatTemplateError
from engine.config import ConfigError
from tools.make_model_dir import CHAT_TEMPLATE, write_tokenizer
from engine.models.tokenizer import ByteTokenizer, IncrementalDetokenizer, Utf8Stream, chat_text, load_tokenizer

transformers = pytest.importorskip("transformers")

CHATS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "naïve café 🙂 東京"},
     {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}],
    [{"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "joined"}]}],
    [{"role": "user", "content": "<|im_start|> inside text", "name": None}],
]


def _stream(tok, ids) -> list[str]:
    d = IncrementalDetokenizer(tok)
    return [d.push(i) for i in ids] + [d.flush()]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def hf_tok(tok_dir):
    return transformers.AutoTokenizer.from_pretrained(str(tok_dir))


# ---- byte presets ------------------------------------------------------------------------------
def test_byte_encode_and_chat_are_unchanged():
    t = ByteTokenizer()
    assert t.encode("héllo") == list("héllo".encode()) == t.encode("héllo", add_special_tokens=False)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat_text(msgs) == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    assert t.chat_prompt(msgs) == list(chat_text(msgs).encode())
    assert isinstance(load_tokenizer(None, 512, 256), ByteTokenizer)


def test_byte_ids_all_decode_to_visible_text():
    t = ByteTokenizer(512, 256)
    assert t.decode(list("héllo".encode()) + [256, 300]) == "héllo<|eos|><|t300|>"
    assert t.decode([104, 256, 300], skip_special_tokens=True) == "h"
    for i in range(512):
        assert t.decode([i]) != "", i
    assert t.decode([0xFF, 0x80, 0xE2, 0x28, 0xE2, 0x82]) == "<|xff|><|x80|><|xe2|>(<|xe2|><|x82|>"
    assert t.decode([0xE2, 0x82, 256]) == "<|xe2|><|x82|><|eos|>"  # EOS cuts the character off


def test_utf8_stream_equals_python_and_emits_as_soon_as_decidable():
    import codecs
    codecs.register_error("test-visible", lambda e: ("".join(f"<|x{b:02x}|>" for b in e.object[e.start:e.end]), e.end))
    rng = random.Random(0)
    pool = list(range(256)) + list("€🙂é東".encode()) * 8
    for _ in range(300):
        data = bytes(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        assert ByteTokenizer().decode(list(data)) == data.decode("utf-8", "test-visible"), data
    s = Utf8Stream()
    assert [s.push(b) for b in "€".encode()] == ["", "", "€"]
    assert [s.push(b) for b in (0xED, 0xA0)] == ["", "<|xed|><|xa0|>"]  # a surrogate: known at its 2nd byte
    assert [s.push(b) for b in (0xF0, 0x41)] == ["", "<|xf0|>A"]
    assert s.push(0xC0) == "<|xc0|>" and s.flush() == ""


def test_byte_stream_pieces_join_to_the_reply():
    t = ByteTokenizer(512, 256)
    rng = random.Random(1)
    pool = list(range(512)) + list("naïve 🙂 東京".encode()) * 20
    for _ in range(200):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 16))]
        pieces = _stream(t, ids)
        assert "".join(pieces) == t.reply_text(ids) == t.decode(ids)
        for i, piece in zip(ids, pieces):
            if i >= 256 or i < 0x80:
                assert piece != "", (ids, pieces)  # decidable at once: emitted at once


# ---- tokenizer.json ----------------------------------------------------------------------------
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_chat_prompt_equals_transformers(tok_dir, hf_tok, chat):
    ours = load_tokenizer(tok_dir, 600, 2)
    msgs = CHATS[chat]
    ref_text = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ref_ids = hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.chat_text(msgs) == ref_text
    assert ours.chat_prompt(msgs) == list(ref_ids)
    assert ref_text.endswith("<|im_start|>assistant\n")


def test_template_file_bos_eos_and_raise_exception(tmp_path, hf_tok):
    write_tokenizer(tmp_path, template_file=True)
    assert (tmp_path / "chat_template.jinja").is_file()
    extra = "{{ bos_token or 'nobos' }}|{{ eos_token }}|{{ pad_token }}|{{ messages | tojson }}\n"
    (tmp_path / "chat_template.jinja").write_text(extra + CHAT_TEMPLATE)
    ours = load_tokenizer(tmp_path, 600, 2)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    msgs = CHATS[1]
    assert ours.chat_text(msgs) == hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert ours.chat_text(msgs).startswith('nobos|<|im_end|>|<|endoftext|>|[{"role": "system"')
    with pytest.raises(ChatTemplateError, match="role tool is not supported"):
        ours.chat_prompt([{"role": "tool", "content": "x"}])


def test_directory_without_template_refuses_chat_and_a_broken_one_refuses_to_load(tmp_path):
    write_tokenizer(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = load_tokenizer(tmp_path, 600, 2)
    assert t.encode("the engine") != []
    with pytest.raises(ChatTemplateError, match="no chat template"):
        t.chat_prompt(CHATS[0])
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="chat template does not compile"):
        load_tokenizer(tmp_path, 600, 2)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read its tokenizer"):
        load_tokenizer(tmp_path, 600, 2)


def test_encode_decode_equal_transformers(tok_dir, hf_tok):
    t = load_tokenizer(tok_dir, 600, 2)
    text = "the engine streams 🙂 naïve 東京 <|im_end|> tokens"
    assert t.encode(text) == hf_tok.encode(text)
    assert t.encode(text, add_special_tokens=False) == hf_tok.encode(text, add_special_tokens=False)
    ids = t.encode(text)
    assert 2 in ids  # the special token in the text is matched, as transformers matches it
    assert t.decode(ids) == hf_tok.decode(ids) == text
    assert t.decode(ids, skip_special_tokens=True) == hf_tok.decode(ids, skip_special_tokens=True)
    assert t.reply_text(ids) == t.decode(ids, skip_special_tokens=True)


def test_hf_stream_pieces_join_to_the_reply_and_never_split_a_character(tok_dir):
    t = load_tokenizer(tok_dir, 600, 2)
    assert t.vocab_size < 576 and t.decode([575]) == "<|t575|>"  # known to the model, not the tokenizer
    rng = random.Random(2)
    text_ids = t.encode("naïve café 🙂 東京 emoji 🚀 ∑ √ π € ½ the engine")
    pool = list(range(t.vocab_size + 20)) + text_ids * 10
    for _ in range(200):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 16))]
        pieces = _stream(t, ids)
        assert "".join(pieces) == t.reply_text(ids), ids
    pieces = _stream(t, text_ids)
    assert "".join(pieces) == "naïve café 🙂 東京 emoji 🚀 ∑ √ π € ½ the engine"
    assert not any("\ufffd" in p for p in pieces)


def test_missing_tokenizers_package_is_a_config_error(tok_dir, no_tokenizers):
    with pytest.raises(ConfigError, match="pip install tokenizers"):
        load_tokenizer(tok_dir, 600, 2)


def test_byte_tokenizer_dir_tokenizes_as_the_presets(tmp_path):
    """tools/byte_tokenizer_dir.py: a tokenizer.json for clients that need one for a preset."""
    from tools.byte_tokenizer_dir import write_byte_tokenizer
    write_byte_tokenizer(tmp_path, 512, 256)
    ours, hf, plain = load_tokenizer(tmp_path, 512, 256), transformers.AutoTokenizer.from_pretrained(str(tmp_path)), ByteTokenizer()
    assert ours.name == "tokenizer.json" and ours.vocab_size == len(hf) == 512
    rng = random.Random(3)
    alphabet = "ab c\n\t naïve 東京 🙂 € <|user|>" + "".join(chr(i) for i in range(0x250))
    for _ in range(100):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert ours.encode(text) == hf.encode(text) == plain.encode(text), text
    msgs = CHATS[1][:3]
    assert ours.chat_prompt(msgs) == plain.chat_prompt(msgs)
    assert hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False) == plain.chat_prompt(msgs)
    assert hf.decode([104, 256, 300]) == plain.decode([104, 256, 300]) == "h<|eos|><|t300|>"
