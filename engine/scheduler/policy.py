"""The lane host's policy: which prompt fills first, when a long prompt may take a step, whether
the clock must be read, and which streams are paused. It decides on plain `Sequence`s and
numbers; engine/scheduler/host.py executes its decisions and never re-derives them.

Each turn the host asks, in order:
  0. `pick_lane(...)`: the free lane a waiting prompt goes to (the prompt cache, then adjacency);
  1. `fill_order(prompts)`: foreground before background, then aged (waited past `aging_s`), then
     fewest rows left, then arrival;
  2. `goes_whole(seq)`: a short prompt (at most SHORT_ROWS rows to fill when admitted; every
     prompt in `whole` mode) runs to its end, back to back, before the next round; a long
     prompt's last rows keep stepping under the share, charged like its other cuts;
  3. `long_step(...)`: a longer prompt takes one step if it owes the decoders nothing;
  4. `round_timed(...)`: one decode round for every `runnable` stream, timed only to pay debt.

The prefill share p (`PrefillBudget`): a long step that took t seconds while streams could decode
owes them t (1 - p) / p seconds of decode rounds before the next long step. The clock is read
only to time such a step and to pay its debt down, so with no prompt waiting the loop is the
plain decode loop. Only the order of whole steps changes, never a cut: the bits do not depend on p.

Mixed mode (`--prefill-mode mixed`): while prompts wait and streams decode, each forward carries
one prompt's cut and one row for every runnable stream (`mixed_cut`): a short prompt's next cut on
the grid first, else the first long prompt's cut sized so the forward takes about
`--mixed-budget` (engine/scheduler/forward_cost.py, learned from timed forwards). So a decoder
waits at most one forward for its next token, and the cut shrinks as the prompt's context grows.
A cut leaves the grid only where the backend says a row keeps its bits wherever its cut falls
(`cut_free`), and never enters the prompt's last grid cut.
"""
from __future__ import annotations

import logging
import math
from typing import Callable

from engine.config import SHORT_ROWS, EngineConfig
from engine.scheduler.backend import next_cut
from engine.scheduler.forward_cost import ForwardCost
from engine.scheduler.sequence import Sequence

log = logging.getLogger("tfengine.policy")

DEBT_CAP_S = 3600.0  # debt saturates here: a tiny share can never grow it without bound
MIN_SHARE = 0.01


def checked_share(p: float) -> float:
    """A share below 0.01, NaN or infinite falls back to 1, with one warning."""
    if not isinstance(p, (int, float)) or math.isnan(p) or math.isinf(p) or p < MIN_SHARE or p > 1:
        log.warning("prefill share %r is outside [%.2f, 1]: using 1 (plain alternation)", p, MIN_SHARE)
        return 1.0
    return float(p)


class PrefillBudget:
    """The decoders' claim on wall time while long prompts step at share p: debt is charged by
    a timed long step, paid by timed decode rounds, and forgiven when there is no one to owe."""

    def __init__(self, share: float):
        self.share = checked_share(share)
        self.debt = 0.0

    @property
    def owes(self) -> bool:
        return self.debt > 0.0

    def times_step(self, decoders_waiting: bool) -> bool:
        """Read the clock around a long step? Only a step taken while streams can decode builds
        debt, and only p < 1 needs it."""
        return decoders_waiting and self.share < 1.0

    def charge(self, step_s: float) -> None:
        self.debt = min(DEBT_CAP_S, self.debt + step_s * (1.0 - self.share) / self.share)

    def pay(self, round_s: float) -> None:
        self.debt = max(0.0, self.debt - round_s)

    def forgive(self) -> None:
        self.debt = 0.0

    def settle(self, prompts_waiting: bool, decoders_waiting: bool) -> None:
        """Waiting prompts owe runnable decoders: with either side gone there is no debt (and
        so no clock read)."""
        if not (prompts_waiting and decoders_waiting):
            self.debt = 0.0


class LanePolicy:
    def __init__(self, cfg: EngineConfig, clock: Callable[[], float], granule: int = 16,
                 sizes: tuple[int, ...] | None = None):
        """granule: mixed cuts end at multiples of this many positions (the backend's `cut_granule`:
        where a cut's attention pads whole tiles, the tile, so a cut never pays for rows it has not);
        sizes: the cut sizes the backend's forwards run at (its `cut_sizes`), which the budget picks among."""
        self.budget = PrefillBudget(cfg.prefill_share)
        self.whole = cfg.prefill_mode == "whole"
        self.mixed = cfg.prefill_mode == "mixed"
        # cuts up to BATCH_ROWS (engine/scheduler/host.py) or a grid cut, whichever is larger
        self.granule = max(1, min(granule, cfg.prefill_rows))
        self.cost = ForwardCost(cfg.mixed_budget_ms / 1000.0, granule=self.granule, most=max(cfg.prefill_rows, 1024),
                                sizes=tuple(sizes) if sizes else None)
        self.aging_s = cfg.aging_s
        self.out_queue = cfg.out_queue
        self.clock = clock
        self.prompt_cache, self.rows = cfg.prompt_cache, cfg.prefill_rows

    # ---- pausing: the one rule, asked by the host and the server -----------------------------
    def is_paused(self, seq: Sequence) -> bool:
        """A stream whose client left `out_queue` tokens undrained gets no rounds."""
        return seq.undrained >= self.out_queue

    def runnable(self, seq: Sequence) -> bool:
        return not self.is_paused(seq) and not seq.cancel_requested

    def resumes(self, seq: Sequence) -> bool:
        """The client just drained one token: did that take the stream off pause? (Then the host
        must look again.)"""
        return seq.undrained == self.out_queue - 1

    # ---- prompts -------------------------------------------------------------------------------
    def fill_order(self, prompts: list[Sequence]) -> list[Sequence]:
        """Foreground before background, then aged, then fewest rows left, then arrival."""
        if len(prompts) < 2:
            return prompts
        now = self.clock()
        return sorted(prompts, key=lambda s: (s.background, now - s.arrival <= self.aging_s,
                                              s.rows_left, s.arrival, s.id))

    def goes_whole(self, seq: Sequence) -> bool:
        """Short by what it had to fill when admitted, not by what is left: otherwise a long prompt's
        last SHORT_ROWS rows would run uncharged and back to back, taking the decoders' share at the
        end of its fill and leaving them a pause of several cuts there."""
        return self.whole or len(seq.prompt) - seq.cached <= SHORT_ROWS

    def long_step(self, long_: list[Sequence], prompts_waiting: bool,
                  decoders_waiting: bool) -> tuple[Sequence, bool] | None:
        """The long prompt to step now and whether to time the step (charge the budget), or
        None while the decoders are still owed. `long_` is in fill order."""
        self.budget.settle(prompts_waiting, decoders_waiting)
        if not long_ or self.budget.owes:
            return None
        return long_[0], self.budget.times_step(decoders_waiting)

    def round_timed(self, prompts_waiting: bool) -> bool:
        """Time this decode round? Only to pay debt down, and debt needs a prompt waiting; in mixed
        mode, while a prompt waits, to learn the forward's cost of the decode rows alone."""
        if self.mixed and prompts_waiting:
            return True
        self.budget.settle(prompts_waiting, True)
        return self.budget.owes

    def mixed_cut(self, ordered: list[Sequence], cut_free: bool) -> tuple[Sequence, int, int, bool] | None:
        """The cut a mixed forward carries: (prompt, start, end, sized), `sized` when the budget
        chose it (the host then times the forward to learn its cost), or None where the forward
        must wait for a timed round of the decode rows alone (the cost model's base). `ordered`
        is in fill order: a short prompt's next grid cut goes first, as short prompts go first in
        every mode."""
        short = next((s for s in ordered if self.goes_whole(s)), None)
        if short is not None:
            return short, short.filled, next_cut(short.filled, len(short.prompt), self.rows), False
        if not ordered:
            return None
        seq = ordered[0]
        grid = next_cut(seq.filled, len(seq.prompt), self.rows)
        last = (len(seq.prompt) - 1) // self.rows * self.rows  # the prompt's last grid cut runs whole
        if not cut_free or last <= seq.filled:
            return seq, seq.filled, grid, False
        if not self.cost.knows_base:
            return None
        g, start = self.granule, seq.filled
        end = (start + self.cost.rows(start, last - start)) // g * g  # at a multiple of the granule
        end = min(last, max(end, (start // g + 1) * g))
        return seq, start, end, True

    # ---- lanes -------------------------------------------------------------------------------------
    def pick_lane(self, free: list[int], lane_rows: dict[int, list[int]], prompt: list[int]) -> tuple[int, int]:
        """The free lane holding the longest prefix of `prompt` (`free` in the order the lanes were
        freed, `lane_rows` what each still holds), and how many rows to reuse: rounded down to a cut
        boundary, so the resumed prompt runs the same cuts as a cold one, and short of the last cut,
        which must run to give the first token. Ties: the lowest lane holding no complete cut
        (streams in adjacent lanes share one run of decode attention: 4 streams in lanes 6,7,0,1
        cost ~0.5 ms a round more than in 0-3 on two CPU cores), else the lane
        freed longest ago (its cut is the oldest to lose)."""
        if not self.prompt_cache:
            return min(free), 0
        prefix = {lane: common_prefix(lane_rows.get(lane, ()), prompt) for lane in free}

        def rank(i: int) -> tuple:
            keeps = len(lane_rows.get(free[i], ())) >= self.rows
            return -prefix[free[i]], keeps, i if keeps else free[i]
        best = free[min(range(len(free)), key=rank)]
        last_cut_start = (len(prompt) - 1) // self.rows * self.rows
        reuse = min(prefix[best] // self.rows * self.rows, last_cut_start)
        return best, max(reuse, 0)


def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
