"""The CPU's runner: the shared core (engine/runner/model_runner.py) on the kernels chosen once
(engine/cpu/kernels.py CpuKernels: prepacked matmuls in whole tiles, the C decode attention, the C++
round); KernelConfig(cpu_fast=False) keeps the plain reference ops. Rounds run eagerly, at whole
tiles of rows (KernelConfig.row_buckets), or one ahead with KernelConfig(overlap=True): the CUDA
graphs' logic, run at once (engine/runner/ahead.py EagerRounds)."""
from __future__ import annotations

import logging

import torch

from engine.config import ConfigError, EngineConfig
from engine.cpu.forward import CpuOps, mixed_products, round_products
from engine.cpu.kernels import CpuKernels
from engine.cpu.packed import bf16_refused
from engine.models.qwen3 import ForwardPlan, TorchOps, decode_attention_loop
from engine.runner import decode_graph
from engine.runner.ahead import Ahead, EagerRounds
from engine.runner.model_runner import ModelRunner, mixed_ids
from engine.scheduler.backend import next_cut

log = logging.getLogger("engine.runner.model_runner")


class CpuRunner(ModelRunner):
    def __init__(self, cfg: EngineConfig, model=None):
        if cfg.kernels.cpu_fast and (why := bf16_refused(cfg.dtype)):
            raise ConfigError(why)
        super().__init__(cfg, model=model)
        # (A tensor-parallel rank wraps _decode_body: its round stays in Python.)
        self.cpu = CpuKernels(self.model, cfg, own_round=type(self)._decode_body is CpuRunner._decode_body)
        self.round_rows = self.cpu.round_rows
        self.batch_cuts = self.cpu.rows_free
        self.cut_free = self.cpu.mix_floor is not None and cfg.prefill_rows >= self.cpu.mix_floor
        if self.cpu.rows_free:  # a cut's attention over its own rows, 16 at a time
            self.cut_granule = 16
        if cfg.kernels.cuda_graph:
            self.graph_fallback_reason = f"no CUDA graphs on device {self.device.type}: eager decode rounds"
            log.info(self.graph_fallback_reason)
        self.buckets = decode_graph.buckets(self)
        self._eager: EagerRounds | None = None
        if decode_graph.overlaps(self):
            self._eager = e = EagerRounds(lambda inp, rows: self._decode_body(inp, rows), self.spare, self.device)
            self.ahead = Ahead(e.fresh, e.chained, self.spare, self.max_model_len, self.round_rows, self.device)

    # ---- prompt cuts -----------------------------------------------------------------------
    @torch.inference_mode()
    def _forward_cut(self, ids: torch.Tensor, lane: int, start: int) -> torch.Tensor:
        """One cut's last row's logits."""
        plan = ForwardPlan.cut(ids, lane, start)
        if self.cpu.packed is not None:
            return self._forward_cpu(plan, pad=not self.cpu.rows_free)[0]
        return self.model.lm_head(self.model(plan, TorchOps(self.model, self.kv, plan))[-1])

    @torch.inference_mode()
    def _forward_many(self, seqs) -> torch.Tensor:
        """Cuts [(tokens, lane, start)] in one forward (with cpu.rows_free), each cut's bits its own:
        its last row's logits."""
        return self._forward_cpu(ForwardPlan.of(seqs), pad=False)

    def _forward_cpu(self, plan: ForwardPlan, pad: bool) -> torch.Tensor:
        """Prompt cuts on the CPU kernels (engine/cpu/forward.py): each cut's last row's logits."""
        packed = self.cpu.packed
        h = self.model(plan, CpuOps(self.model, self.kv, plan, packed, packed.mm, self.cpu.cut_attention, pad))
        return packed.mm(h[plan.last_rows()], "lm_head")

    # ---- one forward carrying both ------------------------------------------------------------
    def _mixed(self, cuts, lanes, tokens, positions) -> tuple[list[int | None], list[int]]:
        """The cuts' rows as prefill_step gives them, the round's as decode does (engine/cpu/forward.py
        mixed_products), where the prepacked kernels and the C++ round's attention run."""
        cpu = self.cpu
        if cpu.packed is None or cpu.round is None:
            return self._one_after_other(cuts, lanes, tokens, positions)
        self._check_mixed(cuts, lanes)
        rows, where = self.padded_round(lanes, tokens, positions)
        if self.ahead is not None:
            self.ahead.drop()
        seqs = [(torch.tensor(list(t[s:e]), dtype=torch.long, device=self.device), lane, s) for lane, t, s, e in cuts]
        plan = ForwardPlan.of(seqs, torch.tensor(rows, dtype=torch.long, device=self.device))
        n = plan.n
        grid = [s % self.prefill_rows == 0 and e == next_cut(s, len(t), self.prefill_rows) for _, t, s, e in cuts]
        attend = cpu.round_attention(self.kv, plan.lanes[n:], plan.positions[n:], list(zip(rows[2], rows[1])),
                                     self.spare, self.max_model_len)  # (the C kernel the C++ round calls)
        ops = CpuOps(self.model, self.kv, plan, cpu.packed, mixed_products(cpu.packed, plan, cpu.mix_floor, grid),
                     cpu.cut_attention, pad=not cpu.rows_free, round_attention=attend)
        h = self.model(plan, ops)
        firsts = torch.cat([cpu.packed.mm(h[[r]], "lm_head") for r in plan.last_rows()])  # each alone, as prefill_step's
        return mixed_ids(cuts, firsts, cpu.packed.mm_tiled(h[n:], "lm_head"), where)

    # ---- decode rounds -----------------------------------------------------------------------
    def _round(self, rows, lanes, ahead: bool, greedy: bool) -> tuple[list[int], torch.Tensor]:
        """The round's ids and logits: the one launched ahead, else the C++ round, else the Python one
        (the same bits each way)."""
        if self.ahead is not None:
            return self.ahead.round(rows, ahead, greedy), self._eager.logits
        if self.cpu.round is not None and self.cpu.round.ready:
            logits, ids = self.cpu.round.rows(rows, self.spare, self.kv)
            return ids.tolist(), logits
        return self._eager_round(rows)

    def _decode_body(self, inp: torch.Tensor, rows=None) -> torch.Tensor:
        """The round's logits [rows, vocab]; rows: the round's (lane, position) pairs as Python ints,
        where the attention wants them."""
        plan, kv = ForwardPlan.round(inp[0], inp[1], inp[2]), self.kv
        if self.cpu.packed is not None:
            return self._decode_cpu(plan, rows)

        def attend(i, q):
            return decode_attention_loop(kv, i, q, plan.lanes, plan.positions, spare=self.spare, rows=rows)
        return self.model.lm_head(self.model(plan, TorchOps(self.model, kv, plan, round_attention=attend)))

    def _decode_cpu(self, plan: ForwardPlan, rows) -> torch.Tensor:
        """A round on the CPU kernels: its products in whole tiles, its attention the C kernel's (the
        C++ round's) or the batched matmuls'."""
        cpu, kv = self.cpu, self.kv
        live = (plan.lanes != kv.spare).nonzero().flatten()  # the padding rows write the spare lane
        attend = cpu.round_attention(kv, plan.lanes, plan.positions, rows, self.spare, self.max_model_len)
        ops = CpuOps(self.model, kv, plan, cpu.packed, round_products(cpu.packed, live), cpu.cut_attention,
                     round_attention=attend)
        return cpu.packed.mm_tiled(self.model(plan, ops), "lm_head", live)
