"""A tensor-parallel rank's model runner: the ModelRunner on the rank's shard (engine/tp_weights.py)
with the model's sums across ranks (engine/parallel.py) and the logits gathered whole after every
forward, so everything after the forward (argmax, sampler, logprobs) is the one-rank code on the
same bits on every rank. On CUDA the decode round's graph captures the collectives inside it."""
from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.parallel import TensorParallel
from engine.presets import resolve_model
from engine.runner import ModelRunner
from engine.tp_weights import load_shard
from engine.weights import DTYPES


class TPRunner(ModelRunner):
    def __init__(self, cfg: EngineConfig, tp: TensorParallel, devices: list[str] | None = None):
        """cfg.device: this rank's device (cuda:r, or cpu). `devices`: every rank's, for describe()."""
        mcfg, _, model_dir = resolve_model(cfg.model)
        self.tp = tp
        self.devices = devices
        model = load_shard(mcfg, cfg.load_format, model_dir, cfg.device, DTYPES[cfg.dtype], cfg.seed,
                           tp.rank, tp.world)
        model.tp_reduce = tp.reduce if tp.active else None
        model.fuse()
        if tp.world > 1 and cfg.kernels.tp_allreduce == "symm":
            from engine.tp_symm import symm_reduce
            tp.symm = symm_reduce(tp.group, torch.device(cfg.device), DTYPES[cfg.dtype], tp.world)
        super().__init__(cfg, model=model)
        self._symm = tp.symm

    def set_sums(self, how: str) -> bool:
        """Device checks (engine/dev/tp_check.py), sent to every rank as a plan: the decode graph
        captured again with its o/down sums through "symm" or "nccl", or "skip"ped (timing only).
        Returns whether the sums go the way asked (symm: set up at start)."""
        if how == "symm" and self._symm is None:
            return False
        self.tp.skip_sums = how == "skip"
        self.tp.symm = self._symm if how == "symm" else None
        if self.graph is not None:
            if getattr(self, "cuts_warmed", None) is not None:
                self.cuts_warmed.result()  # no capture while the cut thread launches work
            self.capture_graph()
        return True

    def symm_agrees(self, rows: int) -> bool:
        """A device check: the symmetric-memory sum of a random [rows, hidden] tensor (a different
        one on each rank) has NCCL's bits."""
        g = torch.Generator(device=self.device).manual_seed(1234 + self.tp.rank)
        y = torch.randn(rows, self.model_config.hidden_size, generator=g, device=self.device).to(self.dtype)
        return self.tp.symm_agrees(y)

    def _decode_body(self, inp: torch.Tensor, rows=None) -> torch.Tensor:
        return self.tp.gather_vocab(super()._decode_body(inp, rows))

    def _forward_cut(self, ids: torch.Tensor, lane: int, start: int) -> torch.Tensor:
        return self.tp.gather_vocab(super()._forward_cut(ids, lane, start))

    def _forward_many(self, seqs) -> torch.Tensor:
        return self.tp.gather_vocab(super()._forward_many(seqs))

    def describe(self) -> dict:
        d = super().describe()
        d["tensor_parallel"] = self.tp.world
        d["devices"] = list(self.devices or [d["device_name"]] * self.tp.world)
        return d
