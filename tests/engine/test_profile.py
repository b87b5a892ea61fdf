"""The cost profile (engine/runner/profile.py): a profile of the tiny preset taken on the CPU holds
the contract's fields and sensible costs, and both commands answer bad flags in one line."""
import json
import sys

import pytest

from engine.runner.profile import KINDS, SCHEMA, ProfileConfig, TimedBackend, host_fit, profile
from engine.scheduler.backend import Capabilities, round_rows
from engine.scheduler.costs import TAUS, Costs, Profile

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "tiny.json"
    cfg = ProfileConfig(model="tiny", device="cpu", dtype="float32", quick=True, longest=1024, wide=4, wide_len=256,
                        repeats=3, budget_s=120)
    doc, path = profile(cfg, out, log=lambda m: None, commit="abc123")
    assert path == out
    return json.loads(out.read_text())


def test_the_profile_holds_the_contracts_fields(tiny):
    assert tiny["schema"] == SCHEMA == "tfbench.profile/2" and tiny["source"] == "measured"
    assert tiny["rounds"] == "rows"  # a round's n: the rows the runner ran it at
    assert tiny["device"]["type"] == "cpu" and tiny["device"]["cpu_isa"] and len(tiny["device"]["load"]) == 3
    assert tiny["model"] == {"name": "tiny", "dtype": "float32", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
                             "head_dim": 16, "intermediate": 128, "vocab": 512}
    e = tiny["engine"]
    assert e["commit"] == "abc123" and e["prefill_rows"] == 256 and e["parallel"] == 4 and "--prefill-rows" in e["flags"]
    assert set(tiny["samples"]) == set(KINDS)
    # each runner's declared capabilities, as the lane host reads them: the mixed runner's cuts free
    caps = {r["prefill_mode"]: r["capabilities"] for r in e["runners"]}
    # the rows each runner's rounds run at, declared as its capabilities too (what a simulation offers)
    assert all(r["capabilities"]["round_sizes"] == r["decode_rows"] for r in e["runners"])
    assert set(caps["stepped"]) == set(Capabilities.__dataclass_fields__) and not caps["stepped"]["split"]
    assert caps["mixed"]["cut_free"] and Costs(Profile.from_dict(tiny, "tiny")).capabilities("mixed").cut_free
    s = tiny["samples"]
    # the CPU runs no round ahead: rounds as decode's, and the notes say so
    assert s["decode_ahead"] == [] and any(n.startswith("decode_ahead:") for n in tiny["notes"])
    for kind, width in (("prefill", 3), ("decode", 4), ("prefill_many", 3), ("mixed", 6)):
        if kind == "prefill_many" and not s[kind]:  # float32 here fills short prompts one at a time
            assert any(n.startswith("prefill_many:") for n in tiny["notes"])
            continue
        assert s[kind], kind
        assert all(len(row) == width and row[-1] > 0 for row in s[kind]), kind
    # split runs on CUDA only: an empty list, and the notes say why
    assert s["split"] == [] and s["split_round"] == []
    assert any(n.startswith("split:") for n in tiny["notes"])
    assert {k for k, _ in s["host"]} == {"turn", "token"} and all(v >= 0 for _, v in s["host"])


def test_the_profiles_costs_are_sensible(tiny):
    s = tiny["samples"]
    # the fastest of a point's repeats: what the work costs when nothing else on the machine takes
    # the core (other tests' load only ever adds)
    cost = lambda rows: min(r[-1] for r in rows)  # noqa: E731
    # a full cut at the far end of the prompt costs more than 16 rows at its start
    far = max(r[1] for r in s["prefill"] if r[0] == 256)
    assert cost([r for r in s["prefill"] if r[:2] == [256, far]]) > cost([r for r in s["prefill"] if r[:2] == [16, 0]])
    # a round over many keys costs more than one over few (the CPU runs rounds at the padded shape,
    # so keys, not streams, are what its cost follows)
    keys = sorted({r[1] for r in s["decode"]})
    assert cost([r for r in s["decode"] if r[1] >= keys[-3]]) > cost([r for r in s["decode"] if r[1] <= keys[2]])
    # short prompts together (where this CPU fills them together): more rows cost more
    assert not s["prefill_many"] or cost([r for r in s["prefill_many"] if r[1] == max(x[1] for x in s["prefill_many"])]) > \
        cost([r for r in s["prefill_many"] if r[1] == min(x[1] for x in s["prefill_many"])])
    # a mixed forward's rows: a cut and the decode rows it carries
    assert all(r[2] >= 1 and r[3] >= r[2] for r in s["mixed"])
    # a round's n: one of the rows its runner declared it runs rounds at; its longest stream's keys
    # at most all its keys, and at least their share a stream
    sizes = {n for r in tiny["engine"]["runners"] for n in r["decode_rows"]}
    for kind, at in (("decode", 0), ("mixed", 2)):
        assert all(r[at] in sizes for r in s[kind]), kind
        assert all(r[at + 1] / r[at] <= r[at + 2] <= r[at + 1] for r in s[kind]), kind


def test_the_profile_measures_two_fills_of_the_longest_prompt_cut_by_cut(tiny):
    """fill: [rows, start, since, s], the longest prompt cut back to back, twice (each from an idle
    device): since runs from ~0 at each fill's first cut and never goes back within a fill."""
    rows = tiny["samples"]["fill"]
    assert rows and all(len(r) == 4 and r[-1] > 0 for r in rows)
    cut = tiny["engine"]["prefill_rows"]
    assert all(r[0] == cut for r in rows)
    fills, this = [], None
    for r in rows:
        if r[1] == 0:  # a fill starts at the prompt's first cut
            this = []
            fills.append(this)
        assert this is not None, rows
        this.append(r)
    assert len(fills) == 2 and len(fills[0]) == len(fills[1]) >= 2
    for f in fills:
        assert [r[1] for r in f] == [i * cut for i in range(len(f))]  # successive cuts of one prompt
        assert 0 <= f[0][2] < 0.05  # its first cut starts the fill
        assert all(a[2] <= b[2] for a, b in zip(f, f[1:]))
        # back to back: each cut starts no earlier than the cut before it ended
        assert all(b[2] >= a[2] + a[3] * 0.999 for a, b in zip(f, f[1:]))
    k, tau = Costs(Profile.from_dict(tiny, "tiny")).heat
    assert k >= 0 and tau in TAUS


def test_the_host_fit_takes_medians_and_the_rise_per_token():
    turns = [(1e-5, 1), (1.2e-5, 1), (0.9e-5, 1), (3e-5, 5), (3.1e-5, 5), (2.9e-5, 5), (5.0, 1)]  # one preempted turn
    turn, token = host_fit(turns)
    assert token == pytest.approx((3e-5 - 1.1e-5) / 4, rel=1e-6)
    assert turn == pytest.approx(1.1e-5 - token, rel=1e-6)
    assert host_fit(turns[:2]) is None


def test_the_timed_backend_adds_up_only_the_backends_calls():
    class Slow:
        parallel = 4

        def decode(self, *a):
            import time
            time.sleep(0.02)
            return [1]
    b = TimedBackend(Slow())
    assert b.parallel == 4 and b.spent == 0
    assert b.decode([0], [1], [0]) == [1]
    assert 0.015 < b.spent < 1


@pytest.mark.parametrize("main", ["engine", "tensorfold_bench"])
@pytest.mark.parametrize("args, says", [
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--budget", "-5"], "--budget must be a positive number"),
    (["--device", "tpu"], "--device must be cpu or cuda"),
    (["--split-sms", "32"], "--split-sms is for --device cuda"),
    (["--split-sms", "1,x"], "--split-sms"),
    (["--cpu-isa", "sse"], "--cpu-isa"),
    (["--bogus"], "No such option: --bogus"),
])
def test_bad_flags_are_one_line_errors(main, args, says, monkeypatch, capsys):
    """`tfengine profile` and its adapter `tfbench profile` (which passes the flags through)."""
    if main == "engine":
        from engine.cli import main as entry
        prog = "tfengine"
    else:
        from tensorfold_bench.cli import main as entry
        prog = "tfbench"
    monkeypatch.setattr(sys, "argv", [prog, "profile", *args])
    with pytest.raises(SystemExit) as exit_:
        entry()
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in err, err


def test_rounds_run_ahead_are_timed_where_the_runner_runs_them():
    """decode_ahead: a chain of rounds, each fed the last one's ids at the next positions, as the
    host asks with no prompt waiting; a runner that runs no round ahead gives none."""
    from engine.config import EngineConfig, KernelConfig
    from engine.runner.build import build_runner
    from engine.runner.profile import Profiler
    p = Profiler(ProfileConfig(model="tiny", device="cpu", dtype="float32", repeats=3, budget_s=60), log=lambda m: None)
    ahead = build_runner(EngineConfig(model="tiny", dtype="float32", parallel=4, max_model_len=256,
                                     kernels=KernelConfig(overlap=True, cpu_cpp=False)))
    assert ahead.runs_ahead
    p.decode_ahead(ahead, [(1, 16), (4, 100), (4, 250)])  # (250: no room for the chain, left out)
    rows = p.out.samples["decode_ahead"]
    # n: the rows each round ran at (the runner's padded shape, however few streams), not its streams
    assert [r[0] for r in rows] == [round_rows(ahead.buckets, [0])] * 3 + [round_rows(ahead.buckets, range(4))] * 3
    assert all(r[0] in ahead.buckets for r in rows)
    assert [r[1] for r in rows[3:]] == [sum(100 + j + 1 + k for j in range(4)) for k in (1, 2, 3)]
    assert [r[2] for r in rows] == [16 + 1 + k for k in (1, 2, 3)] + [100 + 3 + 1 + k for k in (1, 2, 3)]
    assert all(r[3] > 0 for r in rows)
    plain = build_runner(EngineConfig(model="tiny", dtype="float32", parallel=4, max_model_len=256,
                                     kernels=KernelConfig(overlap=False, cpu_cpp=False)))
    p.out.samples["decode_ahead"] = []
    p.decode_ahead(plain, [(1, 16)])
    assert p.out.samples["decode_ahead"] == []


def test_the_command_writes_a_profile_with_serves_dtype(tmp_path, monkeypatch, capsys):
    """`tfengine profile` end to end at its smallest: the dtype serve picks on this CPU, the file
    written where --out says, a line a kind printed."""
    from engine.cli import device_defaults, main as entry
    out = tmp_path / "p.json"
    monkeypatch.setattr(sys, "argv", ["tfengine", "profile", "--model", "tiny", "--quick", "--longest", "512",
                                      "--wide", "2", "--wide-len", "128", "--repeats", "1", "--budget", "60",
                                      "--out", str(out)])
    entry()
    doc = json.loads(out.read_text())
    assert doc["model"]["dtype"] == device_defaults("cpu", None, None, None)[0] and doc["samples"]["prefill"] and doc["samples"]["decode"]
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "prefill:" in printed and "split: none" in printed


def test_each_stage_is_written_as_it_ends(tmp_path):
    """A sitting cut short keeps what it measured: the file after the first runner's stage says it
    is partial and holds that stage's samples; the finished one is not partial."""
    from engine.runner.profile import Profiler
    seen = []
    p = Profiler(ProfileConfig(model="tiny", device="cpu", dtype="float32", quick=True, longest=512, wide=2,
                               wide_len=128, repeats=1, budget_s=60), log=lambda m: None, checkpoint=seen.append)
    doc = p.run()
    assert seen[0]["partial"].startswith("measured through: long") and seen[0]["samples"]["prefill"]
    assert not seen[0]["samples"]["prefill_many"] and "partial" not in doc


@pytest.mark.parametrize("parallel, row_buckets", [(4, None), (3, False), (16, True)])
def test_a_runner_declares_the_rows_its_rounds_run_at(parallel, row_buckets):
    """A runner's caps.round_sizes are its buckets (the row counts its decode rounds run at), and a
    round of a few lanes runs at the fewest holding its highest lane, as the runner pads it."""
    from engine.config import EngineConfig, KernelConfig
    from engine.runner.build import build_runner
    r = build_runner(EngineConfig(model="tiny", dtype="float32", parallel=parallel, max_model_len=128,
                                  kernels=KernelConfig(row_buckets=row_buckets)))
    caps = r.caps
    assert caps.round_sizes == tuple(r.buckets) and caps.round_sizes[-1] == r.round_rows >= parallel
    if row_buckets:
        assert len(caps.round_sizes) > 1  # rounds of a few streams at fewer rows than the padded shape
    for lanes in ([0], [parallel - 1], list(range(parallel))):
        n = caps.round_rows(lanes)
        assert n in r.buckets and n >= max(lanes) + 1
        assert all(b < max(lanes) + 1 for b in r.buckets if b < n)  # the fewest that hold it
        (tok, _, _), _ = r.padded_round(lanes, [1] * len(lanes), [0] * len(lanes))
        assert len(tok) == n  # the rows the runner builds that round at
