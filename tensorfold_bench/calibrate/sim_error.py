"""The simulator's error against committed long-prompt receipts, out of sample.

Receipts are grouped by card, model and engine commit. For each real run of a group, a profile is
fitted from the engine traces of every *other* run of the group (and the B-alone traces not made on
that run's server), its twin is played in virtual time (A, B and C at the run's own send offsets,
lengths and engine configuration, on the engine's real lane host: tensorfold_bench.client.virtual),
and the harness's own long-prompt figures (tensorfold_bench.analysis.figures.long_prompt) are computed on
both. So no run is predicted from its own trace.

    python -m tensorfold_bench.calibrate.sim_error [RECEIPT.json.gz ...]    (default: every long-prompt receipt)
    python -m tensorfold_bench.calibrate.sim_error --profile PROFILE.json RECEIPT.json.gz ...
        (each run's twin on a profile measured once, as the simulator is meant to run)

Every twin plays today's scheduler code (engine/scheduler): a receipt of an older engine commit ran
that commit's scheduler, so its error includes any change of schedule since. Every figure on the
simulated side is simulated. What the simulation lacks shows as error, not as
a fitted constant: the server's HTTP thread taking the host's time while a 32,000-token request is
parsed, the client's own latency, clocks that change with load.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import EngineConfig, KernelConfig
from engine.scheduler.backend import Capabilities
from engine.scheduler.costs import Costs, Profile, ProfileError
from engine.scheduler.trace_profile import TracedRun, TracedStream, profile_of, samples_of
from tensorfold_bench.analysis import figures
from tensorfold_bench.client.stream import StreamRecord
from tensorfold_bench.errors import BenchError
from tensorfold_bench.report import store
from tensorfold_bench.scenarios.long_prompt import LongPromptScript, make_prompts, timeline
from tensorfold_bench.client.virtual import SimError, SimRequest, play

FIGURES = ("b_first_token", "c_first_token", "a_longest_pause", "a_kept")


@dataclass
class RealRun:
    """One tfengine run of a long-prompt receipt, with what its twin needs."""
    receipt: str
    index: int
    variant: str
    group: tuple[str, str, str]  # (card, model, engine commit)
    cfg: EngineConfig
    caps: Capabilities
    vocab: int
    script: LongPromptScript
    records: dict[str, StreamRecord]
    figures: dict
    traced: TracedRun
    alone: list[TracedRun] = field(default_factory=list)  # B-alone traces made on this run's server


def engine_config(d: dict) -> EngineConfig:
    """The engine's configuration as a receipt stores it (fields it lacks take their defaults)."""
    known = {f.name for f in dataclasses.fields(EngineConfig)} - {"kernels"}
    kn = {f.name for f in dataclasses.fields(KernelConfig)}
    kernels = KernelConfig(**{k: v for k, v in (d.get("kernels") or {}).items() if k in kn})
    return EngineConfig(**{k: v for k, v in d.items() if k in known}, kernels=kernels)


def capabilities(cfg: EngineConfig, eng: dict) -> Capabilities:
    """What the run's runner declared: its `capabilities` where the engine description the receipt
    keeps has them, else read back from that description's words (engines that did not list them).
    The rows its rounds ran at: declared, else the description's `decode_rows`."""
    rows = eng.get("decode_rows")
    round_sizes = tuple(int(n) for n in rows) if isinstance(rows, list) and rows else None
    if isinstance(eng.get("capabilities"), dict):
        d = {k: v for k, v in eng["capabilities"].items() if k in Capabilities.__dataclass_fields__}
        for k in ("cut_sizes", "round_sizes"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        d.setdefault("round_sizes", round_sizes)
        return Capabilities(**d)
    mixed_text = str(eng.get("cuda_mixed") or eng.get("cpu_mixed") or "")
    granule = re.search(r"multiples of (\d+)", mixed_text)
    sizes = re.search(r"graphs at cuts of ([\d, ]+) rows", mixed_text)
    mixed = cfg.prefill_mode == "mixed" and bool(mixed_text) and mixed_text != "off"
    return Capabilities(
        cut_granule=int(granule.group(1)) if mixed and granule else 16,
        cut_sizes=tuple(int(s) for s in sizes.group(1).replace(" ", "").split(",")) if mixed and sizes else None,
        cut_free=mixed and ("row-invariant" in mixed_text or "cut_flash" in mixed_text),
        batch_cuts=cfg.device == "cuda" and cfg.kernels.batch_cuts and cfg.kernels.fused,
        runs_ahead=bool(eng.get("decode_ahead")), mixed=True,
        split=cfg.prefill_mode == "split" and str(eng.get("cuda_split", "off")) != "off", round_sizes=round_sizes)


def _streams(recs: list[dict | None]) -> list[TracedStream]:
    return [TracedStream(r["prompt_len"], list(r["token_times"]), r.get("cached_tokens") or 0, r.get("sent"))
            for r in recs if r and r.get("token_times")]


def runs_of(path: Path) -> list[RealRun]:
    """The receipt's traced tfengine runs (a foreign server's runs have no engine trace)."""
    d = store.read(Path(path))
    if d.get("simulated"):  # a simulated receipt's runs are the simulator's own: nothing to check against
        return []
    name = store.stem(Path(path))
    settings = d.get("settings") or {}
    sk = {f.name for f in dataclasses.fields(LongPromptScript)} - {"sampling"}
    script = LongPromptScript(**{k: v for k, v in (settings.get("script") or {}).items() if k in sk})
    out, by_index = [], {}
    for r in d.get("runs") or []:
        eng = ((r.get("engine") or {}).get("engine")) or {}
        conf = (r.get("engine") or {}).get("config")
        if not r.get("trace") or not conf or not r.get("records") or not r.get("figures"):
            continue
        cfg = engine_config(conf)
        card = str(eng.get("device_name"))
        if cfg.device == "cpu":  # one card, two kernel paths: the ISA and dtype tell them apart
            card = " ".join(x for x in (card, (eng.get("cpu") or {}).get("isa"), cfg.dtype) if x)
        group = (card, str(eng.get("model")), str((r.get("engine") or {}).get("commit")))
        recs = {k: StreamRecord.from_dict(v) for k, v in r["records"].items()}
        caps = capabilities(cfg, eng)
        traced = TracedRun(r["trace"], _streams(list(r["records"].values())), cfg.prefill_mode,
                           cfg.decode_sms if cfg.prefill_mode == "split" else None, caps.runs_ahead)
        run = RealRun(name, r["index"], r["variant"], group, cfg, caps,
                      int((eng.get("shape") or {}).get("vocab") or 151_936), script, recs, r["figures"], traced)
        out.append(run)
        by_index[r["index"]] = run
    for alone in (d.get("alone") or {}).values():
        host = by_index.get(alone.get("run"))
        if host is not None and alone.get("trace"):
            host.alone.append(TracedRun(alone["trace"], _streams([alone.get("record"), alone.get("a_record")]),
                                        host.cfg.prefill_mode, host.traced.decode_sms, host.traced.ahead))
    return out


def twin(run: RealRun, costs: Costs) -> dict[str, StreamRecord]:
    """The run played in virtual time: A, B and C at the run's own send offsets and lengths."""
    prompts = make_prompts(run.script, run.vocab)
    a, b, c = (run.records[k] for k in "ABC")
    t0 = a.sent
    reqs = [SimRequest("A", prompts["A"], a.max_tokens, 0.0, until=("B", "C")),
            SimRequest("B", prompts["B"], b.max_tokens, b.sent - t0),
            SimRequest("C", prompts["C"], c.max_tokens, c.sent - t0)]
    return play(reqs, run.cfg, costs, run.caps, vocab_size=run.vocab).records


def kept(f: dict) -> float | None:
    """A kept: its rate while B fills as a percentage of its rate before."""
    if f.get("a_rate_during") is None or not f.get("a_rate_before"):
        return None
    return 100.0 * f["a_rate_during"] / f["a_rate_before"]


def values(f: dict) -> dict[str, float | None]:
    return {"b_first_token": f.get("b_first_token"), "c_first_token": f.get("c_first_token"),
            "a_longest_pause": f.get("a_longest_pause"), "a_kept": kept(f)}


def error(name: str, real: float | None, sim: float | None) -> float | None:
    """Relative error in % (A kept: the difference in points)."""
    if real is None or sim is None:
        return None
    if name == "a_kept":
        return sim - real
    return 100.0 * (sim - real) / real if real else None


@dataclass
class Row:
    run: RealRun
    real: dict[str, float | None]
    sim: dict[str, float | None]
    why: str | None = None  # a run that could not be simulated


def one_tree(commit: str) -> bool:
    """Whether a receipt's engine commit names one tree (not a dirty one, nor a bare HEAD)."""
    return bool(commit) and commit != "None" and "dirty" not in commit and not commit.startswith("HEAD")


def simulated(r: RealRun, costs: Costs) -> Row:
    """One run against its twin on `costs`."""
    real = values(r.figures)
    try:
        recs = twin(r, costs)
    except (ProfileError, SimError) as exc:
        return Row(r, real, {}, str(exc))
    return Row(r, real, values(figures.long_prompt(timeline(r.script), recs).to_dict()))


def check_on(runs: list[RealRun], costs: Costs) -> list[Row]:
    """Each run against its twin on one measured profile (the profile taken once, the runs after)."""
    return [simulated(r, costs) for r in runs]


def check(runs: list[RealRun]) -> list[Row]:
    """Each run against its twin on a profile fitted from the rest of its group."""
    groups: dict[tuple, list[RealRun]] = {}
    for r in runs:
        groups.setdefault(r.group, []).append(r)
    rows = []
    for group in groups.values():
        for r in group:
            samples_of(r.traced)
            for a in r.alone:
                samples_of(a)
        for r in group:
            others = [o for o in group if o is not r]
            traced = [o.traced for o in others] + [a for o in others for a in o.alone]
            card, model, commit = r.group
            profile = profile_of(traced, {"type": r.cfg.device, "name": card}, {"name": model},
                                 {"commit": commit}, "fitted from receipt traces: " + ", ".join(
                                     sorted({f"{o.receipt} run {o.index}" for o in others})))
            real = values(r.figures)
            if not one_tree(commit):
                rows.append(Row(r, real, {}, f"engine commit {commit!r} names no one tree: runs cannot be grouped"))
                continue
            if not traced:
                rows.append(Row(r, real, {}, "no other run of its card and commit to fit from"))
                continue
            rows.append(simulated(r, Costs(profile)))
    return rows


KEEP = 400  # samples a profile keeps of one kind at one row count: more only lengthens the file


def thinned(rows: list, by: int | None) -> list:
    """At most KEEP rows for each value of column `by` (None: of the kind), evenly over the rest of
    the row's values, times rounded to 0.1 us."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(r[by] if by is not None else None, []).append(r)
    out = []
    for _, g in sorted(groups.items(), key=lambda kv: str(kv[0])):
        g = sorted(g)
        step = max(1, -(-len(g) // KEEP))
        out += g[::step]
    return [[round(x, 7) if isinstance(x, float) else x for x in r] for r in out]


def profile_from(runs: list[RealRun], created: str) -> Profile:
    """One profile from every run given (one card, model and commit), thinned for the file."""
    groups = {r.group for r in runs}
    if len(groups) != 1:
        raise ValueError("a profile is of one card, model and engine commit; the receipts hold "
                         + "; ".join(", ".join(g) for g in sorted(groups)))
    (card, model, commit), first = groups.pop(), runs[0]
    if not one_tree(commit):
        raise ValueError(f"engine commit {commit!r} names no one tree: its costs belong to no build")
    for r in runs:
        samples_of(r.traced)
        for a in r.alone:
            samples_of(a)
    traced = [r.traced for r in runs] + [a for r in runs for a in r.alone]
    names = sorted({r.receipt for r in runs})
    cfg = first.cfg
    prof = profile_of(traced, {"type": cfg.device, "name": card},
                      {"name": model, "dtype": cfg.dtype, "vocab": first.vocab},
                      {"commit": commit, "parallel": cfg.parallel, "prefill_rows": cfg.prefill_rows,
                       "max_model_len": cfg.max_model_len}, "fitted from receipt traces: " + ", ".join(names), created)
    by = {"prefill": 0, "decode": 0, "decode_ahead": 0, "host": 0, "mixed": 2, "split": 0, "split_round": 0}
    prof.samples = {k: thinned(v, by.get(k)) for k, v in prof.samples.items()}
    return prof


def _fmt(name: str, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if name == "a_kept" else f"{v * 1000:.0f}"


def table(rows: list[Row]) -> str:
    """Markdown: each run, real / simulated / error per figure, then each group's median |error|."""
    head = ("| receipt | run | card, model | variant | B first token ms | C first token ms | "
            "A longest pause ms | A kept % |")
    out = [head, "|" + "---|" * 8]
    for row in rows:
        r = row.run
        cells = [r.receipt, str(r.index), f"{r.group[0].replace('NVIDIA ', '')}, {r.group[1]}", r.variant]
        if row.why:
            out.append("| " + " | ".join(cells + [f"not simulated: {row.why}", "", "", ""]) + " |")
            continue
        for n in FIGURES:
            e = error(n, row.real[n], row.sim[n])
            es = "-" if e is None else (f"{e:+.1f} pt" if n == "a_kept" else f"{e:+.1f} %")
            cells.append(f"{_fmt(n, row.real[n])} / {_fmt(n, row.sim[n])} ({es})")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def summary(rows: list[Row]) -> str:
    """Per card and model: the median and largest |error| of each figure over the runs simulated."""
    out = ["| card, model | runs | B first token | C first token | A longest pause | A kept |", "|" + "---|" * 6]
    ms = ("c_first_token", "a_longest_pause")  # short figures: their error in ms says more than in %
    by: dict[tuple, list[Row]] = {}
    for row in rows:
        if not row.why:
            by.setdefault(row.run.group[:2], []).append(row)
    for (card, model), rs in sorted(by.items()):
        cells = [f"{card.replace('NVIDIA ', '')}, {model}", str(len(rs))]
        for n in FIGURES:
            es = [abs(e) for e in (error(n, x.real[n], x.sim[n]) for x in rs) if e is not None]
            unit = " pt" if n == "a_kept" else " %"
            cell = f"{statistics.median(es):.1f}{unit} (max {max(es):.1f})" if es else "-"
            if n in ms and es:
                d = [1000 * abs(x.sim[n] - x.real[n]) for x in rs if x.sim[n] is not None and x.real[n] is not None]
                cell += f"; {statistics.median(d):.0f} ms (max {max(d):.0f})"
            cells.append(cell)
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorfold_bench.calibrate.sim_error", description=__doc__.split("\n\n")[0])
    ap.add_argument("receipts", nargs="*", help="long-prompt receipts (default: receipts/*long-prompt.json.gz)")
    ap.add_argument("--device", default=None, help="only runs on this device type (cuda or cpu)")
    ap.add_argument("--write-profile", metavar="FILE", default=None,
                    help="instead: fit one profile from every run of the receipts given (one card, model and "
                         "commit) and write it")
    ap.add_argument("--profile", metavar="FILE", default=None,
                    help="play every run's twin on this measured profile (tfengine profile) instead of "
                         "profiles fitted from the other runs' traces")
    args = ap.parse_args(argv)
    if args.profile and args.write_profile:
        print("--profile and --write-profile: give one", file=sys.stderr)
        return 2
    paths = [Path(p) for p in args.receipts] or sorted(Path("receipts").glob("*long-prompt.json.gz"))
    if not paths:
        print("no long-prompt receipts given or found under receipts/", file=sys.stderr)
        return 2
    t = time.perf_counter()
    runs = []
    for p in paths:
        try:
            runs += [r for r in runs_of(p) if args.device is None or r.cfg.device == args.device]
        except (OSError, ValueError, BenchError) as exc:
            print(f"{exc}" if isinstance(exc, BenchError) else f"{p}: {exc}", file=sys.stderr)
            return 2
    if args.write_profile:
        created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            prof = profile_from(runs, created)
        except ValueError as exc:
            print(f"--write-profile: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {prof.write(Path(args.write_profile))}: " + ", ".join(
            f"{k} {len(v)}" for k, v in prof.samples.items() if v))
        return 0
    if args.profile:
        try:
            costs = Costs.load(Path(args.profile))
        except ProfileError as exc:
            print(f"--profile: {exc}", file=sys.stderr)
            return 2
        rows, how = check_on(runs, costs), f"on the measured profile {args.profile}"
    else:
        rows, how = check(runs), "profiles fitted from the other runs' traces"
    print(f"Simulated (virtual time, {how}) against real, per run: real / simulated (error).\n")
    print(table(rows))
    print("\nMedian |error| per card and model (largest in brackets):\n")
    print(summary(rows))
    print(f"\n{len(rows)} runs from {len(paths)} receipts in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
