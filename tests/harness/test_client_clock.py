"""The client is never what gets measured: a level of N streams is N open at the server, every
run carries the client's self-check, a starved client makes its run invalid, and `tfbench
calibrate` holds the client against the synthetic server's own send times."""
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tensorfold_bench.calibrate import client_error as calibrate, synthetic
from tensorfold_bench.cli.commands import app
from tensorfold_bench.client import player, selfcheck, wire
from tensorfold_bench.client.stream import OpenStreams, Request, StreamClient, StreamRecord, clock, new_record, stream
from tensorfold_bench.scenarios import capacity, sweep
from tensorfold_bench.servers.launcher import launch
from tensorfold_bench.servers.launcher import free_port


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """The synthetic server, launched as calibrate launches it (no stall unless asked)."""
    log = tmp_path_factory.mktemp("sim") / "synthetic.log"
    cmd = [sys.executable, "-m", "tensorfold_bench.calibrate.synthetic", "--port", "{port}", "--first-ms", "20",
           "--every-ms", "10", "--stall-every", "0"]
    with launch(command=cmd, log=log, health="/health") as srv:
        yield srv.url


def reset(url):
    httpx.post(url + "/v1/synthetic/reset")


def test_a_level_of_256_is_256_streams_open_at_the_server(sim):
    reset(sim)
    script = sweep.SweepScript(levels=(256,), tokens=30, cells=1, reps=1, prompt_tokens=8)
    batches, check = asyncio.run(sweep.play_levels(sim, script, synthetic.VOCAB, "sim", synthetic.MODEL))
    (b,) = batches
    assert not b["errors"] and b["tokens"] == 256 * 30
    assert httpx.get(sim + "/v1/synthetic").json()["peak_open"] == 256  # the server's own count
    assert b["peak_open"] == 256 and check["peak_open"] == {"256": 256}
    assert b["server_open"] == 256 and check["server_open"] == {"256": 256}  # as its /metrics said
    assert not [r for r in check["invalid"] if "open at once" in r]


def test_a_starved_client_is_marked_invalid(sim):
    """A busy loop in the harness process (50 ms of every 60 ms on the event loop): the tokens
    are stamped late, and the self-check says so; the same run without it is valid."""
    script = sweep.SweepScript(levels=(8,), tokens=40, cells=1, reps=1, prompt_tokens=8)

    async def starved():
        async def hog():
            while True:
                t = clock()
                while clock() - t < 0.05:
                    pass
                await asyncio.sleep(0.01)
        h = asyncio.create_task(hog())
        try:
            return await sweep.play_levels(sim, script, synthetic.VOCAB, "sim", synthetic.MODEL)
        finally:
            h.cancel()

    batches, check = asyncio.run(starved())
    assert check["loop_lag_p99_ms"] > selfcheck.BOUNDS.lag_p99_s * 1000
    assert any("event loop lagged" in r for r in check["invalid"])
    entry = {"variant": "sim", "batches": batches, "client": check}
    sweep.measure(entry)
    assert "INVALID: the client's event loop lagged" in sweep.line(entry)
    _, calm = asyncio.run(sweep.play_levels(sim, script, synthetic.VOCAB, "sim", synthetic.MODEL))
    assert calm["invalid"] == [] and calm["peak_open"] == {"8": 8}


def test_an_invalid_sweep_run_stays_out_of_the_medians():
    runs = [{"variant": "a", "figures": {"tok_s@1": 10.0}, "client": None},
            {"variant": "a", "figures": {"tok_s@1": 99.0}, "client": {"invalid": ["the client's event loop lagged"]}}]
    data = {"settings": {"script": {"levels": [1]}, "base": "a"}, "runs": runs}
    assert sweep.sweep_figures.sweep_stats(data)["tok_s@1"]["medians"]["a"] == 10.0


def test_the_decoder_stamps_each_event_with_the_read_that_completed_it():
    got = []
    d = wire.Decoder(lambda payload, t: got.append((payload, t)))
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    ev1, ev2 = b'data: {"a":1}\n\n', b'data: {"b":2}\n\ndata: [DONE]\n\n'
    body = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(ev1), ev1, len(ev2), ev2)
    d.feed(head + body[:9], 1.0)  # the first event is split across reads
    d.feed(body[9:20], 2.0)
    d.feed(body[20:], 3.0)
    assert got == [('{"a":1}', 2.0), ('{"b":2}', 3.0)] and d.done_seen and d.complete


def play_one(url: str) -> StreamRecord:
    async def go():
        req = Request("x", [1, 2], max_tokens=3)
        async with StreamClient() as c:
            rec = await stream(c, url, req, new_record(req))
        return rec
    return asyncio.run(go())


def test_a_pause_between_two_bursts_is_no_lag_of_either():
    """Back-to-back bursts leave less than a tick between the last stream's end and the next's
    start; a pause there (the garbage collection before a burst) delayed no token. Watched over
    the open streams it is not counted; watched by their count alone, it is."""
    import time

    async def play(watch_for):
        streams = OpenStreams()
        streams.opened()
        async with watch_for(streams) as w:
            await asyncio.sleep(0.02)
            streams.closed()
            time.sleep(0.3)  # the loop blocked with no stream open
            streams.opened()
            await asyncio.sleep(0.02)
            streams.closed()
        return w
    assert max(asyncio.run(play(selfcheck.Watch.over)).lags) < 0.25
    assert max(asyncio.run(play(lambda s: selfcheck.Watch(lambda: s.now > 0))).lags) >= 0.25


def test_an_error_reply_or_no_server_is_one_line_on_the_record(sim):
    rec = play_one(sim + "/nope")  # the base URL's path is kept: the server answers 404 with a JSON error
    assert rec.error == "HTTP 404: no route POST /nope/v1/completions" and rec.tokens == 0
    assert play_one(f"http://127.0.0.1:{free_port('127.0.0.1')}").error.startswith("ConnectError: ")
    assert play_one(sim).tokens == 3


def test_calibrate_measures_the_stall_and_the_server_keeps_its_schedule():
    s = calibrate.CalibrateSettings(levels=(1, 16), tokens=30,
                                    schedule=synthetic.Schedule(first_ms=20, every_ms=10, stall_every=8, stall_ms=80))
    data = calibrate.run(s)
    rows = {r["level"]: r for r in data["rows"]}
    for lv, r in rows.items():
        assert r["peak_open"] == lv == r["server_peak_open"]
        assert r["stall_truth"] >= 85 and abs(r["stall"] - r["stall_truth"]) < 20  # 80 ms more than a 10 ms gap
        assert r["first_truth_p50"] >= 20 and r["delay_p50"] < 10
    text = calibrate.table(data)
    assert "| wire | 16 | 16 / 16 |" in text and "the highest level measured within bounds" in text


def test_calibrate_flags_are_checked_in_one_line():
    res = CliRunner().invoke(app, ["calibrate", "--client", "nope"])
    assert res.exit_code != 0
    with pytest.raises(Exception, match="--client"):
        calibrate.parse_settings("1", 10, 20, 10, 0, 0, "nope")
    with pytest.raises(Exception, match="--every-ms"):
        calibrate.parse_settings("1", 10, 20, 0, 0, 0, "wire")


def test_vllm_bench_serves_result_is_read_against_the_server_log(tmp_path):
    """tools/calibrate_vs_vllm reads `vllm bench serve --save-detailed`'s result (a small one
    written here: no vLLM in CI): each request is matched with its stream in the synthetic log by
    the arrival its first token's text names, whatever the order, and its figures sit beside the
    truth for the same streams; a failed request is counted, not matched."""
    from tools.calibrate_vs_vllm import vllm_row
    log = {"peak_open": 2, "streams": [
        {"arrival": 0, "sends": [100.020, 100.030, 100.040]},
        {"arrival": 1, "sends": [100.021, 100.031, 100.051]}]}
    result = {"generated_texts": [" s1 t t", " s0 t t", ""], "start_times": [100.0005, 100.0, 100.0],
              "ttfts": [0.0215, 0.0210, 0.0], "itls": [[0.0101, 0.0199], [0.0100, 0.0100], []],
              "errors": ["", "", "Never received a valid chunk"], "max_concurrent_requests": 2}
    (tmp_path / "r.json").write_text(json.dumps(result))
    row = vllm_row(json.loads((tmp_path / "r.json").read_text()), log, 2)
    assert row["failed"] == 1 and row["server_peak_open"] == 2
    assert row["first_p50"] == pytest.approx(21.25) and row["first_truth_p50"] == pytest.approx(20.25)
    # gaps pooled: truth 10, 10, 10, 20 ms; vLLM 10.1, 19.9, 10, 10 (p99 by linear interpolation)
    assert row["itl_truth_p99"] == pytest.approx(19.70) and row["itl_p99"] == pytest.approx(19.606)
    assert row["within"]


def test_the_synthetic_servers_first_token_names_its_arrival(sim):
    reset(sim)
    for n in range(2):
        with httpx.stream("POST", sim + "/v1/completions", json={"prompt": [1, 2, n], "max_tokens": 3,
                                                                   "stream": True}) as r:
            texts = [json.loads(ln[6:])["choices"][0]["text"] for ln in r.iter_lines()
                     if ln.startswith("data: {") and '"choices":[{' in ln]
        assert texts == [f" s{n}", " t", " t"]


# ---- the synthetic server over several worker processes (--workers N) ------------------------

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def ask_worker(sock: Path, op: str):
    """A worker's own answer over its control socket (one JSON line in, its JSON out)."""
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(json.dumps({"op": op}).encode() + b"\n")
    await writer.drain()
    got = json.loads(await reader.read())
    writer.close()
    return got["ok"]


@pytest.fixture
def sim3(tmp_path):
    """The synthetic server as 3 workers, started directly (so its parent's pid is known): the
    process, its URL and its control dir."""
    port_file, control = tmp_path / "port", tmp_path / "ctl"
    control.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "tensorfold_bench.calibrate.synthetic", "--port", "0",
                             "--port-file", str(port_file), "--workers", "3", "--control-dir", str(control),
                             "--first-ms", "20", "--every-ms", "10", "--stall-every", "0"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        yield proc, f"http://127.0.0.1:{int(port_file.read_text())}", control
    finally:
        proc.kill()
        proc.wait()


async def complete(port: int, prompt: list[int], n: int) -> list[str]:
    """One completion over a fresh connection, read to the server's close: the tokens' texts."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"prompt": prompt, "max_tokens": n, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    return [json.loads(ln[6:])["choices"][0]["text"] for ln in raw.decode().split("\n")
            if ln.startswith("data: {") and '"choices":[{' in ln]


def test_three_workers_serve_one_port_and_their_logs_merge(sim3):
    """60 completions over fresh connections, spread by the kernel over 3 worker processes: every
    one gets its tokens, and the merged log holds 60 streams, their arrival numbers unique (worker
    i numbers i, i+3, ...; the first token names it), each sent on the schedule."""
    proc, url, control = sim3
    port = int(url.rsplit(":", 1)[1])
    assert httpx.get(url + "/health").status_code == 200
    httpx.post(url + "/v1/synthetic/reset")

    async def all60():
        return await asyncio.gather(*(complete(port, [7, i], 5) for i in range(60)))
    texts = asyncio.run(all60())
    assert all(len(t) == 5 and t[0].startswith(" s") and t[1:] == [" t"] * 4 for t in texts)
    log = httpx.get(url + "/v1/synthetic").json()
    assert log["workers"] == 3 and log["open"] == 0 and 1 <= log["peak_open"]
    streams = log["streams"]
    arrivals = [s["arrival"] for s in streams]
    assert len(streams) == 60 and len(set(arrivals)) == 60
    assert sorted(int(t[0][2:]) for t in texts) == sorted(arrivals)  # each client's first token names its stream
    assert len({a % 3 for a in arrivals}) > 1  # more than one worker read them
    assert [s["read"] for s in streams] == sorted(s["read"] for s in streams)  # merged by read time
    for s in streams:
        assert len(s["sends"]) == 5 and s["sends"][0] >= s["read"] + 0.020
        # the schedule from the read (20 ms, then every 10), and no send before its time
        assert s["due"] == pytest.approx([s["read"] + 0.020 + j * 0.010 for j in range(5)], abs=1e-9)
        assert all(d >= w for w, d in zip(s["due"], s["sends"]))
    gaps = sorted(b - a for s in streams for a, b in zip(s["sends"], s["sends"][1:]))
    assert gaps[len(gaps) // 2] < 0.030  # about every 10 ms (the host may be loaded)
    metrics = httpx.get(url + "/metrics").text
    assert "tfengine_running_streams 0\n" in metrics and f"synthetic_peak_open_streams {log['peak_open']}" in metrics


def test_one_reset_clears_every_worker():
    """Launched as the harness launches it (capacity.synthetic_server, the listeners checked to be
    its own): a reset through one request empties every worker's log."""
    with capacity.synthetic_server(20.0, 10.0, workers=2) as srv:
        for i in range(8):
            with httpx.Client() as c:  # a fresh connection each
                assert c.post(srv.url + "/v1/completions", json={"prompt": [i], "max_tokens": 2}).status_code == 200
        assert len(httpx.get(srv.url + "/v1/synthetic").json()["streams"]) == 8
        assert httpx.post(srv.url + "/v1/synthetic/reset").json() == {"ok": True}
        log = httpx.get(srv.url + "/v1/synthetic").json()
        assert log["workers"] == 2 and log["streams"] == [] and log["peak_open"] == 0


def test_one_reset_clears_every_workers_own_log(sim3):
    proc, url, control = sim3
    for i in range(12):
        with httpx.Client() as c:
            c.post(url + "/v1/completions", json={"prompt": [i], "max_tokens": 2})
    socks = [control / f"worker-{i}.sock" for i in range(3)]
    assert sum(len(asyncio.run(ask_worker(s, "report"))["streams"]) for s in socks) == 12
    httpx.post(url + "/v1/synthetic/reset")
    assert [asyncio.run(ask_worker(s, "report"))["streams"] for s in socks] == [[], [], []]
    assert httpx.get(url + "/v1/synthetic").json()["streams"] == []


@pytest.mark.parametrize("how", ["terminate", "kill"])
def test_the_workers_stop_with_the_first(sim3, how):
    """The parent stopped (SIGTERM: it stops its workers; SIGKILL: they die with it): no worker
    process is left."""
    proc, url, control = sim3
    pids = [asyncio.run(ask_worker(control / f"worker-{i}.sock", "ping"))["pid"] for i in range(3)]
    assert pids[0] == proc.pid and len(set(pids)) == 3 and all(alive(p) for p in pids)
    getattr(proc, how)()
    proc.wait(timeout=20)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids[1:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids[1:] if alive(p)]


def test_a_bad_workers_value_is_one_line_naming_the_flag():
    res = subprocess.run([sys.executable, "-m", "tensorfold_bench.calibrate.synthetic", "--workers", "0"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "error: argument --workers: must be at least 1" in res.stderr.strip().splitlines()[-1]


# ---- the self-check held against what the run measures ---------------------------------------

def test_send_gaps_are_tested_against_the_schedules_own_distribution():
    """A client that keeps a Poisson schedule (sends a little late, each by its own small delay)
    fits it; one that sends in bunches (every send of a 50 ms window at its end) does not, and a
    constant schedule is judged by its sends' spread."""
    import numpy as np
    g = np.random.default_rng(0)
    sched = np.cumsum(g.standard_exponential(2000) / 1000.0)  # 1,000/s
    kept = selfcheck.arrival_fit(list(sched), list(sched + g.uniform(0, 20e-6, len(sched))))
    assert kept["ks"] < selfcheck.BOUNDS.ks and abs(kept["cv"] - 1) < 0.15 and not kept["constant"]
    bunched = selfcheck.arrival_fit(list(sched), list(np.ceil(sched / 0.05) * 0.05))
    assert bunched["ks"] > 0.5
    d = {"loop_lag_p99_ms": 1.0, "late_p99_ms": 1.0, "late_max_ms": 2.0, "cpu_share": 0.5, "arrivals": bunched,
         "bounds": selfcheck.BOUNDS.to_dict()}
    assert [w for w in selfcheck.reasons(d) if "left the schedule's distribution" in w]
    const = np.arange(100) * 0.01
    assert selfcheck.arrival_fit(list(const), list(const))["cv"] == 0
    jitter = selfcheck.arrival_fit(list(const), list(const + g.uniform(0, 0.008, 100)))
    assert jitter["constant"] and [w for w in selfcheck.reasons({**d, "arrivals": jitter}) if "CV" in w]
    assert selfcheck.arrival_fit([0.0, 1.0], [0.0, 1.0]) is None  # too few to say


def test_lag_and_lateness_are_judged_against_the_figure_the_run_reports():
    """2 ms of lateness is nothing next to a 500 ms first token and everything next to a 5 ms
    one; an event loop busy all the time is saturated whatever it measures."""
    base = {"loop_lag_p99_ms": 0.5, "late_p99_ms": 2.0, "late_max_ms": 3.0, "cpu_share": 0.5,
            "bounds": selfcheck.BOUNDS.to_dict()}
    assert selfcheck.judge(dict(base), {"TTFT p50": 500.0, "TTFT p99": 900.0})["invalid"] == []
    fast = selfcheck.judge(dict(base), {"TTFT p50": 5.0, "TTFT p99": 9.0})
    assert fast["invalid"] == ["the client's sends were late by 2.00 ms at p99, more than 0.1 of the TTFT p50 it "
                               "reports (5.00 ms)"]
    lagged = selfcheck.judge({**base, "loop_lag_p99_ms": 1.2, "late_p99_ms": 0.1}, {"TTFT p50": 5.0, "TTFT p99": 9.0})
    assert lagged["invalid"] == ["the client's event loop lagged 1.20 ms at p99, more than 0.1 of the TTFT p99 it "
                                 "reports (9.00 ms)"]
    assert any("saturated" in w for w in selfcheck.reasons({**base, "loop_busy": 0.97}))


def test_a_receipt_says_the_highest_level_the_client_held():
    ok = {"invalid": []}
    checks = [{**ok, "level": {"label": "rate 1000/s", "value": 1000}},
              {**ok, "level": {"label": "rate 2000/s", "value": 2000}},
              {"invalid": ["saturated"], "level": {"label": "rate 4000/s", "value": 4000}},
              {**ok, "level": {"label": "rate 1000/s", "value": 1000}}]
    assert selfcheck.held(checks) == ("The client held rate 2000/s on this host (every run valid at it); at rate "
                                      "4000/s, 1 of 1 runs was client-limited.")
    sweep_check = {"invalid": ["at 256 streams the client had at most 200 open at once"],
                   "peak_open": {"8": 8, "256": 200}}
    assert selfcheck.held([sweep_check]) == ("The client held 8 streams on this host (every run valid at it); at "
                                             "256 streams, 1 of 1 runs was client-limited.")
    assert selfcheck.held([{"invalid": []}]) is None


def test_a_saturated_client_under_open_loop_load_is_invalid_with_the_reason(sim):
    """A busy loop planted in the client's process (98 ms of every 100 ms on its event loop)
    under an open loop of 200 requests/s: the sends bunch into the loop's free moments, and the
    loop is busy all the time, so the level is invalid and says why; the run's receipt says
    the client did not hold that rate."""
    from tensorfold_bench.scenarios import load
    from tensorfold_bench.workload import spec as spec_mod
    spec = spec_mod.from_flags(rates=[200.0], duration=1.5, input_len="8", output_len="4", seed=0)
    (level,) = spec.levels
    wl = spec.build(level, synthetic.VOCAB)

    async def starved():
        async def hog():
            while True:
                t = clock()
                while clock() - t < 0.098:
                    pass
                await asyncio.sleep(0.002)
        h = asyncio.create_task(hog())
        try:
            return await player.play_level(sim, wl, model=synthetic.MODEL, drain_s=30, level=load.level_dict(level))
        finally:
            h.cancel()

    played, t0, check = asyncio.run(starved())
    entry = {"variant": "sim", "levels": [{**load.level_dict(level), "client": check,
                                           "records": [load.to_req(s, t0) for s in played]}]}
    load.measure_levels(entry, load.Slo())
    assert not entry["valid"]
    why = entry["invalid_reasons"]
    assert any("left the schedule's distribution" in w for w in why), why
    assert any("saturated" in w for w in why), (why, check)
    assert check["arrivals"]["ks"] > selfcheck.BOUNDS.ks and check["loop_busy"] > selfcheck.BOUNDS.busy
    assert "at rate 200/s, 1 of 1 runs was client-limited" in selfcheck.held([check])


# ---- bursts that start together ----------------------------------------------------------------

def test_a_bursts_connections_are_opened_before_its_clock_and_its_send_spread_is_reported(sim, monkeypatch):
    """Every connection of a level is opened before the burst's clock starts, so at its start
    the requests are only written; the spread of the sends is in the self-check."""
    reset(sim)
    opened = []
    real = wire.connect

    async def spy(target, proto):
        if proto.request is None or b"/v1/completions" in proto.request:  # not the /metrics reading
            opened.append(clock())
        return await real(target, proto)
    monkeypatch.setattr(wire, "connect", spy)
    script = sweep.SweepScript(levels=(16,), tokens=5, cells=1, reps=1, prompt_tokens=8)
    batches, check = asyncio.run(sweep.play_levels(sim, script, synthetic.VOCAB, "sim", synthetic.MODEL))
    (b,) = batches
    assert not b["errors"] and len(opened) == 16
    assert max(opened) < min(b["sent"])  # no connect after the clock started
    assert check["send_spread_ms"]["16"] == b["send_spread_ms"] == pytest.approx((max(b["sent"]) - min(b["sent"])) * 1000,
                                                                                 abs=1e-3)
    assert "a burst's sends spread over" in selfcheck.line(check)


def test_a_preopened_connection_the_server_closed_is_replaced_at_the_send(sim):
    async def go():
        req = Request("x", [7, 8, 9], max_tokens=3)
        async with StreamClient() as c:
            (conn,) = await c.preopen(sim, 1)
            conn.transport.close()  # as a server's idle timeout would
            await asyncio.sleep(0.05)
            rec = await stream(c, sim, req, new_record(req), conn=conn)
        return rec
    rec = asyncio.run(go())
    assert rec.error is None and rec.tokens == 3


# ---- an open loop over several processes -------------------------------------------------------

def test_an_open_loop_over_two_processes_sends_the_whole_schedule_once(sim):
    """`--procs 2`: the schedule's requests dealt over two worker processes, each sent at its own
    offset from one start; every request is played once, at its own scheduled time, and the
    self-check covers both processes (the arrival fit over the union of the sends)."""
    from tensorfold_bench.client import workers
    from tensorfold_bench.scenarios import load
    from tensorfold_bench.workload import spec as spec_mod
    reset(sim)
    spec = spec_mod.from_flags(rates=[50.0], duration=1.0, input_len="8", output_len="4", seed=1)
    (level,) = spec.levels
    wl = spec.build(level, synthetic.VOCAB)

    async def go(pool):
        return await player.play_level(sim, wl, model=synthetic.MODEL, drain_s=30, level=load.level_dict(level),
                                     pool=pool)
    with workers.Workers(2) as pool:
        played, t0, check = asyncio.run(go(pool))
    assert sorted(s.item.id for s in played) == sorted(it.id for it in wl.items)
    assert all(s.rec.error is None and s.rec.tokens == 4 for s in played)
    for s in played:  # each at its own offset from the one start
        assert s.rec.scheduled == pytest.approx(t0 + s.item.offset, abs=1e-9)
    assert check["procs"] == 2 and check["arrivals"]["gaps"] == len(played) - 1
    assert check["start_spare_ms"] > 0 and not check["invalid"]  # both processes ready before the start
    assert len(httpx.get(sim + "/v1/synthetic").json()["streams"]) == len(played)
    with pytest.raises(Exception, match="--procs"):
        load.settings_from_flags(model="tiny", device="cpu", dtype=None, share=None, order=None, url=None, out_dir="r",
                                 plain_check=False, parallel=None, prefill_rows=None, max_model_len=None, seed=0,
                                 engine_args=None, workload={"concurrency": "2", "requests": 4}, procs=2)


def test_an_open_loops_connections_open_ahead_and_its_writes_go_on_time_never_early(sim, monkeypatch):
    """Each open-loop request connects up to AHEAD_S before its send time and is written at that
    time by the timer's wake-up: no connect lies between the schedule and the write."""
    from tensorfold_bench.workload import spec as spec_mod
    reset(sim)
    connected: list[float] = []
    real = wire.connect

    async def spy(target, proto):
        await real(target, proto)
        if proto.request is None:  # a connection opened ahead, nothing written yet
            connected.append(clock())
    monkeypatch.setattr(wire, "connect", spy)
    spec = spec_mod.from_flags(rates=[100.0], duration=1.0, input_len="8", output_len="3", seed=2)
    (level,) = spec.levels
    wl = spec.build(level, synthetic.VOCAB)
    played, t0, check = asyncio.run(player.play_level(sim, wl, model=synthetic.MODEL, drain_s=30))
    assert played and all(s.rec.error is None and s.rec.tokens == 3 for s in played)
    assert len(connected) == len(played)  # every one connected ahead, none at its send
    sends = sorted(s.rec.sent for s in played)
    assert all(s.rec.sent >= s.rec.scheduled for s in played)  # never early
    # each connection was open before its send: the i-th connect precedes the i-th send
    assert all(c < s for c, s in zip(sorted(connected), sends))


def test_a_sweep_level_over_two_processes_starts_together_and_is_checked_whole(sim):
    """`tfbench sweep --procs 2`: the level's streams dealt over two worker processes from one
    start; every stream answered, all open at once, and the self-check holds both processes."""
    reset(sim)
    script = sweep.SweepScript(levels=(8,), tokens=5, cells=1, reps=1, prompt_tokens=8)
    batches, check = asyncio.run(sweep.play_levels(sim, script, synthetic.VOCAB, "sim", synthetic.MODEL, procs=2))
    (b,) = batches
    assert not b["errors"] and b["tokens"] == 8 * 5
    assert b["peak_open"] == 8 and check["peak_open"] == {"8": 8}
    assert check["procs"] == 2 and check["workers"]["by_level"]["8"]["procs"] == 2
    assert check["loop_lag_p99_ms"] >= 0 and check["cpu_s"] > 0
    assert httpx.get(sim + "/v1/synthetic").json()["peak_open"] == 8
    assert "8 streams: 2 client processes (--procs)" in selfcheck.line(check)
    assert check["start_spare_ms"] > 0 and "before their shared start" in selfcheck.line(check)


def test_a_process_ready_after_the_shared_start_makes_the_run_invalid(sim, monkeypatch):
    """A worker process still preparing its share when the start every process shares has passed
    sends its first requests late by that much: the check names it, for an open loop and a burst."""
    from tensorfold_bench.client import workers
    from tensorfold_bench.workload import spec as spec_mod
    reset(sim)
    monkeypatch.setattr(workers, "START_AHEAD_S", -0.05)  # the start 50 ms gone when the shares are handed out
    spec = spec_mod.from_flags(rates=[50.0], duration=0.5, input_len="8", output_len="2", seed=3)
    (level,) = spec.levels
    wl = spec.build(level, synthetic.VOCAB)
    reqs = [Request(f"b{i}", [1, 2, 3], max_tokens=2) for i in range(4)]

    async def go(pool):
        loop = await player.play_level(sim, wl, model=synthetic.MODEL, drain_s=30, pool=pool)
        return loop, await pool.burst(sim, reqs, synthetic.MODEL, 30.0)
    with workers.Workers(2) as pool:
        (played, _, check), (recs, watch) = asyncio.run(go(pool))
    assert all(s.rec.error is None for s in played) and all(r.error is None for r in recs)
    assert check["start_spare_ms"] <= -50
    assert any(r.startswith("a client process was ready ") and "after the start its processes share" in r
               for r in check["invalid"])
    assert watch.spare_s <= -0.05
    burst = selfcheck.summary(watch, [r.sent - r.scheduled for r in recs])
    assert any("after the start its processes share" in r for r in burst["invalid"])


def test_the_sweeps_automatic_processes_are_one_per_256_streams_up_to_the_cores():
    from tensorfold_bench.client import workers
    assert [workers.burst_procs(n, 15).procs for n in (1, 256, 257, 1024, 8192)] == [1, 1, 2, 4, 15]
    assert workers.burst_procs(1024, 1).procs == 1  # two cores beside a local server: one for the client
    assert "4 client processes (auto: 1024 streams, at most 256 a process, 15 cores beside the server's)" == \
        workers.burst_procs(1024, 15, server_here=True).text()
    by = sweep.level_procs(3, (8, 64), "http://127.0.0.1:1")
    assert {lv: p.procs for lv, p in by.items()} == {8: 3, 64: 3}


def test_a_bad_sweep_procs_is_one_line_naming_the_flag():
    from tensorfold_bench.errors import FlagError
    with pytest.raises(FlagError, match="^--procs: must be auto or a whole number"):
        sweep.settings_from_flags(model=None, device="cpu", dtype=None, share=None, variants_file=None, base_ref=None,
                                  new_ref=None, aa=False, order=None, url=None, out_dir="r", parallel=None,
                                  prefill_rows=None, max_model_len=None, seed=0, engine_args=None, levels="1",
                                  procs="none")


def test_an_open_loop_request_whose_early_connect_fails_is_still_not_sent_early(monkeypatch):
    """With no connection opened ahead (here: the connect fails), the request is sent by the
    stream itself at its time, never AHEAD_S early; the failure is on its record."""
    from tensorfold_bench.workload import spec as spec_mod
    spec = spec_mod.from_flags(rates=[50.0], duration=0.3, input_len="4", output_len="2", seed=3)
    (level,) = spec.levels
    wl = spec.build(level, synthetic.VOCAB)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    played, t0, _ = asyncio.run(player.play_level(url, wl, model=synthetic.MODEL, drain_s=5))
    assert played and all(s.rec.error and "ConnectError" in s.rec.error for s in played)
    assert all(s.rec.sent >= s.rec.scheduled for s in played)
