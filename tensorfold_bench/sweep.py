"""The `sweep` scenario (concurrent decode): does anything else get slower?

At each level L of `levels` (1, 2, 4, 8), for each cell c of `cells`, `reps` times: L streams
start together, stream s sending prompt P(c, s) (seeded token ids, `prompt_tokens` long) and
generating `tokens` tokens with `ignore_eos`. One such burst is a *batch*:

    aggregate tok/s = all tokens generated / (last token time - first send time)

The median over reps is the cell's figure; the median over cells is the level's figure for the
run, `tok_s@L`. Prompt P(c, s) is the same at every level, rep and variant, so its reply must
be too (greedy decoding is exact whatever the batch): each prompt's token hash is compared
across reps, levels and runs, and a prompt whose replies differ is flagged with the cells
where they differ. The engine's `--parallel` must be at least the largest level (the harness
adds `--parallel max(levels)` to a variant that does not set it, and checks `/v1/engine`).

Reps of a cell run on the same server, so from the second rep on the prompt cache may hold the
prompts: every variant sees the same, and the median over reps is the warm figure.
"""
from __future__ import annotations

import asyncio
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable

from tensorfold_bench import exactness
from tensorfold_bench.client import Request, StreamRecord, new_record, stream
from tensorfold_bench.errors import FlagError
from tensorfold_bench.scenario import http_client, prompt_ids


@dataclass(frozen=True)
class SweepScript:
    levels: tuple[int, ...] = (1, 2, 4, 8)
    tokens: int = 256
    cells: int = 4
    reps: int = 3
    prompt_tokens: int = 200
    seed: int = 0
    timeout_s: float = 900.0  # per batch

    def __post_init__(self):
        if not self.levels or any(l < 1 for l in self.levels):
            raise FlagError("--levels", "each level must be a positive stream count")
        for flag, v in (("--tokens", self.tokens), ("--cells", self.cells), ("--reps", self.reps),
                        ("--prompt-tokens", self.prompt_tokens)):
            if v < 1:
                raise FlagError(flag, f"must be at least 1, not {v}")

    @property
    def max_level(self) -> int:
        return max(self.levels)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SweepScript":
        return cls(**{**d, "levels": tuple(d["levels"])})


def parse_levels(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(","):
        try:
            v = int(part.strip())
        except ValueError:
            raise FlagError("--levels", f"{part.strip()!r} is not a stream count (e.g. 1,2,4,8)") from None
        if v < 1:
            raise FlagError("--levels", f"{v} is not a positive stream count")
        out.append(v)
    if len(set(out)) != len(out):
        raise FlagError("--levels", f"{text!r} repeats a level")
    return tuple(out)


def figure(level: int) -> str:
    return f"tok_s@{level}"


def prompt_key(cell: int, stream_i: int) -> str:
    return f"c{cell}s{stream_i}"


def cell_prompts(script: SweepScript, cell: int, level: int, vocab: int) -> list[list[int]]:
    return [prompt_ids(script.seed, "sweep:" + prompt_key(cell, s), script.prompt_tokens, vocab)
            for s in range(level)]


@dataclass
class Batch:
    """One burst of `level` streams, reduced to what the tables need (raw times are kept too)."""

    level: int
    cell: int
    rep: int
    tok_s: float | None  # None when a stream failed or came short
    tokens: int
    wall_s: float | None
    hashes: list[str | None]  # per stream, 12 hex, in stream order
    errors: list[str] = field(default_factory=list)
    sent: list[float | None] = field(default_factory=list)
    last_token: list[float | None] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def reduce_batch(level: int, cell: int, rep: int, recs: list[StreamRecord], tokens: int) -> Batch:
    """Aggregate tok/s of one burst: all tokens / (last token time - first send time)."""
    errors, hashes = [], []
    for i, r in enumerate(recs):
        ids = exactness.known_ids(r.token_ids)
        if ids is not None and ids:
            hashes.append(exactness.token_hash(ids)[:exactness.SHORT])
        else:
            hashes.append(exactness.short(r.server_sha))
        if r.error:
            errors.append(f"stream {i}: {r.error}")
        elif len(r.token_times) != tokens:
            errors.append(f"stream {i}: {len(r.token_times)} of {tokens} tokens")
    n = sum(len(r.token_times) for r in recs)
    sends = [r.sent for r in recs if r.sent is not None]
    lasts = [r.token_times[-1] for r in recs if r.token_times]
    wall = (max(lasts) - min(sends)) if sends and lasts else None
    tok_s = n / wall if wall and not errors else None
    return Batch(level, cell, rep, tok_s, n, wall, hashes, errors, [r.sent for r in recs],
                 [r.token_times[-1] if r.token_times else None for r in recs])


async def play_batch(url: str, prompts: list[list[int]], tokens: int, model: str = "default",
                     timeout_s: float = 900.0) -> list[StreamRecord]:
    """All streams of one burst, started together."""
    reqs = [Request(f"s{i}", p, max_tokens=tokens, ignore_eos=True) for i, p in enumerate(prompts)]
    recs = [new_record(r) for r in reqs]
    async with http_client() as client:
        tasks = [asyncio.create_task(stream(client, url, q, r, model)) for q, r in zip(reqs, recs)]
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for r, t in zip(recs, tasks):
        if t in pending and not r.error:
            r.error = f"not done after {timeout_s:.0f} s"
    return recs


@dataclass
class SweepRun:
    """One run (one fresh server) of the sweep: every batch, and each level's figure."""

    variant: str
    batches: list[Batch] = field(default_factory=list)

    def cell_figure(self, level: int, cell: int) -> float | None:
        v = [b.tok_s for b in self.batches if b.level == level and b.cell == cell and b.tok_s is not None]
        return statistics.median(v) if v else None

    def level_figure(self, level: int) -> float | None:
        cells = sorted({b.cell for b in self.batches if b.level == level})
        v = [f for f in (self.cell_figure(level, c) for c in cells) if f is not None]
        return statistics.median(v) if v else None

    def figures(self) -> dict[str, float | None]:
        levels = sorted({b.level for b in self.batches})
        return {figure(l): self.level_figure(l) for l in levels}

    def errors(self) -> list[str]:
        return [f"level {b.level} cell {b.cell} rep {b.rep}: {e}" for b in self.batches for e in b.errors]

    def to_dict(self) -> dict:
        return {"variant": self.variant, "figures": self.figures(),
                "batches": [b.to_dict() for b in self.batches]}

    @classmethod
    def from_dict(cls, d: dict) -> "SweepRun":
        return cls(d["variant"], [Batch(**b) for b in d["batches"]])


async def play_sweep(url: str, script: SweepScript, vocab: int, variant: str, model: str = "default",
                     progress: Callable[[str], None] | None = None) -> SweepRun:
    run = SweepRun(variant)
    for level in script.levels:
        for cell in range(script.cells):
            prompts = cell_prompts(script, cell, level, vocab)
            for rep in range(script.reps):
                recs = await play_batch(url, prompts, script.tokens, model, script.timeout_s)
                b = reduce_batch(level, cell, rep, recs, script.tokens)
                run.batches.append(b)
                if progress:
                    tok = "failed" if b.tok_s is None else f"{b.tok_s:.1f} tok/s"
                    progress(f"{variant}: {level} streams, cell {cell + 1}/{script.cells}, "
                             f"rep {rep + 1}/{script.reps}: {tok}")
    return run


@dataclass
class HashCheck:
    """Each prompt's reply across every batch of every run: equal, or flagged."""

    prompts: int
    replies: int
    equal: int  # replies equal to their prompt's reference reply
    reference: dict[str, str | None]  # prompt key -> the reference hash
    flagged: list[str]  # "c0s1: level 8 cell 0 rep 2 of new (run 3): abc != def"

    @property
    def ok(self) -> bool:
        return not self.flagged

    def summary(self) -> str:
        return f"{self.equal} of {self.replies} replies equal" + (
            "" if self.ok else f"; {len(self.flagged)} differ")

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def check_hashes(runs: list[SweepRun], reference_run: int = 0,
                 expected: dict[str, str] | None = None) -> HashCheck:
    """Compare every reply with its prompt's reference: `expected` (a file of accepted hashes)
    when given, else the first reply to that prompt in `runs[reference_run]` (the first base
    run), else in any run."""
    seen: dict[str, list[tuple[int, Batch, str | None]]] = {}
    for ri, run in enumerate(runs):
        for b in run.batches:
            for s, h in enumerate(b.hashes):
                seen.setdefault(prompt_key(b.cell, s), []).append((ri, b, h))
    ref: dict[str, str | None] = {}
    for key, obs in seen.items():
        if expected and key in expected:
            ref[key] = expected[key]
            continue
        pref = [h for ri, _, h in obs if ri == reference_run and h] or [h for _, _, h in obs if h]
        ref[key] = pref[0] if pref else None
    equal, replies, flagged = 0, 0, []
    for key in sorted(seen):
        for ri, b, h in seen[key]:
            replies += 1
            if h is not None and h == ref[key]:
                equal += 1
            else:
                flagged.append(f"{key}: level {b.level} cell {b.cell} rep {b.rep} of "
                               f"{runs[ri].variant} (run {ri + 1}): {h} != {ref[key]}")
    return HashCheck(len(seen), replies, equal, ref, flagged)
