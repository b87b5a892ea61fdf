"""The sweep scenario: batch figures, level figures, hashes across reps, levels and variants."""
import asyncio
import hashlib
from pathlib import Path

import pytest

from tensorfold_bench import sweep
from tensorfold_bench.client import StreamRecord
from tensorfold_bench.errors import FlagError


def rec(sent, times, ids, error=None):
    return StreamRecord("s", "/v1/completions", 10, len(times), sent=sent, token_times=list(times),
                        token_ids=list(ids), error=error)


def test_batch_figure_is_all_tokens_over_first_send_to_last_token():
    a = rec(10.0, [10.5, 11.0, 11.5, 12.0], [1, 2, 3, 4])
    b = rec(10.1, [10.6, 11.1, 11.6, 14.0], [5, 6, 7, 8])
    batch = sweep.reduce_batch(2, 0, 0, [a, b], tokens=4)
    assert batch.tokens == 8 and batch.wall_s == pytest.approx(4.0) and batch.tok_s == pytest.approx(2.0)
    assert batch.hashes[0] == hashlib.sha256(b"1,2,3,4").hexdigest()[:12]
    assert not batch.errors


def test_a_short_or_failed_stream_voids_the_batch():
    a = rec(0.0, [1.0, 2.0], [1, 2])
    b = rec(0.0, [1.0], [1], error="HTTP 500: boom")
    batch = sweep.reduce_batch(2, 0, 0, [a, b], tokens=2)
    assert batch.tok_s is None and "stream 1: HTTP 500: boom" in batch.errors
    short = sweep.reduce_batch(1, 0, 0, [rec(0.0, [1.0], [1])], tokens=2)
    assert short.tok_s is None and "1 of 2 tokens" in short.errors[0]


def batch(level, cell, rep, tok_s, hashes=None):
    return sweep.Batch(level, cell, rep, tok_s, 0, 1.0, hashes or [f"h{cell}{s}" for s in range(level)])


def test_cell_is_median_over_reps_and_level_median_over_cells():
    run = sweep.SweepRun("new", [batch(1, 0, 0, 10), batch(1, 0, 1, 12), batch(1, 0, 2, 30),
                                 batch(1, 1, 0, 20), batch(1, 1, 1, 20), batch(1, 1, 2, None)])
    assert run.cell_figure(1, 0) == 12 and run.cell_figure(1, 1) == 20
    assert run.figures() == {"tok_s@1": 16}
    back = sweep.SweepRun.from_dict(run.to_dict())
    assert back.figures() == run.figures()


def test_hashes_equal_across_levels_reps_and_runs_or_flagged():
    base = sweep.SweepRun("base", [batch(1, 0, 0, 1), batch(2, 0, 0, 1), batch(2, 0, 1, 1)])
    new = sweep.SweepRun("new", [batch(1, 0, 0, 1), batch(2, 0, 0, 1, ["h00", "XX"])])
    hc = sweep.check_hashes([base, new])
    assert (hc.prompts, hc.replies, hc.equal) == (2, 8, 7) and not hc.ok
    assert hc.flagged == ["c0s1: level 2 cell 0 rep 0 of new (run 2): XX != h01"]
    # accepted new outputs: the expected hashes win over the base's
    hc2 = sweep.check_hashes([new], expected={"c0s1": "XX"})
    assert hc2.ok and hc2.summary() == "3 of 3 replies equal"


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


def test_sweep_on_the_tiny_engine(tmp_path):
    """End to end on a real engine: every batch counted, every reply equal across levels and reps."""
    from tensorfold_bench import launcher

    script = sweep.SweepScript(levels=(1, 3), tokens=6, cells=2, reps=2, prompt_tokens=20)
    lines = []
    with launcher.launch(["--model", "tiny", "--parallel", "3"], tmp_path / "engine.log",
                         health_timeout=120) as server:
        run = asyncio.run(sweep.play_sweep(server.url, script, 512, "base", "tiny", progress=lines.append))
    assert len(run.batches) == 2 * 2 * 2 and not run.errors()
    assert all(b.tokens == b.level * 6 for b in run.batches)
    figs = run.figures()
    assert set(figs) == {"tok_s@1", "tok_s@3"} and all(v > 0 for v in figs.values())
    hc = sweep.check_hashes([run])
    assert hc.ok and hc.prompts == 6 and hc.replies == 2 * (1 + 3) * 2
    assert len(lines) == 8 and "3 streams, cell 2/2, rep 2/2" in lines[-1]


# ---- the CLI: tfbench sweep, report, compare ------------------------------------------------

def test_sweep_cli_variants_file_aa_predictions_report_and_compare(tmp_path):
    """`tfbench sweep` with a variants file, --aa and --predict on the tiny engine: the receipt
    carries every run, the statistics columns, the A/A row, the stamped predictions; `report`
    re-renders the same Markdown from the JSON and `compare` reads two receipts."""
    import json

    from typer.testing import CliRunner

    from tensorfold_bench.cli import app

    (tmp_path / "v.yaml").write_text("- {name: whole, flags: --prefill-mode whole}\n"
                                     "- {name: stepped, flags: [--prefill-mode, stepped, --prefill-share, '0.5']}\n")
    (tmp_path / "p.yaml").write_text("stepped:\n  tok_s@1 vs whole: [0.01, 100]\n  nothing: [1, 2]\n")
    args = ["sweep", "--model", "tiny", "--levels", "1,2", "--tokens", "4", "--cells", "1", "--reps", "1",
            "--prompt-tokens", "12", "--variants", str(tmp_path / "v.yaml"), "--order", "whole,stepped,whole",
            "--aa", "--predict", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "r")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, (res.output, res.exception)
    (js,) = (tmp_path / "r").glob("*-sweep.json")
    data = json.loads(js.read_text())
    assert [r["variant"] for r in data["runs"]] == ["whole", "stepped", "whole", "whole A/A", "whole A/A", "whole"]
    assert data["predictions"]["read_at"] < data["runs"][0]["started"]
    assert [p["status"] for p in data["predictions"]["items"]] == ["in", "not measured"]
    assert data["hashes"]["ok"] and data["hashes"]["replies"] == 6 * 3
    assert set(data["stats"]["tok_s@2"]["comparisons"]) == {"stepped", "whole A/A"}
    assert data["variants"][1]["source"]["ref"] is None  # the working tree
    md = js.with_suffix(".md").read_text()
    assert "| 2 | whole A/A |" in md and "1 of 1 predictions in range (1 not measured)" in md
    assert js.with_suffix(".png").exists()
    rep = CliRunner().invoke(app, ["report", str(js)])
    assert rep.exit_code == 0 and js.with_suffix(".md").read_text() == md
    cmp = CliRunner().invoke(app, ["compare", str(js), str(js)])
    assert cmp.exit_code == 0 and "| tok_s@1 | stepped |" in cmp.output and "within A's span" in cmp.output


@pytest.mark.parametrize("args,flag", [
    (["--levels", "1,x"], "--levels"),
    (["--tokens", "0"], "--tokens"),
    (["--variants", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["--predict", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["--order", "base,nobody"], "--order"),
])
def test_sweep_cli_bad_flags_exit_2(args, flag):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "tensorfold_bench", "sweep", "--model", "tiny", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and flag in p.stderr, p.stderr
