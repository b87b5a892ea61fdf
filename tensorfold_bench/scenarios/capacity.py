"""The client's capacity on this host, measured: the CPU one process spends on a request of a
given shape, from a short closed loop against the synthetic server (a process of its own, so its
CPU is not the client's). `tfbench load --procs auto` divides a level's rate by it
(tensorfold_bench.client.workers.choose). The figure is taken once per shape and process: it
holds for every level and run of one invocation.
"""
from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

from tensorfold_bench.client import player
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.servers.launcher import launch
from tensorfold_bench.workload.model import Item, Workload

SYNTHETIC = "tensorfold_bench.calibrate.synthetic"  # launched by module name: a process, never imported here
MODEL = "synthetic"  # the name the synthetic server answers to
PROBE_S = 1.0  # the closed loop's length as the server would take it (the client may take longer)
PROBE_STREAMS = 32  # in flight at once: enough that the loop is never idle waiting for the server
PROBE_MAX = 2000  # requests at most: the probe costs a second or two of one core
EVERY_MS = 0.5  # the probe server's token interval: each token a read of its own
MAX_TOKENS = 256  # a longer reply is measured at this length and scaled: its reads cost the same each

_measured: dict[tuple[int, int], float] = {}


@contextlib.contextmanager
def synthetic_server(first_ms: float, every_ms: float, stall_every: int = 0, stall_ms: float = 0.0,
                     workers: int = 1):
    """The synthetic server in a process of its own (`workers` processes on one port), on a free
    port, stopped on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", SYNTHETIC, "--port", "{port}", "--first-ms", str(first_ms),
               "--every-ms", str(every_ms), "--stall-every", str(stall_every), "--stall-ms", str(stall_ms),
               "--workers", str(workers)]
        with launch(command=cmd, log=Path(tmp) / "synthetic.log", health="/health") as srv:
            yield srv


def probe_workload(input_len: int, output_len: int, n: int) -> Workload:
    prompt = tuple(range(1000, 1000 + max(input_len, 1)))
    return Workload(tuple(Item(f"probe{i}", prompt, output_len) for i in range(n)), "capacity probe")


def cpu_per_request(input_len: int, output_len: int) -> float:
    """Seconds of this process's CPU a request of that shape costs the client (measured once per
    shape): a closed loop of PROBE_STREAMS against a server that answers at once and then streams
    a token every EVERY_MS, about PROBE_S of the server's time; every request is played to its end,
    so the CPU (its bytes prepared, sent, read and decoded) is all spent on requests counted."""
    out = min(max(output_len, 1), MAX_TOKENS)
    key = (max(input_len, 1), out)
    if key not in _measured:
        n = min(PROBE_MAX, PROBE_STREAMS * max(1, int(PROBE_S * 1000 / (out * EVERY_MS + 1))))
        try:
            with synthetic_server(0.0, EVERY_MS) as srv:
                played, _, check = asyncio.run(player.play_level(
                    srv.url, probe_workload(key[0], out, n), model=MODEL, concurrency=PROBE_STREAMS, drain_s=60))
        except BenchError as e:
            raise FlagError("--procs", f"auto could not measure the client's CPU a request ({e}); give --procs N") from None
        done = sum(1 for s in played if s.rec.error is None and s.rec.tokens)
        if not done:
            raise FlagError("--procs", "auto could not measure the client's CPU a request (the synthetic server "
                                       "answered none of its requests); give --procs N")
        _measured[key] = check["cpu_s"] / done
    return _measured[key] * (output_len / out if output_len > out else 1.0)
