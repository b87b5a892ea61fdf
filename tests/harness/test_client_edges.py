"""tools/client_edges.py at tiny sizes: both tables with their columns, and the figures sane against
the synthetic server's schedule (the truth from its reads; what the client measures from its own
send can only be longer). Timings themselves are not judged: the host may be loaded."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tools import client_edges

ROOT = Path(__file__).resolve().parents[2]


def run(*args, tmp_path=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tools.client_edges", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path or ROOT, timeout=300)


def test_the_tables_at_tiny_sizes_hold_the_truth_near_the_schedule(tmp_path):
    out = tmp_path / "edges.json"
    res = run("--levels", "2", "--rates", "50", "--duration", "1", "--tokens", "20", "--server-workers", "2",
              "--burst-server-workers", "2", "--burst-procs", "2", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("served by 2 synthetic server processes (--server-workers).") == 2
    for col in client_edges.BURST_COLUMNS + client_edges.LOAD_COLUMNS:
        assert f" {col} |" in res.stdout, col
    data = json.loads(out.read_text())
    (b,) = data["bursts"]
    assert b["level"] == 2 and b["send_spread"] >= 0 and b["server_peak_open"] == 2
    assert b["procs"] == 2 and b["client"] == "wire x2" and "| 2 client processes (--burst-procs) |" in res.stdout
    # the server's first send comes first_ms (20) after its read, its gaps every_ms (10), late only by its load
    # the server sends on its schedule to the tens of microseconds: a gap is its interval, give or take that
    assert 20 <= b["first_truth_p50"] < 45 and 9.9 <= b["itl_truth_p50"] < 25
    assert b["first_p50"] >= b["first_truth_p50"] - 0.05  # from the client's send: the way to the server added
    assert b["itl_p99"] > 0
    (r,) = data["loads"]
    assert r["rate"] == 50 and r["requests"] > 20 and r["received_per_s"] > 0 and r["server_cv"] > 0
    assert 0 < r["server_ks"] <= 1 and r["procs"] >= 1 and "auto: " in r["procs_why"]
    assert 5 <= r["truth_p50"] < 30 and r["truth_p99"] >= r["truth_p50"]
    assert r["ttft_p50"] >= r["truth_p50"] - 0.05 and r["ttft_p99"] > 0 and r["late_p99_ms"] >= 0
    assert 0 < r["cpu_share"] and isinstance(r["invalid"], list)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("| 50 |"))
    assert line.endswith("valid |") or "**invalid**: " in line
    # the client's own send gaps, beside the server's reads: where the bunching came from
    assert 0 <= r["send_ks"] <= 1 and f"| {r['send_ks']:.3f} ({r['send_cv']:.2f}) |" in line


def test_bad_input_is_one_line_naming_the_flag():
    for args, flag in ((["--rates", "fast"], "--rates"), (["--rates", "0"], "--rates"), (["--levels", "0"], "--levels"),
                       (["--duration", "0"], "--duration"), (["--server-workers", "0"], "--server-workers"),
                       (["--burst-server-workers", "0"], "--burst-server-workers"),
                       (["--burst-procs", "many"], "--burst-procs")):
        res = run(*args)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.strip().splitlines()[-1].startswith(f"client_edges.py: error: {flag}"), res.stderr


def test_the_probe_bins_the_first_half_second_by_its_latest_send():
    """A stall at 30 ms shows in its own 25 ms bin; an empty bin says None, not 0."""
    import numpy as np
    from tools.open_loop_probe import latest_by_bin
    at = np.array([0.001, 0.030, 0.031, 0.060, 0.2])
    late = np.array([0.1, 20.0, 19.5, 0.3, 0.2])
    bins = latest_by_bin(at, late)
    assert len(bins) == 20 and bins[:4] == [0.1, 20.0, 0.3, None] and bins[8] == 0.2
