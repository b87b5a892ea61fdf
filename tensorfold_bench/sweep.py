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
import datetime as dt
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tensorfold_bench import exactness, stats, worktree
from tensorfold_bench.client import Request, StreamRecord, new_record, stream
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.predictions import Predictions
from tensorfold_bench.scenario import http_client, prompt_ids
from tensorfold_bench.variants import Variant

if TYPE_CHECKING:
    from tensorfold_bench.bench import EngineSetup


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


# ---- runs over variants, the receipt's data ----------------------------------------------

SCHEMA = "tfbench.receipt/1"


@dataclass
class SweepSettings:
    engine: "EngineSetup"
    script: SweepScript
    variants: list[Variant]  # the base first
    order: list[str]
    out_dir: Path
    url: str | None = None
    predictions: Predictions | None = None  # read (and stamped) before the first run
    expected_hashes: dict[str, str] | None = None  # accepted reply hashes (prompt key -> 12 hex)
    margin: float = stats.DEFAULT_MARGIN
    stamp: str = ""
    label: str = "sweep"

    def __post_init__(self):
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise FlagError("--variants", f"variant names repeat: {names}")
        for n in self.order:
            if n not in names:
                raise FlagError("--order", f"unknown variant {n!r}; known: {', '.join(names)}")
        if self.engine.parallel < self.script.max_level:
            self.engine = replace(self.engine, parallel=self.script.max_level)
        if not self.stamp:
            self.stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    @property
    def run_dir(self) -> Path:
        return self.out_dir / f"{self.stamp}-{self.label}"


def sources_for(variants: list[Variant], url: str | None) -> dict[str, worktree.Source]:
    """Each variant's engine source (worktrees made now, before any run)."""
    return {v.name: worktree.source(v.ref) for v in variants} if not url else {}


def run_sweep(settings: SweepSettings, reporter=None, on_run: Callable[[dict], None] | None = None) -> dict:
    """Every run in order, a fresh server each (unless --url); returns the receipt's data."""
    from tensorfold_bench import bench

    rep = reporter or bench.QuietReporter()
    by_name = {v.name: v for v in settings.variants}
    rep.start(len(settings.order))
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    sources = sources_for(settings.variants, settings.url)
    data: dict = {
        "schema": SCHEMA, "scenario": "sweep", "created": dt.datetime.now().isoformat(timespec="seconds"),
        "host": bench.host_info(),
        "settings": {"engine": asdict(settings.engine), "engine_flags": settings.engine.flags(),
                     "script": settings.script.to_dict(), "order": settings.order, "url": settings.url,
                     "base": settings.variants[0].name, "margin": settings.margin,
                     "run_dir": str(settings.run_dir)},
        "variants": [{**v.to_dict(), "source": sources[v.name].to_dict() if v.name in sources else None}
                     for v in settings.variants],
        "predictions": settings.predictions.to_dict() if settings.predictions else None,
        "expected_hashes": settings.expected_hashes, "runs": [], "environment": None, "not_run": []}
    for i, name in enumerate(settings.order, 1):
        v = by_name[name]
        rep.step(f"run {i}/{len(settings.order)}: {name}")
        log = settings.run_dir / f"run{i}-{bench.slug(name)}.log"
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
        ctx = (bench.existing(settings.url) if settings.url else
               bench.launch(settings.engine.flags() + v.args, log, env=v.env, root=Path(sources[name].path)))
        with ctx as srv:
            url = srv if isinstance(srv, str) else srv.url
            info = bench.server_info(url)
            model, vocab, mml = bench.model_facts(info)
            if vocab is None:
                raise BenchError("the server reports no vocabulary size (GET /v1/engine); pass a tfengine server")
            par = ((info.get("engine") or {}).get("config") or {}).get("parallel")
            if par is not None and par < settings.script.max_level:
                raise FlagError("--levels", f"the server has --parallel {par}, below the largest level "
                                            f"{settings.script.max_level}")
            if mml is not None and settings.script.prompt_tokens + settings.script.tokens > mml:
                raise FlagError("--tokens", f"{settings.script.prompt_tokens} prompt + {settings.script.tokens} "
                                            f"tokens exceed the server's max_model_len {mml}")
            if data["environment"] is None:
                data["environment"] = info
            run = asyncio.run(play_sweep(url, settings.script, vocab, name, model, rep.note))
        entry = {"index": i, "variant": name, "started": started, **run.to_dict(),
                 "log": None if settings.url else str(log), "engine": info.get("engine"),
                 "errors": run.errors()}
        data["runs"].append(entry)
        rep.note(f"{name}: " + ", ".join(f"{k} {fmt(v)}" for k, v in entry["figures"].items()))
        if on_run:
            on_run(entry)
        rep.advance()
    return analyse(data)


def runs_of(data: dict) -> list[SweepRun]:
    return [SweepRun.from_dict(r) for r in data["runs"]]


def analyse(data: dict) -> dict:
    """The statistics, the hash check, the predictions and what was not run, from the runs alone
    (so a saved receipt re-renders and re-checks the same)."""
    st = data["settings"]
    order = [r["variant"] for r in data["runs"]]
    base = st["base"]
    runs = runs_of(data)
    figs = {}
    for level in st["script"]["levels"]:
        name = figure(level)
        values = [r["figures"].get(name) for r in data["runs"]]
        figs[name] = stats.figure_stats(name, order, values, base, higher_is_better=True,
                                        margin=st.get("margin", stats.DEFAULT_MARGIN)).to_dict()
    data["stats"] = figs
    ref = next((i for i, r in enumerate(data["runs"]) if r["variant"] == base), 0)
    data["hashes"] = check_hashes(runs, ref, data.get("expected_hashes")).to_dict()
    if data.get("predictions"):
        p = Predictions.from_dict(data["predictions"])
        medians = {}
        for name, fs in figs.items():
            for v, m in fs["medians"].items():
                medians.setdefault(v, {})[name] = m
        data["predictions"] = p.check(medians).to_dict()
    notes = []
    if st.get("url"):
        notes.append(f"Fresh servers: --url {st['url']} targets a running server; every variant ran on it as it is.")
    for r in data["runs"]:
        for e in r.get("errors", []):
            notes.append(f"Run {r['index']} ({r['variant']}): {e}: that batch is left out.")
    data["not_run"] = notes
    return data


def fmt(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def stats_table(data: dict, label: str = "streams", unit: str = "tok/s") -> list[str]:
    """One row per (figure, variant): every run's value in run order, the median, base's span,
    new vs base, the paired interval and the verdict."""
    base = data["settings"]["base"]
    lines = [f"| {label} | variant | runs ({unit}, in run order) | median | vs {base} | paired 95 % interval | verdict |",
             "|---|---|---|---|---|---|---|"]
    for name, d in data["stats"].items():
        fs = stats.FigureStats.from_dict(d)
        key = name.split("@", 1)[1] if "@" in name else name
        names = [base] + [v for v in fs.runs if v != base]
        for v in names:
            vals = " / ".join(fmt(x, 2) for x in fs.runs.get(v, [])) or "–"
            if v == base:
                span = f" (span {fmt(fs.base_span[0], 2)}–{fmt(fs.base_span[1], 2)})" if fs.base_span else ""
                lines.append(f"| {key} | {v} (base) | {vals} | **{fmt(fs.medians.get(v), 2)}**{span} | | | |")
                continue
            c = fs.comparisons[v]
            iv = "–" if c.interval_pct is None else f"{c.interval_pct[0]:+.1f} % to {c.interval_pct[1]:+.1f} %"
            lines.append(f"| {key} | {v} | {vals} | **{fmt(c.median, 2)}** | {stats.fmt_pct(c.pct)} | {iv} | {c.verdict} |")
    return lines


def exactness_line(data: dict) -> str:
    h = data["hashes"]
    return (f"Token hashes: {h['equal']} of {h['replies']} replies equal ({h['prompts']} prompts)"
            + ("." if h["ok"] else f"; {len(h['flagged'])} differ (see the receipt)."))


def test_paragraph(data: dict) -> str:
    s = data["settings"]["script"]
    order = "/".join(data["settings"]["order"])
    return (f"**The test.** At each level ({', '.join(map(str, s['levels']))} streams), that many streams start "
            f"together, each sending a {s['prompt_tokens']}-token prompt (seeded token ids) and generating "
            f"{s['tokens']} tokens with ignore_eos; {s['cells']} distinct prompt sets (cells), {s['reps']} reps "
            f"each. Aggregate tok/s = all tokens / (last token time - first send time); the median over reps is "
            f"a cell's figure, the median over cells the run's. A fresh server per run, in the order {order}. "
            "Verdicts pair each run with its adjacent base runs (a bootstrap interval of the median log-ratio, "
            f"margin {data['settings'].get('margin', stats.DEFAULT_MARGIN) * 100:g} %).")


def render_markdown(data: dict, png_name: str | None = None) -> str:
    from tensorfold_bench import receipt

    st = data["settings"]
    names = [v["name"] for v in data["variants"]]
    lines = [f"## tfbench sweep: {' vs '.join(names)}", "", "**Environment.**", *receipt.environment_lines(data)]
    srcs = [f"{v['name']}: {worktree.Source(**v['source']).label}" for v in data["variants"] if v.get("source")]
    if srcs:
        lines.append("- Engine sources: " + "; ".join(srcs) + ".")
    lines += ["", test_paragraph(data), ""]
    if data.get("predictions"):
        p = data["predictions"]
        first = data["runs"][0]["started"] if data["runs"] else "–"
        lines += [f"Predictions read {p['read_at']} (sha256 `{p['sha256'][:16]}`); the first run started {first}.", ""]
    if png_name:
        lines += [f"![aggregate tok/s by streams]({png_name})", ""]
    lines += ["**Aggregate tok/s.**", "", *stats_table(data), ""]
    h = data["hashes"]
    lines += ["**Exactness.** Each prompt's reply is compared across reps, levels and runs with "
              + ("the accepted hashes given." if data.get("expected_hashes") else f"its first reply in a {st['base']} run.")
              + f" {h['equal']} of {h['replies']} replies equal ({h['prompts']} prompts)"
              + ("." if h["ok"] else "; these differ:")]
    lines += [f"- {f}" for f in h["flagged"][:20]]
    if len(h["flagged"]) > 20:
        lines.append(f"- … and {len(h['flagged']) - 20} more (see the JSON)")
    lines.append("")
    if data.get("predictions"):
        lines += Predictions.from_dict(data["predictions"]).markdown() + [""]
    lines += ["**Not run, and why.**", *([f"- {n}" for n in data["not_run"]] or ["- Nothing left out."])]
    return "\n".join(lines) + "\n"


def render_png(data: dict, path: Path) -> Path | None:
    """Aggregate tok/s against streams: each run a dot, each variant's medians a line."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    levels = data["settings"]["script"]["levels"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for k, v in enumerate(data["variants"]):
        name = v["name"]
        med = [data["stats"][figure(l)]["medians"].get(name) for l in levels]
        if all(m is None for m in med):
            continue
        color = f"C{k}"
        ax.plot(levels, [m if m is not None else float("nan") for m in med], "-", color=color, label=name)
        for l in levels:
            ys = data["stats"][figure(l)]["runs"].get(name, [])
            ax.plot([l * (1 + 0.03 * (k - 0.5))] * len(ys), ys, "o", color=color, alpha=0.6, ms=4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(l) for l in levels])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate tok/s")
    ax.set_title("sweep: median per variant, dots = runs")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
