"""The request model every workload produces and `tfbench load` plays.

A workload is a tuple of `Item`s in send order. An item's `offset` is its scheduled send time in
seconds from the run's start: a trace gives it, an arrival process (`arrivals.py`) fills it in,
and a closed loop (`--concurrency`) leaves it None (sent when a slot frees). A multi-turn
session is several items with one `session` id and rising `turn`: turn k > 0 is sent `think`
seconds after turn k-1's reply ended, with the prompt history (turn k-1's prompt, its reply's
token ids, then this item's `prompt`), so a session's later prompts depend on the replies,
which are exact, and are the same in every run whose replies are equal."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    """One request of a workload: what to send and, where known, when."""

    id: str  # unique in the workload, e.g. "r17" or "s3.t2"; receipts and hashes are keyed by it
    prompt: tuple[int, ...] | str  # token ids, or text (sent as text; lengths need a tokenizer)
    output_len: int  # max_tokens, sent with ignore_eos
    offset: float | None = None  # seconds from the run's start; None: the arrival process or the closed loop decides
    session: str | None = None  # multi-turn: the session's id; None: a single request
    turn: int = 0  # 0 for the first turn (and for single requests)
    think: float = 0.0  # multi-turn: seconds after the previous turn's reply ended
    kind: str = "load"  # "load" (the background traffic) or "inject" (a cold long prompt sent into it)
    hash_ids: tuple[int, ...] = ()  # Mooncake traces: ids of 512-token blocks; equal ids, equal prefix
    warmup: bool = False  # sent like the rest, left out of the figures

    @property
    def prompt_len(self) -> int | None:
        """Prompt tokens when the prompt is ids; None for text (unknown without a tokenizer)."""
        return len(self.prompt) if isinstance(self.prompt, tuple) else None


@dataclass(frozen=True)
class Workload:
    """The items in send order, and one line saying where they came from (for the receipt)."""

    items: tuple[Item, ...]
    source: str  # e.g. "synthetic: input 200, output 64, seed 0" or "mooncake trace.jsonl (1,000 lines)"
    timed: bool = False  # True when the items carry their own offsets (a trace): no arrival process applies
