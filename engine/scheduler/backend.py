"""What the lane host asks of a backend. The host speaks lanes and token ids; only the backend
touches tensors. the runners (engine/runner/build.py) are the real ones; tests drive the host with a fake."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


def next_cut(pos: int, length: int, rows: int) -> int:
    """End of the cut that starts at `pos`: cut boundaries are absolute multiples of `rows`."""
    return min(length, (pos // rows + 1) * rows)


def cuts(start: int, length: int, rows: int) -> list[tuple[int, int]]:
    """Every cut from `start` to the end of a `length`-token prompt, on the fixed grid."""
    out = []
    while start < length:
        end = next_cut(start, length, rows)
        out.append((start, end))
        start = end
    return out


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers beyond `prefill_step` and `decode`. The host reads these and nothing
    else of the backend's nature, once, when it starts; the defaults are a plain backend's."""

    # mixed cuts end at multiples of this many positions (where a cut's attention computes whole
    # tiles, the tile)
    cut_granule: int = 16
    # the cut sizes a sized cut takes, ascending; None: any multiple of the granule. Where each size
    # has a forward of its own (CUDA graphs), a cut between two sizes costs the larger one.
    cut_sizes: tuple[int, ...] | None = None
    # a cut's rows keep their bits wherever the cut starts and ends (row-invariant products,
    # attention in tiles at absolute positions): the host may size cuts off the grid
    cut_free: bool = False
    # `prefill_many`: several short cuts in one forward, each with the bits it has alone
    batch_cuts: bool = False
    # `decode(..., ahead=True)`: the round launches the next one before returning
    runs_ahead: bool = False
    # `mixed`: a prompt's cut and decode rows in one forward (MixedBackend)
    mixed: bool = False
    # `start_step`/`step_done`/`finish_step`: cuts on SMs of their own beside the rounds (SplitBackend)
    split: bool = False
    # the row counts a decode round runs at, ascending (a round's forward has fixed shapes: CUDA
    # graphs, CPU row tiles); a round runs at the fewest holding its highest lane, since row r
    # carries lane r. None: at its number of streams. What a round costs follows these rows.
    round_sizes: tuple[int, ...] | None = None

    def round_rows(self, lanes: Sequence[int]) -> int:
        """The rows a round of these lanes runs at."""
        return len(lanes) if self.round_sizes is None else round_rows(self.round_sizes, lanes)


def round_rows(sizes: Sequence[int], lanes: Sequence[int]) -> int:
    """The fewest of `sizes` (ascending) holding a round of these lanes: row r carries lane r, so
    its highest lane and every entry; the largest where none does."""
    need = max(len(lanes), max(lanes, default=-1) + 1)
    return next((n for n in sizes if n >= need), sizes[-1])


class Backend(Protocol):
    parallel: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]  # a reply stops at any of them
    caps: Capabilities = Capabilities()

    def prefill_step(self, lane: int, tokens: Sequence[int], start: int, end: int, *,
                     sampling=None, logprobs: list | None = None) -> int | None:
        """Run one cut: write KV rows [start, end) of `lane` for `tokens[start:end]` (rows below
        `start` are already in the lane). On the prompt's last cut (end == len(tokens)) return
        the first token (greedy, or drawn per `sampling`, an engine.scheduler.sampling.SamplingParams, with
        a TokenLogprob appended to `logprobs` when asked); otherwise None. The host passes
        `sampling` only for a sampled or logprobs-asking stream, so a greedy-only backend works. It returns only when the cut's work is done
        (on a GPU: synchronized), because the host times steps to charge the prefill share."""

    def decode(self, lanes: Sequence[int], tokens: Sequence[int], positions: Sequence[int], *,
               sampling=None, logprobs: list | None = None) -> list[int]:
        """One decode round: for each lane, feed `tokens[i]` at `positions[i]` (writing its KV
        row) and return the next token: greedy, or per `sampling[i]` (one SamplingParams per
        entry, only when some stream samples or asks for logprobs; then `logprobs` gets one
        TokenLogprob or None appended per entry). The batch is padded to a fixed shape so a row's
        bits never depend on its neighbours."""


class BatchBackend(Backend, Protocol):
    """A backend that declares `caps.batch_cuts`."""

    def prefill_many(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[int | None]:
        """Each item (lane, tokens, start, end) as `prefill_step` runs it, every cut a short one
        (at most SHORT_ROWS rows), all in one forward, each with the bits it has alone (greedy).
        Returns per item its first token if the cut ends its prompt, else None."""


class MixedBackend(Backend, Protocol):
    """A backend that declares `caps.mixed` (`--prefill-mode mixed`; without it the host runs
    stepped turns). `caps.cut_free`, `cut_granule` and `cut_sizes` say which cuts it takes."""

    def mixed(self, cuts: Sequence[tuple[int, Sequence[int], int, int]], lanes: Sequence[int],
              tokens: Sequence[int], positions: Sequence[int]) -> tuple[list[int | None], list[int]]:
        """One forward: each cut (lane, tokens, start, end) as `prefill_step` runs it and one row
        per decode entry as `decode` runs it, every row with the bits it has in those calls (greedy
        rows only). Returns (per cut its first token if it ends its prompt, else None; the round's
        ids). It returns only when the work is done: the host times it to learn its cost."""


class SplitBackend(Backend, Protocol):
    """A backend that declares `caps.split`: it runs a prompt's cuts on SMs of their own beside its
    decode rounds (`--prefill-mode split`; without it the host steps prompts in turn). The host
    launches cuts in order and lands them in order; `decode` runs while cuts are in flight."""

    def start_step(self, lane: int, tokens: Sequence[int], start: int, end: int) -> None:
        """Launch the cut [start, end) of lane's prompt, as `prefill_step` would run it (the same
        bits), and return at once; it runs after any cut launched before it."""

    def step_done(self) -> bool:
        """Whether the oldest cut launched and not yet finished is done (never blocks)."""

    def finish_step(self) -> int | None:
        """Wait for the oldest cut in flight; the prompt's greedy first token if it was its last
        cut, else None. Raises what the cut raised."""
