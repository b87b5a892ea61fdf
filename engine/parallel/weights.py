"""One tensor-parallel rank's weights: its slice of every matrix (engine/parallel/group.py says the split).

Each tensor is made or read whole-shaped by name and only the rank's slice is kept, one tensor at
a time (peak memory: the shard plus one full tensor):
- dummy: engine.models.weights.dummy_tensor, the same full tensors as a one-GPU engine, so logits at
  N = 2 can be compared with N = 1;
- safetensors: safe_open's slices read only the rank's rows or columns from disk; names and full
  shapes are checked against the model as engine.models.weights.check_state does.
"""
from __future__ import annotations

from pathlib import Path

import torch

from engine.config import ConfigError, ModelConfig
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.parallel.group import local_config, vocab_shard
from engine.models.weights import DTYPES, _index_files, _wanted, check_shapes, dummy_tensor

COLUMN = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")
ROW = ("o_proj.weight", "down_proj.weight")


def shard_slice(name: str, shape: tuple, rank: int, world: int) -> tuple[int, int, int] | None:
    """(dim, start, end) of the rank's part of tensor `name` of full `shape`; None: replicated.
    The lm_head's vocabulary rows go ceil(V / world) a rank (the last rank's end clipped)."""
    if name.endswith(COLUMN):
        n = shape[0] // world
        return 0, rank * n, (rank + 1) * n
    if name.endswith(ROW):
        n = shape[1] // world
        return 1, rank * n, (rank + 1) * n
    if name == "lm_head.weight":
        n = vocab_shard(shape[0], world)
        return 0, min(rank * n, shape[0]), min((rank + 1) * n, shape[0])
    return None


def _pad_vocab(t: torch.Tensor, rows: int) -> torch.Tensor:
    """The lm_head shard padded to `rows` with zero rows (their logits are cut off after the gather)."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], t.shape[1])])


def _take(t, where: tuple[int, int, int] | None):
    if where is None:
        return t[:]
    dim, a, b = where
    return t[a:b] if dim == 0 else t[:, a:b]


def load_shard(mcfg: ModelConfig, load_format: str, model_dir: Path | None, device, dtype, seed: int,
               rank: int, world: int) -> Qwen3ForCausalLM:
    """The rank's model: built with local_config (its heads, its part of the MLP), every tensor
    its slice, the lm_head its vocabulary rows padded to vocab_shard."""
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    device = torch.device(device)
    with torch.device("meta"):
        full = _wanted(Qwen3ForCausalLM(mcfg))
        model = Qwen3ForCausalLM(local_config(mcfg, world))
        model.lm_head = torch.nn.Linear(mcfg.hidden_size, vocab_shard(mcfg.vocab_size, world), bias=False)
    if load_format == "dummy":
        sd = {k: _take(dummy_tensor(k, shape, seed, dt, device), shard_slice(k, tuple(shape), rank, world)).clone()
              for k, shape in full.items()}
    elif load_format == "safetensors":
        if model_dir is None:
            raise ConfigError("--load-format safetensors needs --model DIR (a directory with config.json "
                              "and *.safetensors), not a preset name")
        sd = _read_shards(Path(model_dir), full, device, dt, rank, world)
    else:
        raise ConfigError(f"--load-format must be dummy or safetensors, not {load_format!r}")
    head = sd.get("lm_head.weight")
    if head is None:  # tied: the lm_head is the embedding's rows
        emb = sd["model.embed_tokens.weight"]
        head = _take(emb, shard_slice("lm_head.weight", tuple(emb.shape), rank, world))
    sd["lm_head.weight"] = _pad_vocab(head, vocab_shard(mcfg.vocab_size, world)).contiguous()
    model.load_state_dict(sd, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def _read_shards(model_dir: Path, full: dict, device, dt: torch.dtype, rank: int, world: int) -> dict:
    """The rank's slices of a safetensors directory: the full shapes checked first, then only the
    slices read."""
    from safetensors import SafetensorError, safe_open
    index = model_dir / "model.safetensors.index.json"
    files = _index_files(model_dir, index) if index.is_file() else sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--model {model_dir}: no *.safetensors files (try --load-format dummy)")
    for f in files:
        if not f.is_file():
            raise ConfigError(f"--model {model_dir}: missing shard {f.name}")

    def each(read: bool):
        for f in files:
            try:
                with safe_open(str(f), framework="pt", device="cpu") as st:
                    for k in st.keys():
                        sl = st.get_slice(k)
                        shape = tuple(sl.get_shape())
                        yield k, shape, (_take(sl, shard_slice(k, shape, rank, world)) if read else None)
            except (SafetensorError, OSError) as e:
                raise ConfigError(f"--model {model_dir}: cannot read {f.name} ({e})") from None

    check_shapes(full, {k: torch.empty(shape, device="meta") for k, shape, _ in each(False)}, f"--model {model_dir}")
    return {k: t.to(device=device, dtype=dt) for k, _, t in each(True)}
