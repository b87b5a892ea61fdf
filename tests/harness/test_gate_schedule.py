"""The gate's schedule layer: each side's scheduler replayed in virtual time on a committed profile,
in a subprocess on that side's `engine`. An unchanged tree gives identical figures every time; a
planted copy of a known schedule regression (short prompts filled one a turn, a decode round
between each, instead of back to back) fails by scenario and figure; a base without the simulator
is "not run". No server, no GPU."""
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.scheduler.costs import Costs
from tensorfold_bench import report
from tensorfold_bench.errors import FlagError
from tensorfold_bench.scenarios import gate, gate_schedule
from tensorfold_bench.servers.worktree import Source

ROOT = Path(__file__).resolve().parents[2]
SHAPE = gate.schedule_shape(gate.PRESETS["cpu"])
PROFILE = gate_schedule.default_profile("cpu")
FILL = "shorts = [s for s in ordered if self.policy.goes_whole(s)]"


def engine_copy(tmp: Path, plant: bool = False, simulator: bool = True) -> Path:
    shutil.copytree(ROOT / "engine", tmp / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    host = tmp / "engine" / "scheduler" / "host.py"
    if plant:
        text = host.read_text()
        assert FILL in text  # the plant must still find the fill it breaks
        host.write_text(text.replace(FILL, FILL + "[:1]", 1))  # one short prompt a turn
    if not simulator:
        (tmp / gate_schedule.SIMULATOR).unlink()
    return tmp


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return engine_copy(tmp_path_factory.mktemp("planted"), plant=True)


@pytest.fixture(scope="module")
def figures(planted):
    """Each engine's figures, replayed once: the tree's and the planted copy's."""
    return gate_schedule.run_side(ROOT, SHAPE, PROFILE), gate_schedule.run_side(planted, SHAPE, PROFILE)


def test_an_unchanged_tree_passes_with_identical_figures_every_time(figures):
    once = gate_schedule.layer(ROOT, ROOT, SHAPE, PROFILE)
    assert once["status"] == "run" and once["reasons"] == []
    assert {r["worse_by"] for r in once["rows"]} == {0.0}
    assert {(r["scenario"], r["figure"]): r["new"] for r in once["rows"]} == {
        (s, f): v for s, figs in figures[0].items() for f, v in figs.items()}
    assert {r["scenario"] for r in once["rows"]} == {"sweep@1", "sweep@4", "shorts", "long_prompt p=1",
                                                    "long_prompt p=0.5", "long_prompt mixed budget=80", "load+cold"}
    # the default profile prices short prompts filled together: the host's batched fill is replayed
    assert Costs.load(PROFILE).has("prefill_many")
    assert all(r["base"] is not None for r in once["rows"])


def test_short_prompts_filled_one_a_turn_fail_naming_the_scenario_and_figure(figures, planted):
    tree, slow = figures
    _, reasons = gate_schedule.compare(tree, slow)
    # the seed's figure: streams that start together lose throughput when their prompts are filled
    # a round apart (on a CPU profile, where filling prompts together costs about what filling them
    # one by one does, the shorts' median first token may even gain: the layer reports each figure)
    assert any(r.startswith("schedule layer, sweep@4: tok_s worse by") for r in reasons), reasons
    assert all("simulated" in r for r in reasons)
    # the other way round the throughput comes back (the first tokens it bought are reported lost)
    rows, back = gate_schedule.compare(slow, tree)
    assert not any(r.startswith("schedule layer, sweep@") and ": tok_s" in r for r in back), back
    assert any(r["worse_by"] < 0 for r in rows)
    # end to end, each side in its own subprocess; acknowledged: shown, not failed
    d = gate_schedule.layer(ROOT, planted, SHAPE, PROFILE, accepted=True)
    assert d["status"] == "run" and d["reasons"] == [] and d["acknowledged"] == reasons


def test_a_base_without_the_simulator_or_that_cannot_replay_is_not_run(tmp_path):
    old = engine_copy(tmp_path / "old", simulator=False)
    d = gate_schedule.layer(old, ROOT, SHAPE, PROFILE)
    assert d["status"] == "not run" and "predates the simulator" in d["why"] and d["reasons"] == []
    broken = engine_copy(tmp_path / "broken")
    (broken / "engine" / "scheduler" / "costs.py").write_text("raise ImportError('an older costs module')\n")
    d = gate_schedule.layer(broken, ROOT, SHAPE, PROFILE)
    assert d["status"] == "not run" and "an older costs module" in d["why"]
    assert gate_schedule.layer(None, ROOT, SHAPE, PROFILE)["status"] == "not run"


def test_a_new_side_whose_replay_fails_fails_the_layer(tmp_path):
    broken = engine_copy(tmp_path)
    with open(broken / "engine" / "scheduler" / "host.py", "a") as f:
        f.write("\n\ndef _broken(self):\n    raise RuntimeError('a broken turn')\n\n\nLaneHost.turn = _broken\n")
    d = gate_schedule.layer(ROOT, broken, SHAPE, PROFILE)
    assert d["status"] == "run" and len(d["reasons"]) == 1
    assert d["reasons"][0].startswith("schedule layer: the new side's replay failed: RuntimeError: a broken turn")


def test_the_change_is_signed_by_direction_and_a_lost_figure_fails():
    assert gate_schedule.change("tok_s", 100.0, 99.0) == pytest.approx(0.01)
    assert gate_schedule.change("ttft_p99", 1.0, 1.01) == pytest.approx(0.01)
    assert gate_schedule.change("ttft_p99", 1.0, 0.5) == pytest.approx(-0.5)
    rows, reasons = gate_schedule.compare({"s": {"tok_s": 100.0, "ttft_p50": 1.0, "a_kept": 0.5}},
                                          {"s": {"tok_s": 99.5, "ttft_p50": 1.02, "a_kept": None}})
    assert reasons == ["schedule layer, s: ttft_p50 worse by 2.00 % (base 1, new 1.02; simulated)",
                       "schedule layer, s: a_kept no value on new (base 0.5, new –; simulated)"]


def test_the_gate_wires_the_layer_into_its_verdict_and_receipt(monkeypatch, figures, planted, tmp_path):
    by_side = {str(ROOT): figures[0], str(planted): figures[1]}
    monkeypatch.setattr(gate_schedule, "run_side", lambda root, shape, profile: by_side[str(root)])
    s = gate.GateSettings(base_ref=None, preset="tiny", out_dir=tmp_path)
    assert gate.schedule_layer(s, Source(str(ROOT), None), Source(str(ROOT), None), None, 256)["status"] == "not run"
    assert gate.schedule_layer(gate.GateSettings(schedule=False, out_dir=tmp_path), Source(str(ROOT), None),
                               Source(str(planted), None), None, 256) is None
    sc = gate.schedule_layer(s, Source(str(ROOT), "b" * 40, "HEAD~1"), Source(str(planted), None), None, 256)
    data = {"settings": {"engine": {"prefill_rows": 256}, "margin": 0.05, "long_margin": 0.25, "preset": "cpu",
                         "preset_values": {"levels": [1], "b_tokens": 1024, "judge_long": True}},
            "runs": [], "accepted_outputs": False, "missing_base": None, "schedule": sc}
    monkeypatch.setattr(gate.exactness, "gate", lambda runs, accepted: {"sweep": {}, "long_prompt": {}, "differ": []})
    d = gate.analyse(data)
    assert not d["passed"] and any(r.startswith("schedule layer, sweep@4: tok_s") for r in d["reasons"])
    md = "\n".join(report.gate.schedule_lines(sc))
    assert "Schedule layer (simulated, in virtual time on the profile" in md
    assert "| sweep@4 | tok_s |" in md and "% worse |" in md
    assert "Not run: no base" in "\n".join(report.gate.schedule_lines(gate_schedule.layer(None, ROOT, SHAPE, PROFILE)))


def test_the_wall_clock_layer_states_the_smallest_slowdown_it_could_catch():
    order = ["base", "new", "new", "base"]
    figs, _, _ = gate.judge(order, [{"tok_s@1": v} for v in (100, 90, 110, 100)], levels=[1], margin=0.2,
                            long_margin=0.5)
    c = figs["tok_s@1"].comparisons["new"]
    assert gate.detectable(figs)["tok_s@1"] == pytest.approx(20 + (c.interval_pct[1] - c.interval_pct[0]) / 2, abs=0.01)
    assert gate.detectable(figs)["tok_s@1"] > 25  # a ±10 % spread hides more than the margin alone


def test_a_missing_schedule_profile_is_a_flag_error(tmp_path):
    with pytest.raises(FlagError, match="--schedule-profile"):
        gate.GateSettings(schedule_profile=tmp_path / "nope.json")
    with pytest.raises(FlagError, match="no CPU profile"):
        gate_schedule.default_profile("cpu", folder=tmp_path)


def test_the_gate_fails_a_commit_that_plants_the_regression_and_passes_one_that_changes_nothing(tmp_path,
                                                                                               monkeypatch):
    """The gate end to end on a repository of three commits (the engine; the engine with the shorts
    filled one a turn; the same again): HEAD~1 checked out in a worktree, each side's engine
    replayed from its own tree. The wall-clock runs are left out (test_gate plays them): the
    schedule layer launches no server."""
    r = tmp_path / "repo"
    git = git_repo(r)
    engine_copy(r)
    (r / ".gitignore").write_text("/.worktrees/\n/runs/\n__pycache__/\n")
    git("add", "-A")
    git("commit", "-qm", "engine")
    host = r / "engine" / "scheduler" / "host.py"
    host.write_text(host.read_text().replace(FILL, FILL + "[:1]", 1))
    git("commit", "-qam", "shorts one a turn")
    monkeypatch.setattr(gate.driver, "run_all", lambda *a, **k: None)
    settings = gate.GateSettings(repo=r, preset="tiny", margin=0.75, long_margin=0.9, out_dir=tmp_path / "o",
                                 order=["base", "new"])
    d, _ = gate.run_gate(settings)
    assert d["schedule"]["status"] == "run" and not d["passed"]
    assert any(x.startswith("schedule layer, sweep@4: tok_s worse by") for x in d["reasons"]), d["reasons"]
    (r / "notes.txt").write_text("nothing the engine reads\n")
    git("add", "-A")
    git("commit", "-qm", "a note")
    d, _ = gate.run_gate(settings)
    assert d["schedule"]["status"] == "run" and d["schedule"]["reasons"] == [], d["schedule"]["reasons"]
    assert {row["worse_by"] for row in d["schedule"]["rows"]} == {0.0}
    assert not any(x.startswith("schedule layer") for x in d["reasons"])


def git_repo(r: Path):
    subprocess.run(["git", "init", "-q", str(r)], check=True)
    return lambda *a: subprocess.run(["git", "-C", str(r), "-c", "user.email=t@e", "-c", "user.name=t", *a],
                                     check=True, capture_output=True)
