"""The /v1/trace ring: bounded, served as valid JSON, filtered by start time; the host fills it."""
import json

from engine.config import EngineConfig
from engine.scheduler.host import LaneHost
from engine.scheduler.trace import TraceRing
from test_host_policy import Clock, FakeBackend, R, run_turns, seq


def test_the_ring_keeps_the_last_maxlen_steps_as_json():
    ring = TraceRing(3)
    for i in range(5):
        ring.add(10.0 + i, 0.25, "decode", 4, 2, None)
    ring.add(15.5, 1e-7, "prefill", 256, 1, 7)
    steps = json.loads(ring.json())["steps"]
    assert len(ring) == 3 and [s["t"] for s in steps] == [13.0, 14.0, 15.5]
    assert steps[-1] == {"t": 15.5, "dur": 1e-7, "kind": "prefill", "rows": 256, "streams": 1, "seq": 7}
    assert steps[0]["seq"] is None and ring.steps() == steps
    assert [s["t"] for s in ring.steps(since=14.0)] == [14.0, 15.5]
    assert ring.steps(since=99.0) == [] and json.loads(TraceRing(2).json()) == {"steps": []}


def test_the_host_traces_each_step_and_round_into_a_bounded_ring():
    clock = Clock()
    backend = FakeBackend(clock)
    cfg = EngineConfig(parallel=4, prefill_rows=R, out_queue=4, trace=True, trace_len=5)
    host = LaneHost(backend, cfg, clock=clock)
    a = seq(2 * R, tag=1)
    host.submit(a)
    host.turn()  # two cuts in whole (short), then a round
    steps = host.trace_steps()
    assert [s["kind"] for s in steps] == ["prefill", "prefill", "decode"]
    assert steps[0]["seq"] == a.id and steps[0]["dur"] == 1.0 and steps[2]["streams"] == 1
    run_turns(host, 10, a)
    assert len(host.trace_steps()) == 5  # the ring's bound


def test_a_trace_len_below_one_is_a_one_line_error():
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--trace", "--trace-len", "0", "--port", "1"],
                       capture_output=True, text=True, timeout=60, env=os.environ)
    assert r.returncode == 2 and "--trace-len" in r.stderr and "Traceback" not in r.stderr
