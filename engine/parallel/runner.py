"""A tensor-parallel rank's model runner: its device's runner on the rank's shard (engine/parallel/weights.py)
with the model's sums across ranks (engine/parallel/group.py) and the logits gathered whole after every
forward, so everything after the forward (argmax, sampler, logprobs) is the one-rank code on the
same bits on every rank. On CUDA the decode round's graph captures the collectives inside it."""
from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.parallel.group import TensorParallel
from engine.models.presets import resolve_model
from engine.runner.cpu_runner import CpuRunner
from engine.runner.cuda_runner import CudaRunner
from engine.runner.build import runner_class
from engine.parallel.weights import load_shard
from engine.models.weights import DTYPES


class TPRank:
    """What a rank adds to its device's runner (CpuTPRunner, CudaTPRunner: build_tp_runner picks one)."""

    def __init__(self, cfg: EngineConfig, tp: TensorParallel, devices: list[str] | None = None):
        """cfg.device: this rank's device (cuda:r, or cpu). `devices`: every rank's, for describe()."""
        mcfg, _, model_dir = resolve_model(cfg.model)
        self.tp = tp
        self.devices = devices
        model = load_shard(mcfg, cfg.load_format, model_dir, cfg.device, DTYPES[cfg.dtype], cfg.seed,
                           tp.rank, tp.world)
        model.tp_reduce = tp.reduce if tp.active else None
        model.tp_fused = tp if tp.active else None
        model.fuse()
        how, dev, dtype = cfg.kernels.tp_allreduce, torch.device(cfg.device), DTYPES[cfg.dtype]
        if tp.world > 1 and how in ("symm", "fused"):
            from engine.parallel.symm import symm_reduce
            tp.symm = symm_reduce(tp.group, dev, dtype, tp.world)
        if tp.world > 1 and how == "fused":
            from engine.parallel.fused import fused_sums
            tp.fused = fused_sums(tp.group, dev, dtype, tp.world, mcfg.hidden_size)
        super().__init__(cfg, model=model)
        self._symm, self._fused = tp.symm, tp.fused

    def set_sums(self, how: str) -> bool:
        """Device checks (tools/tp_check.py), sent to every rank as a plan: the decode graph
        captured again with its o/down sums through "fused" (with symm for what it does not take),
        "symm" or "nccl", or "skip"ped (timing only). Returns whether the sums go the way asked
        (symm, fused: set up at start)."""
        if (how in ("symm", "fused") and self._symm is None) or (how == "fused" and self._fused is None):
            return False
        self.tp.skip_sums = how == "skip"
        self.tp.symm = self._symm if how in ("symm", "fused") else None
        self.tp.fused = self._fused if how == "fused" else None
        if self.graph is not None:
            if getattr(self, "cuts_warmed", None) is not None:
                self.cuts_warmed.result()  # no capture while the cut thread launches work
            self.capture_graph()
        return True

    def set_skinny(self, configs: list, gated: list) -> None:
        """Device checks (tools/tp_check.py --skinny), sent to every rank as a plan: the
        skinny tables of this device plus these entries (SkinnyTables.with_entries); the next
        set_sums captures the decode graph with them."""
        from engine.cuda.skinny import tables_for
        self.kernels.skinny = tables_for(self.device).with_entries(configs, gated)

    def symm_agrees(self, rows: int) -> bool:
        """A device check: the symmetric-memory sum of a random [rows, hidden] tensor (a different
        one on each rank) has NCCL's bits."""
        g = torch.Generator(device=self.device).manual_seed(1234 + self.tp.rank)
        y = torch.randn(rows, self.model_config.hidden_size, generator=g, device=self.device).to(self.dtype)
        return self.tp.symm_agrees(y)

    def fused_agrees(self, rows: int) -> bool:
        """A device check: the fused sum + add + RMSNorm of random [rows, hidden] tensors (the
        partial product a different one on each rank) has the bits of the sum then add_rmsnorm."""
        from engine.cuda.fused import add_rmsnorm
        f, h = self._fused, self.model_config.hidden_size
        if f is None:
            return False
        g = torch.Generator(device=self.device).manual_seed(99)
        x, w = (torch.randn(n, generator=g, device=self.device).to(self.dtype) for n in (rows * h, h))
        g.manual_seed(1234 + self.tp.rank)
        a = torch.randn(rows, h, generator=g, device=self.device).to(self.dtype)
        eye = torch.eye(h, device=self.device, dtype=self.dtype)  # a @ I^T: the partial is `a`, exactly
        want = add_rmsnorm(x.view(rows, h), self.tp.reduce(a.clone()), w, 1e-6)
        ok = True
        for _ in range(2):  # both buffers; and an even count keeps the ranks' next forward on buffer 0
            assert f.write(torch.nn.functional.linear, a, eye)
            got = f.add_norm(x.view(rows, h), w, 1e-6)
            ok = ok and all(torch.equal(p, q) for p, q in zip(got, want))
        return ok

    def _decode_body(self, inp: torch.Tensor, *args, **kw) -> torch.Tensor:
        return self.tp.gather_vocab(super()._decode_body(inp, *args, **kw))

    def _forward_cut(self, ids: torch.Tensor, lane: int, start: int) -> torch.Tensor:
        return self.tp.gather_vocab(super()._forward_cut(ids, lane, start))

    def _forward_many(self, seqs) -> torch.Tensor:
        return self.tp.gather_vocab(super()._forward_many(seqs))

    def describe(self) -> dict:
        d = super().describe()
        d["tensor_parallel"] = self.tp.world
        d["devices"] = list(self.devices or [d["device_name"]] * self.tp.world)
        return d


class CpuTPRunner(TPRank, CpuRunner):
    pass


class CudaTPRunner(TPRank, CudaRunner):
    pass


def build_tp_runner(cfg: EngineConfig, tp: TensorParallel, devices: list[str] | None = None) -> TPRank:
    """This rank's runner on cfg.device (`devices`: every rank's, for describe())."""
    cls = CpuTPRunner if runner_class(cfg.device) is CpuRunner else CudaTPRunner
    return cls(cfg, tp, devices)
