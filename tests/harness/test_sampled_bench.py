"""`--temperature T --seed S`: every request samples with T and a seed derived from S and its
role, so sampled replies compare across schedules and with the plain reference exactly as greedy
ones do; on the real engine's `tiny` preset, through the CLI and the library."""
import asyncio
import subprocess
import sys
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from tensorfold_bench import report
from tensorfold_bench.cli.commands import app
from tensorfold_bench.client.play import play_alone
from tensorfold_bench.client.sampling import GREEDY, Sampling, request_seed
from tensorfold_bench.client.stream import Request
from tensorfold_bench.errors import FlagError
from tensorfold_bench.scenarios import gate
from tensorfold_bench.scenarios import long_prompt, sweep
from tensorfold_bench.servers.launcher import launch
from tiny_run import LONG_PROMPT

SAMPLED = ["--temperature", "1.0", "--seed", "7"]


# ---- the flags and the request body ----------------------------------------------------------

@pytest.mark.parametrize("t", [-0.5, float("inf"), float("nan"), True, "1"])
def test_a_temperature_must_be_a_finite_number_at_least_0(t):
    with pytest.raises(FlagError) as e:
        Sampling(t, 0)
    assert e.value.flag == "--temperature"


def test_a_seed_must_be_an_integer():
    with pytest.raises(FlagError) as e:
        Sampling(1.0, 1.5)
    assert e.value.flag == "--seed"


@pytest.mark.parametrize("cmd", [["run", "long-prompt"], ["sweep"], ["gate"]])
@pytest.mark.parametrize("t", ["-1", "nan", "inf"])
def test_every_command_checks_temperature_before_launching(cmd, t):
    res = CliRunner().invoke(app, [*cmd, "--temperature", t, "--out", "/nonexistent/never-written"])
    assert isinstance(res.exception, FlagError) and res.exception.flag == "--temperature", (res.output, res.exception)


@pytest.mark.parametrize("args, flag", [(["--temperature", "-1"], "--temperature"), (["--seed", "x"], "--seed"),
                                        (["--temperature", "warm"], "--temperature")])
def test_bad_sampling_flags_are_one_red_line_exit_2(args, flag):
    p = subprocess.run([sys.executable, "-m", "tensorfold_bench", "sweep", *args], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and flag in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_greedy_requests_are_unchanged_and_sampled_ones_carry_t_and_the_roles_seed():
    req = Request("B", [5, 6, 7], max_tokens=4)
    assert GREEDY.apply(req, "B") is req
    body = req.body("m")
    assert body["temperature"] == 0 and "seed" not in body
    s = Sampling(0.8, 1234)
    b = s.apply(req, "B").body("m")
    assert b["temperature"] == 0.8 and b["seed"] == request_seed(1234, "B")
    # the same role gets the same seed every time; another role or another S, another seed
    assert request_seed(1234, "B") == request_seed(1234, "B")
    assert len({request_seed(1234, r) for r in ("A", "B", "C", "sweep:c0s0", "sweep:c0s1")}) == 5
    assert request_seed(1234, "B") != request_seed(1235, "B")
    assert all(0 <= request_seed(x, "A") < 2 ** 63 for x in (-1, 0, 2 ** 80))


# ---- the real engine ---------------------------------------------------------------------------

def only(out, pattern):
    files = list(out.glob(pattern))
    assert len(files) == 1, files
    return files[0]


def test_sampled_long_prompt_replies_equal_across_schedules_and_the_plain_reference(tmp_path):
    res = CliRunner().invoke(app, ["run", "long-prompt", *LONG_PROMPT, "--share", "0.5", "--order", "base,new",
                                   "--plain-check", *SAMPLED, "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    js = only(tmp_path, "*-long-prompt.json.gz")
    data = report.read(js)
    assert data["settings"]["sampling"]["temperature"] == 1.0 and data["settings"]["sampling"]["seed"] == 7
    assert [r["variant"] for r in data["runs"]] == ["whole", "stepped p=0.5"]
    ex = data["exactness"]
    for cmp in list(ex["vs_plain"].values()) + list(ex["across_runs"].values()):
        assert [c["equal"] for c in cmp] == [True, True, True], cmp
    assert ex["server_sha"]["mismatch"] == 0 and ex["server_sha"]["match"] >= 4
    md = report.sibling(js, ".md").read_text()
    assert "- Sampling: temperature 1, seed 7;" in md and "stepped p=0.5 3 of 3 equal" in md


def test_sampled_sweep_replies_equal_at_1_and_4_streams_stepped_and_whole(tmp_path):
    res = CliRunner().invoke(app, ["sweep", "--model", "tiny", "--levels", "1,4", "--tokens", "12", "--cells", "1",
                                   "--reps", "2", "--prompt-tokens", "24", "--share", "0.5", "--order", "base,new",
                                   *SAMPLED, "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    js = only(tmp_path, "*-sweep.json.gz")
    data = report.read(js)
    assert data["hashes"]["ok"] and data["hashes"]["replies"] == 2 * (1 + 4) * 2 and data["hashes"]["prompts"] == 4
    assert "- Sampling: temperature 1, seed 7;" in report.sibling(js, ".md").read_text()


def test_the_seed_and_the_temperature_change_the_replies_and_nothing_else_does(tmp_path):
    """One server: a sampled reply replays under the same seed and changes under another seed,
    and differs from the greedy one (so the server really sampled)."""
    script = long_prompt.LongPromptScript(b_at=0, c_after=0, b_tokens=40, c_tokens=20)
    sw = sweep.SweepScript(levels=(2,), tokens=12, cells=1, reps=1, prompt_tokens=20)
    with launch(["--model", "tiny", "--seed", "0"], tmp_path / "srv.log") as srv:
        prompts = long_prompt.make_prompts(script, 512)

        def c_reply(sampling):
            rc = long_prompt.requests(replace(script, sampling=sampling), prompts)["C"]
            rec = asyncio.run(play_alone(srv.url, rc, "tiny"))
            assert rec.error is None and len(rec.token_ids) == script.c_max_tokens, rec.error
            return rec.token_ids

        def sweep_replies(sampling):
            recs = asyncio.run(sweep.play_batch(srv.url, sweep.cell_prompts(sw, 0, 2, 512), sw.tokens, "tiny",
                                                sampling=sampling))
            assert all(r.error is None for r in recs)
            return [r.token_ids for r in recs]

        for play in (c_reply, sweep_replies):
            s7, s8, t05 = Sampling(1.0, 7), Sampling(1.0, 8), Sampling(0.5, 7)
            first = play(s7)
            assert play(s7) == first
            assert play(s8) != first and play(t05) != first and play(GREEDY) != first


def test_the_gates_hash_checks_cover_sampled_replies(tmp_path):
    s = gate.GateSettings(base_ref=None, preset="tiny", margin=0.9, long_margin=0.9, out_dir=tmp_path,
                          order=["base", "new"], sampling=Sampling(1.0, 7))
    d, _ = gate.run_gate(s)
    assert d["settings"]["sampling"]["temperature"] == 1.0
    hc = d["exactness"]["sweep"]["all runs"]
    assert hc["equal"] == hc["replies"] == 2 * (1 + 4) * 2
    assert all(v["equal"] == v["of"] == 2 for v in d["exactness"]["long_prompt"].values())
    assert not any("differs" in r for r in d["reasons"]), d["reasons"]
