"""One runner's CPU kernels: what it chose at start-up, in one place, as engine/cuda/kernels.py's CudaKernels.

CpuKernels holds the ISA torch runs at (engine/cpu/isa.py), whether the matrices hold bf16 values
(engine/cpu/wide.py), the matmuls on prepacked weights (engine/cpu/packed.py PackedLinears), the C
decode attention or the batched matmuls (engine/cpu/decode_attention.py), the C++ round
(engine/cpu/round.py), what the start-up checks found row-invariant (short cuts filled together,
mixed forwards' shared products) and the cut attention's scratch masks. Every choice is made once,
before the first forward, and kept: switching mid-serve would move bits.
"""
from __future__ import annotations

import logging

import torch

from engine.config import EngineConfig
from engine.cpu import isa
from engine.cpu.cut_attention import FutureMasks, cut_attention_cpu, tile_for
from engine.cpu.decode_attention import BMM, C_KERNEL, AttentionKernel, kernel as c_attention
from engine.cpu.packed import (ROW_TILE, BucketPlan, PackedLinears, decode_attention_buckets, invariant_floor,
                               rows_invariant)
from engine.cpu.round import CppRound
from engine.cpu.wide import WideKernel, round_weights, wide_wanted

log = logging.getLogger("engine.cpu.kernels")


class CpuKernels:
    """A CPU runner's kernel state (module doc). `packed`: the packed matmuls, None with
    KernelConfig(cpu_fast=False) (plain torch ops, one SDPA a row); `attention`: the C decode
    attention, None for the batched matmuls; `round`: the C++ decode round (None: the Python one);
    `rows_free`: bf16 prompt products found row-invariant (short cuts share a forward); `mix_floor`:
    the fewest rows from which a product is row-invariant (mixed forwards; None: per part)."""

    def __init__(self, model, cfg: EngineConfig, own_round: bool = True):
        """`model`: fused, on the CPU; its matrices are rounded to bf16 values here where the wide
        kernel is wanted. own_round: this runner's decode round is the model's own (a tensor-parallel
        rank's sums across ranks in Python: no C++ round, no shared prompt products)."""
        knobs = cfg.kernels
        self.isa = isa.capability()
        # float32 compute over bf16-valued matrices where the CPU has no bf16 arithmetic (engine/cpu/wide.py)
        self.wide_weights = wide_wanted(cfg.device, cfg.dtype, knobs.cpu_wide)
        if self.wide_weights:  # (idempotent: a reused or tensor-parallel rank's model too)
            round_weights(model)
        self.tile = tile_for(cfg.prefill_rows)  # the cut attention's query tile
        self.masks = FutureMasks()
        self.packed: PackedLinears | None = None
        self.attention: AttentionKernel | None = None
        self.round: CppRound | None = None
        self.rows_free = False
        self.mix_floor: int | None = None
        self.round_rows = cfg.parallel  # the padded shape: the most rows a decode round has
        if not knobs.cpu_fast:
            return
        c = c_attention(knobs.toolchain)  # before the first forward; never switched mid-serve (it would move bits)
        self.packed = PackedLinears(model, WideKernel(c.lib) if c is not None and self.wide_weights else None)
        log.info("CPU matmuls: %s", self.packed.kind)
        # whole ROW_TILE tiles, so a row's bits do not depend on --parallel (PackedLinears.mm_tiled)
        self.round_rows = -(-cfg.parallel // ROW_TILE) * ROW_TILE
        self.attention = c if c is not None and c.takes(*self.packed.shape) else None
        log.info("decode attention: %s", C_KERNEL if self.attention else BMM)
        if not own_round:
            return
        mcfg = model.config
        self.round = CppRound.started(model, self.packed, knobs.cpu_cpp, self.attention.address if self.attention else 0,
                                      c.elem((mcfg.hidden_size, mcfg.head_dim)) if c else (0, 0, 0, 0),
                                      knobs.toolchain)
        # short cuts together, tiles without zero rows: where a row's bits are its own (one rank)
        self.rows_free = knobs.batch_cuts and rows_invariant(self.packed, self.tile)
        log.info("CPU prompt cuts: %s", "together" if self.rows_free else "one at a time")
        if cfg.prefill_mode == "mixed" and self.round is not None:
            self.mix_floor = invariant_floor(self.packed, self.tile)
            log.info("mixed forwards: %s", "one product over every row" if self.mix_floor is not None
                     else "each product per part (cuts on the grid)")

    def cut_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, pad: bool) -> torch.Tensor:
        """A prompt cut's attention in this runner's tiles (engine/cpu/cut_attention.py)."""
        return cut_attention_cpu(q, k, v, start, self.tile, pad, self.masks)

    def round_attention(self, kv, lanes: torch.Tensor, positions: torch.Tensor, rows: list[tuple[int, int]], spare: int,
                        max_len: int):
        """A decode round's attention attend(layer, q [rows, H, d]) -> [rows, H*d]: the C kernel (the
        same compiled function the C++ round calls), else the batched matmuls by span."""
        c = self.attention
        if c is not None:
            lanes_c, positions_c = lanes.contiguous(), positions.contiguous()
            return lambda i, q: c(kv.k[i], kv.v[i], q, lanes_c, positions_c, spare)
        plan = BucketPlan(rows, spare, max_len, lanes.device)
        return lambda i, q: decode_attention_buckets(kv, i, q, plan)

    def describe_attention(self) -> str:
        """/v1/engine's `decode_attention`."""
        return "sdpa a row" if self.packed is None else C_KERNEL if self.attention else BMM
