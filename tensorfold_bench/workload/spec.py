"""`tfbench load`'s workload flags, checked whole (`from_flags`), and the workload of each level
(`LoadSpec.build`).

Everything that can be checked without a server is checked in `from_flags`: every flag's value and
every line of a dataset file, so bad input is one line and exit 2 before anything launches. Only
the vocabulary waits for the server, so `build` takes it.

`build` is a pure function of (the flags, the level, the vocabulary, the salt): every run and
variant of one level gets the same items, prompts and offsets. Random ids are keyed by the level's
label too, so levels played one after another on one server do not hit each other's cache; `salt`
(e.g. a run's index against a shared --url server) makes every prompt fresh again."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tensorfold_bench.errors import FlagError, WorkloadError
from tensorfold_bench.workload import files, inject as inject_mod, lengths as lengths_mod, readers
from tensorfold_bench.workload.arrivals import ARRIVALS, Arrivals
from tensorfold_bench.workload.ids import block_ids, prompt_ids, rng
from tensorfold_bench.workload.model import Item, Workload

DEFAULT_INPUT_LEN = "256"  # synthetic prompts' own part (after any shared prefix)
DEFAULT_OUTPUT_LEN = "64"


@dataclass(frozen=True)
class Level:
    """One point of the load: an open-loop rate (requests/s), a closed-loop concurrency, or a timed
    trace replayed at a time scale."""

    kind: str  # "rate", "concurrency" or "trace"
    value: float
    label: str  # "rate 2/s", "concurrency 8", "trace x 1"


@dataclass(frozen=True)
class _Unit:
    """A request or a session, before it is an Item: its turns' prompts (or lengths) and outputs."""

    index: int
    turns: tuple[files.Turn, ...]
    line: int = 0  # the file line it came from (0: synthetic)


@dataclass(frozen=True)
class LoadSpec:
    dataset: str = "synthetic"  # "synthetic" or the file as given
    input_len: lengths_mod.Lengths | None = None  # synthetic only
    output_len: lengths_mod.Lengths | None = None  # synthetic; files: where a line gives none
    prefix_groups: int = 0
    prefix_len: int = 0
    turns: int = 1
    think: float = 0.0
    time_scale: float = 1.0
    rates: tuple[float, ...] = ()
    arrivals: Arrivals = Arrivals()
    concurrency: tuple[int, ...] = ()
    requests: int | None = None
    duration: float | None = None
    warmup: int = 0
    inject: inject_mod.Inject | None = None
    seed: int = 0
    data: files.Dataset | None = None  # the file, read and checked

    @property
    def timed(self) -> bool:
        return self.data is not None and self.data.timed

    @property
    def levels(self) -> list[Level]:
        if self.rates:
            return [Level("rate", r, f"rate {r:g}/s") for r in self.rates]
        if self.concurrency:
            return [Level("concurrency", float(c), f"concurrency {c}") for c in self.concurrency]
        return [Level("trace", self.time_scale, f"trace x {self.time_scale:g}")]

    # ---- building ---------------------------------------------------------------------------

    def build(self, level: Level, vocab: int, salt: str = "") -> Workload:
        """The level's items in send order: open loop (rate, trace) by offset, each session's later
        turns right after its first (their offsets None: sent `think` after the previous reply);
        closed loop (concurrency) in order with offsets None, the injects (always timed) last."""
        if vocab < 2:
            raise FlagError("--vocab", f"a vocabulary of {vocab} ids is too small for random prompts")
        key = f"{level.label}|{salt}"
        units, offsets = self._schedule(level)
        items: list[tuple[float, int, Item]] = []  # (its session's turn-0 offset, 0 load / 1 inject, item)
        blocks = block_ids(self.seed, f"{key}|blocks", sorted({h for u in units for t in u.turns for h in t.hash_ids}),
                           files.MOONCAKE_BLOCK, vocab)
        in_lens, out_lens = self._draws(key, units)
        for u, off in zip(units, offsets):
            multi = self.turns > 1  # every unit a session (a ShareGPT one may have fewer turns)
            for k, t in enumerate(u.turns):
                iid = f"s{u.index}.t{k}" if multi else f"r{u.index}"
                prompt, hash_ids = self._prompt(key, u, k, t, in_lens, vocab, blocks)
                out = t.output_len if t.output_len is not None else out_lens[(u.index, k)]
                item = Item(iid, prompt, out, offset=off if k == 0 else None,
                            session=f"s{u.index}" if multi else None, turn=k,
                            think=self.think if k else 0.0, hash_ids=hash_ids, warmup=u.index < self.warmup)
                items.append((off if off is not None else math.inf, 0, item))  # later turns sort with turn 0
        if self.inject:
            for j, off in enumerate(self.inject.offsets(self._end(level, offsets))):
                ids = tuple(prompt_ids(self.seed, f"{key}|inject{j}", self.inject.length, vocab))
                items.append((off, 1, Item(f"i{j}", ids, self.inject.output_len, offset=off, kind="inject")))
        # stable sorts: a session's turns stay in order behind turn 0; at a tie, load before injects
        items.sort(key=(lambda x: x[1]) if level.kind == "concurrency" else (lambda x: (x[0], x[1])))
        return Workload(tuple(i for _, _, i in items), f"{self.describe_source()}; {level.label}; seed {self.seed}",
                        timed=level.kind == "trace")

    def _schedule(self, level: Level) -> tuple[list[_Unit], list[float | None]]:
        """The requests (or sessions) this level sends and their turn-0 offsets."""
        have = None if self.data is None else len(self.data.records)
        cap = self.requests if have is None else min(self.requests or have, have)
        if level.kind == "trace":
            t0 = self.data.records[0].timestamp
            offs = [(r.timestamp - t0) / 1000.0 * self.time_scale for r in self.data.records[:cap]]
            if self.duration is not None:
                offs = [o for o in offs if o < self.duration]
        elif level.kind == "rate":
            offs = self.arrivals.offsets(level.value, seed=self.seed, requests=cap, duration=self.duration)
        else:
            offs = [None] * cap
        return [self._unit(i) for i in range(len(offs))], offs

    def _unit(self, i: int) -> _Unit:
        if self.data is not None:
            r = self.data.records[i]
            return _Unit(i, r.turns[:self.turns] if self.data.fmt == "sharegpt" else r.turns, r.line)
        return _Unit(i, tuple(files.Turn(None, None) for _ in range(self.turns)))

    def _draws(self, key: str, units: list[_Unit]) -> tuple[dict, dict]:
        """Seeded input and output lengths for every (unit, turn) that needs one, drawn in one
        order so that the same units always get the same lengths."""
        need_in = [(u.index, k) for u in units for k, t in enumerate(u.turns) if self.data is None]
        need_out = [(u.index, k) for u in units for k, t in enumerate(u.turns) if t.output_len is None]
        ins = self.input_len.draw(rng(self.seed, f"{key}|input"), len(need_in)) if need_in else []
        outs = self.output_len.draw(rng(self.seed, f"{key}|output"), len(need_out)) if need_out else []
        return dict(zip(need_in, ins)), dict(zip(need_out, outs))

    def _prompt(self, key: str, u: _Unit, k: int, t: files.Turn, in_lens: dict, vocab: int,
                blocks: dict[int, list[int]]) -> tuple[tuple[int, ...] | str, tuple[int, ...]]:
        if self.data is None:  # synthetic: the group's prefix on turn 0, then the item's own ids
            own = prompt_ids(self.seed, f"{key}|r{u.index}.t{k}", in_lens[(u.index, k)], vocab)
            if k == 0 and self.prefix_groups:
                g = u.index % self.prefix_groups
                own = prompt_ids(self.seed, f"{key}|prefix{g}", self.prefix_len, vocab) + own
            return tuple(own), ()
        if t.prompt is None:  # Mooncake: the blocks named by the hash ids, cut to input_len
            ids: list[int] = []
            for h in t.hash_ids:
                ids += blocks[h]
            return tuple(ids[:t.input_len]), t.hash_ids
        if isinstance(t.prompt, tuple) and t.prompt and max(t.prompt) >= vocab:
            raise WorkloadError(f"{self.dataset}:{u.line}: token id {max(t.prompt)} is outside the server's "
                                f"vocabulary of {vocab:,} ids")
        return t.prompt, ()

    def _end(self, level: Level, offsets: list[float | None]) -> float | None:
        """Where an inject every EVERY seconds stops: the duration, else the last load arrival."""
        if self.duration is not None:
            return self.duration
        timed = [o for o in offsets if o is not None]
        return max(timed) if timed else None

    # ---- describing -------------------------------------------------------------------------

    def describe_source(self) -> str:
        if self.data is not None:
            s = self.data.describe()
            if self.output_len is not None:
                s += f", output {self.output_len}" + (" where a line gives none" if self.data.fmt == "jsonl" else "")
        else:
            s = f"synthetic: input {self.input_len}, output {self.output_len}"
            if self.prefix_groups:
                s += f", {self.prefix_groups} prefix groups of {self.prefix_len:,}"
        if self.turns > 1:
            s += f", {self.turns} turns (think {self.think:g} s)"
        return s

    def describe(self) -> str:
        """One line for the receipt: what is sent, when, how many, and the seed."""
        parts = [self.describe_source()]
        if self.rates:
            parts.append(f"{self.arrivals.describe()} at " + ", ".join(f"{r:g}" for r in self.rates) + " /s")
        elif self.concurrency:
            parts.append("closed loop at concurrency " + ", ".join(str(c) for c in self.concurrency))
        else:
            parts.append(f"replayed on its timestamps x {self.time_scale:g}")
        if self.requests is not None:
            parts.append(f"{self.requests:,} {'sessions' if self.turns > 1 else 'requests'}")
        if self.duration is not None:
            parts.append(f"{self.duration:g} s")
        if self.warmup:
            parts.append(f"the first {self.warmup} left out as warm-up")
        if self.inject:
            parts.append(str(self.inject))
        parts.append(f"seed {self.seed}")
        return "; ".join(parts)


# ---- checking the flags ---------------------------------------------------------------------

def _positive(flag: str, x: float, what: str = "a number above 0") -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        raise FlagError(flag, f"{x!r}: must be {what}")
    return float(x)


def _whole(flag: str, x: int, minimum: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise FlagError(flag, f"{x!r}: must be a whole number, at least {minimum}")
    return x


def from_flags(*, dataset: str = "synthetic", fmt: str = "auto", input_len: str | None = None,
               output_len: str | None = None, prefix_groups: int = 0, prefix_len: int = 0, turns: int = 1,
               think: float = 0.0, tokenizer: Path | str | None = None, time_scale: float = 1.0,
               rates: list[float] | None = None, arrival: str = "poisson", burstiness: float = 1.0,
               concurrency: list[int] | None = None, requests: int | None = None, duration: float | None = None,
               warmup: int = 0, inject: str | None = None, seed: int = 0, fallback=None) -> LoadSpec:
    """The load's workload, every flag and file line checked: a FlagError naming the flag, or a
    WorkloadError naming FILE:LINE, before any server starts. `fallback`: what counts text without
    --tokenizer (readers.counter_for)."""
    rates, concurrency = list(rates or []), list(concurrency or [])
    if rates and concurrency:
        raise FlagError("--rate", "give --rate (open loop) or --concurrency (closed loop), not both")
    for r in rates:
        _positive("--rate", r, "requests per second above 0")
    for c in concurrency:
        _whole("--concurrency", c, 1)
    if arrival not in ARRIVALS:
        raise FlagError("--arrival", f"{arrival!r}: expected one of {', '.join(ARRIVALS)}")
    _positive("--burstiness", burstiness)
    if burstiness != 1.0 and arrival != "gamma":
        raise FlagError("--burstiness", "applies to --arrival gamma (the gamma shape; 1 is Poisson)")
    if concurrency and arrival != "poisson":
        raise FlagError("--arrival", "applies to --rate (an open loop); --concurrency is a closed loop")
    if requests is not None:
        _whole("--requests", requests, 1)
    if duration is not None:
        _positive("--duration", duration, "seconds above 0")
    _whole("--warmup", warmup, 0)
    _whole("--turns", turns, 1)
    if not isinstance(think, (int, float)) or isinstance(think, bool) or not math.isfinite(think) or think < 0:
        raise FlagError("--think", f"{think!r}: must be seconds, at least 0")
    if think and turns == 1:
        raise FlagError("--think", "applies to sessions of --turns T > 1 (the wait before each later turn)")
    _whole("--prefix-groups", prefix_groups, 0)
    _whole("--prefix-len", prefix_len, 0)
    if bool(prefix_groups) != bool(prefix_len):
        raise FlagError("--prefix-groups", "give --prefix-groups G and --prefix-len P together (both above 0)")
    _positive("--time-scale", time_scale)
    _whole("--seed", seed, 0)
    if fmt not in files.FORMATS:
        raise FlagError("--format", f"{fmt!r}: expected one of {', '.join(files.FORMATS)}")
    inj = inject_mod.parse(inject) if inject is not None else None
    out = lengths_mod.parse("--output-len", output_len) if output_len is not None else None

    if dataset == "synthetic":
        if fmt != "auto":
            raise FlagError("--format", "applies to a --dataset FILE")
        if time_scale != 1.0:
            raise FlagError("--time-scale", "applies to a timed trace (--dataset FILE with timestamps)")
        spec = LoadSpec(dataset, lengths_mod.parse("--input-len", input_len or DEFAULT_INPUT_LEN),
                        out or lengths_mod.parse("--output-len", DEFAULT_OUTPUT_LEN), prefix_groups, prefix_len,
                        turns, float(think), 1.0, tuple(float(r) for r in rates), Arrivals(arrival, float(burstiness)),
                        tuple(concurrency), requests, duration, warmup, inj, seed)
    else:
        for flag, given in (("--input-len", input_len is not None), ("--prefix-groups", prefix_groups)):
            if given:
                raise FlagError(flag, "applies to --dataset synthetic (a file gives its prompts)")
        arrivals = Arrivals(arrival, float(burstiness))
        most = requests  # no level sends more than this: the rest of the file is checked, not tokenized
        if most is None and rates and duration is not None:
            most = max(len(arrivals.offsets(r, seed=seed, duration=duration)) for r in rates)
        data = readers.read(Path(dataset), fmt, tokenizer=Path(tokenizer) if tokenizer else None, output_len=out,
                            turns=turns, limit=most, fallback=None if tokenizer else fallback)
        if data.fmt == "mooncake" and out is not None:
            raise FlagError("--output-len", f"{dataset} is a Mooncake trace: each line gives its output_length")
        if data.fmt != "sharegpt" and turns > 1:
            raise FlagError("--turns", f"applies to --dataset synthetic and ShareGPT files, not {data.fmt}")
        if data.timed and rates:
            raise FlagError("--rate", f"{dataset} is a timed trace: it replays on its timestamps "
                                      "(--time-scale F stretches it; --concurrency N plays it closed-loop)")
        if time_scale != 1.0 and not (data.timed and not concurrency):
            raise FlagError("--time-scale", "applies to a timed trace replayed on its timestamps")
        spec = LoadSpec(dataset, None, out, 0, 0, turns, float(think), float(time_scale),
                        tuple(float(r) for r in rates), arrivals, tuple(concurrency),
                        requests, duration, warmup, inj, seed, data)

    if not spec.timed and not rates and not concurrency:
        raise FlagError("--rate", "give --rate R[,R...] (open loop) or --concurrency N[,N...] (closed loop)")
    if spec.data is None and rates and requests is None and duration is None:
        raise FlagError("--requests", "an open loop needs --requests N or --duration S (when to stop)")
    if spec.data is None and concurrency and requests is None:
        raise FlagError("--requests", "a closed loop (--concurrency) needs --requests N (how many to send)")
    if warmup:
        for level in spec.levels:  # how many each level sends is known now (offsets need no vocabulary)
            n = len(spec._schedule(level)[1])
            if warmup >= n:
                raise FlagError("--warmup", f"{warmup} warm-up requests leave none of the {n} measured"
                                            + (f" at {level.label}" if len(spec.levels) > 1 else ""))
    if inj and duration is not None and any(t >= duration for t in inj.times):
        raise FlagError("--inject", f"{max(inj.times):g} s is past --duration {duration:g}: it would never be sent")
    if inj and inj.every is not None and concurrency and duration is None:
        raise FlagError("--inject", "an inject every EVERY seconds in a closed loop needs --duration S "
                                    "(or list the times: LEN@T1,T2,...)")
    return spec
