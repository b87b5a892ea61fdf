"""The sweep scenario: hashes across reps, levels and variants; levels and scripts; the CLI end to end."""
import hashlib
import json
import shlex
import sys
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from tensorfold_bench import report
from tensorfold_bench.analysis import exactness
from tensorfold_bench.cli.commands import app
from tensorfold_bench.client import selfcheck
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.scenarios import sweep

import fakeserver
from marks import host_lag


def batch(level, cell, rep, hashes):
    return {"level": level, "cell": cell, "rep": rep, "hashes": hashes}


def test_hashes_equal_across_levels_reps_and_runs_or_flagged():
    base = [batch(1, 0, 0, ["h00"]), batch(2, 0, 0, ["h00", "h01"]), batch(2, 0, 1, ["h00", "h01"])]
    new = [batch(1, 0, 0, ["h00"]), batch(2, 0, 0, ["h00", "XX"])]
    hc = exactness.sweep([("base", base), ("new", new)])
    assert (hc.prompts, hc.replies, hc.equal) == (2, 8, 7) and not hc.ok
    assert hc.flagged == ["c0s1: level 2 cell 0 rep 0 of new (run 2): XX != h01"]
    assert exactness.sweep([("new", new[:1])]).summary() == "1 of 1 replies equal"


def test_a_reply_hash_is_ours_from_the_ids_else_the_servers():
    assert exactness.reply_sha([1, 2, 3, 4]) == hashlib.sha256(b"1,2,3,4").hexdigest()[:12]
    assert exactness.reply_sha([None, None], "abcdef0123456789") == "abcdef012345"
    assert exactness.reply_sha([], None) is None


@pytest.mark.parametrize("text", ["1,x", "0,2", "2,2"])
def test_bad_levels(text):
    with pytest.raises(FlagError, match="--levels"):
        sweep.parse_levels(text)


def test_script_validation():
    assert sweep.parse_levels("1, 2,4,8") == (1, 2, 4, 8)
    with pytest.raises(FlagError, match="--tokens"):
        sweep.SweepScript(tokens=0)


def test_prompts_are_seeded_and_shared_across_levels():
    s = sweep.SweepScript(prompt_tokens=50)
    one, four = sweep.cell_prompts(s, 1, 1, 512), sweep.cell_prompts(s, 1, 4, 512)
    assert one[0] == four[0] and len(set(map(tuple, four))) == 4 and len(four[0]) == 50
    assert sweep.cell_prompts(s, 0, 1, 512) != one


# ---- the CLI: tfbench sweep, report, compare ------------------------------------------------

def test_sweep_cli_variants_file_aa_predictions_report_and_compare(tmp_path, monkeypatch):
    """`tfbench sweep` with a variants file, --aa and --predict: the receipt carries every run,
    the statistics columns, the A/A row, the stamped predictions, every token's time; `report`
    re-renders the same Markdown from the JSON and `compare` reads two receipts. Six fresh
    servers, so the harness's fake server stands in (seconds, not a torch start each); the
    sweep on the real engine runs in the gate's end-to-end test."""
    monkeypatch.setenv("TFBENCH_SERVER_CMD", shlex.join(fakeserver.CMD))
    # what is checked is the command's plumbing: the client's lag is held to its absolute bound, not
    # to a tenth of the fake server's 10 ms rounds, which a loaded 2-core host's wake-ups pass
    monkeypatch.setattr(selfcheck, "BOUNDS", replace(selfcheck.BOUNDS, share=1.0))
    (tmp_path / "v.yaml").write_text("- {name: whole, flags: --prefill-mode whole}\n"
                                     "- {name: stepped, flags: [--prefill-mode, stepped, --prefill-share, '0.5']}\n")
    (tmp_path / "p.yaml").write_text("stepped:\n  tok_s@1 vs whole: [0.01, 100]\n  tok_s@2: [1.0e+9, null]\n"
                                     "  ttft_p50@2 vs whole: [0.01, 100]\n  itl_p50@1: [0, 1.0e+9]\n")
    args = ["sweep", "--model", "tiny", "--levels", "1,2", "--tokens", "4", "--cells", "1", "--reps", "1",
            "--prompt-tokens", "12", "--variants", str(tmp_path / "v.yaml"), "--order", "whole,stepped,whole",
            "--aa", "--predict", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "r")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, (res.output, res.exception)
    (js,) = (tmp_path / "r").glob("*-sweep.json.gz")
    data = report.read(js)
    assert [r["variant"] for r in data["runs"]] == ["whole", "stepped", "whole", "whole A/A", "whole A/A", "whole"]
    assert data["predictions"]["read_at"] < data["runs"][0]["started"]
    # latency figures are checked too (they came back "not measured" before: only tok/s was looked up)
    assert [p["status"] for p in data["predictions"]["items"]] == ["in", "out", "in", "in"], \
        [(r["client"] or {}).get("invalid") for r in data["runs"]]
    assert data["hashes"]["ok"] and data["hashes"]["replies"] == 6 * 3
    assert set(data["stats"]["tok_s@2"]["comparisons"]) == {"stepped", "whole A/A"}
    assert data["variants"][1]["source"]["ref"] is None  # the working tree
    for r in data["runs"]:  # every batch counted, every token's time kept
        assert not r["errors"] and [b["tokens"] for b in r["batches"]] == [4, 8]
        assert all(len(g) == 4 for b in r["batches"] for g in b["gaps_us"])
        assert r["figures"]["ttft_p50@2"] > 0 and r["figures"]["itl_p99@2"] >= r["figures"]["itl_p50@2"] >= 0
    md = report.sibling(js, ".md").read_text()
    assert "| 2 | whole A/A |" in md and "3 of 4 predictions in range" in md
    assert "**Latency**" in md and "| 2 | stepped |" in md
    assert report.sibling(js, ".png").exists()
    rep = CliRunner().invoke(app, ["report", str(js)])
    assert rep.exit_code == 0 and report.sibling(js, ".md").read_text() == md
    cmp = CliRunner().invoke(app, ["compare", str(js), str(js)])
    assert cmp.exit_code == 0 and "| tok_s@1 | stepped |" in cmp.output and "within A's span" in cmp.output


@pytest.mark.parametrize("args,flag", [
    (["--levels", "1,x"], "--levels"),
    (["--tokens", "0"], "--tokens"),
    (["--variants", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["--predict", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["--order", "base,nobody"], "--order"),
])
def test_sweep_cli_bad_flags(args, flag):
    res = CliRunner().invoke(app, ["sweep", "--model", "tiny", *args])
    assert isinstance(res.exception, BenchError) and flag in str(res.exception), (res.output, res.exception)


def test_levels_above_the_lanes_queue_at_the_real_engine(tmp_path):
    """`--parallel 2 --levels 6` on tfengine's tiny preset: the six streams are open at once, the
    server holds two in lanes and queues four (its /metrics), and the receipt marks the level;
    before, --parallel was raised to the largest level and no level could queue."""
    # replies long enough that the lanes' first two streams outlast the other four's connects on a loaded
    # 2-core host (at 96 tokens one had ended before the sixth opened: a peak of 5, the run invalid)
    tokens = 256
    args = ["sweep", "--model", "tiny", "--parallel", "2", "--levels", "2,6", "--tokens", str(tokens), "--cells", "1",
            "--reps", "1", "--prompt-tokens", "12", "--order", "whole", "--out", str(tmp_path / "r")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, (res.output, res.exception)
    (js,) = (tmp_path / "r").glob("*-sweep.json.gz")
    data = report.read(js)
    assert data["settings"]["engine"]["parallel"] == 2
    (run,) = data["runs"]
    assert run["lanes"] == 2
    check = run["client"]
    assert check["peak_open"] == {"2": 2, "6": 6} and check["server_open"] == {"2": 2, "6": 6}
    # every stream open at once and the server's split are what this checks; the client's own lag is
    # the host's (marks.host_lag): not asserted
    assert check["server_split"] == {"6": [2, 4]} and not [w for w in check["invalid"] if not host_lag(w)]
    b6 = next(b for b in run["batches"] if b["level"] == 6)
    assert (b6["server_running"], b6["server_waiting"]) == (2, 4) and b6["tokens"] == 6 * tokens
    md = report.sibling(js, ".md").read_text()
    assert "| 6 (queued behind 2 lanes) | whole |" in md and "| 2 | whole |" in md
    assert "6/6 (server 6: 2 running, 4 waiting)" in md
    # four of the six waited for a lane: their first token came after a stream of the level ended
    first = [sent + gaps[0] / 1e6 for sent, gaps in zip(b6["sent"], b6["gaps_us"])]
    assert sum(t > min(b6["last_token"]) for t in first) == 4


def test_the_dry_run_decodes_a_queued_level_in_waves():
    """256 streams behind 64 lanes decode in four waves of 64: the estimate counts four times a
    64-stream level's rounds (it counted one 256-row wave before)."""
    from tensorfold_bench.cli import dry_run as plan

    def est(parallel):
        s = sweep.settings_from_flags(model="qwen3-8b", device="cuda", dtype=None, share=None, variants_file=None,
                                      base_ref=None, new_ref=None, aa=False, order="whole", url=None, out_dir="r",
                                      parallel=parallel, prefill_rows=None, max_model_len=None, seed=0,
                                      engine_args=None, levels="256", tokens=256, cells=1, reps=1)
        line = next(ln for ln in plan.sweep(s).splitlines() if ln.startswith("Estimated time"))
        m, sec = line.split("about ")[1].split(" ")[0].split(":")
        return int(m) * 60 + int(sec) - 60  # less the server's start

    c = plan.COSTS[("qwen3-8b", "cuda")]
    wave64 = 256 * (c.round_s + 63 * c.round_per_stream_s)
    assert est(64) - est(None) == pytest.approx(4 * wave64 - 256 * (c.round_s + 255 * c.round_per_stream_s), abs=1.5)
