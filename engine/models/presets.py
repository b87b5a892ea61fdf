"""Named model shapes, and `resolve_model`: a preset name or a Hugging Face layout directory.

- `tiny`: unit tests (a forward in milliseconds on one core).
- `cpu`: the demo shape: on 2 CPU cores in float32 one stream decodes alone at >= 20 tok/s and
  a 4,096-token prompt prefills whole in 3 to 10 s, so a long prompt visibly stalls decoders.
- `qwen3-0.6b`, `qwen3-8b`, `qwen3-32b`: the real Qwen3 shapes (vocab 151,936), for the GPU.
Byte-level tokenization: ids 0..255 are bytes; tiny/cpu put EOS at 256 (vocab 512).
A directory is read by engine/models/hf_config.py (config.json and generation_config.json).
"""
from __future__ import annotations

from pathlib import Path

from engine.config import ConfigError, ModelConfig
from engine.models.hf_config import read_model_dir

_QWEN = dict(vocab_size=151_936, head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
             max_position_embeddings=40_960, eos_token_id=151_645, bos_token_id=151_643)

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10_000.0,
                        max_position_embeddings=40_960, eos_token_id=256),
    "cpu": ModelConfig(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=10,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=64, rope_theta=1_000_000.0,
                       max_position_embeddings=40_960, eos_token_id=256),
    "qwen3-0.6b": ModelConfig(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True, **_QWEN),
    "qwen3-8b": ModelConfig(hidden_size=4096, intermediate_size=12_288, num_hidden_layers=36,
                            num_attention_heads=32, num_key_value_heads=8, **_QWEN),
    "qwen3-32b": ModelConfig(hidden_size=5120, intermediate_size=25_600, num_hidden_layers=64,
                             num_attention_heads=64, num_key_value_heads=8, **_QWEN),
}


def resolve_model(name_or_dir: str) -> tuple[ModelConfig, str, Path | None]:
    """(config, model name, directory or None) for a preset name or a local HF layout directory."""
    if name_or_dir in PRESETS:
        return PRESETS[name_or_dir], name_or_dir, None
    d = Path(name_or_dir)
    if d.is_dir():
        return read_model_dir(d, f"--model {name_or_dir}"), d.resolve().name, d
    raise ConfigError(f"--model {name_or_dir!r} is neither a preset ({', '.join(PRESETS)}) nor a directory")
