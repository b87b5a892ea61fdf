"""A cost profile fitted from the engine's own traces in committed long-prompt receipts, in the
layout `tfengine profile` writes (engine/runner/profile.py; schema tfbench.profile/1), with
`source: "fitted from receipt traces: ..."`.

    PYTHONPATH=. python3 -m tools.trace_profile RECEIPT.json.gz [...] --out receipts/profiles/F.json
                                                [--variants "whole,split sms=16"] [--runs 1,2,3]

A long-prompt run with the trace on keeps every prompt step and decode round the lane host ran
(`runs[].trace`, and `alone.*.trace` for B alone): kind, rows, streams, start and duration, as
the host timed them. What the trace leaves out is rebuilt from the run's own records:
- a cut's `start`: the rows of its stream's earlier cuts (B's prompt is cold: cached 0, which every
  receipt checks);
- a round's `keys`: each decoding stream's prompt plus the tokens it has so far, the streams in a
  round of k being the k oldest still decoding (A, then B, then C; a paused stream is rarer than
  the error this makes);
- split cuts: a cut's own time is its landing less the later of its launch and the landing of the
  cut before it (two cuts are in flight at once, the second queued behind the first), and its
  rounds are the rounds that ran wholly inside that time; split rounds with no cut beside them do
  not occur in a run (a round with no cut runs on the whole device), so `split_round` is empty;
- a run's first step is left out: the fresh server's first request pays for its warm-up;
- the host's own time: the gap between a round's end and the next step's start, where under
  2 ms (a longer gap is the loop waiting for work): `turn` the median after one-stream rounds,
  `token` the rise per extra stream;
- prompts filled together (rows that share a start and a duration) are one `prefill_many`; a mixed
  forward's own prompt row (the host traces the cut twice) is dropped.
Prompt steps of split runs are not `prefill` samples (they ran on part of the device, or beside a
cut); rounds of split runs are `decode` samples only outside every cut. Select variants or runs to
fit on some and predict the others, so that an accuracy check is not circular.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from engine.runner.profile import KINDS, SCHEMA, dumps

GAP_S = 0.002  # a gap between steps longer than this is the loop idle, not its own work
KEEP = 120  # decode samples kept per run and stream count (evenly spaced): the file stays small


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def decode_sms(args: list[str]) -> int | None:
    """--decode-sms N of a split variant's flags, None for any other variant."""
    if "split" not in args:
        return None
    for i, a in enumerate(args):
        if a == "--decode-sms":
            return int(args[i + 1])
        if a.startswith("--decode-sms="):
            return int(a.split("=", 1)[1])
    return 32  # the engine's default partition


class Run:
    """One trace and the records of the streams it served, rebuilt step by step."""

    def __init__(self, trace: list[dict], records: list[dict], sms: int | None):
        self.trace = trace
        self.first = min(trace, key=lambda s: s["t"]) if trace else None
        self.sms = sms
        ids = sorted({s["seq"] for s in trace if s["seq"] is not None})
        recs = sorted(records, key=lambda r: r["sent"])[-len(ids):] if ids else []
        self.prompt = {i: r["prompt_len"] for i, r in zip(ids, recs)}
        self.max_tokens = {i: r["max_tokens"] for i, r in zip(ids, recs)}

    def samples(self) -> dict[str, list]:
        out = {k: [] for k in KINDS}
        mixed_at = {(s["t"], s["dur"]) for s in self.trace if s["kind"] == "mixed"}
        steps = [s for s in self.trace if not (s["kind"] == "prefill" and (s["t"], s["dur"]) in mixed_at)]
        together: dict[tuple, list] = defaultdict(list)
        for s in steps:
            if s["kind"] == "prefill":
                together[(s["t"], s["dur"])].append(s)
        # events in the order their effect lands: a cut when it ends (its first token then), a round when it starts
        events = sorted(steps, key=lambda s: s["t"] + s["dur"] if s["kind"] == "prefill" else s["t"])
        filled: dict[int, int] = defaultdict(int)
        out_len: dict[int, int] = {}  # decoding streams -> tokens so far
        rounds: list[tuple[float, float, int, int]] = []  # (t, dur, streams, keys) of every round
        cuts: list[tuple[float, float, int, int, int]] = []  # split: (own start, end, seq, rows, start)
        last_end: dict[int, float] = {}
        for s in events:
            if s["kind"] in ("decode", "mixed"):
                live = sorted(out_len)[: s["streams"]]
                keys = sum(self.prompt.get(q, 0) + out_len[q] for q in live)
                if s["kind"] == "mixed":
                    q, start = s["seq"], filled[s["seq"]]
                    out["mixed"].append([s["rows"], start, s["streams"], keys, s["dur"]])
                    self._fill(q, s["rows"], filled, out_len)
                else:
                    rounds.append((s["t"], s["dur"], s["streams"], keys))
                for q in live:
                    out_len[q] += 1
                    if out_len[q] >= self.max_tokens.get(q, 1 << 30):
                        del out_len[q]
                continue
            q, start = s["seq"], filled[s["seq"]]
            group = together[(s["t"], s["dur"])]
            if s is self.first:  # a fresh server's first request pays its warm-up (A's 16 rows: 24 ms, H100)
                self._fill(q, s["rows"], filled, out_len)
                continue
            if self.sms is not None:
                end = s["t"] + s["dur"]
                if s["rows"] > 512:  # a long prompt's cut on the prompt partition (short ones go in whole)
                    own = max(s["t"], last_end.get(q, s["t"]))
                    cuts.append((own, end, q, s["rows"], start))
                    last_end[q] = end
            elif len(group) > 1:
                if s is group[0]:
                    out["prefill_many"].append([len(group), sum(g["rows"] for g in group), s["dur"]])
            else:
                out["prefill"].append([s["rows"], start, s["dur"]])
            self._fill(q, s["rows"], filled, out_len)
        inside = set()
        for own, end, q, rows, start in cuts:
            beside = [r for r in rounds if own <= r[0] and r[0] + r[1] <= end]
            inside.update(r[0] for r in rounds if r[0] < end and r[0] + r[1] > own)
            if beside:
                out["split"].append([self.sms, rows, start, round(statistics.median(r[2] for r in beside)),
                                     round(statistics.median(r[3] for r in beside)), end - own,
                                     statistics.median(r[1] for r in beside)])
        by_streams: dict[int, list] = defaultdict(list)
        for t, dur, k, keys in rounds:
            if t not in inside:
                by_streams[k].append([k, keys, dur])
        for rows in by_streams.values():
            step = max(1, len(rows) // KEEP)
            out["decode"] += rows[::step]
        out["host"] = self.host(rounds)
        return out

    def _fill(self, q: int, rows: int, filled: dict, out_len: dict) -> None:
        filled[q] += rows
        if q in self.prompt and filled[q] >= self.prompt[q]:
            out_len[q] = 1  # the last cut's first token

    def host(self, rounds) -> list:
        """The loop's own time after a round: the gap to the next step's start, by the round's streams."""
        if self.sms is not None:  # split turns overlap the cut: their gaps are not the host's alone
            return []
        starts = sorted(s["t"] for s in self.trace)
        gaps: dict[int, list[float]] = defaultdict(list)
        import bisect
        for t, dur, k, _ in rounds:
            i = bisect.bisect_right(starts, t)
            if i < len(starts):
                gap = starts[i] - (t + dur)
                if 0 <= gap < GAP_S:
                    gaps[k].append(gap)
        if not gaps.get(1):
            return []
        turn = statistics.median(gaps[1])
        more = [k for k in gaps if k > 1 and len(gaps[k]) >= 5]
        token = max(0.0, (statistics.median(gaps[max(more)]) - turn) / (max(more) - 1)) if more else 0.0
        return [["turn", turn], ["token", token]]


def fit(paths: list[Path], variants: set[str] | None = None, runs: set[int] | None = None) -> dict:
    samples = {k: [] for k in KINDS}
    used, first = [], None
    for path in paths:
        d = load(path)
        sms_of = {v["name"]: decode_sms(v.get("args") or []) for v in d["variants"]}
        took = []
        for r in d["runs"]:
            if not r.get("trace") or (variants and r["variant"] not in variants) or (runs and r["index"] not in runs):
                continue
            if r.get("figures", {}).get("valid") is False:
                continue
            first = first or (d, r)
            got = Run(r["trace"], list(r["records"].values()), sms_of.get(r["variant"])).samples()
            for k in KINDS:
                samples[k] += got[k]
            took.append(str(r["index"]))
        for name, a in (d.get("alone") or {}).items():
            if a.get("trace") and a.get("record") and (not variants or name in variants) and not runs:
                got = Run(a["trace"], [a["record"]], None).samples()
                for k in ("prefill", "decode"):
                    samples[k] += got[k]
                took.append(f"alone {name}")
        if took:
            used.append(f"{path.name.split('.')[0]} ({', '.join(took)})")
    if first is None:
        raise SystemExit("error: no run with a trace among the receipts (and variants/runs) given")
    d, r = first
    eng = r["engine"]["engine"]
    shape = eng["shape"]
    settings = d["settings"]["engine"]
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": "fitted from receipt traces: " + "; ".join(used),
        "device": {"type": eng["device"], "name": eng["device_name"], "capability": eng.get("compute_capability"),
                   "sms": 132 if "H100" in eng["device_name"] or "H200" in eng["device_name"] else None,
                   "cpu": None, "cpu_isa": (eng.get("cpu") or {}).get("isa"), "torch": eng.get("torch"),
                   "cuda": eng.get("cuda_version"), "driver": eng.get("driver")},
        "model": {"name": eng["model"], "dtype": eng["dtype"], "layers": shape["layers"], "hidden": shape["hidden"],
                  "heads": shape["heads"], "kv_heads": shape["kv_heads"], "head_dim": shape["head_dim"],
                  "intermediate": shape["intermediate"], "vocab": shape["vocab"]},
        "engine": {"commit": r["engine"].get("commit"), "parallel": settings["parallel"],
                   "prefill_rows": settings["prefill_rows"], "max_model_len": settings.get("max_model_len"),
                   "prefill_mode": "stepped", "flags": d["settings"].get("engine_flags", [])},
        "notes": ["keys of rounds rebuilt from the records: the k oldest decoding streams; split_round: not in a "
                  "run's trace; host: gaps between steps, with the HTTP thread beside the loop"],
        "samples": samples,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("receipts", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", help="comma list of variant names to fit on (default: every one)")
    ap.add_argument("--runs", help="comma list of run indices to fit on (default: every one; alone runs only without)")
    a = ap.parse_args(argv)
    for p in a.receipts:
        if not p.exists():
            ap.error(f"{p} does not exist")
    runs = {int(x) for x in a.runs.split(",")} if a.runs else None
    doc = fit(a.receipts, set(a.variants.split(",")) if a.variants else None, runs)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(dumps(doc))
    print(f"wrote {a.out}: " + ", ".join(f"{k} {len(v)}" for k, v in doc["samples"].items()), file=sys.stderr)


if __name__ == "__main__":
    main()
