"""`tfbench gate`: the CI regression gate.

Base is the previous commit (`HEAD~1`, or `--base REF`), checked out in a worktree; new is the
working tree (commit + uncommitted changes). Runs go base/new/new/base, a fresh server each,
on a small preset (`cpu` by default; `tiny` for the gate's own tests). Each run plays, on its
one server, a short sweep (levels 1 and 4) and then a short long-prompt run (A decodes, B sends
a cold prompt, C a short chat).

Fails (exit 1), with a receipt saying why, when
- new's aggregate tok/s at a level is "worse" than base under tensorfold_bench.stats' rule
  (the paired interval lies wholly beyond the throughput margin, 5 % by default);
- a long-prompt figure (B's and C's first token, A's longest pause, A's rate while B fills) is
  "worse" likewise, with its own margin (25 % by default: these are sub-second figures); C's
  first token and A's longest pause must also have moved by more than one cut period, since
  where C lands inside one of B's cuts swings them by up to a cut on an unchanged tree;
- any token hash differs: each sweep prompt's reply and B's and C's replies (A's on the common
  prefix, A being cancelled) must be equal across every run of both sides.

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

Exit codes: 0 pass, 1 regression (throughput, a long-prompt figure, or a token hash),
2 usage or infrastructure error (bad flag, a server that would not start, git failure).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from tensorfold_bench import bench, stats, sweep, worktree
from tensorfold_bench.errors import BenchError, FlagError, ServerError
from tensorfold_bench.exactness import known_ids, token_hash
from tensorfold_bench.metrics import long_prompt_figures
from tensorfold_bench.scenario import LongPromptScript, make_prompts, play_long_prompt
from tensorfold_bench.variants import Variant

PASS, FAIL = 0, 1
DEFAULT_BASE = "HEAD~1"
ACCEPT_FILE = ".ci/accept-new-outputs"
# figure -> higher is better
LONG_FIGURES = {"b_first_token": False, "c_first_token": False, "a_longest_pause": False, "a_rate_during": True}
# Figures set by where C lands inside one of B's cuts: C waits for the cut in progress (from
# nothing to a whole cut), and A's longest pause is a cut, or a cut plus C's prompt. An
# unchanged tree's C swung 0.08 s to 0.40 s here (CI, 2 cores, 256-row cuts of ~0.3 s), so
# these must also move by more than one cut period to count.
PHASE_FIGURES = ("c_first_token", "a_longest_pause")


def cut_period(data: dict) -> float:
    """Seconds per cut of B's prompt in base's runs (B's first token over its cut count; the
    decode rounds between cuts included): the slack of PHASE_FIGURES. 0 when unknown."""
    st = data["settings"]
    flags, b_tokens = st.get("engine_flags") or [], st["preset_values"].get("b_tokens")
    if "--prefill-rows" not in flags or not b_tokens:
        return 0.0
    rows = int(flags[flags.index("--prefill-rows") + 1])
    b = [r["long_prompt"]["b_first_token"] for r in data["runs"]
         if r["variant"] == "base" and r["long_prompt"]["valid"]]
    return statistics.median(b) / -(-b_tokens // rows) if b else 0.0


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


PRESETS = {
    # about 25 s a run on two cores: the whole gate (4 runs) within 2 minutes
    "cpu": GatePreset("cpu", (1, 4), 32, 3, 64, 1.5, 0.3, 1024, 2048),
    # the gate's own tests: a few seconds a run. tiny fills B's prompt in milliseconds, so A's
    # rate "while B fills" counts a token or two: its long-prompt figures are shown, not judged
    # (its replies are still compared).
    "tiny": GatePreset("tiny", (1, 4), 24, 2, 32, 0.5, 0.1, 512, 1024, judge_long=False),
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
    base_env: dict[str, str] = field(default_factory=dict)
    repo: Path | None = None
    stamp: str = ""

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise FlagError("--preset", f"must be one of {', '.join(PRESETS)}, not {self.preset!r}")
        for flag, v in (("--margin", self.margin), ("--long-margin", self.long_margin)):
            if not 0 <= v < 1:
                raise FlagError(flag, f"must be a fraction in [0, 1), not {v}")
        if set(self.order) != {"base", "new"}:
            raise FlagError("--order", "the gate's order names base and new, each at least once")
        if not self.stamp:
            self.stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def accepted_by_file(root: Path, base_commit: str | None) -> bool:
    f = root / ACCEPT_FILE
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


def play_run(url: str, info: dict, p: GatePreset, name: str, note: Callable[[str], None]) -> dict:
    model, vocab, _ = bench.model_facts(info)
    if vocab is None:
        raise BenchError("the server reports no vocabulary size (GET /v1/engine)")
    sw = sweep.SweepScript(levels=p.levels, tokens=p.tokens, cells=1, reps=p.reps, prompt_tokens=p.prompt_tokens)
    run = asyncio.run(sweep.play_sweep(url, sw, vocab, name, model))
    script = LongPromptScript(b_at=p.b_at, c_after=p.c_after, b_tokens=p.b_tokens,
                              a_max_tokens=p.max_model_len - 32)
    recs = asyncio.run(play_long_prompt(url, script, make_prompts(script, vocab), model))
    figs = long_prompt_figures(recs["A"], recs["B"], recs["C"])
    ids = {k: known_ids(r.token_ids) or [] for k, r in recs.items()}
    note(f"{name}: " + ", ".join(f"{k} {sweep.fmt(v)}" for k, v in run.figures().items())
         + f"; B first token {sweep.fmt(figs.b_first_token, 2)} s, C {sweep.fmt(figs.c_first_token, 2)} s"
         + ("" if figs.valid else f" (long-prompt run invalid: {'; '.join(figs.invalid_reasons)})"))
    return {"sweep": run.to_dict(), "sweep_errors": run.errors(), "long_prompt": figs.to_dict(),
            "ids": {"A": ids["A"], "B": token_hash(ids["B"])[:12] if ids["B"] else None,
                    "C": token_hash(ids["C"])[:12] if ids["C"] else None}}


def run_gate(settings: GateSettings, reporter=None, _fallback: str | None = None) -> dict:
    """Run base/new/new/base and judge; the returned data carries `passed` and `reasons`.
    A base whose engine will not serve (an old or broken commit) is reported, and the working
    tree is then compared with itself, as for a missing base; a new side that will not serve
    is an error (exit 2)."""
    rep = reporter or bench.QuietReporter()
    p = PRESETS[settings.preset]
    base_src, new_src, missing = sources(settings)
    missing = _fallback or missing
    root = worktree.repo_root(settings.repo)
    accepted = settings.accept_new_outputs or accepted_by_file(root, base_src.commit if not missing else None)
    variants = {"base": Variant("base", [], dict(settings.base_env), base_src.ref and base_src.commit),
                "new": Variant("new", [], dict(settings.new_env), None)}
    srcs = {"base": base_src, "new": new_src}
    engine = bench.EngineSetup(model=p.model, parallel=max(p.levels), max_model_len=p.max_model_len, trace=False)
    run_dir = settings.out_dir / f"{settings.stamp}-gate"
    run_dir.mkdir(parents=True, exist_ok=True)
    data: dict = {"schema": "tfbench.receipt/1", "scenario": "gate",
                  "created": dt.datetime.now().isoformat(timespec="seconds"), "host": bench.host_info(),
                  "settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
                               "preset_values": asdict(p), "engine_flags": engine.flags(), "url": None,
                               "base": "base", "run_dir": str(run_dir)},
                  "variants": [{**variants[k].to_dict(), "source": srcs[k].to_dict()} for k in ("base", "new")],
                  "missing_base": missing, "accepted_outputs": accepted, "runs": [], "environment": None}
    if missing:
        rep.note(missing)
    rep.start(len(settings.order))
    for i, name in enumerate(settings.order, 1):
        v = variants[name]
        rep.step(f"gate run {i}/{len(settings.order)}: {name}")
        log = run_dir / f"run{i}-{name}.log"
        try:
            with bench.launch(engine.flags() + v.args, log, env=v.env, root=Path(srcs[name].path)) as srv:
                info = bench.server_info(srv.url)
                if data["environment"] is None:
                    data["environment"] = info
                entry = play_run(srv.url, info, p, name, rep.note)
        except ServerError as e:
            if name != "base" or srcs["base"].path == srcs["new"].path:
                raise
            lines = str(e).splitlines()
            why = lines[0].rstrip(":; ") + (f"; its log ends: {lines[-1].strip()}" if len(lines) > 1 else "")
            rep.note(f"base {base_src.label} will not serve: {why}")
            return run_gate(replace(settings, base_ref=None), reporter,
                            f"base {base_src.label} would not serve ({why}; log {log}): the working tree "
                            "is compared with itself (A/A): outputs must still agree across fresh servers; "
                            "throughput checks only the noise.")
        data["runs"].append({"index": i, "variant": name, "log": str(log), **entry})
        rep.advance()
    return judge(data)


def judge(data: dict) -> dict:
    """Verdicts and reasons from the runs alone (re-runnable on a saved receipt)."""
    st = data["settings"]
    order = [r["variant"] for r in data["runs"]]
    reasons, notes, figs = [], [], {}
    for level in st["preset_values"]["levels"]:
        name = sweep.figure(level)
        vals = [r["sweep"]["figures"].get(name) for r in data["runs"]]
        figs[name] = stats.figure_stats(name, order, vals, "base", higher_is_better=True, margin=st["margin"])
    period = cut_period(data)
    for key, hib in LONG_FIGURES.items():
        vals = [r["long_prompt"][key] if r["long_prompt"]["valid"] else None for r in data["runs"]]
        figs[key] = stats.figure_stats(key, order, vals, "base", higher_is_better=hib, margin=st["long_margin"],
                                       slack=period if key in PHASE_FIGURES else 0.0)
    judge_long = st["preset_values"].get("judge_long", True)
    if period and judge_long:
        notes.append(f"C's first token and A's longest pause had to move by more than one cut period of B's "
                     f"prompt ({period:.2f} s, from base's B) as well: where C lands inside a cut is luck.")
    if not judge_long:
        notes.append(f"Preset {st.get('preset')}: long-prompt figures are shown, not judged (B fills in milliseconds).")
    for name, fs in figs.items():
        c = fs.comparisons.get("new")
        if c is None or (name in LONG_FIGURES and not judge_long):
            continue
        if c.verdict == stats.WORSE:
            slack = f" and one cut period ({c.slack:.2f} s)" if c.slack else ""
            reasons.append(f"{name}: new is worse than base beyond noise plus the {c.margin_pct:g} % margin{slack}: "
                           f"{stats.describe(c)}")
        elif c.verdict == stats.NA:
            notes.append(f"{name}: too few valid runs for a verdict")
    data["stats"] = {k: fs.to_dict() for k, fs in figs.items()}
    # hashes: the sweep's per prompt, and B, C (A on the common prefix)
    runs = sweep.runs_of({"runs": [{"variant": r["variant"], "batches": r["sweep"]["batches"]} for r in data["runs"]]})
    accepted = data.get("accepted_outputs")
    checks = {}
    groups = [("base", [r for r in runs if r.variant == "base"]), ("new", [r for r in runs if r.variant == "new"])]
    if not accepted:
        groups = [("all runs", runs)]
    for label, group in groups:
        hc = sweep.check_hashes(group)
        checks[label] = hc.to_dict()
        for f in hc.flagged[:5]:
            reasons.append(f"token hash differs ({label}): {f}")
        if len(hc.flagged) > 5:
            reasons.append(f"token hash differs ({label}): … {len(hc.flagged) - 5} more")
    lp_runs = {lab: [r for r in data["runs"] if lab == "all runs" or r["variant"] == lab] for lab, _ in groups}
    lp_equal = {}
    for label, rs in lp_runs.items():
        n_a = min((len(r["ids"]["A"]) for r in rs), default=0)
        for k in ("A", "B", "C"):
            hs = [(r["index"], token_hash(r["ids"]["A"][:n_a])[:12] if k == "A" and n_a else r["ids"].get(k)) for r in rs]
            ref = hs[0][1] if hs else None
            bad = [f"run {i}: {h} != {ref}" for i, h in hs if h != ref or h is None]
            lp_equal[f"{label}:{k}"] = {"equal": len(hs) - len(bad), "of": len(hs)}
            if bad:
                reasons.append(f"long-prompt {k}'s reply differs ({label}{', on its first %d tokens' % n_a if k == 'A' else ''}): "
                               + "; ".join(bad))
    data["hash_checks"], data["long_prompt_hashes"] = checks, lp_equal
    for r in data["runs"]:
        for e in r.get("sweep_errors", []):
            reasons.append(f"run {r['index']} ({r['variant']}): sweep {e}")
        if not r["long_prompt"]["valid"]:
            notes.append(f"run {r['index']} ({r['variant']}): long-prompt run invalid, left out: "
                         + "; ".join(r["long_prompt"]["invalid_reasons"]))
    if data.get("missing_base"):
        notes.append(data["missing_base"])
    if accepted:
        notes.append("Outputs: a change of outputs was acknowledged (--accept-new-outputs or "
                     f"{ACCEPT_FILE}); base's and new's replies were each checked against their own side only.")
    data["passed"], data["reasons"], data["notes"] = not reasons, reasons, notes
    return data


def render_markdown(data: dict, png_name: str | None = None) -> str:
    from tensorfold_bench import receipt

    verdict = "PASS" if data["passed"] else "FAIL"
    srcs = {v["name"]: worktree.Source(**v["source"]).label for v in data["variants"]}
    st = data["settings"]
    lines = [f"## tfbench gate: {verdict}", "",
             f"base = {srcs['base']}{' ' + json.dumps(data['variants'][0]['env']) if data['variants'][0]['env'] else ''}; "
             f"new = {srcs['new']}{' ' + json.dumps(data['variants'][1]['env']) if data['variants'][1]['env'] else ''}; "
             f"order {'/'.join(order_of(data))}, preset `{st['preset']}`, margins {st['margin'] * 100:g} % "
             f"(throughput) and {st['long_margin'] * 100:g} % (long-prompt figures).", ""]
    if data["reasons"]:
        lines += ["**Why it failed.**", *[f"- {r}" for r in data["reasons"]], ""]
    p = st["preset_values"]
    lines += ["**Environment.**", *receipt.environment_lines(data), "",
              f"**The test.** Each run starts a fresh server and plays a sweep (levels "
              f"{', '.join(map(str, p['levels']))}, {p['tokens']} tokens a stream, {p['prompt_tokens']}-token "
              f"prompts, {p['reps']} reps) and then a long-prompt run (B: {p['b_tokens']} tokens sent "
              f"{p['b_at']:g} s into A's decoding; C {p['c_after']:g} s later).", "",
              "| figure | variant | runs (in run order) | median | vs base | paired 95 % interval | verdict |",
              "|---|---|---|---|---|---|---|"]
    for name, d in data["stats"].items():
        fs = stats.FigureStats.from_dict(d)
        for v in ("base", "new"):
            vals = " / ".join(sweep.fmt(x, 3) for x in fs.runs.get(v, [])) or "–"
            if v == "base" or "new" not in fs.comparisons:
                span = f" (span {sweep.fmt(fs.base_span[0], 3)}–{sweep.fmt(fs.base_span[1], 3)})" if fs.base_span and v == "base" else ""
                lines.append(f"| {name} | {v} | {vals} | **{sweep.fmt(fs.medians.get(v), 3)}**{span} | | | |")
            else:
                c = fs.comparisons["new"]
                iv = "–" if c.interval_pct is None else f"{c.interval_pct[0]:+.1f} % to {c.interval_pct[1]:+.1f} %"
                lines.append(f"| {name} | new | {vals} | **{sweep.fmt(c.median, 3)}** | {stats.fmt_pct(c.pct)} | {iv} | {c.verdict} |")
    lines += ["", "**Exactness.**"]
    for label, hc in data["hash_checks"].items():
        lines.append(f"- Sweep replies ({label}): {hc['equal']} of {hc['replies']} equal.")
    lp = data["long_prompt_hashes"]
    lines.append("- Long-prompt replies: " + ", ".join(f"{k} {v['equal']} of {v['of']}" for k, v in lp.items()) + ".")
    if data["notes"]:
        lines += ["", "**Notes.**", *[f"- {n}" for n in data["notes"]]]
    lines += ["", f"Exit code {PASS if data['passed'] else FAIL} (0 pass, 1 regression, 2 usage or infrastructure error)."]
    return "\n".join(lines) + "\n"


def order_of(data: dict) -> list[str]:
    return [r["variant"] for r in data["runs"]] or data["settings"]["order"]
