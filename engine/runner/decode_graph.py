"""The decode round as CUDA graphs, captured for a CudaRunner at each of its row counts.

- Row counts (`buckets`): the padded shape (--parallel), and below it 1, 2, 4, ... rows where every
  product takes the same kernel and tiles as at the padded shape (engine/cuda/skinny.py route), so a
  row's bits are the same whichever graph computes it. Row r always carries lane r: a round runs at
  the fewest rows holding its highest lane (vLLM captures several batch sizes likewise).
- Each row count's host-fed graph: its first node copies the round's rows (tokens, positions,
  lanes, steps) from pinned memory, then the forward and the argmax; `fresh` writes the rows and
  replays it.
- Where rounds run ahead (`overlaps`, engine/runner/ahead.py), two copies of each row count's chained
  graph: the round after the last, its inputs advanced on the device from the last round's ids.
- Each row count is captured with the launch mode its KernelConfig gives it (DecodeGraphs.mode_at:
  PDL, the attention's folds, the TMA ring, the L2 prefetch at few rows), passed down the forward;
  a failed capture leaves eager rounds and says why.

DecodeGraphs owns all of it; the runner holds one and reads it through its public names. What it
reads of the runner is public too: cfg, device, model, fused, skinny, kernels, spare, round_rows,
max_model_len, round_logits.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.cpu.packed import ROW_TILE
from engine.runner.ahead import Ahead, advance_inputs, steps

log = logging.getLogger("engine.runner.model_runner")


@dataclass
class Bucket:
    """One row count's graphs and static buffers: inputs [4, rows] (tokens, positions, lanes, steps)
    pinned on the host and on the device, the logits and ids the graphs write."""
    rows: int
    h_in: torch.Tensor
    s_in: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None
    s_logits: torch.Tensor | None = None
    s_out: torch.Tensor | None = None
    chains: list = field(default_factory=list)  # the chained graphs' replays, taken in turn
    turn: int = 0
    h_np: np.ndarray | None = None  # h_in's memory: rows written straight in, no tensor from lists

    def __post_init__(self):
        self.h_np = self.h_in.numpy()


def buckets(r) -> tuple[int, ...]:
    """The row counts r's decode rounds run at, ascending, the padded shape last. CUDA: those below it
    whose products all route as the padded shape's (KernelConfig.row_buckets None or True). CPU (only
    with row_buckets=True): whole tiles of engine/cpu/packed.py ROW_TILE rows, which is what a CPU
    product multiplies at any row count."""
    full, on = r.round_rows, r.cfg.kernels.row_buckets
    if on is False or r.cfg.tensor_parallel != 1:
        return (full,)
    if r.device.type != "cuda":
        return tuple(n for n in _doublings(ROW_TILE, full) if on) + (full,)
    if not r.skinny:
        return (full,)
    # imported here: the CPU runner never loads triton
    from engine.cuda.skinny import route
    tables, ring = r.kernels.skinny, r.cfg.kernels.ring and r.kernels.ring.available()
    layer = r.model.model.layers[0]
    a, m = layer.self_attn, layer.mlp
    shapes = [(*a.wqkv.shape, False), (*a.o_proj.weight.shape, False), (*m.w_gate_up.shape, True),
              (*m.down_proj.weight.shape, False), (*r.model.lm_head.weight.shape, False)]

    def routes(rows):
        return [route(n, k, rows, tables, gated, ring) for n, k, gated in shapes]
    return tuple(n for n in _doublings(1, full) if routes(n) == routes(full)) + (full,)


def _doublings(first: int, below: int) -> list[int]:
    out, n = [], first
    while n < below:
        out.append(n)
        n *= 2
    return out


def folds(r) -> tuple[bool, bool]:
    """The decode graph's folds (engine/cuda/decode_attention.py): the attention's combine, and its q/k norm +
    RoPE + K/V write. At one rank only (checked on the device there). The q/k fold writes a row's
    K/V in the kernel that attends, so not with a drafter: its rows of one lane read the rows
    before them, written in the same round."""
    from engine.cuda.decode_attention import qk_fold_takes  # (CUDA only: no triton on the CPU runner)
    knobs, a = r.cfg.kernels, r.model.model.layers[0].self_attn
    solo = r.fused and r.cfg.tensor_parallel == 1
    qk = (solo and knobs.fold_qk_norm and not (r.cfg.drafter and r.cfg.drafts)
          and qk_fold_takes(a.n_heads, a.n_kv, a.head_dim))
    return solo and knobs.fold_combine, bool(qk)


def overlaps(r) -> bool:
    """Whether rounds run ahead (KernelConfig.overlap): by default with the decode graph at one rank."""
    on = r.cfg.kernels.overlap
    return bool(on) if on is not None else r.device.type == "cuda" and r.cfg.tensor_parallel == 1


class DecodeGraphs:
    """A runner's decode graphs (module doc): set up by `capture`, then `fresh` / `chain` launch them.
    fold_combine / qk_fold / pdl: what the capture chose (the q/k fold decides which rounds may
    replay: CudaRunner._graph_takes; pdl is /v1/engine's decode_pdl)."""

    def __init__(self, runner, stream: torch.cuda.Stream | None = None):
        """`stream`: capture there (a green context's stream confines the graphs to its SMs:
        engine/cuda/partitions.py), without the chained rounds; None: the whole device."""
        self.runner, self.stream = runner, stream
        self.rounds: dict[int, Bucket] = {}
        self.rows: tuple[int, ...] = (runner.round_rows,)
        self.fold_combine = self.qk_fold = False
        self.pdl = 0
        self.ahead: Ahead | None = None
        self.fallback_reason: str | None = None

    @property
    def full(self) -> Bucket | None:
        """The padded shape's graphs and buffers (the dev probes use them)."""
        return self.rounds.get(self.runner.round_rows)

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        full = self.full
        return None if full is None else full.graph

    def mode_at(self, n: int):
        """The launch mode of n rows' graphs: the capture's PDL and folds, the ring where the skinny
        products run, and the L2 prefetch at few rows (KernelConfig.prefetch_rows)."""
        from engine.cuda.launch import LaunchMode  # (CUDA only: no triton on the CPU runner)
        r, knobs = self.runner, self.runner.cfg.kernels
        return LaunchMode(pdl=self.pdl, fold_combine=self.fold_combine, fold_qk_norm=self.qk_fold,
                          ring=r.skinny and knobs.ring, prefetch=n <= knobs.prefetch_rows)

    def capture(self) -> bool:
        """The graphs at every row count; False, with `fallback_reason`, on the CPU or where capture fails."""
        r = self.runner
        if r.device.type != "cuda":
            self.fallback_reason = f"no CUDA graphs on device {r.device.type}: eager decode rounds"
            log.info(self.fallback_reason)
            return False
        try:
            self.fold_combine, self.qk_fold = folds(r)
            cap = torch.cuda.get_device_capability(r.device)
            self.pdl = r.cfg.kernels.pdl_for(r.cfg.tensor_parallel, cap) * r.fused
            rows = buckets(r)
            chained = overlaps(r) and self.stream is None
            with torch.inference_mode():
                self.rounds = {n: self.capture_at(n, chained) for n in reversed(rows)}  # the padded shape's first
            torch.cuda.synchronize()
            self.rows = rows
            self.ahead = (Ahead(self.fresh, self.chain, r.spare, r.max_model_len, r.round_rows, r.device)
                          if chained else None)
            self.fallback_reason = None
            return True
        except Exception as e:  # pragma: no cover - depends on the device
            self.rounds, self.rows, self.ahead = {}, (r.round_rows,), None
            self.fallback_reason = f"CUDA graph capture failed ({e!r}): eager decode rounds"
            log.warning(self.fallback_reason)
            return False

    def capture_at(self, n: int, chained: bool) -> Bucket:
        """n rows' graphs, launched in mode_at(n)."""
        r, mode = self.runner, self.mode_at(n)
        b = Bucket(n, torch.zeros(4, n, dtype=torch.long).pin_memory(),
                   torch.zeros(4, n, dtype=torch.long, device=r.device))
        b.s_in[2] = b.h_in[2] = r.spare  # warm-up (and a replay before any round) write the spare lane
        s = self.stream or torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):  # (compiles, and allocates the kernels' scratch outside the capture)
                self.argmax(r.round_logits(b.s_in, mode), mode)
        torch.cuda.current_stream().wait_stream(s)
        b.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(b.graph, stream=self.stream):  # the H2D copy inside: one launch a round, not two
            b.s_in.copy_(b.h_in, non_blocking=True)
            b.s_logits = r.round_logits(b.s_in, mode)
            b.s_out = self.argmax(b.s_logits, mode)
        if chained:  # the round after the last, from its ids on the device; two copies taken in turn
            for _ in range(2):
                c = torch.cuda.CUDAGraph()
                with torch.cuda.graph(c):
                    advance_inputs(b.s_in, b.s_out)
                    self.argmax(r.round_logits(b.s_in, mode), mode, b.s_out)
                b.chains.append(c.replay)
        return b

    def argmax(self, logits: torch.Tensor, mode, out: torch.Tensor | None = None) -> torch.Tensor:
        """The round's greedy ids: engine/cuda/fused.py argmax_rows in the fused forward (torch.argmax's
        ids, in chunks side by side), else torch.argmax."""
        if self.runner.fused:
            return self.runner.kernels.at(mode).argmax_rows(logits, out)
        return logits.argmax(-1) if out is None else torch.argmax(logits, -1, out=out)

    def fresh(self, rows) -> torch.Tensor:
        """Launch the host-fed graph of rows' count on `rows` [tokens, positions, lanes]: written into its
        pinned inputs (with the steps row), which its first node copies in. Returns where its ids go."""
        b = self.rounds[len(rows[0])]
        b.h_np[:3] = rows
        b.h_np[3] = steps(rows[2], self.runner.spare)
        b.graph.replay()
        return b.s_out

    def chain(self, n: int) -> torch.Tensor:
        """Launch n rows' chained graph (the round after that count's last); returns where its ids go."""
        b = self.rounds[n]
        b.chains[b.turn % len(b.chains)]()
        b.turn += 1
        return b.s_out
