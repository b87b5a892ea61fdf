"""Workload files, read and checked whole before any server starts: JSONL prompts, ShareGPT JSON and
Mooncake traces. Each reader gives `Record`s (a request, or a session of turns, with the line it
came from); `LoadSpec.build` turns them into items once the server's vocabulary is known.
Every malformed line is one WorkloadError starting FILE:LINE:."""
from __future__ import annotations

from dataclasses import dataclass

MOONCAKE_BLOCK = 512  # tokens per Mooncake hash id
FORMATS = ("auto", "jsonl", "sharegpt", "mooncake")


@dataclass(frozen=True)
class Turn:
    """One request of a record: a prompt (ids or text), or a Mooncake length and blocks."""

    prompt: tuple[int, ...] | str | None  # None: a Mooncake item, built from hash_ids
    output_len: int | None  # None: --output-len decides
    input_len: int | None = None  # Mooncake: the prompt's length, the last block cut to it
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Record:
    line: int  # where it starts in the file (1-based)
    turns: tuple[Turn, ...]  # one, or a session's turns in order
    timestamp: float | None = None  # milliseconds (timed traces)


@dataclass(frozen=True)
class Dataset:
    path: str
    fmt: str  # jsonl, sharegpt or mooncake
    records: tuple[Record, ...]
    timed: bool  # the records carry timestamps: replayed on them
    skipped: int = 0  # entries with nothing to send (ShareGPT: no human turn with a reply)
    entries: int | None = None  # entries with something to send, kept or not (None: all kept)
    counted_by: str | None = None  # the tokenizer that made text ids and counted text replies (None: none did)

    def describe(self) -> str:
        n = len(self.records) if self.entries is None else self.entries
        s = f", {self.skipped:,} skipped" if self.skipped else ""
        s += f", the first {len(self.records):,} read" if n > len(self.records) else ""
        by = f", text counted by {self.counted_by}" if self.counted_by else ""
        return f"{self.fmt} {self.path} ({n:,} {'conversations' if self.fmt == 'sharegpt' else 'lines'}{s}){by}"
