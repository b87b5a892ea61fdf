"""The model's forward (engine/models/qwen3.py Qwen3ForCausalLM.forward) on a CPU runner's kernels.

`CpuOps` is what the trunk calls for a plan: products on the prepacked weights (engine/cpu/packed.py,
through `mm(x, key)`: which product a row takes is the plan's, below), q and k normed and rotated
together (PackedLinears.heads), each cut's attention in tiles at absolute positions
(engine/cpu/cut_attention.py) and the round's rows through the round's attention (the C kernel or
the batched matmuls); norms and the embedding are the model's own modules, as the reference's.

Which product a row takes keeps its bits those of its own call: a cut's rows `packed.mm`, a decode
round's rows `mm_tiled` (whole ROW_TILE tiles), and a forward carrying both, `mixed_products`.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

Product = Callable[[torch.Tensor, object], torch.Tensor]  # (x, key) -> x times the packed matrix `key`


class CpuOps:
    """A plan's forward on the CPU kernels (module doc). mm(x, key): the products; cut_attention(q,
    k, v, start, pad): CpuKernels.cut_attention; pad: a cut's partly covered tile padded with zero
    rows (False where the products are row-invariant); round_attention(i, q): the round's rows'."""

    def __init__(self, model, kv, plan, packed, mm: Product, cut_attention, pad: bool = True,
                 round_attention: Callable[[int, torch.Tensor], torch.Tensor] | None = None):
        self.model, self.kv, self.packed, self._mm = model, kv, packed, mm
        self.cos, self.sin = model.cos[plan.positions], model.sin[plan.positions]
        self.cut_attention, self.pad, self.round_attention = cut_attention, pad, round_attention

    def embed_norm(self, tokens):
        x = self.model.model.embed_tokens(tokens)
        return x, self.model.model.layers[0].input_layernorm(x)

    def mm(self, x, i, name):
        return self._mm(x, (i, name))

    def attention(self, i, qkv, plan):
        q, k, v = self.packed.heads(i, qkv, self.cos, self.sin)
        plan.write_kv(self.kv, i, k, v)
        kv, n = self.kv, plan.n
        outs = [self.cut_attention(q[a:b], kv.k[i, lane], kv.v[i, lane], s, self.pad) for a, b, lane, s in plan.cuts]
        if plan.has_round:
            outs.append(self.round_attention(i, q[n:].contiguous() if n else q))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def act(self, h, i):
        gate, up = self._mm(h, (i, "gate_up")).chunk(2, dim=-1)
        return F.silu(gate) * up

    def add_norm(self, x, a, i, name, norm):
        x = x + self.model.summed(self._mm(a, (i, name)))
        return x, norm(x)


def round_products(packed, live: torch.Tensor) -> Product:
    """A decode round's products: whole ROW_TILE tiles (PackedLinears.mm_tiled), `live` the rows a
    row-invariant kernel multiplies (the padding rows zero, as the C++ round's)."""
    return lambda x, key: packed.mm_tiled(x, key, live)


def mixed_products(packed, plan, floor: int | None, grid: list[bool]) -> Product:
    """The products of a forward carrying prompt cuts and a decode round (plan: the cuts' rows first),
    each row with the bits it has in its own call. With `floor` (the fewest rows from which this
    CPU's products are row-invariant: engine.cpu.packed.invariant_floor) one product over every row
    (the cuts' rows only, where the round's products are the wide kernel's), zero rows added up to
    the floor, except a whole grid cut (`grid`) shorter than the floor, which `prefill_step`
    multiplied at its own row count and so is here (a piece of a longer grid cut was multiplied
    among R rows: it shares). With floor None, each cut alone and the round's rows in its tiles
    (the cuts must then be grid cuts)."""
    n, m = plan.n, plan.rows
    spans = [(a, b) for a, b, _, _ in plan.cuts]
    if floor is None:
        parts = [(a, b, packed.mm) for a, b in spans] + [(n, m, packed.mm_tiled)]
    else:  # runs of rows that share a product; a whole grid cut below the floor alone
        # the wide kernel gives the round's rows their bits at any row count, MKL's cut product
        # other bits: there the round's rows keep their own product beside the cuts' shared one
        apart = packed.wide is not None
        runs = []
        for a, b, alone in ([(a, b, g and b - a < floor) for (a, b), g in zip(spans, grid)]
                            + ([] if apart else [(n, m, False)])):
            if not alone and runs and not runs[-1][2] and runs[-1][1] == a:
                runs[-1] = (runs[-1][0], b, False)
            else:
                runs.append((a, b, alone))

        def shared(x, key):
            short = floor - x.shape[0]
            if short <= 0:
                return packed.mm(x, key)
            return packed.mm(torch.cat([x, x.new_zeros(short, x.shape[1])]), key)[:x.shape[0]]
        parts = [(a, b, packed.mm if alone else shared) for a, b, alone in runs]
        if apart:
            parts.append((n, m, packed.mm_tiled))

    def mm(x, key):
        if len(parts) == 1:
            return parts[0][2](x, key)
        return torch.cat([f(x[a:b], key) for a, b, f in parts])
    return mm
