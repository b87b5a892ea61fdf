"""Every shipped script end to end through the CLI on the real engine's `tiny` preset.

cancel-and-retry runs as a whole session (fresh servers base/new/new/base, the plain reference,
a prediction); the other scripts share one tiny server through --url (one run each), so the
whole file stays short. Cuts of 8 or 16 rows make the tiny model's 4,096-token prompt take about
a second or two, long enough for the scripts' cancels and windows to land inside it; a context of
16,384 keeps A decoding past them (in 4,608, an AVX-512 machine's bf16 A used its room before the
long prompt's first token at p=0.5)."""
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensorfold_bench import report
from tensorfold_bench.cli.commands import app
from tensorfold_bench.servers.launcher import group_alive, launch

from marks import host_lag

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "examples" / "scripts"


def longer_a(name: str, tmp: Path, tokens: int = 12_000) -> Path:
    """A shipped script with its first stream A's 4,000 tokens raised (cut to the context anyway):
    the tiny model in bf16 on an AVX-512 CPU decodes 4,000 tokens before the scripts' long prompts
    are done, and a run whose A stopped decoding is invalid; the cpu preset these scripts are
    written for decodes ~240 tokens a second."""
    text = (SCRIPTS / name).read_text()
    assert "max_tokens: 4000" in text
    path = tmp / name
    path.write_text(text.replace("max_tokens: 4000", f"max_tokens: {tokens}", 1))
    return path


def receipt(out: Path) -> tuple[dict, Path, Path]:
    """The receipt's data, its JSON file (plain or compressed, whichever the writer writes) and its Markdown."""
    files = list(out.glob("*-script.json*"))
    assert len(files) == 1, files
    md = list(out.glob("*-script.md"))
    return report.read(files[0]), files[0], md[0]


def fake_server_cmd() -> list[str]:
    """The harness's stand-in server: a script beside the tests where it lives there, else the module."""
    try:
        import fakeserver
        return fakeserver.CMD
    except ImportError:
        return [sys.executable, "-m", "tensorfold_bench.fakeserver"]


def test_cancel_and_retry_keeps_the_cut_rows_and_equals_the_plain_reference(tmp_path):
    pred = tmp_path / "predict.yaml"
    pred.write_text("stepped p=0.5:\n  first_token:R: [0, 60]\n  cached_tokens:R: [256, 4096]\n")
    res = CliRunner().invoke(app, ["run", "script", str(longer_a("cancel-and-retry.yaml", tmp_path)), "--model", "tiny",
                                   "--prefill-rows", "8", "--max-model-len", "16384", "--share", "0.5", "--order", "base,new,base", "--plain-check", "--predict", str(pred),
                                   "--out", str(tmp_path)])
    assert res.exit_code == 0, (res.output, res.exception)
    data, js, md_path = receipt(tmp_path)
    assert data["scenario"] == "script" and data["settings"]["script"]["name"] == "cancel-and-retry"
    # base/new/base: the fewest runs that pair new with a base run on each side (two pairs: a verdict)
    assert [r["variant"] for r in data["runs"]] == ["whole", "stepped p=0.5", "whole"]
    valid = [r for r in data["runs"] if r["figures"]["valid"]]
    assert len(valid) == 3, [r["figures"]["invalid_reasons"] for r in data["runs"]]
    for r in valid:
        recs = r["records"]
        assert recs["X"]["cancelled"] and not recs["R"]["cancelled"] and recs["A"]["cancelled"]
        # the retry resumed from the cancelled pass's completed cuts (multiples of 8 rows)
        cached = r["figures"]["values"]["cached_tokens:R"]
        assert 256 <= cached < 4096 and cached % 8 == 0, cached
        assert recs["R"]["sent"] - recs["X"]["ended"] >= 0.2
        assert r["figures"]["lateness"]["R"] < 0.25
        assert not group_alive(r["server"]["pgid"])
    # the retry's reply equals the plain reference's, and A's (cancelled) its prefix, in every run
    ex = data["exactness"]
    for cmp in ex["vs_plain"].values():
        by = {c["stream"]: c["equal"] for c in cmp}
        assert by.get("A") is True
    assert all(c["equal"] for r in valid for c in ex["vs_plain"][str(r["index"])] if c["stream"] == "R")
    assert set(data["stats"]) == {"first_token:R", "cached_tokens:R", "longest_pause:A", "rate:A", "rate_before:A"}
    assert {p["key"] for p in data["predictions"]["items"]} == {"first_token:R", "cached_tokens:R"}
    md = md_path.read_text()
    assert md.startswith("# tfbench receipt: script cancel-and-retry")
    assert f"R {len(valid)} of {len(valid)} equal" in md  # across runs and against the plain reference
    assert "```yaml\n# A cancel during a long prompt" in md  # the script itself, as read
    # the Markdown renders from the JSON alone
    res = CliRunner().invoke(app, ["report", str(js), "--no-png"])
    assert res.exit_code == 0, res.output
    assert md_path.read_text() == md


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny server for the scripts played through --url."""
    log = tmp_path_factory.mktemp("tiny") / "tiny.log"
    with launch(["--model", "tiny", "--device", "cpu", "--parallel", "4", "--prefill-rows", "16",
                 "--max-model-len", "16384"], log) as srv:
        yield srv.url


def run_url(url: str, path: Path, out: Path, *extra: str) -> dict:
    res = CliRunner().invoke(app, ["run", "script", str(path), "--url", url, "--out", str(out), *extra])
    data, _, _ = receipt(out)
    assert len(data["runs"]) == 1 and "stats" not in data  # a server tfbench did not launch: no verdicts
    f = data["runs"][0]["figures"]
    # a run the host's load made invalid exits 1, and the script's behaviour still stands
    assert not [r for r in f["invalid_reasons"] if not host_lag(r)], f["invalid_reasons"]
    assert res.exit_code == (0 if f["valid"] else 1), (res.output, res.exception)
    return data


def test_long_prompt_script(tiny, tmp_path):
    data = run_url(tiny, longer_a("long-prompt.yaml", tmp_path), tmp_path)
    r = data["runs"][0]
    v = r["figures"]["values"]
    assert v["first_token:B"] > 0 and v["first_token:C"] > 0 and v["longest_pause:A"] > 0
    assert r["records"]["B"]["usage"]["prompt_tokens"] == 4096 and r["records"]["B"]["cached_tokens"] == 0
    assert r["records"]["A"]["cancelled"] and r["records"]["A"]["ended"] >= r["records"]["C"]["ended"]


def test_cache_resume_script(tiny, tmp_path):
    v = run_url(tiny, SCRIPTS / "cache-resume.yaml", tmp_path)["runs"][0]["figures"]["values"]
    assert v["cached_tokens:Y"] == 2048 and v["first_token:Y"] < v["first_token:P"]


def test_background_priority_script(tiny, tmp_path):
    data = run_url(tiny, SCRIPTS / "background-priority.yaml", tmp_path)
    recs = data["runs"][0]["records"]
    assert set(recs) == {"F", "BG", "G", "G-2", "G-3"}
    # Each copy is due 0.2 s after the one before was sent, and none goes early. How late a
    # send goes is the client's lag on this machine, which the run's validity already bounds.
    names = ("BG", "G", "G-2", "G-3")
    for a, b in zip(names, names[1:]):
        assert abs(recs[b]["scheduled"] - recs[a]["sent"] - 0.2) < 1e-6, (a, b, recs[a]["sent"], recs[b]["scheduled"])
        assert recs[b]["sent"] >= recs[b]["scheduled"], b


def test_two_long_prompts_script(tiny, tmp_path):
    v = run_url(tiny, longer_a("two-long-prompts.yaml", tmp_path), tmp_path)["runs"][0]["figures"]["values"]
    assert v["first_token:B1"] > 0 and v["first_token:B2"] > 0 and v["rate_before:A"] > 0


def test_the_docs_example_runs_unmodified(tiny, tmp_path):
    """The script docs/scripts.md builds up, copied out as a reader would, runs as it is."""
    text = (ROOT / "docs" / "scripts.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    full = next(b for b in blocks if b.startswith("name: "))
    path = tmp_path / "mine.yaml"
    path.write_text(full)
    data = run_url(tiny, path, tmp_path / "r")
    assert data["runs"][0]["figures"]["values"]
    assert json.dumps(data)  # the receipt's data is plain JSON


def test_any_server_through_url_runs_a_script(tmp_path):
    """The harness's fake server (another program, no tfengine) plays cancel-and-retry."""
    with launch(["--max-model-len", "8192"], tmp_path / "fake.log", command=fake_server_cmd()) as srv:
        data = run_url(srv.url, SCRIPTS / "cancel-and-retry.yaml", tmp_path / "r")
    recs = data["runs"][0]["records"]
    assert recs["X"]["cancelled"] and recs["R"]["cached_tokens"] >= 256
    assert any("--url" in n for n in data["not_run"])


def test_compare_two_committed_script_receipts():
    """`tfbench compare` reads script receipts figure by figure (their keys, valid runs only)."""
    a, b = sorted((ROOT / "receipts").glob("*-script.json*"))[:2]
    md = report.compare.markdown(report.read(a), report.read(b), a.name, b.name)
    assert "| longest_pause:A | whole | 16.11 / 11.51 |" in md and "| first_token:B | whole | - |" in md


def test_a_cancel_after_tokens_and_a_retry_at_its_cancel(tiny, tmp_path):
    """`cancel: {tokens: K}` closes the stream once K tokens came; a stream sent at that cancel
    plus seconds goes out then, and the receipt shows both."""
    path = tmp_path / "tokens.yaml"
    path.write_text("""
name: cancel-after-tokens
streams:
  - {name: S, at: 0, prompt: {random: 64}, max_tokens: 2000, cancel: {tokens: 20}}
  - {name: T, at: S.cancelled + 0.1, prompt: {same_as: S}, max_tokens: 8, draft: false, priority: background}
figures:
  - {first_token: T}
  - {cached_tokens: T}
""")
    data = run_url(tiny, path, tmp_path / "r")
    recs = data["runs"][0]["records"]
    assert recs["S"]["cancelled"] and 20 <= len(recs["S"]["token_ids"]) < 2000
    assert recs["T"]["sent"] - recs["S"]["ended"] >= 0.1 and len(recs["T"]["token_ids"]) == 8
    assert data["runs"][0]["figures"]["values"]["first_token:T"] > 0
