"""The decode round's small sums across two GPUs through PyTorch's symmetric memory: a one-shot
all-reduce, one kernel that copies this rank's partial sum into a buffer every rank can read over
NVLink, waits for the peer at a flag in that memory, and adds the two in rank order
(torch.ops.symm_mem.one_shot_all_reduce_*; no multicast: it loads from the peer's buffer).

Exactness: at two ranks each element is p0 + p1, one rounding to the tensor's dtype (bf16 or
fp32), which is NCCL's sum too, and a + b == b + a: the same bits as NCCL's all_reduce on every
rank, whichever of the two a tensor goes through. So the choice by size (this for tensors up to
the buffer, NCCL for a prompt cut's megabytes) never moves a row's bits.

Everything here is set up once, before the decode graph is captured; a rank that cannot set it up
tells the other (a MIN over a one-element NCCL all_reduce) and both keep NCCL.
"""
from __future__ import annotations

import logging
import warnings

import torch

log = logging.getLogger("engine.tp")

# Up to this many bytes a tensor goes through the one-shot kernel: a decode round at --parallel 64
# of qwen3-32b is 64 x 5,120 x 2 B = 640 KiB; a prompt cut's sums (MBs) stay with NCCL's ring.
SYMM_MAX_BYTES = 1 << 20
DTYPES = (torch.bfloat16, torch.float32)


class SymmReduce:
    """The one-shot sum of a rank's tensor and its peer's, into a new tensor."""

    def __init__(self, group, device: torch.device, dtype: torch.dtype, max_bytes: int = SYMM_MAX_BYTES):
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.group = group or dist.group.WORLD
        self.name = self.group.group_name
        self.dtype = dtype
        enable_group(self.name)
        self.buf = symm_mem.empty(max_bytes // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buf, self.name)
        ops = torch.ops.symm_mem
        # the copy into the shared buffer inside the kernel where the torch has it (one launch)
        self._copy_out = getattr(ops, "one_shot_all_reduce_copy_out", None)
        self._out = ops.one_shot_all_reduce_out

    def fits(self, y: torch.Tensor) -> bool:
        n = y.numel() * y.element_size()
        return y.dtype == self.dtype and y.is_contiguous() and 0 < y.numel() <= self.buf.numel() and n % 16 == 0

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        flat, out = y.view(-1), torch.empty_like(y)
        shared = self.buf[:flat.numel()]
        if self._copy_out is not None:
            self._copy_out(shared, flat, "sum", self.name, out.view(-1))
        else:
            shared.copy_(flat)
            self._out(shared, "sum", self.name, out.view(-1))
        return out


def enable_group(name: str) -> None:
    """Symmetric memory for the group (needed by older torch; 2.11 warns it is not)."""
    import torch.distributed._symmetric_memory as symm_mem
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(name)


def made_everywhere(make, group, device: torch.device, what: str, then: str):
    """make() where every rank could make it; else None on every rank (a MIN over a one-element
    all_reduce) and a warning: `what` not set up, `then`. Collective: every rank calls it at the
    same point."""
    import torch.distributed as dist
    made, why = None, ""
    try:
        made = make()
    except Exception as exc:  # an old torch, no peer access, a smaller signal pad
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    ok = torch.tensor([1 if made is not None else 0], dtype=torch.int32, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    if not int(ok.item()):
        log.warning("tensor parallel: %s not set up (%s): %s", what, why or "on another rank", then)
        return None
    return made


def symm_reduce(group, device: torch.device, dtype: torch.dtype, world: int) -> SymmReduce | None:
    """A SymmReduce where every rank could make one (CUDA, two ranks, bf16/fp32); else None, and
    every rank keeps NCCL. Collective: every rank calls it at the same point."""
    if device.type != "cuda" or world != 2 or dtype not in DTYPES:
        return None
    return made_everywhere(lambda: SymmReduce(group, device, dtype), group, device,
                           "symmetric-memory all-reduce", "NCCL sums every tensor")
