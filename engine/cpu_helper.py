"""A prompt cut's work on two cores: one helper thread beside the thread that runs the cut.

tfengine's CPU default gives torch every core but one (engine.cpu_kernels.cpu_threads), the spare
core kept for the HTTP thread, which idles while a prompt fills. During a prompt cut the helper
takes half of each product's output columns (`HelpedLinears`) and half of each attention tile's
KV heads (engine.cpu_attention). Neither changes a bit: a column's dot products and a head's
attention are the same arithmetic whichever thread runs them and whatever the other half holds
(tests/test_cpu_attention.py compares a cut's logits with and without the helper, bf16 and
fp32). Unlike a second OpenMP thread, a helper that a busy machine leaves waiting costs the time
of its half, never a spinning barrier (OpenMP's two threads made a round 9x slower on this box
when another process held a core: engine/dev/PERF.md).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

MIN_ROWS = 64  # cuts shorter than this run on one thread: too little work to hand over
_pool: list[ThreadPoolExecutor] = []  # made on first use


def _start(threads: int) -> None:
    """The helper thread's own settings: torch's thread count for its OpenMP team (not the
    machine's), and no autograd (grad mode is per thread; the caller runs in inference mode)."""
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)


def helper_pool() -> ThreadPoolExecutor:
    if not _pool:
        _pool.append(ThreadPoolExecutor(1, thread_name_prefix="prompt-helper", initializer=_start,
                                        initargs=(torch.get_num_threads(),)))
    return _pool[0]


def helper() -> ThreadPoolExecutor | None:
    """The helper, when this process may run on more cores than torch's compute threads."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return helper_pool() if cores > torch.get_num_threads() else None


class HelpedLinears:
    """engine.cpu_kernels.PackedLinears for a prompt cut's rows, each product split by output
    columns: the first half on the calling thread, the second on the helper. Both halves go
    through `F.linear` on views of the plain matrix (oneDNN's bf16 kernel or MKL's sgemm: the same
    bits as the whole prepacked product, measured on this box's AMD EPYC and pinned by a test;
    no second copy of the weights). Where the whole product would take another kernel (float32 at
    the decode round's row tile, MKL's packed sgemm) or the cut is short, `packed` does it."""

    def __init__(self, packed, pool: ThreadPoolExecutor):
        self.packed, self.pool = packed, pool

    def heads(self, i: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return self.packed.heads(i, qkv, cos, sin)

    def mm(self, x: torch.Tensor, key) -> torch.Tensor:
        rows = x.shape[0]
        if rows < MIN_ROWS or (self.packed.mkl and rows == self.packed.rows):
            return self.packed.mm(x, key)
        w = self.packed.plain[key]
        half = w.shape[0] // 2
        job = self.pool.submit(F.linear, x, w[half:])
        return torch.cat([F.linear(x, w[:half]), job.result()], -1)
