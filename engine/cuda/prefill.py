"""Attention of one prompt cut, at the rate of a whole-prompt attention call, with no mask.

A cut is rows [start, end) of one lane; query row t (absolute position start + t) attends keys
[0, start + t]: causal, the diagonal aligned bottom-right. Flash kernels that align it so are
slow on the H200 (PyTorch's flash: 342 TFLOP/s over a 32k prompt's cuts, against 628 for one
whole causal call through cuDNN; measured 2026-11-30), and a materialized mask is slower still.
So a cut is split where the two halves need no offset mask at all:

- the prefix: the cut's T queries against keys [0, start), nothing masked (a dense rectangle);
- the diagonal: the same queries against keys [start, end), plain causal on a square (top-left
  and bottom-right alignment coincide there);

each through the fastest causal/dense kernel the build has (cuDNN on the H200, `CutBackend`), each
returning its log-sum-exp; one Triton pass merges them: o = (oA eA + oB eB) / (eA + eB) with
e = exp(lse - max). A cut at start 0 is its diagonal alone. Every cut of every schedule
(stepped, whole, resumed from a prompt cache) runs this same function of (start, end) and the
lane's rows, so their bits agree; against one whole-prompt call the difference is rounding
(the halves are rounded to the model dtype before the merge).

On the CPU (Triton's interpreter, tests) the halves come from PyTorch's CPU flash kernel.
"""
from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

log = logging.getLogger("engine.cuda.prefill")
# cuDNN builds a graph for each new shape (70-140 ms on the H200), and PyTorch
# keeps those graphs per thread. So only cuts of a power-of-two row count of at least
# CUDNN_MIN_ROWS go through it: a server's full cuts (R rows) at each grid start, a bounded set
# that `warm` builds ahead; other cuts (a prompt's last, short ones) go through flash, which has
# nothing to build. The choice is a function of the cut's row count, so every schedule of a
# prompt (whole, stepped, resumed) makes it the same way for the same cut.
CUDNN_MIN_ROWS = 1024


def _expand(k: torch.Tensor, heads: int) -> torch.Tensor:
    g = heads // k.shape[1]
    return k if g == 1 else k.repeat_interleave(g, dim=1)


class CutBackend:
    """Which SDPA kernel computes the halves of a long cut on CUDA, for one runner: "cudnn" until a
    build without cuDNN attention refuses it, then "flash" from that cut on."""

    def __init__(self, name: str = "cudnn"):
        self.name = name

    def for_rows(self, rows: int) -> str:
        return self.name if rows >= CUDNN_MIN_ROWS and rows & (rows - 1) == 0 else "flash"


def backend_for(rows: int, backend: CutBackend | None = None) -> str:
    return (backend or CutBackend()).for_rows(rows)


def warm(k: torch.Tensor, v: torch.Tensor, heads: int, rows: int, backend: CutBackend | None = None) -> int:
    """Build cuDNN's graphs for cuts of `rows` rows at every grid start k ([max_len, KVH, d], one
    layer of a lane whose contents do not matter) allows, in the calling thread (PyTorch's cache
    of them is per thread). Returns how many cut shapes ran."""
    backend = backend or CutBackend()
    if not k.is_cuda or backend.for_rows(rows) != "cudnn":
        return 0
    q = torch.zeros(rows, heads, k.shape[2], dtype=k.dtype, device=k.device)
    starts = range(0, k.shape[0] - rows + 1, rows)
    for start in starts:
        cut_attention(q, k[:start + rows], v[:start + rows], start, backend)
    return len(starts)


def _half(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, backend: CutBackend):
    """q [1, H, T, d], k/v [1, KVH, S, d] (strided views) -> (o [1, H, T, d], lse with lse[0, h, t])."""
    if not q.is_cuda:
        k, v = _expand(k, q.shape[1]), _expand(v, q.shape[1])
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)[:2]
        return o, lse
    if q.dtype == torch.float32:  # flash and cuDNN take no float32: a float32 CUDA runner (a reference) does the math
        return _half_math(q, _expand(k, q.shape[1]), _expand(v, q.shape[1]), causal)
    if backend.for_rows(q.shape[2]) == "cudnn":
        try:
            o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)[:2]
            return o, lse[..., 0] if lse.dim() == 4 else lse
        except RuntimeError as e:  # a build without cuDNN attention: flash from the first cut on
            log.warning("cuDNN attention unavailable (%s): prompt cuts through flash", e)
            backend.name = "flash"
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[:2]
    return o, lse


def _half_math(q, k, v, causal: bool):
    """The same (o, lse) by plain matmuls; causal halves are square (the cut's own rows)."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


@triton.jit
def _merge_kernel(OA, OB, LA, LB, Out, T,
                  s_oat, s_oah, s_obt, s_obh, s_lah, s_lat, s_lbh, s_lbt, s_out,
                  D: tl.constexpr, BLOCK_T: tl.constexpr):
    tb = tl.program_id(0)
    h = tl.program_id(1)
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, D)
    tm = t < T
    la = tl.load(LA + h * s_lah + t * s_lat, mask=tm, other=0.0)
    lb = tl.load(LB + h * s_lbh + t * s_lbt, mask=tm, other=0.0)
    m = tl.maximum(la, lb)
    ea = tl.exp(la - m)
    eb = tl.exp(lb - m)
    t64 = t[:, None].to(tl.int64)
    oa = tl.load(OA + t64 * s_oat + h * s_oah + d[None, :], mask=tm[:, None], other=0.0).to(tl.float32)
    ob = tl.load(OB + t64 * s_obt + h * s_obh + d[None, :], mask=tm[:, None], other=0.0).to(tl.float32)
    o = (oa * ea[:, None] + ob * eb[:, None]) / (ea + eb)[:, None]
    tl.store(Out + t64 * s_out + h * D + d[None, :], o.to(Out.dtype.element_ty), mask=tm[:, None])


def merge(oa, la, ob, lb) -> torch.Tensor:
    """Two attention results over disjoint key sets, o [1, H, T, d] and lse [1, H, T] ->
    the attention over their union, [T, H*d] in o's dtype."""
    _, h, t, d = oa.shape
    out = torch.empty(t, h * d, dtype=oa.dtype, device=oa.device)
    block = 32
    _merge_kernel[(triton.cdiv(t, block), h)](
        oa, ob, la, lb, out, t,
        oa.stride(2), oa.stride(1), ob.stride(2), ob.stride(1),
        la.stride(1), la.stride(2), lb.stride(1), lb.stride(2), out.stride(0),
        D=d, BLOCK_T=block, num_warps=4)
    return out


def cut_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                  backend: CutBackend | None = None) -> torch.Tensor:
    """q [T, H, d] at positions [start, start+T); k, v [end, KVH, d] of one lane (end = start+T).
    Causal with the diagonal bottom-right. Returns [T, H*d]. backend: the runner's (CUDA)."""
    backend = backend or CutBackend()
    t, h, d = q.shape
    qh = q.transpose(0, 1)[None]
    kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    ob, lb = _half(qh, kh[:, :, start:], vh[:, :, start:], True, backend)
    if start == 0:
        return ob[0].transpose(0, 1).reshape(t, h * d)
    oa, la = _half(qh, kh[:, :, :start], vh[:, :, :start], False, backend)
    return merge(oa, la, ob, lb)
