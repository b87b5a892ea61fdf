"""Decode rounds launched one ahead: the next round runs while the host reads this one's ids.

A plain round: the host writes its rows, the graph runs, the host waits for the ids, emits them,
builds the next round and launches it. The GPU idles through the host's part (~0.2 ms a round
on the H200). When the lane host expects the next round to be this
one's lanes fed their own greedy ids at the next positions (`ahead`: no prompt waits, every
stream greedy, one row a stream), the runner launches that round at once, from the ids still on
the device (`advance_inputs`: tokens = the last round's argmax, positions + 1 on a lane's row),
and only then reads this round's ids. vLLM and SGLang call this async (overlap) scheduling.

The next call takes the round in flight when every row it asks for is a row that round
computed: the same lane, token and position in the same row. A row's bits never depend on the
other rows or on the round's row count (engine/runner/decode_graph.py buckets), so rows the caller
dropped (a stream that ended, one paused) do not matter, and a round taken this way returns
exactly the ids a fresh one would; a round in flight at more rows than asked serves the call,
but the next is launched fresh at the rows asked for. A dropped row runs on in the chained
rounds (the device advances every lane's row) until a fresh round drops it, so the guard below
watches the rows the device holds, not the ones asked for.

What a round launched for nothing leaves: each of its lanes' K/V row at the next position,
written from the token the lane's history holds there (its last id), the row a later round or a
resumed prompt would write; a new prompt's cut in that lane runs after it on the same stream and
overwrites it. A lane at its last position (max_model_len - 1) is never run ahead: its next row
would land in the next lane's cache. Sampled rounds never run ahead (a draw reads the logits).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

Rows = Sequence[Sequence[int]]  # [tokens, positions, lanes] of one round, one entry a row


def advance(rows: Rows, ids: Sequence[int], spare: int) -> list[list[int]]:
    """The rows of the round after `rows` as the device builds them (advance_inputs): every row
    fed its own id, a lane's row one position on, the spare lane's rows where they were."""
    tokens, positions, lanes = rows
    return [list(ids), [p + (lane != spare) for p, lane in zip(positions, lanes)], list(lanes)]


def steps(lanes: Sequence[int], spare: int) -> list[int]:
    """A round's fourth input row: 1 where a row is a lane's (its position moves on), 0 on a spare row."""
    return [int(lane != spare) for lane in lanes]


def advance_inputs(s_in: torch.Tensor, s_out: torch.Tensor) -> None:
    """In place on the device: s_in [4, rows] (tokens, positions, lanes, steps) becomes the next
    round's, from s_out, the last round's ids; steps is 1 on a lane's row, 0 on a spare one."""
    s_in[0].copy_(s_out)
    s_in[1].add_(s_in[3])


class Ahead:
    """Runs a runner's rounds, one ahead where asked. `fresh(rows)` launches a round from the
    host's rows (at their row count); `chain(n)` launches the round after the last one of n rows
    from the device (a CUDA graph replay, or eager rounds on the CPU); each returns the device
    tensor its ids land in. `width`: the most rows a round has."""

    def __init__(self, fresh: Callable[[Rows], torch.Tensor], chain: Callable[[int], torch.Tensor], spare: int,
                 max_len: int, width: int, device: torch.device):
        self.fresh, self.chain = fresh, chain
        self.spare, self.max_len = spare, max_len
        cuda = torch.device(device).type == "cuda"
        # ids come back through two pinned slots: the round in flight copies into one while the
        # host reads the other
        self.h_out = torch.zeros(2, width, dtype=torch.long, pin_memory=cuda)
        self.events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self.count = [0, 0]  # ids in each slot
        self.slot = 0
        self.last = 0  # rows of the last round launched
        self.pending: tuple[list[list[int]], int] | None = None  # the round in flight: its rows, its slot
        self.taken = 0  # rounds served from a round launched ahead (tests, /metrics-style counts)
        self.wasted = 0  # rounds launched ahead and not asked for

    def round(self, rows: Rows, ahead: bool, greedy: bool = True) -> list[int]:
        """The ids of the round `rows` (one a row of the round that computed them: a round in flight
        at more rows may serve it); with `ahead` (and greedy), the next round is launched before
        they are read, at the row count asked for."""
        took = self._take(rows if greedy else None)
        if took is None:
            took = rows, self._read_back(self.fresh(rows))
        dev, s = took  # the rows the device computed: a row the caller dropped still runs on in them
        nxt = None
        if ahead and greedy and len(dev[0]) == len(rows[0]) and self._room(dev):
            nxt = self._read_back(self.chained())
        ids = self._ids(s)
        if nxt is not None:
            self.pending = (advance(dev, ids, self.spare), nxt)
        return ids

    def chained(self) -> torch.Tensor:
        """Launch the round after the last one, from its ids on the device; where its ids land."""
        return self.chain(self.last)

    def _room(self, rows: Rows) -> bool:
        return all(p + 1 < self.max_len for p, lane in zip(rows[1], rows[2]) if lane != self.spare)

    def _take(self, rows: Rows | None) -> tuple[Rows, int] | None:
        """The round in flight (its rows, its slot) if it is the round `rows` asks for (None: it is
        not), else None; either way it is no longer in flight."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        (tok, pos, lanes), s = pending
        if rows is not None and len(lanes) >= len(rows[2]) and all(
                lane == self.spare or (lanes[r], pos[r], tok[r]) == (lane, rows[1][r], rows[0][r])
                for r, lane in enumerate(rows[2])):
            self.taken += 1
            return pending
        self.wasted += 1
        return None

    def drop(self) -> None:
        """Forget the round in flight (the next round is not it)."""
        self._take(None)

    def _read_back(self, s_out: torch.Tensor) -> int:
        """After a launch: its ids copied to a pinned slot, behind it on the stream."""
        s, self.slot = self.slot, self.slot ^ 1
        self.last = self.count[s] = n = s_out.numel()
        self.h_out[s, :n].copy_(s_out, non_blocking=True)
        if self.events[s] is not None:
            self.events[s].record()
        return s

    def _ids(self, s: int) -> list[int]:
        if self.events[s] is not None:
            self.events[s].synchronize()
        return self.h_out[s, :self.count[s]].tolist()


class EagerRounds:
    """The graphs' launches as eager rounds, for a runner without a decode graph
    (KernelConfig.overlap=True on the CPU: the same logic, run at once, for tests). `body(s_in,
    rows)` is the round's forward -> logits; `rows` its (lane, position) pairs."""

    def __init__(self, body: Callable, spare: int, device: torch.device):
        self.body, self.spare, self.device = body, spare, device
        self.s_in = self.s_out = self.logits = None

    def fresh(self, rows: Rows) -> torch.Tensor:
        self.s_in = torch.tensor([*rows, steps(rows[2], self.spare)], dtype=torch.long, device=self.device)
        self.s_out = torch.zeros(len(rows[0]), dtype=torch.long, device=self.device)
        return self._run()

    def chained(self, n: int) -> torch.Tensor:
        assert n == self.s_out.numel(), "a chained round runs at the rows of the last"
        advance_inputs(self.s_in, self.s_out)
        return self._run()

    def _run(self) -> torch.Tensor:
        self.logits = self.body(self.s_in, list(zip(self.s_in[2].tolist(), self.s_in[1].tolist())))
        torch.argmax(self.logits, -1, out=self.s_out)
        return self.s_out
