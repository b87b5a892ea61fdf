"""A cost profile (engine/scheduler/costs.py) from the engine's own trace of real runs: every prompt
step and decode round the lane host timed (`--trace`: t, dur, kind, rows, streams, seq), with the
streams' token times to place each round's context.

What a trace does not say, and what is assumed instead:
- a cut's `start` (the keys already in the lane): each stream's cuts summed in order, from the rows
  the prompt cache gave it (a stream is told by its cuts' total: prompt length less cached rows);
- a round's `keys`: the streams decoding then (first token received before the round ended, last
  after it began), each at its prompt length plus the tokens it had received by the round's middle
  (a token is received a moment after its round; one token of context either way is noise). Where
  that set's size differs from the round's `streams`, its mean context stands for each stream (and
  where it is empty, the longest prompt's);
- split mode: a cut launched while streams decode runs beside the rounds; the host lands it at a
  turn's edge, so its own time is the time between its landing and the landing before it (the
  quantisation cancels) where it was queued behind that one, and its launch to its landing less half
  a round where it was not;
- prompts filled together (`prefill_many`) share one forward's t and dur in the trace; a mixed
  forward is traced twice (the forward, and its prompt's step), and counted once;
- a forward on the whole device while a split cut runs shares the GPU with it (on older engines it
  waited for the cut), so its time is neither alone's nor the cut's, and is left out;
- rounds the host asked to run ahead (no prompt in a lane, on a runner that runs ahead) are
  `decode_ahead` samples: the host sees less of them (the next round is under way as it reads one);
- a prompt's intake (`host` "prompt_token": the server reading a request before the host sees it):
  from a long prompt's send to its first cut, less half the call the host was in, per prompt token;
- the host's own time: a token's is how much longer the gap between consecutive rounds of n
  streams is than of one, per stream; a turn's, the gap between rounds of one stream less one
  token's (gaps over 5 ms are waits for work, not work).
"""
from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field

from engine.scheduler.costs import KINDS, Profile, widened

IDLE_GAP_S = 0.005  # a gap between rounds longer than this is the host waiting, not working
INTAKE_ROWS = 2048  # prompts long enough that the server's reading them shows against the host's turn


@dataclass
class TracedStream:
    prompt_len: int
    token_times: list[float]  # when each token was received, on the trace's clock
    cached: int = 0
    sent: float | None = None  # when the client sent it, on the trace's clock


@dataclass
class TracedRun:
    trace: list[dict]
    streams: list[TracedStream]
    mode: str = "stepped"  # the engine's --prefill-mode
    decode_sms: int | None = None  # split mode's decode partition
    ahead: bool = False  # the runner ran rounds ahead where the host asked (caps.runs_ahead)
    samples: dict[str, list] = field(default_factory=dict)  # filled by `samples_of`


def _keys(streams: list[TracedStream], t: float, dur: float, n: int) -> int:
    """The keys a round of `n` streams at [t, t + dur] attends to (see the module's assumptions)."""
    mid, end = t + dur / 2, t + dur
    ctx = [s.prompt_len + bisect_right(s.token_times, mid) for s in streams
           if s.token_times and s.token_times[0] < end and s.token_times[-1] > t]
    if len(ctx) == n:
        return sum(ctx)
    if ctx:
        return round(sum(ctx) / len(ctx) * n)
    return n * max((s.prompt_len for s in streams), default=1)


def _owners(trace: list[dict], streams: list[TracedStream]) -> dict[int, int | None]:
    """Each traced prompt's stream (by its cuts' total: its prompt length less cached rows), or None."""
    total: dict[int, int] = defaultdict(int)
    for r in trace:
        if r["kind"] in ("prefill", "mixed") and r["seq"] is not None:
            total[r["seq"]] += r["rows"]
    out, used = {}, set()
    for seq, rows in total.items():
        out[seq] = None
        for i, s in enumerate(streams):
            if i not in used and s.prompt_len - s.cached == rows:
                out[seq] = i
                used.add(i)
                break
    return out


def _waiting(trace: list[dict]) -> list[tuple[float, float]]:
    """When a prompt was in a lane with rows to fill: from its first cut's start to its last's end
    (the host asks no round ahead then)."""
    span: dict[int, list[float]] = {}
    for r in trace:
        if r["kind"] in ("prefill", "mixed") and r["seq"] is not None:
            lo_hi = span.setdefault(r["seq"], [r["t"], r["t"] + r["dur"]])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], r["t"]), max(lo_hi[1], r["t"] + r["dur"])
    return sorted((lo, hi) for lo, hi in span.values())


def samples_of(run: TracedRun) -> dict[str, list]:
    """The run's trace as profile samples, one row a traced call."""
    # a mixed forward is traced twice: as the forward ("mixed") and as its prompt's step ("prefill")
    mixed = {(r["t"], r["dur"], r["seq"]) for r in run.trace if r["kind"] == "mixed"}
    trace = sorted((r for r in run.trace if r["kind"] != "prefill" or (r["t"], r["dur"], r["seq"]) not in mixed),
                   key=lambda r: r["t"])
    out: dict[str, list] = {k: [] for k in KINDS}
    owner = _owners(trace, run.streams)
    pos = {seq: run.streams[i].cached if i is not None else 0 for seq, i in owner.items()}
    decodes = [r for r in trace if r["kind"] == "decode"]
    dec_t = [r["t"] for r in decodes]

    # split: the cuts that ran beside rounds (a round starts inside them)
    beside: set[int] = set()
    if run.mode == "split":
        for i, r in enumerate(trace):
            if r["kind"] == "prefill":
                j = bisect_right(dec_t, r["t"])
                if j < len(dec_t) and dec_t[j] < r["t"] + r["dur"]:
                    beside.add(i)
    split_rounds = [d["dur"] for d in decodes]
    half_round = statistics.median(split_rounds) / 2 if split_rounds else 0.0
    landed_before: dict[int, float] = {}
    in_cut: set[int] = set()  # decode rows that ran beside a cut

    groups: dict[tuple[float, float], list[int]] = defaultdict(list)
    for i, r in enumerate(trace):
        if r["kind"] == "prefill" and i not in beside:
            groups[(r["t"], r["dur"])].append(i)
    # a forward on the whole device while a split cut runs waits for the cut: its time is not its own
    spans = sorted((trace[i]["t"], trace[i]["t"] + trace[i]["dur"]) for i in beside)
    contended = {i for i, r in enumerate(trace) if r["kind"] in ("prefill", "mixed") and i not in beside
                 and any(lo <= r["t"] < hi for lo, hi in spans)}

    for i, r in enumerate(trace):
        kind, rows, seq = r["kind"], r["rows"], r["seq"]
        start = pos.get(seq, 0) if seq is not None else 0
        if kind in ("prefill", "mixed") and seq is not None:
            pos[seq] = start + rows
        if kind == "prefill" and i in beside:
            land = r["t"] + r["dur"]
            prev = landed_before.get(seq)
            cut = land - prev if prev is not None and r["t"] < prev else r["dur"] - half_round
            landed_before[seq] = land
            lo = max(r["t"], prev) if prev is not None else r["t"]
            j0, j1 = bisect_left(dec_t, lo), bisect_left(dec_t, land)
            near = decodes[j0:j1]
            in_cut.update(id(d) for d in near)
            if cut <= 0 or not near:
                continue
            rd = statistics.median(d["dur"] for d in near)
            n = statistics.median_low(d["streams"] for d in near)
            keys = _keys(run.streams, near[0]["t"], rd, n)
            out["split"].append([run.decode_sms or 0, rows, start, n, keys, cut, rd])
        elif i in contended:
            continue
        elif kind == "prefill":
            group = groups[(r["t"], r["dur"])]
            if len(group) > 1:
                if group[0] == i:
                    out["prefill_many"].append([len(group), sum(trace[g]["rows"] for g in group), r["dur"]])
            elif r["dur"] > 0:
                out["prefill"].append([rows, start, r["dur"]])
        elif kind == "mixed" and r["dur"] > 0:
            keys = _keys(run.streams, r["t"], r["dur"], r["streams"])
            out["mixed"].append([rows, start, r["streams"], keys, r["dur"]])
    waits = _waiting(trace)
    w_lo = [lo for lo, _ in waits]
    for d in decodes:
        if d["dur"] <= 0 or id(d) in in_cut:
            continue
        j = bisect_right(w_lo, d["t"])
        waiting = any(lo <= d["t"] < hi for lo, hi in waits[max(0, j - 4):j])
        kind = "decode_ahead" if run.ahead and not waiting else "decode"
        out[kind].append([d["rows"], _keys(run.streams, d["t"], d["dur"], d["rows"]), d["dur"]])

    # a long prompt's time from the client's send to its first cut, less the call the host was in
    first: dict[int, dict] = {}
    for r in trace:
        if r["kind"] in ("prefill", "mixed") and r["seq"] is not None and r["seq"] not in first:
            first[r["seq"]] = r
    starts = [r["t"] for r in trace]
    for seq, r in first.items():
        i = owner.get(seq)
        st = run.streams[i] if i is not None else None
        if st is None or st.sent is None or st.prompt_len - st.cached < INTAKE_ROWS:
            continue
        k = bisect_left(starts, r["t"]) - 1  # the call before the first cut: the host was busy in it
        prev = trace[k] if k >= 0 else None
        ready = prev["t"] + prev["dur"] / 2 if prev is not None and prev["t"] > st.sent else r["t"]
        if ready > st.sent:
            out["host"].append(["prompt_token", (ready - st.sent) / st.prompt_len])

    # the host's own time: gaps between consecutive decode rounds
    gaps: dict[int, list[float]] = defaultdict(list)
    for a, b in zip(trace, trace[1:]):
        if a["kind"] == b["kind"] == "decode" and a["streams"] == b["streams"]:
            g = b["t"] - a["t"] - a["dur"]
            if 0 <= g < IDLE_GAP_S:
                gaps[a["streams"]].append(g)
    token = 0.0
    if 1 in gaps:  # a gap of one stream is a turn and one token; n streams' is longer by n - 1 tokens
        one = statistics.median(gaps[1])
        per = [(statistics.median(gs) - one) / (n - 1) for n, gs in sorted(gaps.items()) if n > 1 and len(gs) >= 5]
        token = max(0.0, statistics.median(per)) if per else 0.0
        out["host"] += [["turn", max(0.0, g - token)] for g in gaps[1]] + [["token", t] for t in per if t >= 0]
    run.samples = out
    return out


def profile_of(runs: list[TracedRun], device: dict, model: dict, engine: dict, source: str,
               created: str = "") -> Profile:
    """One profile from several runs' traces (their samples pooled)."""
    samples: dict[str, list] = {k: [] for k in KINDS}
    for run in runs:
        for k, rows in (run.samples or samples_of(run)).items():
            samples[k].extend(rows)
    return Profile("fitted from traces", created, source, device, model, engine,
                   {k: [widened(k, r) for r in rows] for k, rows in samples.items()}, "streams")
