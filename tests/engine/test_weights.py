"""Dummy weights are deterministic; safetensors directories load strictly (sharded too)."""
import json

import pytest
import torch

from engine.config import ConfigError
from engine.models.presets import PRESETS
from engine.models.weights import dummy_state, load_model, save_pretrained

TINY = PRESETS["tiny"]


def test_dummy_deterministic_and_seeded():
    a, b = dummy_state(TINY, 0, torch.float32, "cpu"), dummy_state(TINY, 0, torch.float32, "cpu")
    c = dummy_state(TINY, 1, torch.float32, "cpu")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    w = a["model.layers.0.mlp.up_proj.weight"]
    assert 0.015 < w.std().item() < 0.025
    assert torch.equal(a["model.norm.weight"], torch.ones(TINY.hidden_size))
    bf = dummy_state(TINY, 0, torch.bfloat16, "cpu")
    assert bf["lm_head.weight"].dtype == torch.bfloat16


def test_sharded_roundtrip(tmp_path):
    m = load_model(TINY, "dummy", None, "cpu", "float32", seed=5)
    save_pretrained(m, TINY, tmp_path, max_shard_bytes=100_000)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    m2 = load_model(TINY, "safetensors", tmp_path, "cpu", "float32")
    sd, sd2 = m.state_dict(), m2.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)


def test_tied_roundtrip(tmp_path):
    from dataclasses import replace
    cfg = replace(TINY, tie_word_embeddings=True)
    m = load_model(cfg, "dummy", None, "cpu", "float32")
    assert m.lm_head.weight is m.model.embed_tokens.weight
    save_pretrained(m, cfg, tmp_path)
    m2 = load_model(cfg, "safetensors", tmp_path, "cpu", "float32")
    assert m2.lm_head.weight is m2.model.embed_tokens.weight
    assert torch.equal(m.lm_head.weight, m2.lm_head.weight)


def test_missing_and_mismatched(tmp_path):
    from safetensors.torch import load_file, save_file
    m = load_model(TINY, "dummy", None, "cpu", "float32")
    save_pretrained(m, TINY, tmp_path)
    f = tmp_path / "model.safetensors"
    sd = load_file(str(f))
    with pytest.raises(ConfigError, match="needs --model DIR"):
        load_model(TINY, "safetensors", None, "cpu", "float32")
    sd.pop("model.layers.1.mlp.down_proj.weight")
    save_file(sd, str(f))
    with pytest.raises(ConfigError, match="missing.*down_proj"):
        load_model(TINY, "safetensors", tmp_path, "cpu", "float32")
    sd["model.layers.1.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(sd, str(f))
    with pytest.raises(ConfigError, match="shape"):
        load_model(TINY, "safetensors", tmp_path, "cpu", "float32")
    sd["model.layers.1.mlp.down_proj.weight"] = torch.zeros(TINY.hidden_size, TINY.intermediate_size)
    sd["model.layers.9.extra.weight"] = torch.zeros(2)
    save_file(sd, str(f))
    with pytest.raises(ConfigError, match="unexpected"):
        load_model(TINY, "safetensors", tmp_path, "cpu", "float32")
    f.unlink()
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        load_model(TINY, "safetensors", tmp_path, "cpu", "float32")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3"
