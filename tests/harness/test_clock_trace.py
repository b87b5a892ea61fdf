"""tools/clock_trace.py on the committed H100 clock sampling: the cuts of a whole fill beside the
SM clock, the late ones under the software power cap."""
from pathlib import Path

from engine.scheduler.costs import Costs
from tools import clock_trace

ROOT = Path(__file__).resolve().parents[2]
RECEIPT = ROOT / "receipts" / "20261207-090718-long-prompt.json.gz"
CLOCKS = ROOT / "receipts" / "gpu-clocks" / "20261207-0907-h100-clocks.csv"
OFFSET = float((ROOT / "receipts" / "gpu-clocks" / "20261207-0907-h100-offset.txt").read_text().split()[0])
PROFILE = ROOT / "receipts" / "profiles" / "h100-qwen3-8b-59255b8.json"


def test_the_samples_are_read_on_the_engines_clock_and_a_cut_line_is_skipped():
    s = clock_trace.samples(CLOCKS, OFFSET)
    assert len(s) > 2000 and all(a[0] < b[0] for a, b in zip(s, s[1:]))
    assert {mhz for _, mhz, _, _ in s} >= {345, 1980}  # idle, then the top clock


def test_a_whole_fills_late_cuts_ran_under_the_power_cap_below_the_top_clock():
    rows = clock_trace.table(RECEIPT, CLOCKS, OFFSET, Costs.load(PROFILE), every=1).splitlines()[2:]
    whole = [r.split(" | ") for r in rows if r.startswith("| 1 whole |")]
    assert len(whole) == 31  # 32,000 tokens: 31 cuts of 1,024 rows, then the last 256 (not a full cut)
    late = [r for r in whole if int(r[1].rstrip("k")) >= 20]
    assert all(int(r[4]) < 1980 and r[6].rstrip(" |").endswith("4") for r in late)
