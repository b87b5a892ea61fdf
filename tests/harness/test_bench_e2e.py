"""End to end through the CLI on the real engine's `tiny` preset with short timings; and --url
against the harness's fake server."""
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensorfold_bench import report
from tensorfold_bench.cli.commands import app
from tensorfold_bench.errors import FlagError
from tensorfold_bench.servers.launcher import group_alive, launch

import fakeserver
from tiny_run import LONG_PROMPT



def receipt_json(out: Path) -> dict:
    files = list(out.glob("*-long-prompt.json.gz"))
    assert len(files) == 1, files
    return report.read(files[0])


def test_long_prompt_tiny_engine(tmp_path):
    res = CliRunner().invoke(app, ["run", "long-prompt", *LONG_PROMPT, "--share", "0.5", "--plain-check", "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    data = receipt_json(tmp_path)
    assert data["schema"] == "tfbench.receipt/4"
    assert [r["variant"] for r in data["runs"]] == ["whole", "stepped p=0.5", "stepped p=0.5", "whole"]
    assert data["settings"]["script"]["b_tokens"] == 600
    env = data["environment"]["engine"]
    assert env["engine"]["model"] == "tiny" and "torch" in env["engine"] and "commit" in env
    for r in data["runs"]:
        assert r["figures"]["b_first_token"] > 0 and r["figures"]["c_first_token"] > 0
        assert len(r["records"]["A"]["token_ids"]) > 10
        assert r["records"]["B"]["usage"]["prompt_tokens"] == 600
        assert r["trace"], "the engine ran with --trace"
        assert Path(r["log"]).exists()
        assert not group_alive(r["server"]["pgid"]), "a server outlived its run"
    assert not group_alive(data["plain"]["server"]["pgid"])
    # the same prompts on every fresh server: the same replies, whatever the schedule
    hashes = data["exactness"]["hashes"]
    for k in "ABC":
        assert len({h[k] for h in hashes.values()}) == 1, (k, hashes)
    for cmp in list(data["exactness"]["vs_plain"].values()) + list(data["exactness"]["across_runs"].values()):
        assert all(c["equal"] for c in cmp), cmp
    assert data["exactness"]["server_sha"]["mismatch"] == 0 and data["exactness"]["server_sha"]["match"] >= 8
    assert set(data["alone"]) == {"whole", "stepped p=0.5"}
    assert all(a["idle"]["confirmed"] and a["b_first_token"] > 0 for a in data["alone"].values())
    for a in data["alone"].values():  # and A alone, its own prompt: the same tokens as beside B
        ids, beside = a["a_record"]["token_ids"], data["runs"][0]["records"]["A"]["token_ids"]
        n = min(len(ids), len(beside))  # (A beside B was cancelled: either can be the longer)
        assert n > 10 and ids[:n] == beside[:n]
    md = next(tmp_path.glob("*-long-prompt.md")).read_text()
    assert "% of its pace alone)" in md
    assert "| whole |" in md and "6 of 6 equal" in md and "Not run, and why" in md
    # a CPU run names the CPU (its vector instructions set its speed and its bits), never a CUDA build
    device = next(ln for ln in md.splitlines() if ln.startswith("- Device:"))
    cpu = env["engine"]["cpu"]
    assert device.startswith("- Device: CPU, ") and cpu["isa"] in device and "CUDA" not in device
    assert f"decode products: {env['engine']['cpu_matmuls']}, weights" in device  # the kernel the ISA chose
    assert cpu["cores"] >= 1 and cpu["threads"] >= 1
    assert next(tmp_path.glob("*-long-prompt.png")).stat().st_size > 10_000
    # the Markdown renders from the JSON alone
    js = next(tmp_path.glob("*-long-prompt.json.gz"))
    before = md
    res = CliRunner().invoke(app, ["report", str(js), "--no-png"])
    assert res.exit_code == 0, res.output
    assert report.sibling(js, ".md").read_text() == before


def test_url_targets_running_server(tmp_path):
    cmd = fakeserver.CMD
    with launch(["--trace"], tmp_path / "fake.log", command=cmd) as srv:
        res = CliRunner().invoke(app, ["run", "long-prompt", *LONG_PROMPT, "--url", srv.url, "--order", "base,base",
                                       "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, (res.output, res.exception)
    data = receipt_json(tmp_path / "r")
    assert all("pgid" not in r["server"] for r in data["runs"])  # nothing launched
    assert [v["name"] for v in data["variants"]] == ["tfengine"] and "stats" not in data  # its own name, no verdicts
    b_prompts = {r["hashes"]["B"]["sha256"] for r in data["runs"]}
    assert len(b_prompts) == 2  # each run its own cold prompt on a shared server
    assert all(r["figures"]["valid"] for r in data["runs"]), [r["figures"]["invalid_reasons"] for r in data["runs"]]
    assert any("--url" in line for line in data["not_run"])


@pytest.mark.parametrize("args, flag", [(["--share", "2"], "--share"), (["--order", "whole,bogus"], "--order"),
                                        (["--b-tokens", "0"], "--b-tokens"), (["--c-after", "-1"], "--c-after"),
                                        (["--device", "tpu"], "--device"), (["--margin", "1.5"], "--margin")])
def test_a_bad_flag_value_is_an_error_naming_the_flag(args, flag):
    res = CliRunner().invoke(app, ["run", "long-prompt", *args])
    assert isinstance(res.exception, FlagError) and res.exception.flag == flag, (res.output, res.exception)


@pytest.mark.parametrize("args, flag", [(["--b-at", "x"], "--b-at"), (["--b-tokens", "0"], "--b-tokens")])
def test_bad_flag_is_one_red_line_exit_2(args, flag):
    """Through the real entry point: a usage error (click's) and a bad value (the library's)."""
    p = subprocess.run([sys.executable, "-m", "tensorfold_bench", "run", "long-prompt", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert flag in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_variant_whose_server_dies_is_a_failed_run_not_a_lost_receipt(tmp_path, monkeypatch):
    srv = tmp_path / "srv.py"
    srv.write_text(fakeserver.IMPORT + "import sys\n"
                   "if '--prefill-share' in sys.argv and '--check' not in sys.argv:\n"
                   "    sys.exit('refusing --prefill-share (a broken new side: its flags check, it will not serve)')\n"
                   "fakeserver.main(sys.argv[1:])\n")
    monkeypatch.setenv("TFBENCH_SERVER_CMD", f"{sys.executable} {srv}")
    res = CliRunner().invoke(app, ["run", "long-prompt", *LONG_PROMPT, "--plain-check", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, (res.output, res.exception)
    data = receipt_json(tmp_path / "r")
    ok = [r for r in data["runs"] if r["variant"] == "whole"]
    bad = [r for r in data["runs"] if r["variant"] != "whole"]
    assert all(r["figures"]["valid"] for r in ok) and len(ok) == 2
    assert all(r["records"] is None and "refusing --prefill-share" in r["error"] for r in bad) and len(bad) == 2
    md = next((tmp_path / "r").glob("*.md")).read_text()
    assert "the server failed" in md and data["plain"] is not None
