"""Model pieces: HF names, presets, resolve_model (tokenizers: tests/engine/test_tokenizer.py)."""
import json

import pytest
import torch

from engine.config import ConfigError, EngineConfig
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.presets import PRESETS, resolve_model


def test_hf_parameter_names():
    with torch.device("meta"):
        m = Qwen3ForCausalLM(PRESETS["tiny"])
    names = set(m.state_dict())
    for n in ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
              "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
              "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
              "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
              "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
              "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
              "model.layers.0.post_attention_layernorm.weight"]:
        assert n in names
    assert len(names) == 3 + 2 * 11


@pytest.mark.parametrize("name,params", [("qwen3-0.6b", 0.596e9), ("qwen3-8b", 8.19e9), ("qwen3-32b", 32.8e9)])
def test_qwen_shapes(name, params):
    c = PRESETS[name]
    assert c.vocab_size == 151936 and c.head_dim == 128 and c.rope_theta == 1e6 and c.eos_token_id == 151645
    assert c.tie_word_embeddings == (name == "qwen3-0.6b")
    assert abs(c.num_parameters() - params) / params < 0.01


def test_resolve_model(tmp_path):
    cfg, name, d = resolve_model("tiny")
    assert name == "tiny" and d is None and cfg.eos_token_id == 256
    with pytest.raises(ConfigError, match="--model"):
        resolve_model("no-such-model")
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny"].to_hf_dict()))
    cfg2, _, d2 = resolve_model(str(tmp_path))
    assert cfg2 == PRESETS["tiny"] and d2 == tmp_path


def test_config_errors():
    with pytest.raises(ConfigError):
        EngineConfig(dtype="float64")
