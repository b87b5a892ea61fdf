"""Every figure a receipt shows, as pure functions of raw records (no I/O, no clock), and the
one registry of their names, units, directions, digits and labels that renderers read.

Long-prompt figures (a script's, by the A/B/C timeline's figure definitions), with
W = (B send, B first token]:
- B first token: B's first token time - B's send time; C likewise from C's send.
- A's longest pause: the largest gap t[i+1] - t[i] between consecutive A tokens such that the
  gap overlaps W: t[i] < B first token and t[i+1] > B send. A gap that spans B's send (or B's
  first token) counts whole. A gap that ends exactly at B's send, or starts exactly at B's first
  token, does not. Tokens of one chunk share a time, so their gaps are 0.
- A during B: A tokens with B send < t <= B first token, divided by the length of W.
- A before: the window (s, B send] of the same length, where s = max(B send - |W|, A's first
  token): A tokens inside it divided by its length (A's first token itself is its start and
  is not counted).

A script's figures (tensorfold_bench.workload.script_file) are the same functions over any stream and window:
first token from the stream's own send, longest pause and rate inside a window between events
(and the rate in the window of equal length just before it), cached tokens as reported.

The sweep's figures are in `sweep_figures`.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


from tensorfold_bench.analysis import stats
from tensorfold_bench.client import selfcheck
from tensorfold_bench.client.stream import StreamRecord
from tensorfold_bench.receipt import Alone, Receipt, Record, Run, as_receipt
from tensorfold_bench.servers.launcher import flag_value
from tensorfold_bench.workload.script_file import Figure, Point, Script

LATE_LIMIT_S = 0.25  # a send later than this against its script time makes the run invalid


@dataclass(frozen=True)
class FigureSpec:
    name: str
    unit: str
    higher_is_better: bool
    digits: int
    label: str


REGISTRY = {s.name: s for s in (
    FigureSpec("b_first_token", "s", False, 2, "B first token"),
    FigureSpec("c_first_token", "s", False, 2, "C first token"),
    FigureSpec("a_longest_pause", "s", False, 2, "A longest pause"),
    FigureSpec("a_rate_during", "tok/s", True, 1, "A during B"),
    FigureSpec("a_rate_before", "tok/s", True, 1, "A before"),
    FigureSpec("b_alone", "s", False, 2, "B alone"),
    FigureSpec("tok_s", "tok/s", True, 1, "aggregate tok/s"),
    FigureSpec("ttft_p50", "ms", False, 1, "first token p50"),
    FigureSpec("itl_p50", "ms", False, 1, "inter-token p50"),
    FigureSpec("itl_p99", "ms", False, 1, "inter-token p99"),
    # a script's figures, one per stream (or label): `first_token:R`
    FigureSpec("first_token", "s", False, 2, "first token"),
    FigureSpec("longest_pause", "s", False, 2, "longest pause"),
    FigureSpec("rate", "tok/s", True, 1, "rate in the window"),
    FigureSpec("rate_before", "tok/s", True, 1, "rate before the window"),
    FigureSpec("cached_tokens", "tokens", True, 0, "cached tokens"),
    # tfbench load's, one per level (`goodput@rate=2`): tensorfold_bench.analysis.load
    FigureSpec("goodput", "req/s", True, 2, "goodput"),
    FigureSpec("attainment", "%", True, 1, "SLO attainment"),
    FigureSpec("req_s", "req/s", True, 2, "requests/s"),
    FigureSpec("out_tok_s", "tok/s", True, 1, "output tok/s"),
    FigureSpec("ttft_p99", "ms", False, 1, "first token p99"),
    FigureSpec("tpot_p50", "ms", False, 1, "TPOT p50"),
    FigureSpec("tpot_p99", "ms", False, 1, "TPOT p99"),
    FigureSpec("e2e_p50", "ms", False, 1, "end-to-end p50"),
    FigureSpec("e2e_p99", "ms", False, 1, "end-to-end p99"),
    FigureSpec("ttft_sched_p99", "ms", False, 1, "first token p99 from the schedule"),
    FigureSpec("pause_in", "ms", False, 1, "background's longest pause during fills"),
    FigureSpec("itl_p99_in", "ms", False, 1, "background's inter-token p99 during fills"),
    FigureSpec("ttft_p99_in", "ms", False, 1, "first token p99 of requests sent during fills"),
    FigureSpec("inject_ttft", "ms", False, 1, "injected prompt's first token"),
)}
# the long-prompt receipt's figure names and the A/B/C script's figures they are (the script's
# figure definitions: tensorfold_bench.scenarios.long_prompt.FIGURES)
LONG_PROMPT_KEYS = {"b_first_token": "first_token:B", "c_first_token": "first_token:C",
                    "a_longest_pause": "longest_pause:A", "a_rate_during": "rate:A", "a_rate_before": "rate_before:A"}
LONG_PROMPT = tuple(LONG_PROMPT_KEYS)
LATENCY = ("ttft_p50", "itl_p50", "itl_p99")


def predictable_long_prompt() -> set[str]:
    """The names a long-prompt prediction may use (see long_prompt_predicted)."""
    return {*LONG_PROMPT, *(k + "_s" for k in ("b_first_token", "c_first_token", "a_longest_pause")),
            "a_rate_during_b_pct", "b_alone", "b_alone_s"}


def predictable_sweep(levels) -> set[str]:
    """The names a sweep prediction may use: tok/s and the latencies at each level run."""
    return {at(f, lv) for f in ("tok_s", *LATENCY) for lv in levels}


def num(v: float | None, digits: int = 2, none: str = "-") -> str:
    """`1,234.57`; `none` for a missing value (long-prompt tables show "-", sweep tables "–")."""
    if v is None or v != v:
        return none
    return f"{v:,.{digits}f}"


def spec(name: str) -> FigureSpec:
    """A figure's spec; a per-level figure `tok_s@8` is the family `tok_s`, a script's
    `first_token:R` the kind `first_token`."""
    return REGISTRY[name.split("@", 1)[0].split(":", 1)[0]]


def at(family: str, level: int) -> str:
    return f"{family}@{level}"


def median(values: list[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def stats_for(names: list[str], order: list[str], values: list[dict], base: str, margin: float,
              slack: dict[str, float] | None = None) -> dict[str, stats.FigureStats]:
    """Each named figure's statistics over the runs (`values[i]`: run i's figures; None leaves a
    run out), its direction from the registry."""
    return {n: stats.figure_stats(n, order, [v.get(n) for v in values], base, margin=margin,
                                  higher_is_better=spec(n).higher_is_better, slack=(slack or {}).get(n, 0.0))
            for n in names}


# ---- long-prompt ---------------------------------------------------------------------------

@dataclass
class LongPromptFigures:
    b_first_token: float | None
    c_first_token: float | None
    a_longest_pause: float | None
    a_rate_during: float | None  # A tok/s while B fills
    a_rate_before: float | None  # A tok/s in the equal window before B's send
    a_tokens_during: int
    window: float | None  # |W| in seconds
    lateness: dict[str, float | None]  # per stream: send - script time
    valid: bool
    invalid_reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LongPromptFigures":
        return cls(**d)


def client_bottleneck(f, check: dict | None) -> None:
    """A run whose client self-check failed is invalid (`f`: figures with `valid` and
    `invalid_reasons`), its reasons said; a send late past the bound is already one of the
    figures' own reasons."""
    if why := selfcheck.bottleneck(check):
        f.valid = False
        f.invalid_reasons += why


def first_token_latency(rec: StreamRecord) -> float | None:
    if rec.sent is None or not rec.token_times:
        return None
    return rec.token_times[0] - rec.sent


def longest_pause(times: list[float], lo: float, hi: float) -> float | None:
    """Largest gap between consecutive times that overlaps the window (lo, hi); None if no gap
    does (fewer than two tokens, or every gap outside the window)."""
    best = None
    for a, b in zip(times, times[1:]):
        if a < hi and b > lo:
            g = b - a
            best = g if best is None or g > best else best
    return best


def count_in(times: list[float], lo: float, hi: float) -> int:
    """Tokens with lo < t <= hi."""
    return sum(1 for t in times if lo < t <= hi)


def rate_before(times: list[float], b_send: float, length: float) -> float | None:
    if not times or length <= 0:
        return None
    start = max(b_send - length, times[0])
    if start >= b_send:
        return None
    return count_in(times, start, b_send) / (b_send - start)


def lateness(rec: StreamRecord) -> float | None:
    if rec.scheduled is None or rec.sent is None:
        return None
    return rec.sent - rec.scheduled


def long_prompt(script: Script, records: dict[str, StreamRecord], t0: float = 0.0,
                late_limit: float = LATE_LIMIT_S) -> LongPromptFigures:
    """One A/B/C run's figures: the script's own (script_run, validity included) under the
    long-prompt receipt's names, with what its `rate` figure's window W counts (A's tokens in W,
    W's length)."""
    sf = script_run(script, records, t0, late_limit)
    rate = next(f for f in script.figures if f.key == LONG_PROMPT_KEYS["a_rate_during"])
    lo, hi = (point_time(p, records, t0) for p in rate.window)
    window = None if lo is None or hi is None else hi - lo
    during = 0 if window is None else count_in(records[rate.stream].token_times, lo, hi)
    return LongPromptFigures(*(sf.values.get(LONG_PROMPT_KEYS[k]) for k in LONG_PROMPT), during, window, sf.lateness,
                             valid=sf.valid, invalid_reasons=sf.invalid_reasons)


def failed_long_prompt(why: str) -> LongPromptFigures:
    """A run whose server failed: no figure, invalid."""
    return LongPromptFigures(None, None, None, None, None, 0, None, {}, valid=False,
                             invalid_reasons=[f"the server failed: {why}"])


def pace_alone(times: list[float], lo: float, hi: float, alone: list[float]) -> float | None:
    """A's rate alone over the tokens it made in (lo, hi] beside B: the same token indices (the
    same context lengths) of its run with nothing else running, or None where that run is short."""
    i0, i1 = count_in(times, float("-inf"), lo), count_in(times, float("-inf"), hi)
    if i0 < 1 or i1 <= i0 or len(alone) < i1 or alone[i1 - 1] <= alone[i0 - 1]:
        return None
    return (i1 - i0) / (alone[i1 - 1] - alone[i0 - 1])


def pace_pct(run: Run, a_alone: Record | None) -> float | None:
    """One run's A rate while B fills as a percentage of A's pace alone over the same tokens."""
    f = LongPromptFigures.from_dict(run.figures)
    recs = run.records or {}
    if not a_alone or not f.valid or f.a_rate_during is None or "A" not in recs or "B" not in recs:
        return None
    b = recs["B"]
    if b.sent is None or not b.token_times:
        return None
    pace = pace_alone(recs["A"].token_times or [], b.sent, b.token_times[0], a_alone.token_times or [])
    return 100 * f.a_rate_during / pace if pace else None


def medians(figs: list[LongPromptFigures]) -> dict[str, float | None]:
    """Median of each figure over the valid runs only."""
    ok = [f for f in figs if f.valid]
    return {k: median([getattr(f, k) for f in ok]) for k in LONG_PROMPT}


@dataclass
class VariantSummary:
    """One variant's long-prompt runs: their figures (in run order), the medians over the valid
    ones, B alone, B's median against alone (`x_alone`), A's rate during B as a percentage of
    before (`during_pct`) and of its pace alone over the same tokens (`pace_pct`)."""
    runs: list[Run]
    figures: list[LongPromptFigures]
    median: dict[str, float | None]
    alone: float | None
    x_alone: float | None
    during_pct: float | None
    pace_pct: float | None


def long_prompt_summary(data: Receipt | dict) -> dict[str, VariantSummary]:
    """variant -> its summary, for the variants that ran: the long-prompt receipt's analysis,
    computed once per checkpoint and read by the predictions, the table, the frontier (its lines
    and picture) and the command's printed summary."""
    r, out = as_receipt(data), {}
    for v in r.variants:
        runs = [run for run in r.runs if run.variant == v.name]
        if not runs:
            continue
        figs = [LongPromptFigures.from_dict(run.figures) for run in runs]
        med = medians(figs)
        alones = (r.alone or {}).get(v.name) or Alone()
        alone = alones.b_first_token
        x_alone = med["b_first_token"] / alone if alone and med["b_first_token"] else None
        pct = 100 * (med["a_rate_during"] or 0) / med["a_rate_before"] if med["a_rate_before"] else None
        paces = [p for p in (pace_pct(run, alones.a_record) for run in runs) if p is not None]
        out[v.name] = VariantSummary(runs, figs, med, alone, x_alone, pct, median(paces) if paces else None)
    return out


# The trade the engine's scheduler aims past on the long-prompt test: A keeps at least 45 % of its
# rate with B at most 1.25x alone, and at least 75 % with B at most 1.7x (slowdown, kept %).
FRONTIER_TARGETS = ((1.25, 45.0), (1.7, 75.0))


def targets_met(rows: list[dict], targets=FRONTIER_TARGETS) -> list[tuple[float, float, list[str]]]:
    """Each target (B's slowdown at most, A kept at least) with the frontier's variants that meet it."""
    return [(x, kept, [r["variant"] for r in rows if r["slowdown"] <= x and r["kept"] >= kept])
            for x, kept in targets]


def frontier(data: Receipt | dict, summary: dict[str, VariantSummary] | None = None) -> list[dict]:
    """Each variant's trade, ordered by B's slowdown (its median first token over alone, `x_alone`):
    A's kept rate (during B over before, in percent), its distance in points above the line
    100 * (1 - 1/slowdown) that alternating whole steps between A and B sits on (B given a share
    f of the steps takes 1/f as long; A keeps 1 - f), the variants that dominate it (no slower
    for B and keeping no less of A, better in one), and its `--prefill-mode` (None: not given).
    A variant missing either median is left out; [] when fewer than two remain (no trade to show).
    `summary`: long_prompt_summary's, where the caller has it already."""
    r, rows = as_receipt(data), []
    summary = long_prompt_summary(r) if summary is None else summary
    for v in r.variants:
        s = summary.get(v.name)
        if not s or s.x_alone is None or s.during_pct is None or s.median["a_rate_during"] is None:
            continue
        mode = flag_value(list(v.args or []), "--prefill-mode")
        x, kept = s.x_alone, s.during_pct
        rows.append({"variant": v.name, "mode": mode, "slowdown": x, "kept": kept,
                     "vs_line": kept - 100 * (1 - 1 / x)})
    if len(rows) < 2:
        return []
    for row in rows:
        row["dominated_by"] = [o["variant"] for o in rows if o["slowdown"] <= row["slowdown"] and o["kept"] >= row["kept"]
                               and (o["slowdown"] < row["slowdown"] or o["kept"] > row["kept"])]
    return sorted(rows, key=lambda row: row["slowdown"])


def margin_of(r: Receipt) -> float:
    return stats.DEFAULT_MARGIN if r.settings.margin is None else r.settings.margin


def long_prompt_stats(data: Receipt | dict) -> dict:
    """Each long-prompt figure's statistics over the runs, invalid runs left out."""
    r = as_receipt(data)
    order = [run.variant for run in r.runs]
    values = [run.figures if run.figures["valid"] else {} for run in r.runs]
    return {k: fs.to_dict() for k, fs in
            stats_for(list(LONG_PROMPT), order, values, r.variants[0].name, margin_of(r)).items()}


def long_prompt_predicted(summary: dict[str, VariantSummary]) -> dict[str, dict[str, float | None]]:
    """variant -> figure -> median, for predictions, from long_prompt_summary's: the long-prompt
    figures (also as `_s`, and `a_rate_during_b_pct` = during / before in percent) and `b_alone`."""
    out: dict[str, dict] = {}
    for name, s in summary.items():
        m = dict(s.median)
        for k in ("b_first_token", "c_first_token", "a_longest_pause"):
            m[k + "_s"] = m.get(k)
        if m.get("a_rate_during") is not None and m.get("a_rate_before"):
            m["a_rate_during_b_pct"] = m["a_rate_during"] / m["a_rate_before"] * 100
        m["b_alone"] = m["b_alone_s"] = s.alone
        out[name] = m
    return out


# ---- scripts -------------------------------------------------------------------------------

def event_time(rec: StreamRecord, kind: str) -> float | None:
    """When a stream's event (tensorfold_bench.workload.script_file.EVENTS) happened, or None: not (yet).
    `done` is a stream that finished by itself; one cancelled or failed is never done."""
    if kind == "sent":
        return rec.sent
    if kind == "first_token":
        return rec.token_times[0] if rec.token_times else None
    if kind == "done":
        return rec.ended if rec.ended is not None and not rec.cancelled and not rec.error else None
    if kind == "cancelled":
        return rec.ended if rec.cancelled else None
    raise ValueError(f"unknown event {kind!r}")


def point_time(point: Point, records: dict[str, StreamRecord], t0: float) -> float | None:
    """A script's time point on the run's clock (t0: the run's start), or None: its event did not happen."""
    if point.event is None:
        return t0 + point.plus
    t = event_time(records[point.event.stream], point.event.kind)
    return None if t is None else t + point.plus


@dataclass
class ScriptFigures:
    """One script run's figures (key -> value), each send's lateness, the expectations' results
    (held None: the server reported nothing to check) and whether the run is valid."""

    values: dict[str, float | None]
    lateness: dict[str, float | None]
    expects: list[dict]
    valid: bool
    invalid_reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ScriptFigures":
        return cls(**d)


def _window_figure(f: Figure, rec: StreamRecord, lo: float, hi: float, reasons: list[str]) -> dict[str, float | None]:
    """A stream's longest pause or rate in (lo, hi]; the stream must decode across the window."""
    times, start, end = rec.token_times, f.window[0], f.window[1]
    if not times or times[0] >= lo:
        reasons.append(f"{f.stream} had no token before {start}: it was not decoding across the window")
    stop = rec.ended if rec.ended is not None else (times[-1] if times else None)
    if not times or times[-1] < lo or (stop is not None and stop < hi):
        reasons.append(f"{f.stream} stopped decoding before {end}: it was not decoding across the window")
    if f.kind == "longest_pause":
        pause = longest_pause(times, lo, hi)
        if pause is None and times and times[0] < lo:
            pause = hi - lo  # its last token came before the window and none after it
        return {f.key: pause}
    length = hi - lo
    out = {f.key: count_in(times, lo, hi) / length if length > 0 else None}
    if f.versus == "before":
        out[f.keys[1]] = rate_before(times, lo, length)
    return out


def script_run(script: Script, records: dict[str, StreamRecord], t0: float,
               late_limit: float = LATE_LIMIT_S) -> ScriptFigures:
    """One run's figures from its streams' raw records. Invalid: a stream that failed or was not
    sent, a send later than `late_limit`, a first token that never came, a window whose stream was
    not decoding across it (or whose event did not happen), an expectation missed."""
    reasons: list[str] = []
    for name, r in records.items():
        if r.error:
            reasons.append(f"{name}: {r.error}" if r.sent is None else f"{name} failed: {r.error}")
    late = {name: lateness(r) for name, r in records.items()}
    reasons += [f"{name} was sent {v:.3f} s late (limit {late_limit} s)" for name, v in late.items()
                if v is not None and v > late_limit]
    values: dict[str, float | None] = {}
    for f in script.figures:
        rec = records[f.stream]
        if f.kind == "first_token":
            values[f.key] = first_token_latency(rec)
            if values[f.key] is None and not rec.error:
                reasons.append(f"{f.stream} got no token")
        elif f.kind == "cached_tokens":
            values[f.key] = None if rec.cached_tokens is None else float(rec.cached_tokens)
        else:
            lo, hi = (point_time(p, records, t0) for p in f.window)
            missing = [str(p) for p, t in zip(f.window, (lo, hi)) if t is None]
            if missing:
                reasons.append(f"{f.key}: {' and '.join(missing)} did not happen")
                values.update({k: None for k in f.keys})
                continue
            values.update(_window_figure(f, rec, lo, hi, reasons))
    expects = []
    for s in script.streams:
        for e in s.expect:
            rec = records[s.name]
            got = None if rec.error else rec.cached_tokens
            held = e.holds(got)
            # unknown: the stream replied but the server reported nothing to check (never a failure);
            # a stream that failed or was not sent is already a reason of its own
            expects.append({"stream": s.name, "check": str(e), "got": got, "held": held,
                            "unknown": held is None and not rec.error})
            if held is False:
                reasons.append(f"{s.name}'s {e.what} is {got}, expected {e.op} {e.value}")
    reasons = list(dict.fromkeys(reasons))  # a stream in two windows is one reason, once
    return ScriptFigures(values, late, expects, valid=not reasons, invalid_reasons=reasons)


def failed_script(why: str) -> ScriptFigures:
    """A run whose server failed: no figure, invalid."""
    return ScriptFigures({}, {}, [], valid=False, invalid_reasons=[f"the server failed: {why}"])


def script_values(r: Receipt) -> list[dict]:
    """Each run's figures, an invalid run's as none (left out of medians and verdicts)."""
    return [run.figures["values"] if run.figures["valid"] else {} for run in r.runs]


def script_keys(r: Receipt) -> list[str]:
    return list(r.settings.figure_keys)


def script_medians(data: Receipt | dict) -> dict[str, dict[str, float | None]]:
    """variant -> figure -> the median over its valid runs (what predictions are checked against)."""
    r = as_receipt(data)
    values, out = script_values(r), {}
    for v in r.variants:
        mine = [x for run, x in zip(r.runs, values) if run.variant == v.name]
        if mine:
            out[v.name] = {k: median([x.get(k) for x in mine]) for k in script_keys(r)}
    return out


def script_stats(data: Receipt | dict) -> dict:
    """Each script figure's statistics over the runs, invalid runs left out."""
    r = as_receipt(data)
    order = [run.variant for run in r.runs]
    return {k: fs.to_dict() for k, fs in
            stats_for(script_keys(r), order, script_values(r), r.variants[0].name, margin_of(r)).items()}


# ---- the gate and comparisons --------------------------------------------------------------

def cut_period(prefill_rows: int | None, b_tokens: int | None, b_first_tokens: list[float]) -> float:
    """Seconds per cut of B's prompt (B's first token over its cut count; the decode rounds
    between cuts included): where C lands inside a cut is luck up to this much. 0 when unknown."""
    if not prefill_rows or not b_tokens or not b_first_tokens:
        return 0.0
    return statistics.median(b_first_tokens) / -(-b_tokens // prefill_rows)


def token_gaps(times: list[float]) -> list[tuple[float, float]]:
    """(time, gap before it) for every token after the first: what the timeline draws."""
    return [(b, b - a) for a, b in zip(times, times[1:])]


def across_sessions(xa: list[float], xb: list[float]) -> dict:
    """Two sessions' runs of one figure (not drift-paired): each median, B's against A's in
    percent, and whether B's median lies inside A's span of runs (None: cannot tell)."""
    ma, mb = median(xa), median(xb)
    return {"a": ma, "b": mb, "pct": (mb / ma - 1) * 100 if ma and mb is not None else None,
            "within": None if not xa or mb is None else min(xa) <= mb <= max(xa)}


def figure_runs(data: Receipt | dict) -> dict[str, dict[str, list[float]]]:
    """figure -> variant -> the valid runs' values, for any scenario's receipt."""
    r = as_receipt(data)
    if r.scenario == "long-prompt":
        names = list(LONG_PROMPT)
        values = [run.figures if run.figures["valid"] else {} for run in r.runs]
    elif r.scenario == "script":
        names, values = script_keys(r), script_values(r)
    elif r.scenario == "load":
        names = list(dict.fromkeys(n for run in r.runs for n in run.figures or {}))
        values = [run.figures if run.valid else {} for run in r.runs]
    else:
        names = list(dict.fromkeys(n for run in r.runs for n in run.figures))
        values = [{} if (run.client or {}).get("invalid") else run.figures for run in r.runs]
    order = [run.variant for run in r.runs]
    return {n: stats.by_variant(order, [v.get(n) for v in values]) for n in names}
