"""CPU fast paths: matmuls on weights prepacked once, and a batched row-invariant decode attention.

- `PackedLinears`: every matrix of the trunk and the lm_head reordered once into oneDNN's
  blocked layout (bf16: `mkldnn._linear_pointwise`, AMX or avx512_bf16 where the CPU has them)
  or MKL's packed sgemm layout (fp32 decode rounds: `mkl._mkl_linear` at the round's fixed row
  count). Plain `F.linear` reorders a bf16 weight on every call; on one core of a Xeon with AMX
  that cost 9.7 ms against 7.1 ms packed for the `cpu` preset's 66 MB of bf16 matrices at 8 rows
  (PERF.md, issue 13). A given shape always takes the same kernel, so rows stay exact.
- `decode_attention_buckets`: the decode round's attention batched over rows. Each row attends
  over a span that depends on its own position only (its length rounded up to SPAN multiples,
  later keys masked to exactly zero weight), and rows of the same span go through one batched
  matmul whose entries are independent problems of the same shape. So a row's bits depend on its
  own lane and position, never on its neighbours, as with the one-SDPA-a-row reference loop
  (engine.model.decode_attention_loop), at a few ops a span group instead of a dozen a row.
- `cpu_dtype()`: bfloat16 where the CPU does bf16 matmuls natively (AMX or avx512_bf16), else
  float32; `cpu_threads()`: compute threads, leaving one core to the HTTP thread.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

SPAN = 64  # decode attention spans are multiples of this many keys


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 natively (AMX tiles or avx512_bf16)."""
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except (AttributeError, RuntimeError):  # an older torch without the probes
        return False


def cpu_dtype() -> tuple[str, str]:
    """(dtype, why) for `--dtype` left unset on the CPU."""
    if cpu_bf16_native():
        what = "AMX" if torch.cpu._is_amx_tile_supported() else "avx512_bf16"
        return "bfloat16", f"bfloat16: the CPU has {what}"
    return "float32", "float32: the CPU has neither AMX nor avx512_bf16"


def cpu_threads() -> int:
    """Compute threads for `--threads` left unset: every core but one (at least one), so the
    HTTP thread never preempts an OpenMP worker mid-barrier."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


class PackedLinears:
    """The trunk's matrices (fused q/k/v, o, fused gate/up, down, per layer) and the lm_head,
    reordered once for the CPU's matmul libraries. `mm(x, key)` multiplies by one of them:
    key is (layer, "qkv" | "o" | "gate_up" | "down") or "lm_head"."""

    def __init__(self, model, decode_rows: int):
        self.rows = decode_rows
        self.plain: dict = {}
        for i, layer in enumerate(model.model.layers):
            a, m = layer.self_attn, layer.mlp
            self.plain[(i, "qkv")] = a.wqkv
            self.plain[(i, "o")] = a.o_proj.weight
            self.plain[(i, "gate_up")] = m.w_gate_up
            self.plain[(i, "down")] = m.down_proj.weight
        self.plain["lm_head"] = model.lm_head.weight
        self.dtype = model.lm_head.weight.dtype
        self.bf16 = self.dtype == torch.bfloat16
        self.mkl = self.dtype == torch.float32 and torch.backends.mkl.is_available()
        with torch.no_grad():
            if self.bf16:
                self.packed = {k: torch.ops.mkldnn._reorder_linear_weight(w.detach(), decode_rows)
                               for k, w in self.plain.items()}
            elif self.mkl:  # packed for the decode round's row count; prompt cuts take F.linear
                self.packed = {k: torch.ops.mkl._mkl_reorder_linear_weight(w.detach().contiguous(), decode_rows)
                               for k, w in self.plain.items()}
            else:
                self.packed = {}

    def mm(self, x: torch.Tensor, key) -> torch.Tensor:
        if self.bf16:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed[key], None, "none", [], "")
        if self.mkl and x.dim() == 2 and x.shape[0] == self.rows:
            return torch.ops.mkl._mkl_linear(x, self.packed[key], self.plain[key], None, self.rows)
        return F.linear(x, self.plain[key])


class BucketPlan:
    """Per decode round, computed once and used by every layer: the active rows grouped by span,
    as tensors (rows, lanes) and a boolean mask [g, 1, 1, span] of the keys each row sees."""

    def __init__(self, rows: list[tuple[int, int]], spare: int, max_len: int, device):
        groups: dict[int, list[tuple[int, int, int]]] = {}
        for r, (lane, pos) in enumerate(rows):
            if lane == spare:
                continue
            span = min(max_len, (pos // SPAN + 1) * SPAN)
            groups.setdefault(span, []).append((r, lane, pos))
        self.groups = []
        for span, members in sorted(groups.items()):
            idx = torch.tensor([m[0] for m in members], device=device)
            lanes = torch.tensor([m[1] for m in members], device=device)
            pos = torch.tensor([m[2] for m in members], device=device)
            seen = torch.arange(span, device=device)[None, :] <= pos[:, None]
            self.groups.append((span, idx, lanes, seen[:, None, None, :]))


def decode_attention_buckets(kv, i: int, q: torch.Tensor, plan: BucketPlan) -> torch.Tensor:
    """q [P, H, d] of a padded round -> [P, H*d]; padding rows get zeros. One SDPA a span group:
    its kernel works each (row, head) on its own with blocks set by the span, so a row's bits
    depend on its own position and lane only."""
    p, h, d = q.shape
    out = torch.zeros(p, h * d, dtype=q.dtype, device=q.device)
    for span, idx, lanes, seen in plan.groups:
        g = idx.shape[0]
        k = kv.k[i, lanes, :span].transpose(1, 2)  # [g, KVH, span, d], a strided view of one gather
        v = kv.v[i, lanes, :span].transpose(1, 2)
        qg = q.index_select(0, idx)[:, :, None, :]  # [g, H, 1, d]
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=seen, enable_gqa=True)
        out.index_copy_(0, idx, o.reshape(g, h * d))
    return out
