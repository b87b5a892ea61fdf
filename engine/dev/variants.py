"""The decode-graph variants engine/dev/ahead_probe.py compares (engine/dev/PERF.md runs 46-74): each a
few settings (a module attribute or a table entry) made around a graph capture and undone after it, the
--parallel it runs at, and its KernelConfig changes. Which program takes an item, when a load is asked
for, which kernel takes a product at a row count: the settings are the engine's own knobs, so a variant
found faster ships by changing that knob's default.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

import engine.kernels as K
import engine.kernels_fused as KF
import engine.kernels_prefetch as P
import engine.kernels_ring as R
import engine.kernels_skinny as S
from engine import decode_graph
from engine.kernels_skinny import SkinnyConfig as C


@dataclass(frozen=True)
class Variant:
    sets: tuple = ()  # (module or dict, attribute or key, value)
    parallel: int = 8
    knobs: dict = field(default_factory=dict)


# run 57's "oldends": an embedding kernel then add_rmsnorm, and torch's argmax
OLD_ENDS = ((KF, "embed_rmsnorm", lambda table, ids, w, eps: KF.add_rmsnorm(F.embedding(ids, table), None, w, eps)),
            (decode_graph, "argmax",
             lambda r, logits, out=None: logits.argmax(-1) if out is None else torch.argmax(logits, -1, out=out)))
O64 = (S.CONFIGS, (4096, 4096, 64), C(32, 128, 4, 6))  # o at 64 rows on the Triton tiles (shipped after run 64)
GATED64 = (24576, 4096, 64)
DOWN64 = (4096, 12288, 64)

# name -> Variant. Run 47 also ran "nopre" (the first block loaded before the PDL wait: commit a3ccbab);
# runs 52-53's norm / pf0 were module settings of engine/kernels.py at d0d79cf; run 61-62's weight
# prefetch (w1, w8, w1c1, w1c8) is at 4670d2f; run 69's r128 / r96 at 676ee65; runs 74 and 80's key walks
# (kv, ahead, i32, kv32, ahead32: engine/kernels.py WALK, INDEX32) and carveouts (carve100, carve50p64:
# CARVEOUT, engine/cuda_attrs.py) at 9a5a3df; run 85's early exit (early, earlyp64: engine/kernels.py EARLY) and
# runs 87-88's norm taken into the next ring (pn, pn1, pn16, pnnofence, pnskel: engine/kernels_ring.py PRENORM,
# NORM) at fc62108; runs 91-94's norm in the ring's MMA warps (pn; norm8w: kernels_fused.NORM_WARPS) at 728cdba.
VARIANTS: dict[str, Variant] = {
    "base": Variant(),
    "p1": Variant(parallel=1),  # the round at one row
    # runs 46, 60: o's stages staged before its wait
    "o12": Variant(((R.STAGED, (4096, 4096), 12),)), "o16": Variant(((R.STAGED, (4096, 4096), 16),)),
    # runs 52-55: the small kernels' L2 prefetch at no row count / at every count up to 8
    "nopf": Variant(knobs={"prefetch_rows": 0}), "pf8": Variant(knobs={"prefetch_rows": 8}),
    "oldends": Variant(OLD_ENDS),  # run 57
    # run 59: the ring's programs
    "qkv132": Variant(((R.PROGRAMS, (6144, 4096), 132),)),
    "gu132": Variant(((R.PROGRAMS, (24576, 4096, "gated"), 132),)),
    # run 64, at --parallel 64: o (o64) and the gated gate/up (g64a, g64b) on Triton's tiles at 64 rows
    "o64": Variant((O64,), 64),
    "g64a": Variant(((S.GATED, GATED64, C(32, 128, 4, 6)),), 64),
    "g64b": Variant(((S.GATED, GATED64, C(16, 256, 4, 4)),), 64),
    "og64": Variant((O64, (S.GATED, GATED64, C(32, 128, 4, 6))), 64),
    # run 65: o64 with down, o or the plain gate/up on other tiles at 64 rows
    "o64d2": Variant((O64, (S.CONFIGS, DOWN64, C(32, 128, 4, 6, 2))), 64),
    "o64d64": Variant((O64, (S.CONFIGS, DOWN64, C(64, 128, 4, 6))), 64),
    "o64d256": Variant((O64, (S.CONFIGS, DOWN64, C(32, 256, 4, 4, 2))), 64),
    "o64k2": Variant(((S.CONFIGS, (4096, 4096, 64), C(32, 128, 4, 6, 2)),), 64),  # o itself in 2 K ranges
    "o64gu": Variant((O64, (S.CONFIGS, (24576, 4096, 64), C(32, 256, 4, 4))), 64),
    # run 67, at --parallel 64: the L2 prefetch in the 64-row graph, 64 or 256 K/V rows
    "pf64r": Variant((), 64, {"prefetch_rows": 64}),
    "pf64r256": Variant(((P, "PREFETCH_ROWS", 256),), 64, {"prefetch_rows": 64}),
    # run 68, at --parallel 64: the q/k norm + RoPE in a kernel of its own; the split grid's cap
    "noqkf": Variant((), 64, {"fold_qk_norm": False}),
    "g8": Variant(((K, "GRID_PER_SM", 8),), 64), "g4": Variant(((K, "GRID_PER_SM", 4),), 64),
    # run 70, at one row: the first split's 128 / 256 K/V rows into L2 before the wait
    "pf128": Variant(((P, "PREFETCH_ROWS", 128),)), "pf256": Variant(((P, "PREFETCH_ROWS", 256),)),
    # run 72: the split grid's cap at --parallel 8
    "g1": Variant(((K, "GRID_PER_SM", 1),)), "g2": Variant(((K, "GRID_PER_SM", 2),)),
    # run 76: the split's length and the walk's block (engine/kernels.py SPLIT 256, BLOCK 64 shipped); other bits
    "s128": Variant(((K, "SPLIT", 128),)), "s64": Variant(((K, "SPLIT", 64),)),
    "b128": Variant(((K, "BLOCK", 128),)), "s128b128": Variant(((K, "SPLIT", 128), (K, "BLOCK", 128))),
    # run 79: o at 64 rows back on cuBLAS (no PDL: its programs are not resident while the attention runs)
    "o64cublas": Variant(((S.CONFIGS, (4096, 4096, 64), None),), 64),
    # run 81: the split kernel's pipeline stages by rows (engine/kernels.py STAGES; {64: 2} shipped after it)
    "st3": Variant(((K, "STAGES", {}),), 64), "st1": Variant(((K, "STAGES", {64: 1}),), 64),
    "st2all": Variant(((K, "STAGES", {n: 2 for n in (1, 2, 4, 8, 16, 32, 64)}),)),
    # run 86, a bound and not a candidate (other tokens): no add+RMSNorm kernel in the trunk, each product's
    # output read as it is by the next one; what a norm folded into the next ring's programs could save at most
    "nonorm": Variant(((KF, "add_rmsnorm", lambda x, r, w, eps: (x, x if r is None else r)),)),
    # run 90: fewer stages of W staged before the wait in every ring (8 shipped; run 33: 12 and 16 lost)
    **{f"stg{n}": Variant(tuple((R.STAGED, key, n) for key in R.SHAPES)) for n in (2, 4, 6)},
    # run 95: the loads of the round's small kernels where they were before LOADS_FIRST (after the sums)
    "late": Variant(((K, "LOADS_FIRST", set()),)), "latep64": Variant(((K, "LOADS_FIRST", set()),), 64),
    "first64": Variant(((K, "LOADS_FIRST", {64}),), 64),  # run 95: loads first at 64 rows too
    # run 77: the split kernel's warps a program (4 shipped)
    "nw2": Variant(((K, "WARPS", 2),)), "nw8": Variant(((K, "WARPS", 8),)),
}

_MISSING = object()


@contextmanager
def applied(name: str):
    """VARIANTS[name]'s settings made, then undone in reverse order (a table entry it added removed);
    yields its KernelConfig changes."""
    saved = []
    try:
        for obj, key, value in VARIANTS[name].sets:
            if isinstance(obj, dict):
                saved.append((obj, key, obj.get(key, _MISSING)))
                obj[key] = value
            else:
                saved.append((obj, key, getattr(obj, key)))
                setattr(obj, key, value)
        yield VARIANTS[name].knobs
    finally:
        for obj, key, old in reversed(saved):
            if not isinstance(obj, dict):
                setattr(obj, key, old)
            elif old is _MISSING:
                obj.pop(key, None)
            else:
                obj[key] = old


def recapture(r, cfg, name: str) -> None:
    """r's decode graphs captured again under VARIANTS[name]: its settings baked into the graphs (and
    undone after), its KernelConfig changes on `cfg`, r's config before any variant."""
    with applied(name) as knobs:
        r.cfg = replace(cfg, kernels=replace(cfg.kernels, **knobs))
        r.capture_graph()
