"""CPU fast paths: matmuls on weights prepacked once, and a batched row-invariant decode attention.

- `PackedLinears`: every matrix of the trunk and the lm_head reordered once into oneDNN's
  blocked layout (bf16: `mkldnn._linear_pointwise`, AMX or avx512_bf16 where the CPU has them)
  or MKL's packed sgemm layout (fp32 decode rounds: `mkl._mkl_linear` at the round's fixed row
  count). Plain `F.linear` reorders a bf16 weight on every call; on one core of a Xeon with AMX
  that cost 9.7 ms against 7.1 ms packed for the `cpu` preset's 66 MB of bf16 matrices at 8 rows
  on one core. A given shape always takes the same kernel, so rows stay exact.
- `decode_attention_buckets`: the decode round's attention batched over rows, where the C kernel
  (engine/cpu/decode_attention.c, the default) cannot be built. Each row attends
  over a span that depends on its own position only (its length rounded up to SPAN multiples,
  later keys masked to exactly zero weight), and rows of the same span go through one batched
  matmul whose entries are independent problems of the same shape. So a row's bits depend on its
  own lane and position, never on its neighbours, as with the one-SDPA-a-row reference loop
  (engine.models.qwen3.decode_attention_loop), at a few ops a span group instead of a dozen a row.
- `cpu_dtype()`: bfloat16 where the CPU does bf16 matmuls natively (AMX or avx512_bf16), else
  float32; `cpu_threads()`: compute threads, leaving one core to the HTTP thread.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from engine.cpu import isa
from engine.models.qwen3 import rotate

SPAN = 64  # decode attention spans are multiples of this many keys
ROW_TILE = 8  # decode rounds multiply this many rows a call, whatever --parallel is


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 natively (AMX tiles or avx512_bf16) at the ISA torch runs
    (a --cpu-isa cap below AVX-512 turns both off: engine.cpu.isa)."""
    if isa.capped():
        return False
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except (AttributeError, RuntimeError):  # an older torch without the probes
        return False


def packs_bf16() -> bool:
    """Whether oneDNN multiplies bf16 weights here: it needs AVX-512 (bw, vl, dq) or AVX-NE-CONVERT."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_refused(dtype: str) -> str | None:
    """Why `--dtype` cannot run on this CPU's fast path, or None. The fast path keeps its bf16
    products row-invariant through oneDNN's packed weights, which this CPU cannot take; rather
    than fail at the first product, the engine refuses the flag."""
    if dtype == "bfloat16" and not packs_bf16():
        return (f"--dtype bfloat16 needs a CPU with AVX-512 or AVX-NE-CONVERT for its packed bf16 products; "
                f"this one has {torch.backends.cpu.get_cpu_capability()}: use --dtype float32 (the default here)")
    return None


def cpu_dtype() -> tuple[str, str]:
    """(dtype, why) for `--dtype` left unset on the CPU."""
    if cpu_bf16_native():
        what = "AMX" if torch.cpu._is_amx_tile_supported() else "avx512_bf16"
        return "bfloat16", f"bfloat16: the CPU has {what}"
    if isa.capped():
        return "float32", f"float32: --cpu-isa caps torch at {isa.capability()} (the CPU has AVX-512)"
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

    def __init__(self, model, wide=None):
        """wide: engine.cpu.wide.WideKernel where the matrices hold bf16 values (round_weights): the
        decode round's products then read bf16 copies of them, only the round's own rows."""
        self.rows = ROW_TILE
        self.plain: dict = {}
        for i, layer in enumerate(model.model.layers):
            a, m = layer.self_attn, layer.mlp
            self.plain[(i, "qkv")] = a.wqkv
            self.plain[(i, "o")] = a.o_proj.weight
            self.plain[(i, "gate_up")] = m.w_gate_up
            self.plain[(i, "down")] = m.down_proj.weight
        self.plain["lm_head"] = model.lm_head.weight
        # q and k heads normed as one [rows, H + KVH, d] block: each head's own norm weight
        a = model.model.layers[0].self_attn if len(model.model.layers) else None
        self.shape = (a.n_heads, a.n_kv, a.head_dim) if a is not None else None
        self.eps = model.config.rms_norm_eps if a is not None else 0.0
        self.qk_norm = [torch.cat([layer.self_attn.q_norm.weight.detach().expand(a.n_heads, -1),
                                   layer.self_attn.k_norm.weight.detach().expand(a.n_kv, -1)])
                        for layer in model.model.layers]
        self.dtype = model.lm_head.weight.dtype
        self.bf16 = self.dtype == torch.bfloat16
        self.mkl = self.dtype == torch.float32 and torch.backends.mkl.is_available()
        # the wide kernel takes widths of whole 16-lane chunks (a tensor-parallel shard's too)
        fits = all(w.shape[1] % 16 == 0 for w in self.plain.values())
        self.wide = wide if self.dtype == torch.float32 and fits else None
        with torch.no_grad():
            if self.wide is not None:  # bf16 copies for decode rounds; prompt cuts take F.linear (MKL)
                self.packed = {k: self.wide.pack(w) for k, w in self.plain.items()}
            elif self.bf16:
                self.packed = {k: torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROW_TILE)
                               for k, w in self.plain.items()}
            elif self.mkl:  # packed for the decode round's row tile; prompt cuts take F.linear
                self.packed = {k: torch.ops.mkl._mkl_reorder_linear_weight(w.detach().contiguous(), ROW_TILE)
                               for k, w in self.plain.items()}
            else:
                self.packed = {}

    def heads(self, i: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """qkv [rows, (H + 2 KVH) d] -> q [rows, H, d], k and v [rows, KVH, d]: q and k RMSNormed
        (float32, as HF's RMSNorm) and rotated together, half the ops of doing each on its own."""
        h, kvh, d = self.shape
        rows = qkv.shape[0]
        qk = qkv[:, :(h + kvh) * d].reshape(rows, h + kvh, d)
        f = qk.float()
        qk = self.qk_norm[i] * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.eps)).to(qkv.dtype)
        qk = rotate(qk, cos, sin)
        return qk[:, :h], qk[:, h:], qkv[:, (h + kvh) * d:].reshape(rows, kvh, d)

    @property
    def kind(self) -> str:
        """/v1/engine's `cpu_matmuls`."""
        if self.wide is not None:
            return f"bf16 weights widened to float32 in C ({self.wide.isa}); prompt cuts MKL"
        return "oneDNN, prepacked" if self.bf16 else "MKL, prepacked" if self.mkl else "torch"

    def mm_tiled(self, x: torch.Tensor, key, live: torch.Tensor | None = None) -> torch.Tensor:
        """A decode round's product, ROW_TILE rows a call (the runner pads every round to whole
        tiles): the library picks its kernel by row count, and a bf16 kernel's bits differ between
        row counts (1 and 4 rows parted at token 22 of 64), as do float32's (MKL: one kernel for 1
        to 3 rows, another for 4 or more; a sampled reply parted at token 267), so every round
        multiplies tiles of one shape and a row's bits do not depend on --parallel: the plain
        reference (1 lane) equals any server (tests/engine/test_cpu_exactness.py). The wide kernel's
        rows are each their own at any count: it multiplies only `live` (the others zero)."""
        if self.wide is not None:
            return self.wide(x, self.packed[key], live)
        rows = x.shape[0]
        if rows % ROW_TILE:
            raise ValueError(f"a decode round of {rows} rows: the runner pads rounds to multiples of {ROW_TILE}")
        if rows == ROW_TILE:
            return self.mm(x, key)
        return torch.cat([self.mm(x[r:r + ROW_TILE], key) for r in range(0, rows, ROW_TILE)])

    def mm(self, x: torch.Tensor, key) -> torch.Tensor:
        if self.wide is not None:  # a prompt cut's product: MKL over the same (bf16-valued) weights
            return F.linear(x, self.plain[key])
        if self.bf16:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed[key], None, "none", [], "")
        if self.mkl and x.dim() == 2 and x.shape[0] == self.rows:
            return torch.ops.mkl._mkl_linear(x, self.packed[key], self.plain[key], None, self.rows)
        return F.linear(x, self.plain[key])


CHECK_ROWS = (1, 3, 8, 17, 64, 100, 255, 512)  # row counts a CPU prompt product is checked at
CHECK_BIG = 1024  # ... against this many rows (engine.scheduler.host.BATCH_ROWS: the most rows a batched fill has)


def rows_invariant(packed: PackedLinears, tile: int) -> bool:
    """Whether on this machine a row's bits in a bf16 prompt cut's products are its own whatever
    the other rows: layer 0's four packed matrices and the lm_head (`packed.mm`, every layer's
    shapes are layer 0's) and the cut attention's two products (engine.cpu.cut_attention: q against
    a strided [d, keys] view of the cache, the scores against a [keys, d] one), each at every
    count of CHECK_ROWS and two offsets against one CHECK_BIG-row product (a kernel picked by the
    row count would part them). Then short cuts may share a forward (ModelRunner.prefill_many)
    and a tile's attention skip its zero rows with the bits they have alone. On an AMD EPYC with
    avx512_bf16 (oneDNN) every one is. float32 (MKL's packed kernel at 8 rows, F.linear elsewhere;
    flash attention): False, and cuts keep their old path."""
    if not packed.bf16 or packed.shape is None:
        return False
    g = torch.Generator().manual_seed(0)

    def same(f, cols: int) -> bool:
        x = torch.randn(CHECK_BIG, cols, generator=g).to(packed.dtype)
        whole = f(x)
        return all(torch.equal(f(x[o:o + m]), whole[o:o + m]) for m in CHECK_ROWS for o in (0, 5))

    with torch.inference_mode():
        for key in [(0, "qkv"), (0, "o"), (0, "gate_up"), (0, "down"), "lm_head"]:
            if not same(lambda x: packed.mm(x, key), packed.plain[key].shape[1]):
                return False
        _, kvh, d = packed.shape
        kv = torch.randn(tile, kvh, d, generator=g).to(packed.dtype)
        mm = lambda a, b: torch.mm(a, b, out=a.new_empty(a.shape[0], b.shape[1]))  # noqa: E731 (as the tiles call it)
        return same(lambda x: mm(x, kv[:, 0].t()), d) and same(lambda x: mm(x, kv[:, 0]), tile)


FLOOR_SCAN = 64  # a float32 product is checked at every row count up to this many, to find its floor


def invariant_floor(packed: PackedLinears, tile: int) -> int | None:
    """The fewest rows from which a prompt product gives each row the bits it has in any larger
    product, so a cut's rows and a round's may share one (ModelRunner.mixed); None where none was
    found. bf16: 1 where `rows_invariant` holds. float32: layer 0's matrices and the lm_head, at
    every row count up to FLOOR_SCAN and those of CHECK_ROWS, two offsets, against one CHECK_BIG-row
    product, and the round's ROW_TILE-row tile (MKL's packed kernel) too, unless the round's
    products are the wide kernel's (then only the cuts share a product). At this thread count:
    MKL on an AMD EPYC (AVX2) takes another kernel for a block below 4 rows, so one thread is
    row-invariant from 4 rows on and two (which split the rows) from 12; its 8-row packed tile
    gives the bits of a cut's product. (The fp32 cut attention pads its tiles: invariant by
    construction.)"""
    if packed.shape is None:
        return None
    if packed.bf16:
        return 1 if rows_invariant(packed, tile) else None
    g = torch.Generator().manual_seed(0)
    counts = sorted({*range(1, FLOOR_SCAN + 1), *CHECK_ROWS})
    keys = [(0, "qkv"), (0, "o"), (0, "gate_up"), (0, "down"), "lm_head"]
    floor = 1
    with torch.inference_mode():
        for key in keys:
            x = torch.randn(CHECK_BIG, packed.plain[key].shape[1], generator=g).to(packed.dtype)
            whole = packed.mm(x, key)
            # the round's rows share the cut's product only where its tile gives the same bits; the
            # wide kernel's rows never share it (ModelRunner.mixed multiplies them apart)
            if packed.wide is None and not torch.equal(packed.mm_tiled(x[:ROW_TILE], key), whole[:ROW_TILE]):
                return None
            for m in counts:
                if m >= floor and not all(torch.equal(packed.mm(x[o:o + m], key), whole[o:o + m]) for o in (0, 5)):
                    floor = m + 1
            if floor > FLOOR_SCAN:
                return None
    return floor


class BucketPlan:
    """(Mirrored in C++ by engine/cpu/round.cpp's bucket_plan.) Per decode round, computed once
    and used by every layer: the active rows grouped by span (and, for a drafter's extra rows of
    a lane, by which entry of the lane they are, so a group holds each lane once), and each such
    group split into runs of consecutive lanes. A run is one strided view of the cache, no copy.
    (Runs, not one lane range a group: four streams in lanes 0, 2, 5, 7, as a server hands out
    lanes after others finish, computed the attention of eight.)"""

    def __init__(self, rows: list[tuple[int, int]], spare: int, max_len: int, device):
        groups: dict[tuple[int, int], dict[int, tuple[int, int]]] = {}
        for r, (lane, pos) in enumerate(rows):
            if lane == spare:
                continue
            span = min(max_len, (pos // SPAN + 1) * SPAN)
            nth = 0
            while lane in groups.get((span, nth), {}):
                nth += 1
            groups.setdefault((span, nth), {})[lane] = (r, pos)
        self.groups = []
        for (span, _), members in sorted(groups.items()):
            lanes = sorted(members)
            cuts = [0] + [j for j in range(1, len(lanes)) if lanes[j] != lanes[j - 1] + 1] + [len(lanes)]
            for a, b in zip(cuts, cuts[1:]):
                run = lanes[a:b]
                pos = torch.tensor([members[lane][1] for lane in run])
                mask = torch.zeros(len(run), span, 1, device=device)
                mask.masked_fill_((torch.arange(span)[None, :] > pos[:, None])[..., None].to(device), float("-inf"))
                rows_of = torch.tensor([members[lane][0] for lane in run], device=device)
                at = torch.arange(len(run), device=device)
                self.groups.append((run[0], run[-1] + 1, span, rows_of, mask, at, rows_of))


def decode_attention_buckets(kv, i: int, q: torch.Tensor, plan: BucketPlan) -> torch.Tensor:
    """q [P, H, d] of a padded round -> [P, H*d]; padding rows get zeros.

    A group is two batched matmuls on the model's dtype, one batch entry a lane, so no cache copy
    and no conversion: scores = K [span, KVH*d] @ Q, where Q [KVH*d, H] holds each query head in
    the rows of its KV head and exact zeros elsewhere (GQA without repeating K); softmax in
    float32 over the span; out = P^T @ V [span, KVH*d], of which each head keeps its KV head's
    block. Every entry's arithmetic is set by its span alone (the batched kernel does each entry
    as its own problem), so a row's bits depend on its own lane and position only. In bf16 the
    scores are rounded to bf16 before the softmax (max abs error ~2e-3 on unit-scale values
    against float32 attention; one-SDPA-a-row bf16: ~1e-3)."""
    p, h, d = q.shape
    kvh = kv.k.shape[3]
    eye = torch.eye(kvh, dtype=q.dtype)[None, :, None, :, None]
    out = torch.zeros(p, h * d, dtype=q.dtype, device=q.device)
    for lo, hi, span, q_rows, mask, at, rows_out in plan.groups:
        n = hi - lo
        k = kv.k[i, lo:hi, :span].view(n, span, kvh * d)
        v = kv.v[i, lo:hi, :span].view(n, span, kvh * d)
        qg = q.index_select(0, q_rows).view(n, kvh, h // kvh, d).transpose(2, 3)  # [n, KVH, d, rep]
        qbd = (qg[:, :, :, None, :] * eye).reshape(n, kvh * d, h)  # block-diagonal
        s = torch.bmm(k, qbd).float().mul_(d ** -0.5).add_(mask).softmax(1).to(q.dtype)  # [n, span, H]
        o = torch.bmm(s.transpose(1, 2), v).view(n, kvh, h // kvh, kvh, d)
        o = torch.diagonal(o, dim1=1, dim2=3).permute(0, 3, 1, 2).reshape(n, h * d)
        out.index_copy_(0, rows_out, o.index_select(0, at))
    return out

