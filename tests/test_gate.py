"""The CI gate: a slowed decode round fails it, an unchanged tree passes, hashes must agree."""
import copy
import subprocess
from pathlib import Path

import pytest

from tensorfold_bench import gate, receipt, stats


# ---- judging saved data (no servers) ------------------------------------------------------

def fake_run(i, variant, tok_s, hashes=("aaa", "bbb"), b=1.0, ids=(1, 2, 3), c=0.1):
    batches = [{"level": l, "cell": 0, "rep": 0, "tok_s": tok_s * l, "tokens": l, "wall_s": 1.0,
                "hashes": list(hashes[:l]), "errors": [], "sent": [], "last_token": []} for l in (1, 2)]
    return {"index": i, "variant": variant,
            "sweep": {"variant": variant, "figures": {"tok_s@1": tok_s, "tok_s@2": 2 * tok_s}, "batches": batches},
            "sweep_errors": [],
            "long_prompt": {"b_first_token": b, "c_first_token": c, "a_longest_pause": 0.2,
                            "a_rate_during": 10.0, "valid": True, "invalid_reasons": []},
            "ids": {"A": list(ids), "B": "b" * 12, "C": "c" * 12}}


def fake_data(runs, accepted=False, **settings):
    return {"settings": {"margin": 0.05, "long_margin": 0.25, "preset_values": {"levels": [1, 2]}, **settings},
            "runs": runs, "accepted_outputs": accepted, "missing_base": None}


def test_judge_passes_equal_runs():
    d = gate.judge(fake_data([fake_run(1, "base", 100), fake_run(2, "new", 101), fake_run(3, "new", 99),
                              fake_run(4, "base", 100)]))
    assert d["passed"] and not d["reasons"]
    assert d["stats"]["tok_s@1"]["comparisons"]["new"]["verdict"] == stats.WITHIN


def test_judge_fails_a_throughput_loss_and_a_slower_first_token():
    d = gate.judge(fake_data([fake_run(1, "base", 100), fake_run(2, "new", 80, b=1.6),
                              fake_run(3, "new", 81, b=1.7), fake_run(4, "base", 100)]))
    assert not d["passed"]
    assert any(r.startswith("tok_s@1: new is worse") for r in d["reasons"])
    assert any(r.startswith("b_first_token: new is worse") for r in d["reasons"])


def test_c_landing_late_in_a_cut_is_luck_but_waiting_for_the_whole_prompt_fails():
    # CI's A/A-like failure: C at 0.08 s vs 0.30 s, B 1.33 s over 4 cuts of 256 rows
    cut = {"engine_flags": ["--prefill-rows", "256"], "preset_values": {"levels": [1, 2], "b_tokens": 1024}}
    lucky = [fake_run(1, "base", 100, b=1.34, c=0.075), fake_run(2, "new", 100, b=1.37, c=0.40),
             fake_run(3, "new", 100, b=1.59, c=0.20), fake_run(4, "base", 100, b=1.31, c=0.083)]
    d = gate.judge(fake_data(copy.deepcopy(lucky), **cut))
    assert d["passed"], d["reasons"]
    assert gate.cut_period(d) == pytest.approx(1.325 / 4)
    assert d["stats"]["c_first_token"]["comparisons"]["new"]["slack"] == pytest.approx(1.325 / 4)
    assert not gate.judge(fake_data(copy.deepcopy(lucky)))["passed"]  # without the cut period it fails
    # C stuck behind all of B's prompt: far more than a cut
    stuck = [fake_run(1, "base", 100, b=1.34, c=0.075), fake_run(2, "new", 100, b=1.37, c=1.45),
             fake_run(3, "new", 100, b=1.36, c=1.40), fake_run(4, "base", 100, b=1.31, c=0.083)]
    d = gate.judge(fake_data(stuck, **cut))
    assert any(r.startswith("c_first_token: new is worse") and "cut period" in r for r in d["reasons"])


def test_judge_fails_a_changed_hash_unless_accepted():
    runs = [fake_run(1, "base", 100), fake_run(2, "new", 100, hashes=("aaa", "XXX")),
            fake_run(3, "new", 100, hashes=("aaa", "XXX")), fake_run(4, "base", 100)]
    d = gate.judge(fake_data(copy.deepcopy(runs)))
    assert not d["passed"] and any("token hash differs" in r for r in d["reasons"])
    ok = gate.judge(fake_data(copy.deepcopy(runs), accepted=True))
    assert ok["passed"], ok["reasons"]
    # accepted, but new disagrees with itself: still a failure
    runs[2] = fake_run(3, "new", 100, hashes=("aaa", "YYY"))
    assert not gate.judge(fake_data(runs, accepted=True))["passed"]


def test_judge_fails_a_changed_long_prompt_reply():
    runs = [fake_run(1, "base", 100), fake_run(2, "new", 100), fake_run(3, "new", 100), fake_run(4, "base", 100)]
    runs[1]["ids"]["B"] = "d" * 12
    d = gate.judge(fake_data(runs))
    assert any(r.startswith("long-prompt B's reply differs") for r in d["reasons"])
    runs[1]["ids"]["B"] = "b" * 12
    runs[2]["ids"]["A"] = [1, 2, 9, 9]  # A is compared on the common prefix (3 tokens)
    assert any("long-prompt A's reply differs" in r for r in gate.judge(fake_data(runs))["reasons"])


def test_accept_file_names_the_base_commit(tmp_path):
    (tmp_path / ".ci").mkdir()
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert not gate.accepted_by_file(tmp_path, sha)
    (tmp_path / ".ci" / "accept-new-outputs").write_text(sha[:10] + "\n# new rope scaling\n")
    assert gate.accepted_by_file(tmp_path, sha)
    assert not gate.accepted_by_file(tmp_path, "f" * 40)  # lapsed: another base
    (tmp_path / ".ci" / "accept-new-outputs").write_text("0123\n")  # too short to mean a commit
    assert not gate.accepted_by_file(tmp_path, sha)


def test_missing_base_ref_compares_the_tree_with_itself(tmp_path):
    r = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(r)], check=True)
    (r / "f").write_text("x")
    for args in (["add", "f"], ["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "one"]):
        subprocess.run(["git", "-C", str(r), *args], check=True)
    base, new, note = gate.sources(gate.GateSettings(repo=r, out_dir=tmp_path / "o"))
    assert base == new and "HEAD~1" in note and "A/A" in note


def test_bad_settings():
    with pytest.raises(gate.FlagError, match="--preset"):
        gate.GateSettings(preset="huge")
    with pytest.raises(gate.FlagError, match="--order"):
        gate.GateSettings(order=["base", "base"])


# ---- real engines (tiny preset) ------------------------------------------------------------
# Wide margins: on a shared 2-core machine (a neighbour's benchmark running) tiny's HTTP-bound
# figures swing by tens of percent between fresh servers; a decode round slowed by 50 ms cuts
# tiny's tok/s by about 90 %, far beyond a 75 % margin (new below 1/1.75 of base).
MARGIN = 0.75

def run(tmp_path, **kw):
    s = gate.GateSettings(base_ref=None, preset="tiny", margin=MARGIN, long_margin=0.9, out_dir=tmp_path,
                          order=["base", "new", "base"], **kw)
    return gate.run_gate(s)


def test_an_unchanged_tree_passes(tmp_path):
    d = run(tmp_path)
    assert d["passed"], d["reasons"]
    assert d["hash_checks"]["all runs"]["equal"] == d["hash_checks"]["all runs"]["replies"] > 0
    paths = receipt.write(d, tmp_path, "g")
    assert "## tfbench gate: PASS" in paths["md"].read_text()


def test_a_slowed_decode_round_fails(tmp_path):
    d = run(tmp_path, new_env={"TFENGINE_DECODE_SLEEP_MS": "50"})
    assert not d["passed"]
    assert any(r.startswith("tok_s@1: new is worse") for r in d["reasons"]), d["reasons"]
    assert not any("hash" in r for r in d["reasons"])  # slower, not different
    md = gate.render_markdown(d)
    assert "## tfbench gate: FAIL" in md and "Why it failed" in md


def test_a_base_that_will_not_serve_falls_back_to_a_a(tmp_path):
    """HEAD~1's engine dies at start (an old or broken commit): the gate says so and compares
    the working tree with itself instead of failing CI on the base's account."""
    import shutil

    r = tmp_path / "repo"
    (r / "engine").mkdir(parents=True)
    git = lambda *a: subprocess.run(["git", "-C", str(r), "-c", "user.email=t@e", "-c", "user.name=t", *a],
                                    check=True, capture_output=True)
    subprocess.run(["git", "init", "-q", str(r)], check=True)
    (r / ".gitignore").write_text("/.worktrees/\n__pycache__/\n/runs/\n")
    (r / "engine" / "__main__.py").write_text("raise SystemExit('this engine is broken')\n")
    git("add", "-A")
    git("commit", "-qm", "broken")
    shutil.rmtree(r / "engine")
    shutil.copytree(Path(gate.__file__).resolve().parent.parent / "engine", r / "engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    git("add", "-A")
    git("commit", "-qm", "working")
    s = gate.GateSettings(repo=r, preset="tiny", margin=MARGIN, long_margin=0.9, out_dir=tmp_path / "o",
                          order=["base", "new", "base"])
    d = gate.run_gate(s)
    assert d["passed"], d["reasons"]
    assert "would not serve" in d["missing_base"] and "this engine is broken" in d["missing_base"]
    assert d["variants"][0]["source"]["path"] == str(r)


def test_gate_cli_usage_errors_exit_2():
    import sys

    for args, flag in ((["--preset", "huge"], "--preset"), (["--new-env", "NOEQUALS"], "--new-env"),
                       (["--margin", "2"], "--margin"), (["--order", "base,newer"], "--order")):
        p = subprocess.run([sys.executable, "-m", "tensorfold_bench", "gate", *args], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2 and flag in p.stderr, p.stderr


def test_a_given_base_that_is_no_commit_is_an_error(tmp_path):
    with pytest.raises(gate.worktree.GitError, match="--base 'nope' is not a commit"):
        gate.sources(gate.GateSettings(base_ref="nope", out_dir=tmp_path))
