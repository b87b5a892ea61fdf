"""`--sim PROFILE` end to end through the CLI: every scenario in virtual time on a small profile,
no server, a receipt marked simulated that re-renders; flags and kinds a simulation cannot play
refused in one line."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensorfold_bench.cli.commands import app
from tensorfold_bench.errors import FlagError
from tensorfold_bench.report import store

PA, PB, PC = 0.002, 2e-5, 1e-9
DA, DB = {1: 0.006, 2: 0.0065, 4: 0.007, 8: 0.008}, 2e-8


def cut_s(rows, start):
    return PA + PB * rows + PC * rows * (start + rows / 2)


def round_s(n, keys):
    return DA[n] + DB * keys


@pytest.fixture
def prof(tmp_path) -> Path:
    """A cpu profile with prompt cuts, rounds, mixed forwards and the host, and no split samples."""
    samples = {
        "prefill": [[r, st, cut_s(r, st)] for r in (16, 34, 64, 256) for st in (0, 512, 1024, 2048)],
        "decode": [[n, k, round_s(n, k)] for n in DA for k in (n * 20, n * 500, n * 3000)],
        "mixed": [[r, st, 1, 500, round_s(1, 500) + 0.001 + 1.8e-5 * r] for r in (64, 128, 256) for st in (0, 1024)],
        "host": [["turn", 5e-5], ["token", 1e-5]]}
    p = tmp_path / "small.json"
    p.write_text(json.dumps({"schema": "tfbench.profile/1", "created": "2026-12-07", "source": "test",
                             "device": {"type": "cpu", "name": "test cpu"},
                             "model": {"name": "cpu", "dtype": "float32", "vocab": 512},
                             "engine": {"commit": "abc1234", "parallel": 4, "prefill_rows": 256,
                                        "max_model_len": 4352}, "samples": samples}))
    return p


def tfbench(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def receipt(out: Path, kind: str) -> dict:
    (path,) = out.glob(f"*-{kind}.json.gz")
    return store.read(path)


def test_long_prompt_in_virtual_time_writes_a_simulated_receipt_that_rerenders(prof, tmp_path):
    out = tmp_path / "r"
    r = tfbench("run", "long-prompt", "--sim", prof, "--share", "1,0.5", "--mixed", "20", "--b-tokens", "1024",
                "--b-at", "0.5", "--out", out)
    assert r.exit_code == 0, r.output
    d = receipt(out, "long-prompt")
    assert d["simulated"]["profile"] == str(prof) and d["simulated"]["engine_commit"] == "abc1234"
    assert d["exactness"] == {"not_judged": "simulated: token identities come from the simulated backend"}
    assert any(n.startswith("Simulated:") for n in d["not_run"])
    by = {}
    for run in d["runs"]:
        assert run["figures"]["valid"], run["figures"]["invalid_reasons"]
        by.setdefault(run["variant"], []).append(run["figures"]["b_first_token"])
    assert set(by) == {"whole", "stepped p=1", "stepped p=0.5", "mixed budget=20"}
    assert all(len(set(v)) == 1 for v in by.values())  # virtual time: every run of a variant is the same
    assert by["stepped p=0.5"][0] > by["stepped p=1"][0] > by["whole"][0]  # a smaller share fills B later
    assert "alone" in d and d["alone"]["whole"]["b_first_token"] > 0
    (md,) = out.glob("*-long-prompt.md")
    assert "**Simulated, not measured**" in md.read_text()
    assert tfbench("report", next(out.glob("*-long-prompt.json.gz"))).exit_code == 0
    from tensorfold_bench.calibrate.sim_error import runs_of
    assert runs_of(next(out.glob("*-long-prompt.json.gz"))) == []  # never checked against as if real


def test_a_script_plays_its_events_and_cancels_in_virtual_time(prof, tmp_path):
    script = tmp_path / "s.yaml"
    script.write_text("name: two\nstreams:\n"
                      "  - {name: A, at: 0, prompt: {random: 16}, max_tokens: 400, until: [B.done]}\n"
                      "  - {name: B, at: A.first_token + 0.05, prompt: {random: 600}, max_tokens: 8}\n"
                      "figures: [{first_token: B}]\n")
    out = tmp_path / "r"
    r = tfbench("run", "script", script, "--sim", prof, "--share", "0.5", "--out", out)
    assert r.exit_code == 0, r.output
    d = receipt(out, "script")
    assert d["simulated"]
    for run in d["runs"]:
        recs = run["records"]
        a_first = recs["A"]["token_times"][0]
        assert recs["B"]["sent"] == pytest.approx(a_first + 0.05)
        assert recs["A"]["cancelled"] and recs["A"]["ended"] >= recs["B"]["ended"]


@pytest.mark.parametrize("flags, named", [(["--url", "http://x"], "--url"), (["--plain-check"], "--plain-check"),
                                          (["--aa"], "--aa")])
def test_flags_a_simulation_cannot_honour_are_refused_by_name(prof, tmp_path, flags, named):
    r = tfbench("run", "long-prompt", "--sim", prof, *flags, "--out", tmp_path)
    assert isinstance(r.exception, FlagError) and r.exception.flag == named and "--sim" in str(r.exception)


def test_a_profile_without_split_samples_refuses_split_naming_profile_and_kind(prof, tmp_path):
    r = tfbench("run", "long-prompt", "--sim", prof, "--split", "32", "--b-tokens", "512", "--out", tmp_path)
    assert isinstance(r.exception, FlagError) and r.exception.flag == "--sim"
    assert str(prof) in str(r.exception) and "no split samples" in str(r.exception)
    assert not list(tmp_path.glob("*.json.gz"))


def test_a_sweep_in_virtual_time_gives_tok_s_per_level_that_grows_with_streams(prof, tmp_path):
    out = tmp_path / "r"
    r = tfbench("sweep", "--sim", prof, "--levels", "1,4", "--tokens", "32", "--cells", "1", "--reps", "1",
                "--prompt-tokens", "64", "--share", "0.5", "--out", out)
    assert r.exit_code == 0, r.output
    assert "not judged (simulated" in r.output
    d = receipt(out, "sweep")
    assert d["simulated"]["device_type"] == "cpu"
    f = d["runs"][0]["figures"]
    one, four = f["tok_s@1"], f["tok_s@4"]
    # a round of 4 streams costs DA[4] against DA[1] for 1: four tokens for about the price of one
    assert four / one == pytest.approx(4 * round_s(1, 80) / round_s(4, 4 * 80), rel=0.15)


def test_a_load_in_virtual_time_keeps_arrivals_sessions_and_the_injected_prompt(prof, tmp_path):
    out = tmp_path / "r"
    r = tfbench("load", "--sim", prof, "--rate", "4", "--requests", "12", "--input-len", "64", "--output-len", "16",
                "--turns", "2", "--think", "0.1", "--inject", "1024@1", "--out", out)
    assert r.exit_code == 0, r.output
    d = receipt(out, "load")
    recs = d["runs"][0]["levels"][0]["records"]
    assert all(not x["error"] and x["tokens"] == x["max_tokens"] for x in recs)
    by = {x["id"]: x for x in recs}
    later = [x for x in recs if x["turn"] == 1]
    assert later
    for x in later:  # a later turn goes `think` after its session's last reply ended, with the history
        prev = next(p for p in recs if p["session"] == x["session"] and p["turn"] == 0)
        assert x["sent"] == pytest.approx(prev["ended"] + 0.1, abs=1e-6)
        assert x["prompt_len"] > prev["prompt_len"] + prev["max_tokens"]
    assert any(x["kind"] == "inject" for x in by.values())
    assert d["runs"][0]["alone"]["ttft_ms"] > 0
    r = tfbench("load", "--sim", prof, "--rate", "4", "--requests", "4", "--max-concurrency", "2", "--out", out)
    assert isinstance(r.exception, FlagError) and r.exception.flag == "--max-concurrency"


def test_predictions_computed_from_the_simulation_are_written_first_and_hold_its_figures(prof, tmp_path):
    out = tmp_path / "r"
    r = tfbench("run", "long-prompt", "--sim", prof, "--predict", f"sim:{prof}", "--share", "0.5",
                "--b-tokens", "1024", "--b-at", "0.5", "--out", out)
    assert r.exit_code == 0, r.output
    (pred,) = out.glob("*-long-prompt-predictions.yaml")
    d = receipt(out, "long-prompt")
    assert pred.name.startswith(d["settings"]["run_dir"].rsplit("/", 1)[-1])  # the receipt's own stamp
    text = pred.read_text()
    assert text.startswith("# Computed, not guessed") and str(prof) in text
    p = d["predictions"]
    assert p["path"].endswith(pred.name) and p["read_at"] < d["runs"][0]["started"]
    items = p["items"]
    keys = {(i["variant"], i["key"]) for i in items}
    assert {("whole", "b_first_token_s"), ("stepped p=0.5", "a_rate_during_b_pct")} <= keys
    for i in items:  # ranges from the profile's spread hold the simulation they came from
        assert i["status"] == "in", i
        assert i["lo"] < i["value"] < i["hi"]


def test_predict_sim_with_a_profile_that_cannot_be_read_names_the_flag(tmp_path):
    r = tfbench("run", "long-prompt", "--predict", f"sim:{tmp_path / 'none.json'}", "--out", tmp_path)
    assert isinstance(r.exception, FlagError) and r.exception.flag == "--predict"


def test_the_frontier_command_runs_each_policy_once_and_draws_them_side_by_side(prof, tmp_path):
    out = tmp_path / "r"
    r = tfbench("frontier", "--sim", prof, "--shares", "0.25,0.5,1", "--mixed-budgets", "10,40", "--b-tokens", "1024",
                "--b-at", "0.5", "--out", out)
    assert r.exit_code == 0, r.output
    assert "Frontier" in r.output and "mixed budget=40" in r.output
    d = receipt(out, "long-prompt")
    names = [run["variant"] for run in d["runs"]]
    assert names == ["whole", "stepped p=0.25", "stepped p=0.5", "stepped p=1", "mixed budget=10", "mixed budget=40"]
    from tensorfold_bench.analysis.figures import frontier
    rows = {x["variant"]: x for x in frontier(d)}
    assert set(rows) == set(names)
    # a smaller share keeps more of A and slows B more: the stepped line runs up and to the right
    assert rows["stepped p=0.25"]["slowdown"] > rows["stepped p=0.5"]["slowdown"] > rows["stepped p=1"]["slowdown"]
    assert rows["stepped p=0.25"]["kept"] > rows["stepped p=1"]["kept"]
    assert list(out.glob("*-long-prompt-frontier.png"))
    # the profile has no split samples, so none are asked for by default; asked for, they are refused
    r = tfbench("frontier", "--sim", prof, "--split", "32", "--out", out)
    assert isinstance(r.exception, FlagError) and "no split samples" in str(r.exception)


def test_a_dry_run_under_sim_says_nothing_is_launched(prof, tmp_path):
    r = tfbench("run", "long-prompt", "--sim", prof, "--share", "0.5", "--dry-run", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    assert f"Simulated on {prof}: no server is launched" in r.output
    assert not list(tmp_path.glob("*.json.gz"))


def test_a_variants_file_becomes_engine_configurations_and_an_unknown_flag_is_refused(prof, tmp_path):
    good = tmp_path / "v.yaml"
    good.write_text("- {name: base, flags: [--prefill-mode, whole]}\n"
                    "- {name: slow, flags: [--prefill-share, '0.25', --parallel, '2']}\n")
    out = tmp_path / "r"
    r = tfbench("run", "long-prompt", "--sim", prof, "--variants", good, "--b-tokens", "1024", "--b-at", "0.5",
                "--out", out)
    assert r.exit_code == 0, r.output
    d = receipt(out, "long-prompt")
    cfg = {run["variant"]: run["engine"]["config"] for run in d["runs"]}
    assert cfg["base"]["prefill_mode"] == "whole"
    assert cfg["slow"]["prefill_share"] == 0.25 and cfg["slow"]["parallel"] == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: base, flags: [--prefill-mode, whole]}\n- {name: odd, flags: [--warp-speed, '9']}\n")
    r = tfbench("run", "long-prompt", "--sim", prof, "--variants", bad, "--out", tmp_path / "x")
    assert isinstance(r.exception, FlagError) and "--warp-speed" in str(r.exception) and "'odd'" in str(r.exception)


def test_the_long_prompt_summary_is_computed_once_per_checkpoint(prof, tmp_path, monkeypatch):
    """The session computes each variant's summary once at each checkpoint (after each run, and at
    the end); the Markdown, the frontier picture and the command's printed frontier read that one."""
    from tensorfold_bench.analysis import figures
    calls = []

    def counted(figs):
        calls.append(len(figs))
        return real(figs)
    real = figures.medians
    monkeypatch.setattr(figures, "medians", counted)  # once per variant with runs, per summary
    out = tmp_path / "r"
    r = tfbench("frontier", "--sim", prof, "--shares", "0.5", "--mixed-budgets", "none", "--b-tokens", "1024",
                "--b-at", "0.5", "--out", out)
    assert r.exit_code == 0, r.output
    assert "Frontier" in r.output and list(out.glob("*-long-prompt-frontier.png"))
    # after run 1 (one variant has runs), after run 2 (two), at the end (two)
    assert len(calls) == 1 + 2 + 2
