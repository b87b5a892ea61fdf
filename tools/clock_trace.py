"""A long-prompt receipt's prompt cuts beside the GPU's SM clock, power and throttle reasons as
`nvidia-smi -lms` sampled them in the same device call (scripts/gpu_clocks_check.sh): each cut's
time, its ratio to a profile's cost for it, and the clock while it ran.

    python -m tools.clock_trace RECEIPT.json.gz CLOCKS.csv OFFSET.txt PROFILE.json [--every 3]

OFFSET.txt: wall time minus CLOCK_MONOTONIC on the device (the engine's trace is on the latter).
Throttle reasons are nvidia-smi's bits: 0x4 the software power cap, 0x1 idle."""
from __future__ import annotations

import argparse
import bisect
import datetime
from pathlib import Path

from engine.scheduler.costs import Costs
from tensorfold_bench.report import store


def samples(csv: Path, offset: float) -> list[tuple[float, int, float, str]]:
    """(monotonic time, SM MHz, watts, throttle reasons) per line of `nvidia-smi --format=csv,nounits`."""
    out = []
    for line in csv.read_text().splitlines()[1:]:
        cells = [c.strip() for c in line.split(",")]
        try:
            wall = datetime.datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
            out.append((wall.timestamp() - offset, int(cells[1]), float(cells[3]), cells[5]))
        except (ValueError, IndexError):
            continue  # a header repeated, or a line nvidia-smi cut short
    return out


def cuts(trace: list[dict], rows: int) -> list[tuple[int, float, float]]:
    """A prompt's cuts of `rows` rows and more, in order: (start, t, seconds)."""
    out, start = [], 0
    for s in trace:
        if s["kind"] == "prefill" and s["rows"] >= rows:
            out.append((start, s["t"], s["dur"]))
            start += s["rows"]
    return out


def table(receipt: Path, csv: Path, offset: float, costs: Costs, every: int = 3) -> str:
    d = store.read(receipt)
    clock = samples(csv, offset)
    at = [c[0] for c in clock]

    def near(t: float):
        return clock[min(bisect.bisect_left(at, t), len(clock) - 1)]
    lines = ["| run | cut | ms | over the profile | SM MHz | W | throttle |", "|---|---|---|---|---|---|---|"]
    traces = [(f"{r['index']} {r['variant']}", r.get("trace") or []) for r in d.get("runs") or []]
    traces += [(f"alone {k}", a.get("trace") or []) for k, a in (d.get("alone") or {}).items()]
    for name, trace in traces:
        for i, (start, t, dur) in enumerate(cuts(trace, costs.profile.engine.get("prefill_rows") or 1024)):
            if i % every == 0:
                _, mhz, watts, why = near(t + dur / 2)
                lines.append(f"| {name} | {start // 1024}k | {dur * 1000:.1f} | {dur / costs.prefill(1024, start):.2f} | "
                             f"{mhz} | {watts:.0f} | {why} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("receipt", type=Path)
    p.add_argument("clocks", type=Path)
    p.add_argument("offset", type=Path)
    p.add_argument("profile", type=Path)
    p.add_argument("--every", type=int, default=3, help="one cut in this many")
    a = p.parse_args(argv)
    offset = float(a.offset.read_text().split()[0])
    print(table(a.receipt, a.clocks, offset, Costs.load(a.profile), a.every), end="")


if __name__ == "__main__":
    main()
