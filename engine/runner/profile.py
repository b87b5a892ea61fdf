"""A cost profile: the real runner's forwards timed in one sitting, for the simulator's virtual clock.

    tfengine profile --model qwen3-8b --device cuda [--out FILE] [--quick]

Builds the runner(s) a device serves with (dummy weights, loaded once and shared), times each kind
of call the lane host makes over a grid sized for the device, and writes one small JSON file of
raw samples (schema `tfbench.profile/2`, rounds counted by the rows they ran at; fitting is the
simulator's job when it loads one). A round's `n` is the rows its forward ran at (the runner's
padded shape, backend.Capabilities.round_sizes), which is what its products cost, however few
streams it carried; `keys` the sum of each stream's position + 1, `longest` the longest stream's:
- `prefill`   [rows, start, s]: one `prefill_step` cut of `rows` rows whose first is at `start`;
- `decode`    [n, keys, longest, s]: one `decode` round;
- `decode_ahead` [n, keys, longest, s]: one round of a chain the host asks to run ahead (no prompt
  waiting: `decode(..., ahead=True)`, each fed the last one's ids), where the runner runs rounds
  ahead (CUDA's graphs): the host's part of a round hides under the next one;
- `prefill_many` [prompts, rows, s]: short prompts from position 0 filled in one forward;
- `mixed`     [rows, start, n, keys, longest, s]: one `mixed` forward, a cut beside a round;
- `split`     [decode_sms, rows, start, n, keys, longest, cut_s, round_s]: a cut launched with
  `start_step` while rounds run back to back on the decode partition (cut: launch to the first
  `step_done` after a round, as the host sees it; round: the median round beside it);
- `split_round` [decode_sms, n, keys, longest, s]: a round on the decode partition with no cut;
- `fill`      [rows, start, since, s]: the longest prompt filled cut by cut, back to back, as a
  whole fill runs (`since`: seconds from the fill's first cut to this one's start), after an idle
  second; twice. A device slows under a sustained fill (its clocks follow its power), which the
  prefill grid's short bursts do not see;
- `host`      [["turn", s], ["token", s]]: the real LaneHost's own time a turn outside backend
  calls, and the extra per token it emits (a least-squares line over its turns, per chunk).
Every `s` is one call's wall time with the device synchronized, as the host sees it; each point
is repeated, one row a repeat, so a profile carries its own spread. A kind the device or engine
cannot run is an empty list, and `notes` says why.

The runners share one set of weights and are built one after another, each freed before the next
(their KV caches would not fit together): a long-context runner at a few lanes (prompt cuts up to
the longest prompt, rounds beside it), a wide one at many lanes and short contexts (rounds up to
the sweep's 64 streams, short prompts together, the host), then the split and mixed runners.
"""
from __future__ import annotations

import gc
import json
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from engine.config import Toolchain
from engine.scheduler.host import BATCH_ROWS

SCHEMA = "tfbench.profile/2"
KINDS = ("prefill", "decode", "decode_ahead", "prefill_many", "mixed", "split", "split_round", "host", "fill")


@dataclass(frozen=True)
class ProfileConfig:
    """What to profile and how long to spend. None: the device's default (`sized`)."""

    model: str = "tiny"
    device: str = "cpu"
    dtype: str | None = None
    quick: bool = False
    longest: int | None = None  # the longest prompt (keys) the long runner's grid reaches
    wide: int | None = None  # lanes of the wide runner (rounds up to this many streams)
    wide_len: int | None = None  # the wide runner's tokens per lane
    prefill_rows: int | None = None
    split_sms: tuple[int, ...] | None = None  # decode partitions measured (cuda)
    repeats: int | None = None
    budget_s: float | None = None  # past it, the kinds not yet measured are left empty (notes say so)
    seed: int = 0
    cpu_isa: str = "native"
    threads: int | None = None
    toolchain: Toolchain = field(default_factory=Toolchain)  # the CPU kernels' compilers (the CLI reads them)

    def sized(self) -> "ProfileConfig":
        cuda = self.device != "cpu"
        rows = self.prefill_rows or (1024 if cuda else 256)
        quick = self.quick
        return replace(
            self, prefill_rows=rows,
            longest=self.longest or (32768 if cuda else 4096),
            wide=self.wide or (64 if cuda else 8),
            wide_len=self.wide_len or (4096 if cuda else 1024),
            split_sms=self.split_sms if self.split_sms is not None else ((24, 32, 40, 56) if cuda else ()),
            repeats=self.repeats or (3 if quick or not cuda else 5),
            budget_s=self.budget_s or ((240 if quick else 900) if cuda else (60 if quick else 300)))

    def check(self) -> None:
        from engine.config import ConfigError
        for flag, v in (("--longest", self.longest), ("--wide", self.wide), ("--wide-len", self.wide_len),
                        ("--prefill-rows", self.prefill_rows), ("--repeats", self.repeats)):
            if v is not None and v < 1:
                raise ConfigError(f"{flag} must be at least 1, not {v}")
        if self.budget_s is not None and not (self.budget_s > 0):
            raise ConfigError(f"--budget must be a positive number of seconds, not {self.budget_s}")
        for n in self.split_sms or ():
            if n < 8 or n % 8:
                raise ConfigError(f"--split-sms: each partition must be a multiple of 8 SMs, not {n}")
        if self.split_sms and self.device == "cpu":
            raise ConfigError("--split-sms is for --device cuda (split SMs run on a GPU only)")
        if self.device == "cpu" and self.dtype is None:
            raise ConfigError("a CPU profile needs its --dtype (tfengine profile passes the one serve picks here)")


@dataclass
class Grid:
    """The points each kind is measured at, from the sized config."""

    prefill: list[tuple[int, int]]  # (rows, start)
    decode_long: list[tuple[int, int]]  # (streams, context of each) on the long runner
    decode_wide: list[tuple[int, int]]  # the same on the wide runner
    many: list[tuple[int, int]]  # (prompts, rows each)
    mixed: list[tuple[int, int, int, int]]  # (rows, start, streams, context)
    split: list[tuple[int, int, int]]  # (start, streams, context): full cuts
    split_round: list[tuple[int, int]]  # (streams, context)
    host: list[int]  # streams of each host workload

    @staticmethod
    def of(c: ProfileConfig, cuda: bool) -> "Grid":
        r, L, q = c.prefill_rows, c.longest, c.quick
        starts = sorted({s // r * r for s in [0, *(L * k // 8 for k in range(1, 8)), L - r]} | {r})
        small = [n for n in (16, 64, 128, 256, 512) if n < r]
        prefill = [(r, s) for s in starts] + [(n, s) for n in small for s in (0, starts[len(starts) // 2], starts[-1])]
        ctx_long = [16, 1024, L // 4, L // 2, L - 1] if cuda else [16, L // 4, L // 2, L - 1]
        long_streams = [1, 2, 3, 4]
        wide_streams = sorted({n for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64) if n <= c.wide} | {c.wide})
        if q:
            wide_streams = [n for n in wide_streams if n in (1, 2, 4, 8, 16, 32, 64, c.wide)]
        ctx_wide = sorted({16, c.wide_len // 8, c.wide_len // 4, c.wide_len // 2, c.wide_len - 1})
        # the host fills at most BATCH_ROWS rows together (and one prompt past them)
        many = [(p, n) for p in (1, 2, 3, 4, 6, 8, 16, 32, 64) if p <= c.wide
                for n in (16, 32, 64, 128, 256, 512) if p * n <= BATCH_ROWS + 512 and not (q and n in (32, 128))]
        mix_rows = [n for n in (64, 128, 256, 512, r) if n <= r]
        mixed = [(n, s, k, 1024 if cuda else 64) for n in mix_rows for s in (0, starts[len(starts) // 2], starts[-1])
                 for k in (1, 3)]
        split = [(s, k, 1024) for s in starts[:: 2 if q else 1] for k in (1, 3)]
        split_round = [(k, x) for k in (1, 2, 3) for x in (16, 1024, L // 2)]
        host = [1, 4, c.wide] if c.wide > 4 else [1, c.wide]
        return Grid(prefill, [(k, x) for k in long_streams for x in ctx_long],
                    [(k, x) for k in wide_streams for x in ctx_wide], many, mixed, split, split_round, host)


@dataclass
class Profile:
    samples: dict[str, list] = field(default_factory=lambda: {k: [] for k in KINDS})
    notes: list[str] = field(default_factory=list)


class Timer:
    """Wall time of calls, the device synchronized where the call does not do it itself."""

    def __init__(self, runner):
        self.r = runner
        self.cuda = runner.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize(self.r.device)

    def __call__(self, fn, *args, **kw) -> float:
        self.sync()
        t = time.perf_counter()
        fn(*args, **kw)
        self.sync()
        return time.perf_counter() - t


def ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def round_of(r, lanes, positions) -> list[int]:
    """A round's [n, keys, longest]: the rows the runner runs these lanes at, the keys its streams
    attend to, the longest stream's."""
    return [r.caps.round_rows(lanes), sum(p + 1 for p in positions), max(positions) + 1]


class Profiler:
    def __init__(self, cfg: ProfileConfig, log=print, commit: str | None = None, checkpoint=None):
        """commit: the engine's git commit, written into the profile (engine.cli.engine_commit);
        checkpoint(doc): called after each runner's stage with the profile so far (`partial` set), so
        a sitting cut short (a device call's time limit) keeps what it measured."""
        cfg.check()
        self.commit = commit
        self.checkpoint = checkpoint
        self.cfg = cfg.sized()
        self.cuda = self.cfg.device != "cpu"
        self.grid = Grid.of(self.cfg, self.cuda)
        self.out = Profile()
        self.rng = random.Random(cfg.seed)
        self.log = log
        self.t0 = self.budget_from = time.perf_counter()
        self.model = None  # the weights, loaded by the first runner and shared
        self.runners: list[dict] = []
        self.shape = None
        self.described: dict | None = None

    # ---- the runners ------------------------------------------------------------------------
    def engine_config(self, parallel: int, max_len: int, mode: str = "stepped", **kw):
        from engine.config import EngineConfig, KernelConfig
        knobs = {"cpu_cpp": True} if not self.cuda else {}  # the C++ round from the first call, as served once loaded
        knobs.update(kw.pop("knobs", {}))
        return EngineConfig(model=self.cfg.model, device=self.cfg.device, dtype=self.dtype, parallel=parallel,
                            max_model_len=max_len, prefill_rows=self.cfg.prefill_rows, prefill_mode=mode,
                            seed=self.cfg.seed, kernels=KernelConfig(toolchain=self.cfg.toolchain, **knobs), **kw)

    def stage(self, purpose: str, parallel: int, max_len: int, measure, mode: str = "stepped", flags=(), **kw) -> None:
        """Build a runner (the weights shared), `measure(runner)`, and free it before the next: two
        runners' KV caches need not fit together. Nothing outside holds the runner once this returns."""
        from engine.runner.build import build_runner
        from engine.runner.report import capabilities_doc
        ecfg = self.engine_config(parallel, max_len, mode, **kw)
        t = time.perf_counter()
        r = build_runner(ecfg, model=self.model)
        try:
            if getattr(r, "cuts_warmed", None) is not None:
                r.cuts_warmed.result()
            if self.model is None:  # the budget counts from here: loading and compiling are not measuring
                self.budget_from = time.perf_counter()
            self.model, self.shape = r.model, r.model_config
            self.runners.append({"purpose": purpose, "parallel": parallel, "max_model_len": max_len,
                                 "prefill_mode": mode, "flags": ["--parallel", str(parallel), "--max-model-len",
                                                                 str(max_len), "--prefill-mode", mode, *flags],
                                 "decode_rows": list(r.buckets), "capabilities": capabilities_doc(r.caps),
                                 "built_s": round(time.perf_counter() - t, 2)})
            if self.described is None:
                self.described = r.describe()
            self.log(f"profile: {purpose}: runner built in {time.perf_counter() - t:.1f} s")
            measure(r)
            if self.checkpoint is not None:
                self.checkpoint({**self.document(), "partial": f"measured through: {purpose}"})
        finally:
            del r
            gc.collect()
            if self.cuda:
                import torch
                torch.cuda.synchronize()
                torch.cuda.empty_cache()

    @property
    def dtype(self) -> str:
        """The dtype served: given (the CLI passes serve's choice for the CPU), or CUDA's bfloat16."""
        return self.cfg.dtype or "bfloat16"

    def attempt(self, kind: str, measure, *args) -> None:
        """measure(*args); a kind that fails keeps what it measured, and the notes say why it stopped."""
        try:
            measure(*args)
        except Exception as exc:  # (one kind's failure leaves the others' samples worth writing)
            self.out.notes.append(f"{kind}: stopped by {type(exc).__name__}: {exc}")
            self.log(f"profile: {kind} failed: {type(exc).__name__}: {exc}")

    def left(self) -> float:
        return self.cfg.budget_s - (time.perf_counter() - self.budget_from)

    def over(self, kind: str, done: int, of: int) -> bool:
        """Whether the budget is spent; notes how much of `kind` was measured."""
        if self.left() > 0:
            return False
        self.out.notes.append(f"{kind}: {done} of {of} points measured before the {self.cfg.budget_s:.0f} s budget ran out")
        return True

    # ---- the kinds ----------------------------------------------------------------------------
    def prefill(self, r) -> None:
        timer, lane, reps = Timer(r), r.parallel - 1, self.cfg.repeats
        points = [(n, s) for n, s in self.grid.prefill if s + n <= r.max_model_len]
        for i, (rows, start) in enumerate(points):
            if self.over("prefill", i, len(points)):
                return
            toks = ids(self.rng, start + rows + 1, r.vocab_size)  # not the prompt's last cut: no lm_head row
            r.prefill_step(lane, toks, start, start + rows)  # untimed: a shape's first call builds its kernels
            for _ in range(reps):
                self.out.samples["prefill"].append([rows, start, timer(r.prefill_step, lane, toks, start, start + rows)])

    def fill(self, r) -> None:
        """The longest prompt the runner holds, cut by cut with nothing between, twice, each after an
        idle second (a fifth on the CPU): the device cooled as between a real run's prompts."""
        timer, lane, rows = Timer(r), r.parallel - 1, self.cfg.prefill_rows
        longest = min(self.cfg.longest, r.max_model_len - 1)
        toks = ids(self.rng, longest + 1, r.vocab_size)
        for rep in range(2):
            if self.over("fill", rep, 2):
                return
            time.sleep(1.0 if self.cuda else 0.2)
            t0 = time.perf_counter()
            for start in range(0, longest - rows + 1, rows):
                since = time.perf_counter() - t0
                self.out.samples["fill"].append([rows, start, since, timer(r.prefill_step, lane, toks, start, start + rows)])

    def decode(self, r, points) -> None:
        timer, reps = Timer(r), self.cfg.repeats
        points = [(k, x) for k, x in points if k <= r.parallel and x < r.max_model_len]
        for i, (streams, ctx) in enumerate(points):
            if self.over("decode", i, len(points)):
                return
            lanes = list(range(streams))
            toks = ids(self.rng, streams, r.vocab_size)
            pos = [min(r.max_model_len - 1, ctx + j) for j in range(streams)]  # (contexts a little apart)
            r.decode(lanes, toks, pos)
            for _ in range(reps):
                self.out.samples["decode"].append([*round_of(r, lanes, pos), timer(r.decode, lanes, toks, pos)])

    def decode_ahead(self, r, points) -> None:
        """Rounds as the host asks for them with no prompt waiting: each fed the last one's ids at the
        next positions, with `ahead`, so the next is launched before this one's ids are read."""
        if not r.runs_ahead:
            return
        reps = self.cfg.repeats
        points = [(k, x) for k, x in points if k <= r.parallel and x + k + reps + 2 < r.max_model_len]
        for i, (streams, ctx) in enumerate(points):
            if self.over("decode_ahead", i, len(points)):
                return
            lanes = list(range(streams))
            pos = [ctx + j for j in range(streams)]
            out = r.decode(lanes, ids(self.rng, streams, r.vocab_size), pos, ahead=True)
            for _ in range(reps):
                pos = [p + 1 for p in pos]
                t = time.perf_counter()
                out = r.decode(lanes, out, pos, ahead=True)  # (its ids read: the round is done)
                self.out.samples["decode_ahead"].append([*round_of(r, lanes, pos), time.perf_counter() - t])

    def prefill_many(self, r) -> None:
        if not r.caps.batch_cuts:
            self.out.notes.append("prefill_many: this runner fills short prompts one at a time (no batch_cuts)")
            return
        timer, reps = Timer(r), self.cfg.repeats
        points = [(p, n) for p, n in self.grid.many if p <= r.parallel and n < r.max_model_len]
        for i, (prompts, rows) in enumerate(points):
            if self.over("prefill_many", i, len(points)):
                return
            items = [(lane, ids(self.rng, rows, r.vocab_size), 0, rows) for lane in range(prompts)]
            r.prefill_many(items)
            for _ in range(reps):
                self.out.samples["prefill_many"].append([prompts, prompts * rows, timer(r.prefill_many, items)])

    def host(self, r) -> None:
        """The real LaneHost over short workloads (every stream a short prompt, then a reply), each
        backend call timed: a turn's time outside them, fitted against the tokens it emitted."""
        from engine.scheduler.host import LaneHost
        from engine.scheduler.sequence import Sequence
        turns: list[tuple[float, int]] = []
        for streams in self.grid.host:
            if self.over("host", len(turns), len(self.grid.host)):
                break
            backend = TimedBackend(r)
            host = LaneHost(backend, r.cfg)
            seqs = [Sequence(prompt=ids(self.rng, 24, r.vocab_size), max_tokens=48, ignore_eos=True,
                             emit=lambda kind, payload: None) for _ in range(streams)]
            for s in seqs:
                host.submit(s)
            while not all(s.done for s in seqs):
                before, out0 = backend.spent, host.counters.tokens_out
                t = time.perf_counter()
                host.turn()
                turns.append((time.perf_counter() - t - (backend.spent - before), host.counters.tokens_out - out0))
        for chunk in (turns[i::5] for i in range(5)):  # five fits, for the spread
            fit = host_fit(chunk)
            if fit is not None:
                self.out.samples["host"] += [["turn", fit[0]], ["token", fit[1]]]

    def mixed(self, r) -> None:
        timer, reps, lane = Timer(r), self.cfg.repeats, r.parallel - 1
        sizes = r.caps.cut_sizes
        points = []
        for rows, start, streams, ctx in self.grid.mixed:
            if sizes is not None and rows not in sizes:
                continue
            if start % r.caps.cut_granule or start + rows >= r.max_model_len or streams >= r.parallel:
                continue
            points.append((rows, start, streams, ctx))
        for i, (rows, start, streams, ctx) in enumerate(points):
            if self.over("mixed", i, len(points)):
                return
            toks = ids(self.rng, start + rows + 1, r.vocab_size)
            lanes = list(range(streams))
            dtoks = ids(self.rng, streams, r.vocab_size)
            pos = [ctx + j for j in range(streams)]
            cut = [(lane, toks, start, start + rows)]
            r.mixed(cut, lanes, dtoks, pos)
            for _ in range(reps):
                self.out.samples["mixed"].append([rows, start, *round_of(r, lanes, pos),
                                                  timer(r.mixed, cut, lanes, dtoks, pos)])

    def split(self, r, sms: int) -> None:
        import torch
        timer, reps, lane, rows = Timer(r), self.cfg.repeats, r.parallel - 1, self.cfg.prefill_rows
        part = r.sm_split.decode

        def alone(lanes, toks, pos):  # a round on the decode partition's graphs, nothing beside it
            padded, _ = r.padded_round(lanes, toks, pos)
            with torch.cuda.stream(part):
                r.split_graphs.fresh(padded).tolist()
        points = [(s, k, x) for s, k, x in self.grid.split if s + rows <= r.max_model_len and k < r.parallel]
        for i, (start, streams, ctx) in enumerate(points):
            if self.over(f"split {sms}", i, len(points)):
                break
            toks = ids(self.rng, start + rows + 1, r.vocab_size)
            lanes, dtoks = list(range(streams)), ids(self.rng, streams, r.vocab_size)
            pos = [ctx + j for j in range(streams)]
            for rep in range(reps + 1):  # the first untimed
                torch.cuda.synchronize()
                t = time.perf_counter()
                r.start_step(lane, toks, start, start + rows)
                rounds = []
                while True:
                    u = time.perf_counter()
                    r.decode(lanes, dtoks, pos)
                    rounds.append(time.perf_counter() - u)
                    if r.step_done():
                        break
                r.finish_step()
                cut = time.perf_counter() - t
                if rep:
                    self.out.samples["split"].append([sms, rows, start, *round_of(r, lanes, pos), cut,
                                                      statistics.median(rounds)])
        pts = [(k, x) for k, x in self.grid.split_round if k < r.parallel and x < r.max_model_len]
        for streams, ctx in pts:
            lanes, toks = list(range(streams)), ids(self.rng, streams, r.vocab_size)
            pos = [ctx + j for j in range(streams)]
            alone(lanes, toks, pos)
            for _ in range(reps):
                self.out.samples["split_round"].append([sms, *round_of(r, lanes, pos), timer(alone, lanes, toks, pos)])

    # ---- the sitting --------------------------------------------------------------------------
    def run(self) -> dict:
        c, g = self.cfg, self.grid
        rows = c.prefill_rows
        long_len = c.longest + rows
        flags = ["--prefill-rows", str(rows)]
        self.log(f"profile: {c.model} on {c.device}, budget {c.budget_s:.0f} s")

        def long_(r):
            self.attempt("prefill", self.prefill, r)
            self.attempt("fill", self.fill, r)
            self.attempt("decode", self.decode, r, g.decode_long)
            self.attempt("decode_ahead", self.decode_ahead, r, g.decode_long)

        def wide(r):
            self.attempt("decode", self.decode, r, g.decode_wide)
            self.attempt("decode_ahead", self.decode_ahead, r, g.decode_wide)
            self.attempt("prefill_many", self.prefill_many, r)
            self.attempt("host", self.host, r)
        self.stage("long: prompt cuts, rounds beside a long context", 4, long_len, long_, flags=flags)
        self.stage("wide: rounds of many streams, short prompts together, the host", c.wide, c.wide_len, wide,
                   flags=flags)
        if not self.cuda:
            self.out.notes.append("split: --prefill-mode split runs on CUDA only")
        if not self.out.samples["decode_ahead"]:
            self.out.notes.append("decode_ahead: this runner runs no round ahead (rounds as decode's)")
        for sms in c.split_sms:
            if self.over(f"split {sms}", 0, 1):
                break
            try:
                self.stage(f"split: {sms} decode SMs", 4, long_len,
                           lambda r, n=sms: self.attempt(f"split {n}", self.split, r, n), "split",
                           flags=[*flags, "--decode-sms", str(sms)], decode_sms=sms)
            except Exception as exc:  # a partition the device cannot make: the others still measured
                self.out.notes.append(f"split {sms}: {type(exc).__name__}: {exc}")
        if not self.over("mixed", 0, 1):
            knobs = {"cut_tiles": True} if self.cuda else {}
            mflags = [*flags, "--cut-attention", "tiles"] if self.cuda else flags
            try:
                self.stage("mixed: a cut and a round in one forward", 4, long_len,
                           lambda r: self.attempt("mixed", self.mixed, r), "mixed", knobs=knobs,
                           flags=mflags)
            except Exception as exc:  # (the CUDA one needs the tiles' start-up checks to pass)
                self.out.notes.append(f"mixed: {type(exc).__name__}: {exc}")
        return self.document()

    def document(self) -> dict:
        import torch
        d = self.described
        m = self.shape
        dev = {"type": "cuda" if self.cuda else "cpu", "name": d.get("device_name"),
               "capability": d.get("compute_capability"), "sms": None, "cpu": platform.processor() or None,
               "cpu_isa": None, "torch": torch.__version__, "cuda": torch.version.cuda, "driver": d.get("driver"),
               "load": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
        if self.cuda:
            dev["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
            from engine.runner.device_info import cpu_identity
            dev["cpu"] = cpu_identity()["model"]
        else:
            cpu = d.get("cpu") or {}
            dev.update(cpu=cpu.get("model"), cpu_isa=cpu.get("isa"), cores=cpu.get("cores"), threads=cpu.get("threads"),
                       isa_cap=self.cfg.cpu_isa)
        return {
            "schema": SCHEMA,
            "rounds": "rows",
            "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": "measured",
            "device": dev,
            "model": {"name": d.get("model"), "dtype": self.dtype, "layers": m.num_hidden_layers, "hidden": m.hidden_size,
                      "heads": m.num_attention_heads, "kv_heads": m.num_key_value_heads, "head_dim": m.head_dim,
                      "intermediate": m.intermediate_size, "vocab": m.vocab_size},
            "engine": {"commit": self.commit, "parallel": max(r["parallel"] for r in self.runners), "prefill_rows": self.cfg.prefill_rows,
                       "max_model_len": self.cfg.longest + self.cfg.prefill_rows, "prefill_mode": "stepped",
                       "flags": ["--model", self.cfg.model, "--device", self.cfg.device, "--dtype", self.dtype,
                                 "--prefill-rows", str(self.cfg.prefill_rows), "--seed", str(self.cfg.seed),
                                 *(["--cpu-isa", self.cfg.cpu_isa] if not self.cuda else [])],
                       "runners": self.runners},
            "profiler": {"quick": self.cfg.quick, "repeats": self.cfg.repeats, "budget_s": self.cfg.budget_s,
                         "took_s": round(time.perf_counter() - self.t0, 1)},
            "notes": self.out.notes,
            "samples": self.out.samples,
        }


def host_fit(turns: list[tuple[float, int]]) -> tuple[float, float] | None:
    """(a turn's own seconds, the extra seconds a token) from (host seconds, tokens emitted) per turn:
    the median turn at the fewest tokens, and the rise of the median to the most tokens, per token.
    Medians, not least squares: a turn the OS preempted is seconds off, and one such turn would tilt
    a line. None with too few turns."""
    if len(turns) < 3:
        return None
    by: dict[int, list[float]] = {}
    for secs, n in turns:
        by.setdefault(n, []).append(secs)
    lo, hi = min(by), max(by)
    base = statistics.median(by[lo])
    per = max(0.0, (statistics.median(by[hi]) - base) / (hi - lo)) if hi > lo else 0.0
    return max(0.0, base - per * lo), per


class TimedBackend:
    """A runner as the lane host sees it, with the time spent inside its calls added up."""

    CALLS = ("prefill_step", "decode", "prefill_many", "mixed", "start_step", "step_done", "finish_step")

    def __init__(self, inner):
        self.inner, self.spent = inner, 0.0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.CALLS:
            return attr

        def timed(*args, **kw):
            t = time.perf_counter()
            try:
                return attr(*args, **kw)
            finally:
                self.spent += time.perf_counter() - t
        return timed


def profile(cfg: ProfileConfig, out: Path | None = None, log=print, commit: str | None = None) -> tuple[dict, Path]:
    """Take a profile and write it (default: receipts/profiles/<model>-<device name or cpu-<isa>>.json)."""
    where: list[Path] = [] if out is None else [out]

    def write(doc: dict) -> None:
        if not where:
            tag = doc["device"]["name"] if cfg.device != "cpu" else f"cpu-{cfg.cpu_isa}"
            where.append(Path("receipts/profiles") / f"{cfg.model}-{slug(tag)}.json")
        where[0].parent.mkdir(parents=True, exist_ok=True)
        tmp = where[0].with_name(where[0].name + ".tmp")
        tmp.write_text(dumps(doc))
        tmp.replace(where[0])  # whole or not at all: a reader never sees half a file
    doc = Profiler(cfg, log, commit, checkpoint=write).run()
    write(doc)
    return doc, where[0]


def dumps(doc: dict) -> str:
    """The profile as JSON text: indented, but each sample on one line (thousands of rows stay
    readable and small), seconds to 7 significant digits."""
    def row(r):
        return json.dumps([float(f"{v:.7g}") if isinstance(v, float) else v for v in r])
    head = json.dumps({k: v for k, v in doc.items() if k != "samples"}, indent=1)
    kinds = ",\n".join(f'  "{k}": [' + ("\n   " + ",\n   ".join(map(row, rows)) + "\n  ]" if rows else "]")
                       for k, rows in doc["samples"].items())
    return head[:-2] + ',\n "samples": {\n' + kinds + "\n }\n}\n"


def slug(s: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in s.lower()).strip("-").replace("--", "-")


def summary(doc: dict) -> str:
    """One line a kind: how many samples and their median seconds."""
    lines = [f"{doc['model']['name']} on {doc['device']['name']} ({doc['profiler']['took_s']} s)"]
    for k, rows in doc["samples"].items():
        if not rows:
            lines.append(f"  {k}: none")
            continue
        secs = [r[-1] if k != "split" else r[-2] for r in rows if isinstance(r[-1], float)]
        lines.append(f"  {k}: {len(rows)} samples" + (f", median {statistics.median(secs) * 1e3:.2f} ms" if secs else ""))
    lines += [f"  note: {n}" for n in doc["notes"]]
    return "\n".join(lines)


