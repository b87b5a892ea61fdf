"""One runner's CUDA kernels: the state that is legitimately per runner, and the launches bound to a mode.

CudaKernels holds what a runner settles at start-up or learns while it runs: the skinny tables of
its device (engine/cuda/skinny.py tables_for), the cuBLAS row counts its start-up check adopted for
prompt cuts (engine/cuda/batch.py Buckets), the TMA ring's state (engine/cuda/ring.py Ring: off once
it failed), the cut attention's SDPA backend (engine/cuda/prefill.py CutBackend) or its tiles at absolute
positions (engine/cuda/cut_flash.py, KernelConfig.cut_tiles) and a dev probe's
clock buffer (engine/cuda/clock.py). `at(mode)` gives the forward's launches under one LaunchMode
(engine/cuda/launch.py): eager calls take PLAIN, each decode-graph capture its own mode.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cuda import batch, cut_flash, decode_attention as da, fused, prefill, skinny
from engine.cuda.launch import PLAIN, LaunchMode
from engine.cuda.ring import Ring


class CudaKernels:
    """A runner's kernel state (module doc). `skinny`: the tables its decode products use (default:
    the device's); `batch`: set once at start-up from adopt_buckets; `clock`: [layers, programs,
    SLOTS] int64, set by a profiling probe before it captures (None: the kernels compile without);
    `tiles`: the cut_flash config every prompt cut's attention runs through (None: prefill.py's halves)."""

    def __init__(self, device: torch.device, tables: skinny.SkinnyTables | None = None,
                 tiles: cut_flash.CutFlashConfig | None = None):
        self.device = torch.device(device)
        self.skinny = tables or skinny.tables_for(self.device)
        self.batch = batch.NO_BUCKETS
        self.ring = Ring()
        self.cuts = prefill.CutBackend()
        self.cut_flash = tiles
        self.clock: torch.Tensor | None = None

    def at(self, mode: LaunchMode = PLAIN) -> "Launch":
        return Launch(self, mode)

    def matmul(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The row-invariant product of prompt cuts filled together (engine/cuda/batch.py)."""
        return batch.matmul(x, w, self.batch)


@dataclass(frozen=True)
class Launch:
    """The forward's kernels under one launch mode, with the runner's tables and state."""

    kernels: CudaKernels
    mode: LaunchMode = PLAIN

    def linear(self, x, w, out=None):
        return skinny.linear(x, w, out, mode=self.mode, tables=self.kernels.skinny, ring=self.kernels.ring)

    def gate_up_silu(self, x, w):
        return skinny.gate_up_silu(x, w, mode=self.mode, tables=self.kernels.skinny, ring=self.kernels.ring)

    def add_rmsnorm(self, x, r, w, eps):
        return fused.add_rmsnorm(x, r, w, eps, self.mode)

    def embed_rmsnorm(self, table, ids, w, eps):
        return fused.embed_rmsnorm(table, ids, w, eps, self.mode)

    def qk_norm_rope_write(self, *args):
        return fused.qk_norm_rope_write(*args, mode=self.mode)

    def silu_mul(self, gu, out=None):
        return fused.silu_mul(gu, self.mode, out)

    def argmax_rows(self, logits, out=None):
        return fused.argmax_rows(logits, out, self.mode)

    def attention(self, kv, i: int, q, lanes, positions, qk: tuple | None = None):
        """The decode attention (engine/cuda/decode_attention.py) with the mode's folds and PDL."""
        clock = self.kernels.clock
        return da.decode_attention(kv, i, q, lanes, positions, qk=qk, mode=self.mode,
                                  clock=None if clock is None else clock[i])

    def cut_attention(self, q, k, v, start: int):
        if self.kernels.cut_flash is not None:
            return cut_flash.cut_attention(q, k, v, start, self.kernels.cut_flash)
        return prefill.cut_attention(q, k, v, start, self.kernels.cuts)

    qk_fold_takes = staticmethod(da.qk_fold_takes)
