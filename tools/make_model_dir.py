"""Write a random Qwen3 Hugging Face directory with transformers' own `save_pretrained`, plus a
byte-level BPE tokenizer trained offline on a built-in text: the layout a real checkpoint has
(config.json, generation_config.json, *.safetensors, tokenizer.json, tokenizer_config.json with a
Qwen-style chat template). Nothing is downloaded. Tests use it; so can peer comparisons:

    python -m tools.make_model_dir OUT_DIR [--seed 0] [--tie] [--shard-kb 64]

The shapes are tiny (a forward in milliseconds on one core); the weights are normal with std
`init_std` (0.1: sharper logits than transformers' 0.02, so greedy replies vary). The RoPE base
is 50,000, neither transformers' default (10,000) nor Qwen3's (1,000,000), so a reader that
misses the field fails a comparison. transformers 5 writes `rope_parameters` and `dtype`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# A compact template in Qwen's ChatML form: a default system turn, content as a string or a list
# of text parts, raise_exception on a role it does not know, the assistant header when asked.
CHAT_TEMPLATE = """{%- if messages[0].role != 'system' %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('role ' ~ message.role ~ ' is not supported') }}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.content is string %}
        {{- message.content }}
    {%- else %}
        {%- for part in message.content %}
            {%- if part.type == 'text' %}{{- part.text }}{%- endif %}
        {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

_WORDS = ("the engine streams tokens to every client while a long prompt fills its lane in cuts "
          "greedy replies keep their ids across schedules and the harness hashes each reply "
          "a receipt shows the tables a reviewer pastes into a pull request with the figures "
          "naïve café déjà vu façade über straße 東京 日本語 中文 한국어 emoji 🙂 🚀 ∑ √ π € ½")


def corpus(lines: int = 400) -> list[str]:
    """A deterministic training text: the word list in many orders, so BPE learns merges."""
    words = _WORDS.split()
    return [" ".join(words[(i * k) % len(words)] for k in range(1, 13)) for i in range(lines)]


def train_tokenizer(vocab_size: int = 600):
    """A byte-level BPE (GPT-2 / Qwen style) with Qwen's three special tokens, ids 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def write_tokenizer(out: Path, template_file: bool = False) -> int:
    """tokenizer.json + tokenizer_config.json (template inline, or in chat_template.jinja as
    transformers 5 saves it). Returns the tokenizer's vocabulary size."""
    tok = train_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 32768,
           "clean_up_tokenization_spaces": False, "add_bos_token": False}
    if template_file:
        (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    else:
        cfg["chat_template"] = CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return tok.get_vocab_size()


def make_model_dir(out, seed: int = 0, tie: bool = False, shard_kb: int | None = None, init_std: float = 0.1,
                   template_file: bool = False, layers: int = 2) -> Path:
    """Write the directory and return its path. The model's vocabulary is the tokenizer's rounded
    up to 64, so some ids are unknown to the tokenizer, as in real Qwen3 checkpoints."""
    import torch
    import transformers
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n_tok = write_tokenizer(out, template_file)
    im_end, eot = SPECIALS.index("<|im_end|>"), SPECIALS.index("<|endoftext|>")
    config = transformers.Qwen3Config(
        vocab_size=(n_tok + 63) // 64 * 64, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        # transformers 5 reads rope_parameters, 4.x rope_theta (and saves the other as it came)
        rope_parameters={"rope_type": "default", "rope_theta": 50_000.0}, rope_theta=50_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=tie, initializer_range=init_std, bos_token_id=eot, eos_token_id=im_end)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot, do_sample=True,
        temperature=0.6, top_p=0.95, top_k=20)
    kw = {"max_shard_size": f"{shard_kb}KB"} if shard_kb else {}
    model.save_pretrained(str(out), **kw)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tie", action="store_true", help="tied input and output embeddings")
    ap.add_argument("--shard-kb", type=int, default=None, help="shard the safetensors (with an index)")
    ap.add_argument("--template-file", action="store_true", help="chat template in chat_template.jinja")
    a = ap.parse_args()
    print(make_model_dir(a.out, a.seed, a.tie, a.shard_kb, template_file=a.template_file))


if __name__ == "__main__":
    main()
