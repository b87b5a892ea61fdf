"""The tensor side of sampling, for the model runner: from a row's own logits to its token (and
logprobs), one row at a time so nothing depends on the row's neighbours.

A sampled row (temperature > 0): fp32 softmax of logits / T, sorted most likely first (stable:
ties by token id), cut to top_k, then to the shortest prefix whose mass reaches top_p, and the
token taken by inverse CDF at `uniform(seed, pos)` of the kept mass. Every step is a fixed
sequence of single-row ops, so the same logits, seed and position give the same token whatever
else runs. A greedy row keeps the runner's argmax untouched: greedy ids never move.
"""
from __future__ import annotations

from typing import Sequence

import torch

from engine.scheduler.sampling import SamplingParams, TokenLogprob, uniform


def draw(logits: torch.Tensor, sp: SamplingParams, pos: int) -> torch.Tensor:
    """The sampled token (a 0-d tensor on the logits' device) for one row of logits ([vocab])."""
    if sp.seed is None:
        raise ValueError("a sampled row needs a seed (the host fills one when the request gave none)")
    probs = torch.softmax(logits.float() / sp.temperature, dim=-1)
    vals, idx = torch.sort(probs, descending=True, stable=True)
    if sp.top_k:
        vals, idx = vals[:sp.top_k], idx[:sp.top_k]
    if sp.top_p < 1.0:  # keep each token whose predecessors' mass is still below top_p
        vals = torch.where(torch.cumsum(vals, 0) - vals < sp.top_p, vals, torch.zeros_like(vals))
    cdf = torch.cumsum(vals, 0)
    j = torch.searchsorted(cdf, (cdf[-1] * uniform(sp.seed, pos)).reshape(1), right=True)
    last = torch.count_nonzero(vals).clamp(min=1) - 1  # u * mass may round up to the mass itself
    return idx[torch.minimum(j[0], last)]


def logprob_of(logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """The token's log-probability under the raw logits, and the k most likely (ties: lower id)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if k:
        vals, idx = torch.sort(lp, descending=True, stable=True)
        top = list(zip(idx[:k].tolist(), vals[:k].tolist()))
    return TokenLogprob(float(lp[token]), top)


def choose(logits: torch.Tensor, greedy: list[int], params: Sequence[SamplingParams | None],
           positions: Sequence[int], logprobs: list | None = None) -> list[int]:
    """Row i's token: `greedy[i]` (the runner's argmax of `logits[i]`) for a greedy row, the draw at
    `positions[i]` (the new token's position) for a sampled one. With `logprobs` given, one
    TokenLogprob (or None, where the row asked for none) is appended per row."""
    out = list(greedy)
    picked = [(i, draw(logits[i], sp, positions[i])) for i, sp in enumerate(params)
              if sp is not None and not sp.greedy]
    if picked:  # one device sync for all sampled rows
        for (i, _), tok in zip(picked, torch.stack([t for _, t in picked]).tolist()):
            out[i] = tok
    if logprobs is not None:
        logprobs.extend(None if sp is None or sp.logprobs is None else logprob_of(logits[i], out[i], sp.logprobs)
                        for i, sp in enumerate(params))
    return out
