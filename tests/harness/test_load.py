"""tfbench load: the figures on hand-made records (goodput, coordinated omission, queueing, the
inject windows), the player against the fake server (offsets kept, --max-concurrency, sessions,
a closed loop), every class of bad input, and the CLI end to end on the engine's tiny preset."""
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensorfold_bench import report
from tensorfold_bench.analysis import exactness, load as lf
from tensorfold_bench.client import player, selfcheck
from tensorfold_bench.cli.commands import app
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.scenarios import load
from tensorfold_bench.workload.model import Item, Workload

import fakeserver
from marks import host_lag

ROOT = Path(__file__).resolve().parents[2]


def req(id, sent, gaps_ms, *, scheduled=None, released=None, kind="load", warmup=False, max_tokens=None, error=None):
    gaps = [round(g * 1000) for g in gaps_ms]
    end = sent + sum(gaps_ms) / 1000
    return lf.Req(id, kind, warmup, scheduled if scheduled is not None else sent, released, sent, gaps, end, error,
                  10, max_tokens if max_tokens is not None else len(gaps), len(gaps))


# ---- the figures --------------------------------------------------------------------------

def test_slo_needs_a_unit_and_known_keys():
    assert lf.parse_slo("ttft=500ms,tpot=50ms,e2e=10s") == lf.Slo(0.5, 0.05, 10.0)
    assert lf.parse_slo("TTFT=0.2s") == lf.Slo(ttft=0.2)
    for bad in ("ttft=500", "ttft=500ms,ttft=1s", "latency=1s", "tpot=-5ms", "tpot=0ms", "ttft"):
        with pytest.raises(FlagError, match="^--slo: "):
            lf.parse_slo(bad)


def test_goodput_counts_requests_meeting_every_bound_per_second():
    slo = lf.Slo(ttft=0.1, tpot=0.02)
    reqs = [req("a", 0.0, [50, 10, 10]),         # meets both
            req("b", 0.5, [150, 10, 10]),        # TTFT 150 ms: misses
            req("c", 1.0, [50, 30, 30]),         # TPOT 30 ms: misses
            req("d", 1.5, [20, 10, 10], max_tokens=5),  # came short: never meets
            req("w", 0.1, [500, 500], warmup=True)]     # warm-up: not counted at all
    f = lf.level_figures(reqs, slo)
    assert (f["requests"], f["completed"], f["slo_met"]) == (4, 4, 1)
    assert f["attainment_pct"] == 25.0
    span = 1.5 + 0.04 - 0.0
    assert f["goodput"] == pytest.approx(1 / span) and f["req_s"] == pytest.approx(4 / span)
    assert f["latency"]["ttft"]["max"] == pytest.approx(150) and f["latency"]["tpot"]["max"] == pytest.approx(30)
    assert f["out_tok_s"] == pytest.approx(12 / span)
    # pooled inter-token gaps: every gap after the first token of every request
    assert sorted(lf.latencies(lf.measured(reqs))["itl"]) == pytest.approx([0.01] * 6 + [0.03, 0.03])
    assert not f["invalid"] and lf.level_figures(reqs, lf.Slo())["goodput"] is None


def test_latency_from_the_schedule_counts_a_late_send_and_a_late_run_is_invalid():
    """Coordinated omission: a request sent 300 ms late has a fast TTFT from its own send, but
    from its scheduled time it waited; its lateness passes the bound, so the run is invalid."""
    reqs = [req(f"r{i}", i * 0.1, [20, 10]) for i in range(50)]
    reqs[10] = req("r10", 1.3, [20, 10], scheduled=1.0)
    reqs[11] = req("r11", 1.4, [20, 10], scheduled=1.1)
    f = lf.level_figures(reqs, lf.Slo(ttft=0.1))
    assert f["latency"]["ttft"]["max"] == pytest.approx(20)
    assert f["latency"]["ttft_sched"]["max"] == pytest.approx(320)
    assert f["slo_met"] == 48  # the two late ones miss the TTFT bound from their schedule
    assert f["late_ms"]["max"] == pytest.approx(300)
    assert any("lateness p99" in why for why in f["invalid"])


def test_a_wait_for_a_slot_is_queueing_not_lateness():
    r = req("q", 0.501, [20], scheduled=0.0, released=0.5)
    assert r.lateness == pytest.approx(0.001) and r.lead == pytest.approx(0.501)
    f = lf.level_figures([r, req("p", 0.0, [20])], lf.Slo(ttft=0.1))
    assert not f["invalid"] and f["slo_met"] == 1 and f["queued_ms"]["max"] == pytest.approx(500)


def test_interference_inside_the_fill_windows_against_outside():
    # an injected prompt sent at 1.0 s gets its first token at 2.0 s: the window (1.0, 2.0]
    inj = req("i0", 1.0, [1000], kind="inject")
    bg = req("a", 0.0, [10] + [100] * 9 + [800] + [100] * 5)  # tokens every 0.1 s, one 0.8 s pause at 1.81 s
    short_in = req("c", 1.2, [900, 10])  # sent inside the window: waits for the fill
    short_out = req("d", 3.0, [30, 10])
    f = lf.interference([inj, bg, short_in, short_out])
    assert (f["injected"], f["filled"], f["window_s"]) == (1, 1, pytest.approx(1.0))
    assert f["pause_in_ms"] == pytest.approx(800) and f["pause_out_ms"] == pytest.approx(100)
    assert f["ttft_p99_in_ms"] == pytest.approx(900) and f["ttft_p99_out_ms"] == pytest.approx(30, abs=1)
    assert f["inject_ttft_p50_ms"] == pytest.approx(1000) and (f["sent_in"], f["sent_out"]) == (1, 2)
    assert lf.interference([bg]) is None  # no injected prompt: no table
    # the injected prompt is not background traffic: left out of the level's latencies
    assert lf.level_figures([inj, bg], lf.Slo())["requests"] == 1


def test_replies_compare_per_level_and_id_across_runs_and_with_the_plain_reference():
    def run(i, variant, shas):
        return {"index": i, "variant": variant, "levels": [{"label": "rate 1/s", "records": [
            lf.Req(f"r{k}", sha=s, pkey=f"p{k}", gaps_us=[1]) for k, s in enumerate(shas)]}]}
    data = {"settings": {"base": "whole"}, "runs": [run(1, "whole", ["a", "b"]), run(2, "new", ["a", "X"]),
                                                    run(3, "whole", ["a", "b"])],
            "plain": {"hashes": {"p0": "a", "p1": "b"}}}
    e = exactness.load(data)
    assert e["across_runs"] == {"whole": {"equal": 4, "of": 4, "unknown": 0}, "new": {"equal": 1, "of": 2, "unknown": 0}}
    assert e["vs_plain"]["new"]["equal"] == 1 and e["vs_plain"]["whole"]["equal"] == 4 and not e["ok"]
    assert e["flagged"][0].startswith("rate 1/s r1: run 2 (new) X != b")


# ---- the player against the fake server ----------------------------------------------------

@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    port_file = tmp_path_factory.mktemp("fake") / "port"
    proc = subprocess.Popen([*fakeserver.CMD, "serve", "--port", "0", "--port-file", str(port_file),
                             "--prefill-mode", "whole"])
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        proc.terminate()
        proc.wait(10)


def play(url, items, **kw):
    played, t0, check = asyncio.run(player.play_level(url, Workload(tuple(items), "test"), **kw))
    return {r.id: r for r in (load.to_req(s, t0) for s in played)}, check


def test_open_loop_sends_on_the_offsets_whatever_is_in_flight(fake):
    items = [Item(f"r{i}", tuple(range(300, 340)), 20, offset=0.05 * i) for i in range(8)]
    recs, check = play(fake, items)
    for i in range(8):
        r = recs[f"r{i}"]
        assert r.scheduled == pytest.approx(0.05 * i) and r.error is None and r.tokens == 20
        assert 0 <= r.lateness < 0.05, r
    assert check["open_peak"] >= 3  # each reply takes ~0.2 s: later ones went while earlier ones ran


def test_max_concurrency_queues_and_the_wait_counts_from_the_schedule(fake):
    items = [Item(f"q{i}", (1, 2, 3, 4), 5, offset=0.0) for i in range(3)]
    recs, check = play(fake, items, max_concurrency=1)
    q0, q1, q2 = recs["q0"], recs["q1"], recs["q2"]
    assert q0.released is None and q1.released >= q0.ended - 0.01 and q2.released >= q1.ended - 0.01
    assert q2.lead > q2.ttft and q2.lateness < 0.05 and check["open_peak"] == 1
    f = lf.level_figures(list(recs.values()), lf.Slo())
    assert f["latency"]["ttft_sched"]["max"] > f["latency"]["ttft"]["max"] + 40


def test_a_later_turn_carries_the_history_and_waits_its_think_time(fake):
    items = [Item("s0.t0", tuple(range(400, 420)), 4, offset=0.0, session="s0"),
             Item("s0.t1", (5, 6, 7), 4, session="s0", turn=1, think=0.1)]
    recs, _ = play(fake, items)
    t0, t1 = recs["s0.t0"], recs["s0.t1"]
    assert t1.prompt_len == 20 + 4 + 3  # the first prompt, its reply's 4 ids, the new part
    assert t1.scheduled == pytest.approx(t0.ended + 0.1, abs=0.005) and t1.sent >= t1.scheduled
    assert t1.session == "s0" and t1.turn == 1 and t1.pkey != t0.pkey


def test_a_closed_loop_keeps_n_in_flight_and_injects_go_on_time(fake):
    items = [Item(f"r{i}", (1, 2, 3, i + 5), 6) for i in range(6)]
    items.append(Item("i0", tuple(range(300, 600)), 1, offset=0.05, kind="inject"))
    recs, check = play(fake, items, concurrency=2)
    assert all(recs[f"r{i}"].tokens == 6 for i in range(6)) and check["open_peak"] == 3  # 2 + the inject
    assert recs["i0"].sent == pytest.approx(0.05, abs=0.02)


# ---- bad input: one line, exit 2, before any server starts ----------------------------------

BAD = [
    (["--rate", "2", "--duration", "5", "--slo", "ttft=500"], "--slo"),
    (["--rate", "0", "--duration", "5"], "--rate"),
    (["--rate", "fast", "--duration", "5"], "--rate"),
    (["--rate", "2", "--duration", "5", "--output-len", "0"], "--output-len"),
    (["--rate", "2", "--duration", "5", "--max-concurrency", "0"], "--max-concurrency"),
    (["--concurrency", "2,x", "--requests", "4"], "--concurrency"),
    (["--rate", "2", "--duration", "5", "--format", "csv"], "--format"),
    (["--rate", "2"], "--requests"),
    (["--rate", "2", "--duration", "5", "--procs", "two"], "--procs"),
    (["--concurrency", "2", "--requests", "4", "--procs", "2"], "--procs"),
]


def test_bad_input_is_one_line_and_exit_2_before_any_server(tmp_path):
    """As a user meets it: the process's exit code and its whole stderr (one class; the others in-process below)."""
    flags, flag = BAD[0]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TFBENCH_SERVER_CMD": "false"}
    res = subprocess.run([sys.executable, "-m", "tensorfold_bench", "load", "--model", "tiny", *flags,
                          "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}"), res.stderr
    assert "Traceback" not in res.stderr and not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags,flag", BAD)
def test_each_bad_input_names_its_flag_before_any_server(flags, flag, tmp_path, monkeypatch):
    monkeypatch.setenv("TFBENCH_SERVER_CMD", "false")  # a server start would fail loudly, not pass
    res = CliRunner().invoke(app, ["load", "--model", "tiny", *flags, "--out", str(tmp_path)])
    assert isinstance(res.exception, BenchError) and str(res.exception).startswith(flag), (res.output, res.exception)
    assert not list(tmp_path.iterdir())


# ---- client processes: how many, and the arrivals they send ------------------------------------

def test_the_automatic_rule_gives_each_process_at_most_half_a_core_up_to_the_cores():
    from tensorfold_bench.client import workers
    assert workers.choose(1000, 0.0003, 16).procs == 1  # 0.3 of a core
    assert workers.choose(2000, 0.0003, 16).procs == 2  # 0.6: two of 0.3
    assert workers.choose(4000, 0.0003, 16).procs == 3  # 1.2
    assert workers.choose(4000, 0.0003, 2).procs == 2  # no more than the cores
    assert workers.choose(float("inf"), 0.0003, 4).procs == 4  # a trace's sends all at once
    p = workers.choose(2000, 0.0003, 16)
    assert p.to_dict() == {"procs": 2, "rule": "auto", "rate": 2000, "cpu_ms": 0.3, "cores": 16, "busy": 0.5}
    assert p.text() == ("2 client processes (auto: 2000 req/s at 0.300 ms of client CPU each is 0.60 of a core, "
                        "at most 0.5 a process, 16 cores)")
    assert workers.asked_rate([0.0, 0.5, 1.0, 2.0]) == 1.5 and workers.asked_rate([1.0]) is None


@pytest.mark.parametrize("arrival,burstiness", [("poisson", 1.0), ("gamma", 0.5), ("constant", 1.0)])
def test_the_processes_parts_together_are_the_schedule_itself(arrival, burstiness):
    """Dealt over processes, every item keeps its own offset and lands in exactly one part: the
    union of the sends is the seeded draw of the process asked for, not N draws at rate/N."""
    from scipy import stats
    from tensorfold_bench.workload import spec as spec_mod
    spec = spec_mod.from_flags(rates=[500.0], duration=4.0, input_len="8", output_len="4", seed=3, arrival=arrival,
                               burstiness=burstiness)
    (level,) = spec.levels
    wl = spec.build(level, 1000)
    for n in (2, 3):
        parts = player.deal(wl, n)
        assert len(parts) == n and all(abs(len(p.items) - len(wl.items) / n) <= 1 for p in parts)
        assert sorted((it.id, it.offset) for p in parts for it in p.items) == sorted((it.id, it.offset) for it in wl.items)
    offsets = sorted(it.offset for p in player.deal(wl, 2) for it in p.items)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    if arrival == "poisson":  # the union's gaps are exponential at the rate asked
        assert stats.kstest([g * 500 for g in gaps], "expon").statistic < 0.05
    multi = spec_mod.from_flags(rates=[50.0], duration=2.0, input_len="8", output_len="4", seed=3, turns=3)
    wl = multi.build(multi.levels[0], 1000)
    for p in player.deal(wl, 2):  # a session's turns stay in one process (each waits for the last's reply)
        sess = {it.session for it in p.items}
        assert all(sum(1 for it in p.items if it.session == s) == 3 for s in sess)


def test_procs_as_given_auto_from_the_measured_cost_and_one_for_a_closed_loop(monkeypatch):
    from tensorfold_bench.client import workers
    from tensorfold_bench.scenarios import capacity
    from tensorfold_bench.workload import spec as spec_mod
    spec = spec_mod.from_flags(rates=[2000.0], duration=1.0, input_len="32", output_len="16", seed=0)
    items = spec.build(spec.levels[0], 1000).items
    asked = []
    monkeypatch.setattr(capacity, "cpu_per_request", lambda i, o: asked.append((i, o)) or 0.0004)
    monkeypatch.setattr(workers, "cores", lambda: 4)
    s = load.LoadSettings(None, spec, lf.Slo(), procs="auto")
    p = load.level_procs(s, items, False, None)
    assert p.procs == 2 and p.rule == "auto" and asked == [(32, 16)] and 1900 < p.rate < 2100  # 0.8 of a core
    assert load.level_procs(replace(s, procs=3), items, False, None) == workers.Procs(3, "--procs")
    assert load.level_procs(s, items, True, None).procs == 1
    assert load.level_procs(s, items, False, 8) == workers.Procs(1, "--max-concurrency")
    # a server on this host keeps a core: 2 cores leave the client one, and nothing is measured
    monkeypatch.setattr(workers, "cores", lambda: 2)
    p = load.level_procs(s, items, False, None)
    assert p.procs == 1 and len(asked) == 1 and p.text() == "1 client process (auto: 1 core beside the server's)"
    assert load.level_procs(s, items, False, None, server_here=False).procs == 2  # a remote server: both cores
    assert workers.on_this_host("http://127.0.0.1:8000") and workers.on_this_host("http://localhost:1/v1")
    assert not workers.on_this_host("http://10.1.2.3:8000")
    monkeypatch.setattr(workers, "cores", lambda: 1)  # no core to spare: nothing measured
    p = load.level_procs(s, items, False, None, server_here=False)
    assert p.procs == 1 and len(asked) == 2 and p.text() == "1 client process (auto: 1 core)"
    assert load.auto_procs(items[:1]).text() == "1 client process (auto: fewer than two timed sends)"
    for bad in ("0", "two", "1.5", 0):
        with pytest.raises(FlagError, match="^--procs: must be auto or a whole number"):
            load.parse_procs(bad)
    assert load.parse_procs("AUTO") == "auto" and load.parse_procs("2") == 2


def test_the_measured_cost_a_request_is_positive_and_grows_with_the_reply():
    from tensorfold_bench.scenarios import capacity
    short, long = capacity.cpu_per_request(32, 4), capacity.cpu_per_request(32, 64)
    assert 0 < short < long < 0.05
    assert capacity.cpu_per_request(32, 4) == short  # measured once per shape


# ---- the CLI end to end on the tiny preset ---------------------------------------------------

def test_poisson_whole_vs_stepped_with_injects_and_the_plain_reference(tmp_path, monkeypatch):
    # what is checked here is the load's play, not the client's timing of a tiny model on a loaded
    # host: its lag is held against the whole first token, not a tenth of it
    monkeypatch.setattr(selfcheck, "BOUNDS", replace(selfcheck.BOUNDS, share=1.0))
    pred = tmp_path / "predict.yaml"
    pred.write_text("stepped p=0.5:\n  goodput@rate 6/s: [0, 100]\n")
    res = CliRunner().invoke(app, ["load", "--model", "tiny", "--prefill-rows", "16", "--rate", "6", "--duration", "2",
                                   "--input-len", "24", "--output-len", "6", "--inject", "700@0.7",
                                   "--slo", "ttft=2s,tpot=1s", "--share", "0.5", "--order", "base,new,base",
                                   "--plain-check", "--predict", str(pred), "--warmup", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    js = next(tmp_path.glob("*-load.json.gz"))
    data = report.read(js)
    assert [r["variant"] for r in data["runs"]] == ["whole", "stepped p=0.5", "whole"]
    # the client's lag on a loaded host (marks.host_lag) is the host's: not asserted
    assert not [w for r in data["runs"] for w in r["invalid_reasons"] if not host_lag(w.split(": ", 1)[-1])], \
        [r["invalid_reasons"] for r in data["runs"]]
    # the same requests at the same offsets in every run
    offs = [[(q["id"], q["scheduled"]) for q in r["levels"][0]["records"]] for r in data["runs"]]
    assert offs[0] == offs[1] == offs[2] and any(q["kind"] == "inject" for q in data["runs"][0]["levels"][0]["records"])
    assert data["runs"][0]["levels"][0]["records"][0]["warmup"]
    f = data["runs"][1]["levels"][0]["figures"]
    assert f["goodput"] > 0 and f["interference"]["filled"] == 2 and data["runs"][1]["alone"]["ttft_ms"] > 0
    e = data["exactness"]
    for v in ("whole", "stepped p=0.5"):
        assert e["across_runs"][v]["equal"] == e["across_runs"][v]["of"] > 0
        assert e["vs_plain"][v]["equal"] == e["vs_plain"][v]["of"] == e["across_runs"][v]["of"]
    assert "goodput@rate 6/s" in data["stats"]
    # an invalid run (here only the host's lag, asserted above) has no median: its prediction is
    # "not measured", never held against a figure the client could not keep
    (p,) = data["predictions"]["items"]
    if data["runs"][1]["invalid_reasons"]:
        assert p["status"] == "not measured" and data["predictions"]["checked"] == 0
    else:
        assert p["status"] in ("in", "out") and data["predictions"]["checked"] == 1
    md = next(tmp_path.glob("*-load.md")).read_text()
    n = e["across_runs"]["whole"]["of"]
    assert f"whole: {n} of {n} replies equal across runs; {n} of {n} equal to the plain reference" in md
    assert "### rate 6/s" in md and "**Interference**" in md
    # --procs auto: the rule's inputs in every level's check (6/s needs far less than half a core)
    w = data["runs"][0]["levels"][0]["client"]["workers"]
    assert w["rule"] == "auto" and w["procs"] == 1 and w["rate"] > 0 and w["cores"] >= 1 and w["server_here"]
    # the client's CPU a request is measured where a core is left beside the server (not on 2 cores)
    assert (w.get("cpu_ms", 0) > 0) == (w["cores"] >= 2)
    assert "1 client process (auto: " in md
    assert not (tmp_path / js.name.replace(".json.gz", ".png")).exists()  # one level: a point, no curve to draw
    res = CliRunner().invoke(app, ["report", str(js), "--no-png"])  # the Markdown from the JSON alone
    assert res.exit_code == 0 and next(tmp_path.glob("*-load.md")).read_text() == md


def test_multi_turn_sessions_in_a_closed_loop_equal_the_plain_reference_turn_by_turn(tmp_path, monkeypatch):
    """Each later turn's prompt holds the run's own earlier replies; replayed turn by turn on the
    plain reference, every turn's reply is equal (so every later prompt met its plain twin)."""
    # what is checked is the turns' exactness, not the client's timing on a loaded host (a 3.4 ms
    # late send against a tiny model's 16 ms first token is over the relative bound)
    monkeypatch.setattr(selfcheck, "BOUNDS", replace(selfcheck.BOUNDS, share=1.0, lag_p99_s=10.0))
    res = CliRunner().invoke(app, ["load", "--model", "tiny", "--prefill-rows", "16", "--concurrency", "2",
                                   "--requests", "3", "--turns", "3", "--think", "0.05", "--input-len", "12",
                                   "--output-len", "5", "--share", "0.5", "--order", "base,new", "--plain-check",
                                   "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    data = report.read(next(tmp_path.glob("*-load.json.gz")))
    recs = {q["id"]: q for q in data["runs"][0]["levels"][0]["records"]}
    assert len(recs) == 9 and recs["s0.t2"]["prompt_len"] == 3 * 12 + 2 * 5  # history: two prompts' parts, two replies
    assert recs["s0.t1"]["scheduled"] >= recs["s0.t0"]["ended"] + 0.05 - 1e-6
    e = data["exactness"]
    assert e["vs_plain"]["stepped p=0.5"] == {"equal": 9, "of": 9, "unknown": 0, "no_reference": 0}
    assert e["across_runs"]["stepped p=0.5"]["equal"] == 9


def test_the_picture_draws_latency_and_goodput_against_the_rate(tmp_path):
    data = report.read(ROOT / "receipts" / "20261202-003218-load.json.gz")  # three rates
    assert report.render_png(data, tmp_path / "p.png") == tmp_path / "p.png" and (tmp_path / "p.png").stat().st_size > 5000


def test_a_sharegpt_text_file_runs_without_a_tokenizer_counted_by_the_presets_own(tmp_path, monkeypatch):
    """No --tokenizer: the launched preset's own tokenizer makes the prompts' ids and counts the
    replies, and the receipt names it."""
    # what is checked is the counting, not the client's timing on a loaded host (three sends: the
    # first one's lateness is the p99, tens of ms on a CI box running two workers)
    monkeypatch.setattr(selfcheck, "BOUNDS", replace(selfcheck.BOUNDS, share=100.0, lag_p99_s=10.0))
    data_file = ROOT / "examples" / "workloads" / "sharegpt-5.json"
    res = CliRunner().invoke(app, ["load", "--model", "tiny", "--dataset", str(data_file), "--rate", "4",
                                   "--requests", "3", "--order", "base", "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    data = report.read(next(tmp_path.glob("*-load.json.gz")))
    assert "text counted by tfengine's byte-level tokenizer (preset tiny)" in data["settings"]["workload"]
    recs = data["runs"][0]["levels"][0]["records"]
    assert recs[0]["prompt_len"] == len(b"What is a KV cache?") and recs[0]["tokens"] == recs[0]["max_tokens"] > 1
    assert "text counted by tfengine's byte-level tokenizer" in next(tmp_path.glob("*-load.md")).read_text()
