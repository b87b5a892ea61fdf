"""Tensor parallel: the process group, the two collectives the model needs, and the shard shapes.

Megatron's split over N ranks of one host: q/k/v and gate/up are column-parallel (each rank holds
H/N query heads, KVH/N key-value heads, I/N of the MLP), o and down are row-parallel (each rank's
product is a partial sum of the full one), so one sum across ranks follows each of them
(`reduce`); the lm_head is split by vocabulary and the logits are gathered whole (`gather_vocab`),
so the sampler and the argmax run unchanged, on the same bits, on every rank.

Exactness within a TP size. A row's bits must not depend on how many rows go through a collective
(stepped = whole, alone = beside others), and every rank must hold the same bits after it:
- N = 2: one all_reduce. Each element is a + b, one rounding, and a + b == b + a: exact and the
  same on both ranks whatever algorithm or chunking NCCL or gloo pick.
- N > 2: an all_reduce's order of additions per element depends on the ring's chunking, which
  depends on the tensor's size, so a row could change with its neighbours. Instead all_gather the
  partial sums and add them in rank order, elementwise: ((p0 + p1) + p2) + ...; the same order
  for every element, on every rank. It moves N-1 times the bytes of the ring's reduce-scatter.
NVLink SHARP (NVLS) reduces inside the switch, in its own order and precision: it is turned off
(NCCL_NVLS_ENABLE=0) before the communicator exists, and so is symmetric memory's multicast
(TORCH_SYMM_MEM_DISABLE_MULTICAST=1): the one-shot sum (engine/parallel/symm.py) loads from the peer.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import timedelta

import torch

from engine.config import ConfigError, ModelConfig

# A collective that waits longer than this raises (gloo) or is aborted by the watchdog (NCCL): the
# last resort behind the watchers in engine/parallel/launch.py, which end the server within seconds.
COLLECTIVE_TIMEOUT_S = 300.0


def check_tensor_parallel(mcfg: ModelConfig, n: int, device: str) -> None:
    """A ConfigError naming the flag when the model cannot be split over `n` ranks."""
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"--tensor-parallel must be a whole number >= 1, not {n!r}")
    if n == 1:
        return
    if mcfg.num_key_value_heads % n or mcfg.num_attention_heads % n:
        raise ConfigError(f"--tensor-parallel {n} must divide the model's {mcfg.num_key_value_heads} key-value heads "
                          f"and {mcfg.num_attention_heads} query heads")
    if mcfg.intermediate_size % n:
        raise ConfigError(f"--tensor-parallel {n} must divide the model's intermediate size {mcfg.intermediate_size}")
    if device.startswith("cuda"):
        if ":" in device:
            raise ConfigError(f"--tensor-parallel {n} uses cuda:0..cuda:{n - 1}: give --device cuda, not {device}")
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < n:
            raise ConfigError(f"--tensor-parallel {n} needs {n} CUDA devices; torch sees {have}")


def local_config(mcfg: ModelConfig, n: int) -> ModelConfig:
    """The shape one rank's model is built with: its heads and its part of the MLP. The vocabulary
    stays whole (the embedding is replicated); the lm_head shard is set apart (vocab_shard)."""
    return replace(mcfg, num_attention_heads=mcfg.num_attention_heads // n,
                   num_key_value_heads=mcfg.num_key_value_heads // n,
                   intermediate_size=mcfg.intermediate_size // n, tie_word_embeddings=False)


def vocab_shard(vocab: int, n: int) -> int:
    """Rows of the lm_head each rank holds: ceil(vocab / n); the last rank's are padded with zeros."""
    return -(-vocab // n)


@dataclass
class TensorParallel:
    """One rank's place in the group and its collectives. At world 1 both are the identity unless
    `collectives` is set (a one-rank check that the collectives capture into a CUDA graph)."""

    rank: int
    world: int
    vocab: int
    group: object = None  # the torch.distributed process group (None: the default one)
    collectives: bool = False
    # CUDA, two ranks: the one-shot symmetric-memory sum for small tensors (engine/parallel/symm.py),
    # the same bits as NCCL's; None: NCCL sums every tensor
    symm: object = None
    # CUDA, two ranks: the small sums fused into the add + RMSNorm after them, the product written
    # straight into symmetric memory (engine/tp_fused.FusedSums; the same bits); None: not fused
    fused: object = None
    skip_sums: bool = False  # timing only (tools/tp_check.py): the o/down sums left out, wrong logits

    @property
    def active(self) -> bool:
        return self.world > 1 or self.collectives

    def reduce(self, y: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial product `y`, the same bits on every rank."""
        if not self.active:
            return y
        import torch.distributed as dist
        if self.skip_sums:
            return y
        if self.world <= 2:
            if self.symm is not None and self.symm.fits(y):
                return self.symm(y)
            dist.all_reduce(y, group=self.group)
            return y
        parts = torch.empty((self.world, *y.shape), dtype=y.dtype, device=y.device)
        _all_gather(parts.view(self.world * y.shape[0], *y.shape[1:]), y.contiguous(), self.group)
        out = parts[0] + parts[1]
        for r in range(2, self.world):
            out += parts[r]
        return out

    def fused_write(self, mm, a: torch.Tensor, w: torch.Tensor) -> bool:
        """This rank's partial product mm(a, w) into the fused sum's buffer (then `fused_add_norm`);
        False: not fused here (none set up, timing-only skip, a product it does not take)."""
        return self.fused is not None and not self.skip_sums and self.fused.write(mm, a, w)

    def fused_add_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float, mode=None):
        """After fused_write: add_rmsnorm(x, the sum over ranks, w, eps) in one kernel, launched per
        `mode` (engine/cuda/launch.py LaunchMode; None: plain)."""
        return self.fused.add_norm(x, w, eps) if mode is None else self.fused.add_norm(x, w, eps, mode)

    def symm_agrees(self, y: torch.Tensor) -> bool:
        """Whether the symmetric-memory sum of `y` has NCCL's bits (a check on the device)."""
        import torch.distributed as dist
        ref = y.clone()
        dist.all_reduce(ref, group=self.group)
        return self.symm is not None and self.symm.fits(y) and torch.equal(self.symm(y.clone()), ref)

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Each rank's logits over its vocabulary shard -> the full logits [..., vocab] on every rank."""
        if not self.active:
            return logits
        flat = logits.reshape(-1, logits.shape[-1]).contiguous()
        parts = torch.empty((self.world * flat.shape[0], flat.shape[1]), dtype=flat.dtype, device=flat.device)
        _all_gather(parts, flat, self.group)
        full = parts.view(self.world, flat.shape[0], flat.shape[1]).permute(1, 0, 2).reshape(flat.shape[0], -1)
        return full[:, :self.vocab].reshape(*logits.shape[:-1], self.vocab)


def _all_gather(out: torch.Tensor, x: torch.Tensor, group) -> None:
    """Rank r's `x` into rows [r * len(x), (r + 1) * len(x)) of `out` (all_gather_single where the
    torch has it; it replaced all_gather_into_tensor)."""
    import torch.distributed as dist
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, x, group=group)


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def join(device: str, rank: int, world: int, store) -> None:
    """Join the group through rank 0's TCPStore. NCCL: NVLS off (set before the communicator
    exists), and a collective's failure surfaces as an error rather than a hang."""
    import torch.distributed as dist
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    kw = {"device_id": torch.device(device)} if device.startswith("cuda") else {}
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S), **kw)


def tcp_store(world: int, port: int = 0):
    """Rank 0's TCPStore on 127.0.0.1 (port 0: one the system picks; workers are told it), or,
    given the port, a worker's client of it."""
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", port, world, port == 0, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                         wait_for_workers=False)
