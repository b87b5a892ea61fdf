"""Reading a Hugging Face Qwen3 `config.json` (+ `generation_config.json`) as transformers 4.x and
5.x write them, into engine.config.ModelConfig. What the model does not implement is refused with
one line (ConfigError), never ignored:

- `model_type` must be "qwen3" and `architectures` (when given) "Qwen3ForCausalLM".
- RoPE: transformers 5 writes `rope_parameters: {"rope_theta": ..., "rope_type": "default"}`,
  transformers 4 a top-level `rope_theta` and `rope_scaling` (null or a dict with `type` /
  `rope_type`). Only the "default" type (plain RoPE) is implemented; any other is refused.
  Absent everywhere, the base is 10,000, Qwen3Config's default in both versions.
- Every layer must be full attention (`layer_types`, or `use_sliding_window`), no
  `attention_bias`, `hidden_act` silu, no `quantization_config`.
- Fields transformers defaults when absent get its defaults (head_dim 128, kv heads = heads,
  rms_norm_eps 1e-6, max_position_embeddings 32,768, untied embeddings).
- `dtype` (transformers 5) or `torch_dtype` (4.x): the checkpoint's dtype, kept as a name.
- EOS: `eos_token_id` may be an int or a list. As in transformers' `generate`, the ids of
  `generation_config.json` win when that file names some; otherwise config.json's.
- `generation_config.json` sampling fields (temperature, top_p, top_k, min_p,
  repetition_penalty, do_sample, max_new_tokens) become ModelConfig.generation, the defaults a
  server applies to a request that does not set them (as vLLM's `--generation-config auto`).
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.config import ConfigError, GenerationDefaults, ModelConfig

REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
DTYPE_NAMES = {"float32": "float32", "float": "float32", "fp32": "float32", "bfloat16": "bfloat16",
               "bf16": "bfloat16", "float16": "float16", "half": "float16", "fp16": "float16"}


def _eos_list(value, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ConfigError(f"{where}: eos_token_id must be a token id or a non-empty list of them, not {value!r}")
    return tuple(dict.fromkeys(ids))  # unique, first kept first


def _rope_theta(d: dict) -> float:
    """The RoPE base; refuses a RoPE type other than the plain one the model implements."""
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ConfigError("rope_parameters / rope_scaling must be objects")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ConfigError("per-layer-type rope_parameters are not implemented (Qwen3 has one RoPE)")
    for source in (scaling, params):
        kind = source.get("rope_type", source.get("type", "default"))
        if kind != "default":
            raise ConfigError(f"RoPE type {kind!r} is not implemented (only 'default'); "
                              f"remove rope_scaling / rope_parameters.rope_type to serve it with plain RoPE")
        if source.get("partial_rotary_factor", 1.0) != 1.0:
            raise ConfigError("partial_rotary_factor is not implemented (Qwen3 rotates the whole head)")
    theta = params.get("rope_theta", d.get("rope_theta", 10_000.0))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ConfigError(f"rope_theta must be a positive number, not {theta!r}")
    return float(theta)


def _check_architecture(d: dict) -> None:
    mt, archs = d.get("model_type"), d.get("architectures")
    if mt != "qwen3":
        raise ConfigError(f"model_type {mt!r} is not implemented (this engine serves Qwen3: model_type 'qwen3')")
    if archs is not None and archs != ["Qwen3ForCausalLM"]:
        raise ConfigError(f"architectures {archs!r} are not implemented (only Qwen3ForCausalLM)")
    n = d.get("num_hidden_layers")
    layer_types = d.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ConfigError("sliding-window layers (layer_types) are not implemented: every layer must be full_attention")
    if (layer_types is None and d.get("use_sliding_window") and d.get("sliding_window") is not None
            and isinstance(n, int) and d.get("max_window_layers", 28) < n):
        raise ConfigError("use_sliding_window is not implemented: every layer must be full attention")
    if d.get("attention_bias"):
        raise ConfigError("attention_bias is not implemented (Qwen3's projections have no bias)")
    if d.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act {d.get('hidden_act')!r} is not implemented (only silu)")
    if d.get("quantization_config") is not None:
        raise ConfigError("quantized checkpoints (quantization_config) are not implemented")


def _dtype(d: dict) -> str | None:
    raw = d.get("dtype", d.get("torch_dtype"))
    if raw is None or raw == "auto":
        return None
    name = DTYPE_NAMES.get(str(raw).removeprefix("torch."))
    if name is None:
        raise ConfigError(f"checkpoint dtype {raw!r} is not implemented (float32, bfloat16 or float16)")
    return name


def _generation(g: dict) -> GenerationDefaults:
    kw = {k: g[k] for k in GenerationDefaults.FIELDS if g.get(k) is not None}
    try:
        return GenerationDefaults(**kw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"generation_config.json: {e}") from None


def from_hf_dict(d: dict, generation: dict | None = None) -> ModelConfig:
    """A ModelConfig from config.json's dict (and generation_config.json's, when there is one)."""
    if not isinstance(d, dict):
        raise ConfigError("config.json must hold a JSON object")
    _check_architecture(d)
    missing = [k for k in REQUIRED if not isinstance(d.get(k), int) or isinstance(d.get(k), bool)]
    if missing:
        raise ConfigError(f"config.json lacks integer {', '.join(missing)}")
    heads = d["num_attention_heads"]
    gen = generation or {}
    eos = _eos_list(gen.get("eos_token_id"), "generation_config.json") or _eos_list(d.get("eos_token_id"), "config.json")
    if not eos:
        raise ConfigError("neither config.json nor generation_config.json names an eos_token_id")
    bos = d.get("bos_token_id", gen.get("bos_token_id"))
    return ModelConfig(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=d.get("num_key_value_heads") or heads, head_dim=d.get("head_dim") or 128,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta(d),
        max_position_embeddings=d.get("max_position_embeddings", 32_768),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        eos_token_id=eos[0], eos_token_ids=eos, bos_token_id=bos if isinstance(bos, int) else None,
        dtype=_dtype(d), generation=_generation(gen))


def _read_json(path: Path, where: str) -> dict:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where}: cannot read {path.name} ({e})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: {path.name} must hold a JSON object")
    return d


def read_model_dir(model_dir: Path, where: str) -> ModelConfig:
    """config.json (required) and generation_config.json (optional) of a model directory."""
    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"{where}: directory has no config.json")
    gen_path = model_dir / "generation_config.json"
    gen = _read_json(gen_path, where) if gen_path.is_file() else None
    try:
        return from_hf_dict(_read_json(cfg_path, where), gen)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
