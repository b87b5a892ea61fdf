"""The model's forward (engine/models/qwen3.py Qwen3ForCausalLM.forward) on the fused kernels (CUDA,
or Triton's interpreter in tests).

`FusedOps` is what the trunk calls for a plan: the embedding with layer 0's norm in one kernel, the
residual add with the next norm in one (engine/cuda/fused.py; at tensor parallel the sum across ranks
fused into it where engine/parallel/fused.py takes the product), the q/k norm + RoPE + K/V write of
every row in one (or done by the decode attention itself: `fold`, engine/cuda/qkfold.py), silu * up;
products through `mm` (cuBLAS by default, engine/cuda/skinny.py's for a decode round's few rows, the
row-invariant product of prompt cuts filled together, or a mixed forward's pair); each cut's
attention through the launch's cut attention, the round's rows through the decode attention.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, w) -> x @ w.T


class FusedOps:
    """A plan's forward on the fused kernels (module doc). launch: engine.cuda.kernels.Launch (the
    kernels under one launch mode). mm(x, w), act(h, w_gate_up): the products (None: cuBLAS, or
    with `skinny` the decode round's kernels). fold: the decode attention does the q/k norm, RoPE
    and K/V write (a plain round; LaunchMode.fold_qk_norm). cut_rows(i, q): the attention of rows
    [0, n) in one call (the mixed graphs'; None: each cut's through launch.cut_attention);
    round_attention(i, q): the round's rows' (None: launch.attention)."""

    def __init__(self, model, kv, plan, launch, mm: Product | None = None, act: Product | None = None,
                 skinny: bool = False, fold: bool = False, cut_rows=None, round_attention=None):
        if mm is None and skinny:
            mm, act = launch.linear, launch.gate_up_silu
        elif mm is None:
            mm, act = F.linear, (lambda h, w: launch.silu_mul(F.linear(h, w)))
        elif act is None:
            act = lambda h, w: launch.silu_mul(mm(h, w))  # noqa: E731
        self.model, self.kv, self.launch, self._mm, self._act = model, kv, launch, mm, act
        self.eps = model.config.rms_norm_eps
        self.fold, self.cut_rows, self.round_attention = fold, cut_rows, round_attention

    def embed_norm(self, tokens):
        m = self.model.model
        return self.launch.embed_rmsnorm(m.embed_tokens.weight, tokens, m.layers[0].input_layernorm.weight, self.eps)

    def mm(self, x, i, name):
        return self._mm(x, self.model.weight(i, name))

    def attention(self, i, qkv, plan):
        model, kv, launch, n = self.model, self.kv, self.launch, plan.n
        a = model.model.layers[i].self_attn
        if self.fold:
            qk = (a.q_norm.weight, a.k_norm.weight, model.cos, model.sin, a.n_heads, self.eps)
            return launch.attention(kv, i, qkv, plan.lanes, plan.positions, qk=qk)
        q = launch.qk_norm_rope_write(qkv, a.q_norm.weight, a.k_norm.weight, model.cos, model.sin, kv.k[i], kv.v[i],
                                      plan.lanes, plan.positions, a.n_heads, a.n_kv, a.head_dim, self.eps)
        if self.cut_rows is not None:
            outs = [self.cut_rows(i, q[:n])]
        else:
            outs = [launch.cut_attention(q[a:b], kv.k[i, lane, :s + b - a], kv.v[i, lane, :s + b - a], s)
                    for a, b, lane, s in plan.cuts]
            if plan.pad:
                outs.append(q.new_zeros(plan.pad, q.shape[1] * q.shape[2]))
        if plan.has_round:
            lanes, positions = (plan.lanes, plan.positions) if n == 0 else (plan.lanes[n:], plan.positions[n:])
            rq = q if n == 0 else q[n:]
            outs.append(self.round_attention(i, rq) if self.round_attention is not None
                        else launch.attention(kv, i, rq, lanes, positions))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def act(self, h, i):
        return self._act(h, self.model.weight(i, "gate_up"))

    def add_norm(self, x, a, i, name, norm):
        w, f = self.model.weight(i, name), self.model.tp_fused
        if f is not None and f.fused_write(self._mm, a, w):
            return f.fused_add_norm(x, norm.weight, self.eps, self.launch.mode)
        return self.launch.add_rmsnorm(x, self.model.summed(self._mm(a, w)), norm.weight, self.eps)


def round_kernels(launch, skinny: bool) -> tuple[Product, Product]:
    """A decode round's product and gate/up + silu * up: engine/cuda/skinny.py's where `skinny`, else cuBLAS's."""
    if skinny:
        return launch.linear, launch.gate_up_silu
    return F.linear, (lambda x, w: launch.silu_mul(F.linear(x, w)))


def mixed_products(n: int, cut_mm: Product, launch, skinny: bool) -> tuple[Product, Product]:
    """A mixed forward's mm and act (the cuts' rows [0, n) first): each product runs twice, the cuts'
    rows through cut_mm (the row-invariant product of prompt cuts, engine/cuda/batch.py: a row's bits
    those of its grid cut) and the round's rows through the round's own kernels at the round's row
    count (a row's bits those of a plain round)."""
    round_mm, round_act = round_kernels(launch, skinny)

    def mm(x, w):
        return torch.cat([cut_mm(x[:n], w), round_mm(x[n:], w)])

    def act(x, w):
        return torch.cat([launch.silu_mul(cut_mm(x[:n], w)), round_act(x[n:], w)])
    return mm, act
