"""A command's life through the real entry point: the receipt after every run, a signal mid-command
(partial receipt, exit 130 / 143, no engine left), every run failed (exit 1), flag faults caught
before any server starts (exit 2, one line), and "B alone" never measured on a dead server."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensorfold_bench import report
from tensorfold_bench.cli import lifecycle, progress
from tensorfold_bench.cli.commands import app
from tensorfold_bench.errors import BenchError

import fakeserver
from tiny_run import LONG_PROMPT

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["sweep", "--model", "tiny", "--levels", "1,2", "--tokens", "8", "--cells", "1", "--reps", "2",
         "--prompt-tokens", "16"]


def tfbench(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tensorfold_bench", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


def wait_for(pattern: str, out: Path, proc: subprocess.Popen, timeout: float = 240) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(out.glob(pattern))
        if found:
            return found[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no {pattern} after {timeout} s")


def engines_of(run_dir: Path) -> list[int]:
    """Live processes whose command line names the run folder (each engine's --port-file does)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(run_dir).encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.parametrize("cmd, sig", [(SWEEP, signal.SIGTERM),
                                      (["run", "long-prompt", *LONG_PROMPT, "--share", "0.5"], signal.SIGINT)])
def test_a_receipt_after_the_first_run_and_a_signal_keeps_it(tmp_path, cmd, sig):
    """On the real engine's tiny preset: the receipt exists (partial) once the first run is done;
    a signal in the second run rewrites it as interrupted, says so, exits 128 + n, stops the engine."""
    p = tfbench([*cmd, "--out", str(tmp_path)])
    js = wait_for("*.json.gz", tmp_path, p)
    first = report.read(js)
    assert first["partial"]["done"] == 1 and len(first["runs"]) == 1 and first["partial"]["total"] == 4
    assert first["partial"]["missing"][0].startswith("run 2 (")
    assert "**Partial receipt (in progress).** 1 of 4 runs finished" in report.sibling(js, ".md").read_text()
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err
    name = signal.Signals(sig).name
    assert f"interrupted by {name}: partial receipt (" in err and "Traceback" not in err, err
    data = report.read(js)
    assert data["partial"]["why"] == f"interrupted by {name}" and data["runs"][0]["index"] == 1
    run_dir = Path(data["settings"]["run_dir"])
    deadline = time.monotonic() + 15
    while engines_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not engines_of(run_dir), "an engine outlived tfbench"
    rep = subprocess.run([sys.executable, "-m", "tensorfold_bench", "report", str(js), "--no-png"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert f"Partial receipt (interrupted by {name})" in rep.stdout
    assert "runs finished; missing: run 2" in rep.stderr


def test_every_run_failed_exits_1_after_writing_the_receipt(tmp_path):
    srv = tmp_path / "srv.py"  # its flags check, it never serves
    srv.write_text(fakeserver.IMPORT + "import sys\n"
                   "if '--check' not in sys.argv:\n    sys.exit('this engine cannot serve')\n"
                   "fakeserver.main(sys.argv[1:])\n")
    p = tfbench(["run", "long-prompt", *LONG_PROMPT, "--order", "base,new", "--out", str(tmp_path / "r")],
                {"TFBENCH_SERVER_CMD": f"{sys.executable} {srv}"})
    _, err = p.communicate(timeout=240)
    assert p.returncode == 1, err
    assert "every run failed or was invalid" in err and "this engine cannot serve" in err and "Traceback" not in err
    (js,) = (tmp_path / "r").glob("*.json.gz")
    data = report.read(js)
    assert data["partial"] is None and all(r["error"] for r in data["runs"])


def test_b_alone_waits_for_a_fresh_server_when_the_engine_died(tmp_path, monkeypatch):
    """The first server dies when C arrives: its run is invalid, and B alone for that variant is
    measured on its next run, not on the dead server."""
    srv = tmp_path / "srv.py"
    srv.write_text(fakeserver.IMPORT + f"""import os, sys
from pathlib import Path
marker = Path({str(tmp_path / 'died')!r})
class Dying(fakeserver.Fake):
    n = 0
    def check(self, body):
        Dying.n += 1
        if Dying.n == 3 and not marker.exists():
            marker.write_text('x')
            os._exit(3)
fakeserver.main(sys.argv[1:], kind=Dying)
""")
    monkeypatch.setenv("TFBENCH_SERVER_CMD", f"{sys.executable} {srv}")
    res = CliRunner().invoke(app, ["run", "long-prompt", *LONG_PROMPT, "--order", "base,new,base", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, (res.output, res.exception)
    (js,) = (tmp_path / "r").glob("*.json.gz")
    data = report.read(js)
    assert not data["runs"][0]["figures"]["valid"]
    assert data["alone"]["whole"]["run"] == 3 and data["alone"]["whole"]["b_first_token"] > 0
    assert data["alone"]["stepped p=0.5"]["run"] == 2
    assert any("B alone was not measured on it; it is measured on run 3" in n for n in data["not_run"])


def fault_files(tmp_path: Path) -> dict[str, Path]:
    files = {"list": "whole: [--prefill-mode, whole]\n", "quote": "- name: a\n  flags: \"--x 'open\"\n",
             "predict": "whole:\n  b_first_tokn: [0, 1]\n", "broken": "{not json", "noschema": "{}"}
    out = {}
    for k, text in files.items():
        out[k] = tmp_path / f"{k}.{'json' if k in ('broken', 'noschema') else 'yaml'}"
        out[k].write_text(text)
    out["cut"] = tmp_path / "cut.json.gz"  # a receipt's data cut short after its first bytes
    out["cut"].write_bytes(report.store.encode({"schema": "tfbench.receipt/1"})[:40])
    return out


LP = ["run", "long-prompt", "--model", "tiny"]
FAULTS = [  # (args, text the one line must hold)
    ([*LP, "--b-at", "inf"], "--b-at"), ([*LP, "--b-at", "nan"], "--b-at"), ([*LP, "--c-after", "inf"], "--c-after"),
    ([*LP, "--c-after", "nan"], "--c-after"), ([*LP, "--share", "0.005"], "--share"), ([*LP, "--share", ""], "--share"),
    ([*LP, "--order", ""], "--order"), ([*LP, "--variants", "{list}"], "expected a mapping"),
    ([*LP, "--variants", "{quote}"], "No closing quotation"), ([*LP, "--predict", "{predict}"], "b_first_tokn"),
    (["run", "long-prompt", "--model", "nosuch"], "--model 'nosuch'"), ([*LP, "--dtype", "float8"], "--dtype"),
    ([*LP, "--engine-arg=--bogus"], "--bogus"), (["sweep", "--model", "tiny", "--share", ""], "--share"),
    (["report", "{broken}"], "not JSON"), (["report", "{noschema}"], "not a tfbench receipt"),
    (["report", "{cut}"], "broken gzip data"),
    (["compare", "{broken}", "{noschema}"], "not a tfbench receipt"), (["report", "/nonexistent.json"], "does not exist"),
]


@pytest.mark.parametrize("args, text", FAULTS, ids=[" ".join(a[2:] or a) for a, _ in FAULTS])
def test_a_flag_fault_is_one_line_before_any_server(tmp_path, args, text):
    files = fault_files(tmp_path)
    args = [a.format(**files) for a in args]
    res = CliRunner().invoke(app, [*args, *(["--out", str(tmp_path / "r")] if args[0] != "report" and
                                            args[0] != "compare" else [])])
    assert isinstance(res.exception, BenchError), (res.output, res.exception)
    assert text in str(res.exception) and "\n" not in str(res.exception), str(res.exception)
    assert not list(tmp_path.glob("r/*/run*.log")), "a server was launched"


def test_a_flag_fault_exits_2_in_one_line_through_main(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tensorfold_bench", "run", "long-prompt", "--model", "tiny",
                        "--dtype", "float8", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "--dtype must be float32 or bfloat16" in p.stderr and "Traceback" not in p.stderr
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("error:")] == p.stderr.strip().splitlines()[-1:]


def test_dry_run_prints_the_plan_and_launches_nothing(tmp_path):
    res = CliRunner().invoke(app, ["sweep", "--levels", "1,2,4,8", "--dry-run", "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    assert "whole / stepped p=0.5 / stepped p=0.5 / whole" in res.output
    assert "python -m engine serve" in res.output and "--prefill-share 0.5" in res.output
    assert "Estimated time: about" in res.output and "2 cells x 2 reps, 64 tokens" in res.output
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_cpu_sweep_defaults_are_scaled_and_said():
    from tensorfold_bench.scenarios import sweep
    s = sweep.settings_from_flags(model=None, device="cpu", dtype=None, share=None, variants_file=None, base_ref=None,
                                  new_ref=None, aa=False, order=None, url=None, out_dir="r", parallel=None,
                                  prefill_rows=None, max_model_len=None, seed=0, engine_args=None, levels="1,2,4,8")
    assert (s.script.tokens, s.script.cells, s.script.reps) == (64, 2, 2)
    assert "--tokens 64 (256 on cuda)" in s.scaled["scaled_down"]
    g = sweep.settings_from_flags(model=None, device="cuda", dtype=None, share=None, variants_file=None,
                                  base_ref=None, new_ref=None, aa=False, order=None, url=None, out_dir="r",
                                  parallel=None, prefill_rows=None, max_model_len=None, seed=0, engine_args=None,
                                  levels="1,2", tokens=None, cells=3)
    assert (g.script.tokens, g.script.cells, g.script.reps) == (256, 3, 3) and g.scaled["scaled_down"] is None


def test_time_left_comes_from_the_runs_so_far():
    assert progress.time_left(0, 4, 0.0, 5.0) is None
    assert progress.time_left(2, 4, 100.0, 10.0) == 90.0  # 50 s a run, 2 left, 10 s into the next
    assert progress.time_left(4, 4, 200.0, 0.0) == 0.0
    assert lifecycle.exit_code(signal.SIGTERM) == 143 and lifecycle.exit_code(signal.SIGINT) == 130
