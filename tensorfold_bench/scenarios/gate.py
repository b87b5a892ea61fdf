"""`tfbench gate`: the CI regression gate.

Base is the previous commit (`HEAD~1`, or `--base REF`), checked out in a worktree; new is the
working tree (commit + uncommitted changes). Runs go base/new/new/base, a fresh server each,
on a small preset (`cpu` by default; `tiny` for the gate's own tests). Each run plays, on its
one server, a short sweep (levels 1 and 4) and then a short long-prompt run (A decodes, B sends
a cold prompt, C a short chat).

Fails (exit 1), with a receipt saying why, when
- new's aggregate tok/s at a level is "worse" than base under tensorfold_bench.analysis.stats' rule
  (the paired interval lies wholly beyond the throughput margin, 5 % by default);
- a long-prompt figure (B's and C's first token, A's longest pause, A's rate while B fills) is
  "worse" likewise, with its own margin (25 % by default: these are sub-second figures); C's
  first token and A's longest pause must also have moved by more than one cut period, since
  where C lands inside one of B's cuts swings them by up to a cut on an unchanged tree;
- any token hash differs: each sweep prompt's reply and B's and C's replies (A's on the common
  prefix, A being cancelled) must be equal across every run of both sides.

With `--load RATE` each run also plays a short Poisson load at RATE requests/s (tfbench load's
player and figures: a few seconds of short requests); new fails where its output tok/s is worse
beyond the throughput margin, its TTFT p99 worse beyond the long-prompt margin, any of those
requests failed, or any reply differs from base's.

With `--temperature T --seed S` every request samples with T and its role's seed
(tensorfold_bench.client.sampling), and the same hash checks cover the sampled replies; `--seed` also
seeds the engine's dummy weights and the prompts.

**A deliberate change of outputs** is acknowledged by `--accept-new-outputs`, or by committing a
file `.ci/accept-new-outputs` whose first line is the full or abbreviated commit of the base
it applies to (`git rev-parse HEAD > .ci/accept-new-outputs` before committing the change): the
acknowledgement lapses by itself at the next commit. Accepted, base's and new's replies may
differ from each other, but each side's must still agree with themselves.

**No base.** When the default base HEAD~1 does not exist (a shallow CI clone, or the first
commit), the gate says so and compares the working tree with itself (an A/A run): outputs must
still be deterministic across fresh servers, and the engine must still serve; throughput then
checks nothing but the noise, and the receipt says so. The same holds when the base's engine
will not start. A `--base REF` that names no commit is a usage error (exit 2), not a fallback.

**The schedule layer** (tensorfold_bench.scenarios.gate_schedule) replays, before the runs, the
gate's sweep and long-prompt shapes and the shapes a scheduler is known to break on (eight short
prompts arriving together, a long prompt behind decoding streams at p = 0.5 and 1, a Poisson load
with a cold prompt) in virtual time on a committed cost profile (`--schedule-profile`; default the
CPU preset's), once on base's engine and once on new's. It is deterministic: any figure worse by
1 % or more fails. A deliberate change of the schedule is acknowledged as outputs are: by
`--accept-schedule` or a committed `.ci/accept-schedule` naming the base commit (it lapses at the
next commit). A base that predates the simulator, or none, leaves the layer "not run". The
wall-clock layer's receipt states the smallest slowdown it could have caught on each figure (the
margin plus half its paired interval), so a pass is not read as "no regression".

Exit codes: 0 pass, 1 regression (throughput, a long-prompt figure, a token hash, a schedule
figure, or a new side whose replay fails),
2 usage or infrastructure error (bad flag, a server that would not start, git failure).
"""
from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tensorfold_bench.analysis import exactness, figures, load as load_figures, stats, sweep as sweep_figures
from tensorfold_bench.analysis.figures import num
from tensorfold_bench.client import player, selfcheck
from tensorfold_bench.client.sampling import GREEDY, Sampling
from tensorfold_bench.errors import FlagError, ServerError
from tensorfold_bench.scenarios import gate_schedule, load, long_prompt, sweep
from tensorfold_bench.servers import worktree
from tensorfold_bench.session import defaults, driver
from tensorfold_bench.session.driver import Reporter, Run, Session
from tensorfold_bench.session.variants import Variant

DEFAULT_BASE = "HEAD~1"
ACCEPT_FILE = ".ci/accept-new-outputs"
ACCEPT_SCHEDULE_FILE = ".ci/accept-schedule"
LONG_JUDGED = ("b_first_token", "c_first_token", "a_longest_pause", "a_rate_during")
LOAD_JUDGED = {"out_tok_s": "margin", "ttft_p99": "long_margin"}  # --load's figures and the margin each gets
# Figures set by where C lands inside one of B's cuts: C waits for the cut in progress (from
# nothing to a whole cut), and A's longest pause is a cut, or a cut plus C's prompt. An
# unchanged tree's C swung 0.08 s to 0.40 s here (CI, 2 cores, 256-row cuts of ~0.3 s), so
# these must also move by more than one cut period to count.
PHASE_FIGURES = ("c_first_token", "a_longest_pause")


@dataclass(frozen=True)
class GatePreset:
    model: str
    levels: tuple[int, ...]
    tokens: int
    reps: int
    prompt_tokens: int
    b_at: float
    c_after: float
    b_tokens: int
    max_model_len: int
    judge_long: bool = True  # False: long-prompt figures are shown, not judged
    load_s: float = 6.0  # --load: seconds of Poisson arrivals
    load_input: int = 64  # --load: each request's prompt and reply
    load_output: int = 16


PRESETS = {
    # about 25 s a run on two cores: the whole gate (4 runs) within 2 minutes
    "cpu": GatePreset("cpu", (1, 4), 32, 3, 64, 1.5, 0.3, 1024, 2048),
    # the gate's own tests: a few seconds a run. tiny fills B's prompt in milliseconds, so A's
    # rate "while B fills" counts a token or two: its long-prompt figures are shown, not judged
    # (its replies are still compared).
    "tiny": GatePreset("tiny", (1, 4), 24, 2, 32, 0.5, 0.1, 512, 1024, judge_long=False, load_s=2.0, load_input=24,
                       load_output=8),
}


@dataclass
class GateSettings:
    base_ref: str | None = DEFAULT_BASE  # None: the working tree against itself (tests)
    preset: str = "cpu"
    margin: float = 0.05
    long_margin: float = 0.25
    accept_new_outputs: bool = False
    out_dir: Path = Path("runs/gate")
    order: list[str] = field(default_factory=lambda: ["base", "new", "new", "base"])
    new_env: dict[str, str] = field(default_factory=dict)  # e.g. TFENGINE_DECODE_SLEEP_MS (tests)
    repo: Path | None = None
    stamp: str = ""
    sampling: Sampling = GREEDY  # --temperature, --seed (which also seeds the weights and prompts)
    vocab: int | None = None  # --vocab (default: the server's)
    tokenizer: str | None = None  # --tokenizer DIR
    load_rate: float | None = None  # --load RATE: a short Poisson load in every run
    schedule: bool = True  # False: --no-schedule
    schedule_profile: Path | None = None  # --schedule-profile (default: the CPU preset's)
    accept_schedule: bool = False  # --accept-schedule

    def __post_init__(self):
        if self.schedule_profile is not None and not Path(self.schedule_profile).is_file():
            raise FlagError("--schedule-profile", f"{self.schedule_profile}: no such file")
        if self.preset not in PRESETS:
            raise FlagError("--preset", f"must be one of {', '.join(PRESETS)}, not {self.preset!r}")
        defaults.check_margin(self.margin)
        defaults.check_margin(self.long_margin, "--long-margin")
        if set(self.order) != {"base", "new"}:
            raise FlagError("--order", "the gate's order names base and new, each at least once")
        if self.load_rate is not None:
            self.load_spec()  # its flags checked now, before any server starts

    def load_spec(self):
        """--load's workload: Poisson at the rate for the preset's seconds, short requests."""
        from tensorfold_bench.workload.spec import from_flags
        if self.load_rate is None or not (self.load_rate > 0):
            raise FlagError("--load", f"{self.load_rate!r}: must be requests per second above 0")
        p = PRESETS[self.preset]
        return from_flags(rates=[self.load_rate], duration=p.load_s, input_len=str(p.load_input),
                          output_len=str(p.load_output), seed=self.sampling.seed)


def parse_env(items: list[str] | None) -> dict[str, str]:
    """`--new-env KEY=VALUE` (repeatable) -> a mapping."""
    env = {}
    for kv in items or []:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise FlagError("--new-env", f"expected KEY=VALUE, got {kv!r}")
        env[k] = v
    return env


def accepted_by_file(root: Path, base_commit: str | None, name: str = ACCEPT_FILE) -> bool:
    f = root / name
    if not base_commit or not f.exists():
        return False
    first = (f.read_text().strip().splitlines() or [""])[0].strip()
    return len(first) >= 7 and base_commit.startswith(first)


def sources(settings: GateSettings) -> tuple[worktree.Source, worktree.Source, str | None]:
    """(base source, new source, a note when the base ref is missing)."""
    new = worktree.working_tree(settings.repo)
    root = worktree.repo_root(settings.repo)
    if settings.base_ref is None:
        return new, new, None
    if worktree.resolve(settings.base_ref, root) is None:
        if settings.base_ref != DEFAULT_BASE:
            raise worktree.GitError(f"--base {settings.base_ref!r} is not a commit of {root}")
        shallow = worktree.git(root, "rev-parse", "--is-shallow-repository", check=False) == "true"
        why = "this clone is shallow" if shallow else "no such commit"
        return new, new, (f"base ref {settings.base_ref!r} is missing ({why}): the working tree is compared "
                          "with itself (A/A): outputs must still agree across fresh servers; throughput "
                          "checks only the noise.")
    return worktree.checkout(settings.base_ref, root), new, None


def long_script(p: GatePreset, sampling: Sampling = GREEDY) -> long_prompt.LongPromptScript:
    """The preset's short long-prompt run."""
    return long_prompt.LongPromptScript(b_at=p.b_at, c_after=p.c_after, b_tokens=p.b_tokens,
                                        a_max_tokens=p.max_model_len - 32, seed=sampling.seed, sampling=sampling)


def play(p: GatePreset, run: Run, sampling: Sampling = GREEDY, load_spec=None) -> dict:
    """One run: a short sweep, then a short long-prompt run (then, with --load, a short Poisson
    load), on one server; raw records."""
    sw = sweep.SweepScript(levels=p.levels, tokens=p.tokens, cells=1, reps=p.reps, prompt_tokens=p.prompt_tokens,
                           seed=sampling.seed, sampling=sampling)
    batches, sw_check = asyncio.run(sweep.play_levels(run.url, sw, run.vocab, run.variant.name, run.model))
    recs, lp_check = asyncio.run(long_prompt.play_script(run.url, long_script(p, sampling), run.vocab, run.model))
    out = {"sweep": {"batches": batches, "client": sw_check},
           "long_prompt": {"records": recs, "client": lp_check}}
    if load_spec is not None:
        level = load_spec.levels[0]
        played, t0, check = asyncio.run(player.play_level(run.url, load_spec.build(level, run.vocab), model=run.model,
                                                        sampling=sampling))
        out["load"] = {"label": level.label, "client": check,
                       "records": [load.to_req(s, t0) for s in played]}
    return out


def schedule_shape(p: GatePreset, prefill_rows: int = 256, seed: int = 0) -> gate_schedule.Shape:
    """The preset's values the schedule layer replays."""
    return gate_schedule.Shape(levels=p.levels, tokens=p.tokens, prompt_tokens=p.prompt_tokens, b_at=p.b_at,
                               c_after=p.c_after, b_tokens=p.b_tokens, max_model_len=p.max_model_len,
                               load_input=p.load_input, load_output=p.load_output, prefill_rows=prefill_rows,
                               seed=seed)


def schedule_layer(settings: GateSettings, base_src: worktree.Source, new_src: worktree.Source,
                   missing: str | None, prefill_rows: int) -> dict | None:
    """The schedule layer's receipt section (gate_schedule.layer); None with --no-schedule."""
    if not settings.schedule:
        return None
    p = PRESETS[settings.preset]
    # the profiles are of the CPU preset's model: the layer judges the schedule, not the model
    profile = Path(settings.schedule_profile or gate_schedule.default_profile("cpu", prefill_rows))
    shape = schedule_shape(p, prefill_rows, settings.sampling.seed)
    same = missing or base_src.path == new_src.path
    accepted = settings.accept_schedule or (not same and accepted_by_file(
        worktree.repo_root(settings.repo), base_src.commit, ACCEPT_SCHEDULE_FILE))
    return gate_schedule.layer(None if same else Path(base_src.path), Path(new_src.path), shape, profile, accepted)


class Gate(driver.Scenario):
    """The gate's runs through the session driver: each plays a short sweep, a short long-prompt
    run (and, with --load, a short load) on one server; the judgement comes from the runs alone."""

    has_plain = False
    keep_failed = False  # every run or none: a base that will not serve falls back to A/A

    def __init__(self, settings: GateSettings, session: Session, srcs: dict[str, worktree.Source],
                 missing: str | None, accepted: bool, schedule: dict | None):
        # the session is built at run time, from the sources resolved then (a missing base falls back)
        self.settings, self.session, self.plain_check = settings, session, False
        self.srcs, self.missing, self.accepted, self.schedule = srcs, missing, accepted, schedule
        self.load_spec = settings.load_spec() if settings.load_rate is not None else None

    def header(self) -> dict:
        g = self.settings
        return {"preset": g.preset, "preset_values": asdict(PRESETS[g.preset]), "base_ref": g.base_ref,
                "long_margin": g.long_margin, "new_env": g.new_env, "accept_new_outputs": g.accept_new_outputs,
                "sampling": g.sampling.to_dict(), "load_rate": g.load_rate}

    def sources(self) -> dict[str, worktree.Source]:
        return self.srcs

    def begin(self, data: dict) -> None:
        data.update(missing_base=self.missing, accepted_outputs=self.accepted, schedule=self.schedule)

    def play(self, data: dict, run: Run) -> dict:
        return play(PRESETS[self.settings.preset], run, self.settings.sampling, self.load_spec)

    def measure(self, entry: dict) -> None:
        """The run's figures: the sweep's, and the long-prompt ones when that run is valid."""
        sw = sweep_figures.sweep_run(entry["sweep"]["batches"])
        entry["sweep"]["errors"] = sweep_figures.batch_errors(entry["sweep"]["batches"])
        lp = figures.long_prompt(long_prompt.timeline(long_script(PRESETS[self.settings.preset])),
                                 entry["long_prompt"]["records"])
        figures.client_bottleneck(lp, entry["long_prompt"].get("client"))
        entry["long_prompt"]["figures"] = lp.to_dict()
        sw_bad = (entry["sweep"].get("client") or {}).get("invalid")
        entry["figures"] = {**({} if sw_bad else sw),
                            **({k: getattr(lp, k) for k in figures.LONG_PROMPT} if lp.valid else {})}
        if entry.get("load"):
            ld = entry["load"]
            f = load_figures.level_figures(ld["records"], load_figures.Slo())
            ld["figures"] = f
            ld["invalid"] = f["invalid"] + selfcheck.bottleneck(ld.get("client"))
            if not ld["invalid"]:
                entry["figures"].update({k: v for k, v in load_figures.flat(ld["label"], f).items()
                                         if load_figures.family(k) in LOAD_JUDGED})

    def line(self, entry: dict) -> str:
        """The run's progress line: tok/s per level, B's and C's first token, the load's tok/s."""
        sw = sweep_figures.sweep_run(entry["sweep"]["batches"])
        lp, sw_bad = entry["long_prompt"]["figures"], (entry["sweep"].get("client") or {}).get("invalid")
        return (f"{entry['variant']}: "
                + ", ".join(f"{k} {num(v, 1, '–')}" for k, v in sw.items() if k.startswith("tok_s"))
                + f"; B first token {num(lp['b_first_token'], 2, '–')} s, C {num(lp['c_first_token'], 2, '–')} s"
                + (f"; load {entry['load']['label']}: {num(entry['load']['figures']['out_tok_s'], 1, '–')} tok/s"
                   if entry.get("load") else "")
                + ("" if lp["valid"] else f" (long-prompt run invalid: {'; '.join(lp['invalid_reasons'])})")
                + (f" (sweep invalid: {'; '.join(sw_bad)})" if sw_bad else ""))

    def validity(self, entry: dict) -> tuple[bool, list[str]]:
        """A run's invalid parts are left out figure by figure, said in the gate's notes."""
        return True, []

    def check(self, data: dict) -> None:
        """Hashes, statistics and verdicts together: the gate's pass or fail needs them all."""
        analyse(data)


def run_gate(settings: GateSettings, reporter: Reporter | None = None, save: driver.Save | None = None,
             _fallback: str | None = None, _schedule: dict | None = None) -> tuple[dict, object]:
    """Run base and new in the order and judge; the returned data carries `passed` and `reasons`.
    A base whose engine will not serve (an old or broken commit) is reported, and the working
    tree is then compared with itself, as for a missing base; a new side that will not serve
    is an error (exit 2)."""
    rep = reporter or driver.QuietReporter()
    p = PRESETS[settings.preset]
    base_src, new_src, missing = sources(settings)
    missing = _fallback or missing
    accepted = settings.accept_new_outputs or accepted_by_file(worktree.repo_root(settings.repo),
                                                               base_src.commit if not missing else None)
    base = Variant("base", [], {}, base_src.ref and base_src.commit)
    engine = defaults.EngineSetup(model=p.model, parallel=max(p.levels), max_model_len=p.max_model_len, trace=False,
                                 seed=settings.sampling.seed)
    s = Session(engine, [base, Variant("new", [], dict(settings.new_env))], list(settings.order), settings.out_dir,
                "gate", margin=settings.margin, stamp=settings.stamp, repo=settings.repo,
                vocab=settings.vocab, tokenizer=settings.tokenizer)
    if missing:
        rep.note(missing)
    schedule = _schedule if _fallback else schedule_layer(settings, base_src, new_src, missing, engine.prefill_rows)
    if schedule is not None:
        rep.note(f"schedule layer: {schedule['status']}" + (
            f" ({schedule['why']})" if schedule["why"] else
            f", {len(schedule['reasons'])} figure(s) worse by 1 % or more"))
    try:
        return driver.run(Gate(settings, s, {"base": base_src, "new": new_src}, missing, accepted, schedule), rep,
                          save)
    except ServerError as e:
        if e.variant != "base" or base_src.path == new_src.path:
            raise
        lines = str(e).splitlines()
        why = lines[0].rstrip(":; ") + (f"; its log ends: {lines[-1].strip()}" if len(lines) > 1 else "")
        rep.note(f"base {base_src.label} will not serve: {why}")
        # a run folder of its own, so the failed base's log stays where the note says
        return run_gate(replace(settings, base_ref=None, stamp=s.stamp + "-aa"), reporter, save,
                        f"base {base_src.label} would not serve ({why}; log {e.log}): the working tree "
                        "is compared with itself (A/A): outputs must still agree across fresh servers; "
                        "throughput checks only the noise.", schedule)


def judge(order: list[str], run_figures: list[dict], *, levels: list[int], margin: float, long_margin: float,
          period: float = 0.0, judge_long: bool = True, load_label: str | None = None
          ) -> tuple[dict[str, stats.FigureStats], list[str], list[str]]:
    """The verdicts, from each run's figures alone: (statistics, reasons to fail, notes). New
    fails where a figure is "worse" than base beyond the noise plus its margin; C's first token
    and A's longest pause must also have moved by more than `period` (one cut of B's prompt)."""
    figs = figures.stats_for([figures.at("tok_s", lv) for lv in levels], order, run_figures, "base", margin)
    figs.update(figures.stats_for(list(LONG_JUDGED), order, run_figures, "base", long_margin,
                                  slack={k: period for k in PHASE_FIGURES}))
    if load_label is not None:
        for fam, which in LOAD_JUDGED.items():
            figs.update(figures.stats_for([f"{fam}@{load_label}"], order, run_figures, "base",
                                          margin if which == "margin" else long_margin))
    reasons, notes = [], []
    if period and judge_long:
        notes.append(f"C's first token and A's longest pause had to move by more than one cut period of B's "
                     f"prompt ({period:.2f} s, from base's B) as well: where C lands inside a cut is luck.")
    for name, fs in figs.items():
        c = fs.comparisons.get("new")
        if c is None or (name in LONG_JUDGED and not judge_long):
            continue
        if c.verdict == stats.WORSE:
            slack = f" and one cut period ({c.slack:.2f} s)" if c.slack else ""
            reasons.append(f"{name}: new is worse than base beyond noise plus the {c.margin_pct:g} % margin{slack}: "
                           f"{stats.describe(c)}")
        elif c.verdict == stats.NA:
            notes.append(f"{name}: too few valid runs for a verdict")
    return figs, reasons, notes


def detectable(figs: dict[str, stats.FigureStats]) -> dict[str, float]:
    """The smallest slowdown, in percent, each judged figure could have failed on: its margin plus
    half its paired interval (a "worse" needs the whole interval beyond the margin)."""
    out = {}
    for name, fs in figs.items():
        c = fs.comparisons.get("new")
        if c is not None and c.interval_pct is not None:
            out[name] = round(c.margin_pct + (c.interval_pct[1] - c.interval_pct[0]) / 2, 2)
    return out


def analyse(data: dict) -> dict:
    """Statistics, hash checks, verdicts and notes from the runs alone."""
    st, p = data["settings"], data["settings"]["preset_values"]
    base_b = [r["figures"].get("b_first_token") for r in data["runs"] if r["variant"] == "base"]
    period = figures.cut_period(st["engine"]["prefill_rows"], p["b_tokens"], [b for b in base_b if b is not None])
    load_label = next((r["load"]["label"] for r in data["runs"] if r.get("load")), None)
    figs, reasons, notes = judge([r["variant"] for r in data["runs"]], [r["figures"] for r in data["runs"]],
                                 levels=p["levels"], margin=st["margin"], long_margin=st["long_margin"],
                                 period=period, judge_long=p["judge_long"], load_label=load_label)
    if not p["judge_long"]:
        notes.append(f"Preset {st['preset']}: long-prompt figures are shown, not judged (B fills in milliseconds).")
    data["stats"] = {k: fs.to_dict() for k, fs in figs.items()}
    data["detectable"] = {k: v for k, v in detectable(figs).items() if p["judge_long"] or k not in LONG_JUDGED}
    sc = data.get("schedule")
    if sc is not None:
        reasons += sc["reasons"]
        if sc["status"] != "run":
            notes.append(f"Schedule layer not run: {sc['why']}.")
        if sc["acknowledged"]:
            notes.append(f"Schedule layer: a change of the schedule was acknowledged (--accept-schedule or "
                         f"{ACCEPT_SCHEDULE_FILE}); worse figures shown, not failed: " + "; ".join(sc["acknowledged"]))
    checks = exactness.gate(data["runs"], bool(data["accepted_outputs"]))
    data["exactness"] = {"sweep": checks["sweep"], "long_prompt": checks["long_prompt"]}
    reasons += checks["differ"]
    if load_label is not None:
        data["exactness"]["load"], differ = exactness.gate_load(data["runs"], bool(data["accepted_outputs"]))
        reasons += differ
    for r in data["runs"]:
        reasons += [f"run {r['index']} ({r['variant']}): sweep {e}" for e in r["sweep"]["errors"]]
        lp = r["long_prompt"]["figures"]
        if not lp["valid"]:
            notes.append(f"run {r['index']} ({r['variant']}): long-prompt run invalid, left out: "
                         + "; ".join(lp["invalid_reasons"]))
        ld = r.get("load") or {}
        reasons += [f"run {r['index']} ({r['variant']}): load {why}" for why in (ld.get("figures") or {}).get("invalid", [])
                    if "failed" in why]
        if ld.get("invalid"):
            notes.append(f"run {r['index']} ({r['variant']}): load invalid, left out: " + "; ".join(ld["invalid"]))
        sw_bad = (r["sweep"].get("client") or {}).get("invalid")
        if sw_bad:
            notes.append(f"run {r['index']} ({r['variant']}): sweep invalid, the client was the bottleneck, left "
                         "out: " + "; ".join(sw_bad))
    if data.get("missing_base"):
        notes.append(data["missing_base"])
    if data["accepted_outputs"]:
        notes.append("Outputs: a change of outputs was acknowledged (--accept-new-outputs or "
                     f"{ACCEPT_FILE}); base's and new's replies were each checked against their own side only.")
    data["passed"], data["reasons"], data["notes"] = not reasons, reasons, notes
    return data
