"""Weights: seeded dummy weights made on the target device, or a local HF safetensors directory.

- `dummy`: every tensor is drawn on the target device from a torch.Generator of that device,
  seeded from (seed, tensor name), so weights are deterministic for (preset, seed, dtype, device
  type) and independent of the order tensors are made in. Linear weights and embeddings are
  normal with std 0.02 (HF's initializer_range), norms are 1.
- `safetensors`: config.json + *.safetensors (sharded with model.safetensors.index.json or not;
  an index naming a file outside the directory is refused), names and shapes checked strictly
  against the model; a clear ConfigError otherwise. Tied embeddings: lm_head.weight may be
  absent (transformers does not save it) and is then the embedding. Tensors are cast from the
  checkpoint's dtype to the engine's.
The model is built on the meta device and the tensors are assigned (load_state_dict(assign=True)).
`save_pretrained` writes config.json + model.safetensors (optionally sharded) for tests and users.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch

from engine.config import ConfigError, ModelConfig
from engine.models.qwen3 import Qwen3ForCausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STD = 0.02


def _tensor_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def _wanted(model: Qwen3ForCausalLM) -> dict[str, torch.Size]:
    """Names and shapes the checkpoint must hold (lm_head.weight is optional when tied)."""
    out = {k: v.shape for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def dummy_state(cfg: ModelConfig, seed: int, dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        shapes = _wanted(Qwen3ForCausalLM(cfg))
    device = torch.device(device)
    return {name: dummy_tensor(name, shape, seed, dtype, device) for name, shape in shapes.items()}


def dummy_tensor(name: str, shape, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One dummy tensor, from its name and the seed alone (a tensor-parallel rank makes the full
    tensor this way and keeps its slice, so every TP size has the same weights)."""
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    g = torch.Generator(device=device)
    g.manual_seed(_tensor_seed(seed, name))
    return torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, STD, generator=g).to(dtype)


def _index_files(model_dir: Path, index: Path) -> list[Path]:
    """The shards an index names; a name that leaves the directory is refused (checked by name,
    not by resolving links, so a Hugging Face cache snapshot's symlinked blobs still load)."""
    where = f"--model {model_dir}"
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = set(weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{where}: bad {index.name} ({e!r})") from None
    for name in sorted(names):
        parts = PurePosixPath(str(name)).parts if isinstance(name, str) else ()
        if (not parts or PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()
                or ".." in parts or "\\" in name):
            raise ConfigError(f"{where}: {index.name} names a file outside the directory: {name!r}")
    return [model_dir / n for n in sorted(names)]


def read_safetensors(model_dir: Path, device) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    files = _index_files(model_dir, index) if index.is_file() else sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--model {model_dir}: no *.safetensors files (try --load-format dummy)")
    sd = {}
    for f in files:
        if not f.is_file():
            raise ConfigError(f"--model {model_dir}: missing shard {f.name}")
        try:
            sd.update(load_file(str(f), device=str(device)))
        except (SafetensorError, OSError) as e:
            raise ConfigError(f"--model {model_dir}: cannot read {f.name} ({e})") from None
    return sd


def check_state(model: Qwen3ForCausalLM, sd: dict, where: str) -> None:
    check_shapes(_wanted(model), sd, where)


def check_shapes(wanted: dict, sd: dict, where: str) -> None:
    """Every wanted name in `sd` (values: anything with a .shape) at its shape, and nothing else."""
    missing = [k for k in wanted if k not in sd]
    extra = [k for k in sd if k not in wanted and k != "lm_head.weight"]
    if missing:
        raise ConfigError(f"{where}: {len(missing)} tensors missing, e.g. {', '.join(missing[:3])}")
    if extra:
        raise ConfigError(f"{where}: {len(extra)} unexpected tensors, e.g. {', '.join(extra[:3])}")
    for k, shape in wanted.items():
        if tuple(sd[k].shape) != tuple(shape):
            raise ConfigError(f"{where}: tensor {k} has shape {tuple(sd[k].shape)}, the config says {tuple(shape)}")


def load_model(cfg: ModelConfig, load_format: str, model_dir: Path | None, device, dtype: str | torch.dtype,
               seed: int = 0) -> Qwen3ForCausalLM:
    """Build on meta, fill with dummy or safetensors weights on `device` in `dtype`, tie."""
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    if load_format == "dummy":
        sd = dummy_state(cfg, seed, dt, device)
    elif load_format == "safetensors":
        if model_dir is None:
            raise ConfigError("--load-format safetensors needs --model DIR (a directory with config.json "
                              "and *.safetensors), not a preset name")
        sd = read_safetensors(model_dir, device)
        check_state(model, sd, f"--model {model_dir}")
        sd = {k: v.to(dt) for k, v in sd.items()}
    else:
        raise ConfigError(f"--load-format must be dummy or safetensors, not {load_format!r}")
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True, assign=True)
    model.tie()
    return model.eval().requires_grad_(False)


def save_pretrained(model: Qwen3ForCausalLM, cfg: ModelConfig, out_dir, max_shard_bytes: int | None = None) -> Path:
    """config.json + model.safetensors (or shards with an index when max_shard_bytes is given)."""
    from safetensors.torch import save_file
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    d = cfg.to_hf_dict()
    d["torch_dtype"] = str(next(iter(sd.values())).dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(d, indent=2))
    if max_shard_bytes is None:
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if cur and size + n > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k], size = v, size + n
    shards.append(cur)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    return out
