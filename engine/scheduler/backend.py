"""What the lane host asks of a backend. The host speaks lanes and token ids; only the backend
touches tensors. `ModelRunner` is the real one; tests drive the host with a fake."""
from __future__ import annotations

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


class Backend(Protocol):
    parallel: int
    max_model_len: int
    vocab_size: int
    eos_token_id: int  # the first of eos_token_ids
    eos_token_ids: tuple[int, ...]  # a reply stops at any of them (optional: defaults to (eos_token_id,))

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


class MixedBackend(Backend, Protocol):
    """A backend that can carry a prompt's cut and decode rows in one forward (`--prefill-mode
    mixed`; optional: the host runs stepped turns with a backend that has no `mixed`)."""

    # Whether a cut's rows keep their bits wherever the cut starts and ends (row-invariant
    # products, attention in tiles at absolute positions): then the host may size cuts off the
    # grid; otherwise every cut it hands `mixed` is a grid cut.
    cut_free: bool
    # Mixed cuts end at multiples of this many positions (optional, default 16): where a cut's
    # attention computes whole tiles, the tile.
    cut_granule: int
    # The cut sizes a sized cut takes, ascending (optional, default None: any multiple of the
    # granule): where each size has a forward of its own (CUDA graphs), a cut between two sizes
    # costs the larger one.
    cut_sizes: tuple[int, ...] | None

    def mixed(self, cuts: Sequence[tuple[int, Sequence[int], int, int]], lanes: Sequence[int],
              tokens: Sequence[int], positions: Sequence[int]) -> tuple[list[int | None], list[int]]:
        """One forward: each cut (lane, tokens, start, end) as `prefill_step` runs it and one row
        per decode entry as `decode` runs it, every row with the bits it has in those calls (greedy
        rows only). Returns (per cut its first token if it ends its prompt, else None; the round's
        ids). It returns only when the work is done: the host times it to learn its cost."""


class SplitBackend(Backend, Protocol):
    """A backend that runs a prompt's cuts on SMs of their own beside its decode rounds
    (`--prefill-mode split`; optional: without these the host steps prompts in turn). The host
    launches cuts in order and lands them in order; `decode` runs while cuts are in flight."""

    def start_step(self, lane: int, tokens: Sequence[int], start: int, end: int) -> None:
        """Launch the cut [start, end) of lane's prompt, as `prefill_step` would run it (the same
        bits), and return at once; it runs after any cut launched before it."""

    def step_done(self) -> bool:
        """Whether the oldest cut launched and not yet finished is done (never blocks)."""

    def finish_step(self) -> int | None:
        """Wait for the oldest cut in flight; the prompt's greedy first token if it was its last
        cut, else None. Raises what the cut raised."""
