"""tfbench against servers that are not tfengine, end to end through the CLI, on the foreign
stand-in (real HTTP on loopback, no vLLM needed): --url with the server's own name and no
verdicts, NAME=URL repeated, variants that launch a command, token ids only when asked, counting
by chunks with unknown (never differing) hashes, the vocabulary from --vocab / --tokenizer, the
cold check, failed commands and the exit codes."""
import json
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensorfold_bench import report
from tensorfold_bench.analysis import exactness
from tensorfold_bench.cli.commands import app
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.servers.launcher import group_alive, launch

import foreignserver

SHORT = ["--b-at", "0.4", "--c-after", "0.1", "--b-tokens", "300", "--c-tokens", "8", "--no-trace"]
STANDIN = [*foreignserver.CMD, "serve", "--port", "{port}"]


def standin(*flags: str) -> list[str]:
    return [*STANDIN, *flags]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Running stand-ins, one per behaviour: vLLM-like (ids only when asked, no vocab_size, no
    token_sha, no cached_tokens), text chunks only, and one reporting cached_tokens."""
    log = tmp_path_factory.mktemp("servers")
    kinds = {"vllm": ["--fingerprint", "fp-7"], "text": ["--ids", "never", "--tokens-per-chunk", "3"],
             "cached": ["--cached-tokens", "--model", "m2"]}
    with ExitStack() as stack:
        yield {k: stack.enter_context(launch(log=log / f"{k}.log", command=standin(*f))).url for k, f in kinds.items()}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def receipt(out: Path, kind: str = "long-prompt") -> tuple[dict, str]:
    js = next(out.glob(f"*-{kind}.json.gz"))
    return report.read(js), report.sibling(js, ".md").read_text()


def test_url_is_one_server_named_by_itself_without_verdicts(servers, tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "config.json").write_text(json.dumps({"vocab_size": 900}))
    res = invoke("run", "long-prompt", *SHORT, "--url", servers["vllm"], "--tokenizer", str(tok),
                 "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, (res.output, res.exception)
    data, md = receipt(tmp_path / "r")
    assert [v["name"] for v in data["variants"]] == ["standin"] and data["settings"]["order"] == ["standin"]
    assert data["variants"][0]["args"] == [] and "--prefill-mode" not in md  # no flags that were not applied
    assert "stats" not in data and "verdict |" not in md and "not launched by tfbench" in md
    ident = data["identities"]["standin"]
    assert (ident["model"], ident["owned_by"], ident["version"], ident["launched"]) == ("tiny", "standin",
                                                                                        "0.0.1-standin", False)
    assert ident["system_fingerprint"] == "fp-7" and "fp-7" in md
    assert data["vocab"] == 900  # from --tokenizer DIR's config.json
    run = data["runs"][0]
    assert run["figures"]["valid"], run["figures"]["invalid_reasons"]
    assert all(rec["error"] is None and rec["counted_by"] == "ids" for rec in run["records"].values())
    assert run["cold"] == {"by": "fresh random prompt", "cached_tokens": None, "held": True}
    assert "fresh random prompt" in md and "sends no token_sha" in md
    assert run["hashes"]["B"]["sha256"] and run["log"] is None


def test_named_urls_compare_in_the_order_given_and_fresh_prompts_each_session(servers, tmp_path):
    args = ["--url", f"second={servers['cached']}", "--url", f"first={servers['vllm']}", "--vocab", "1000"]
    for out in ("r1", "r2"):
        res = invoke("run", "long-prompt", *SHORT, *args, "--out", str(tmp_path / out))
        assert res.exit_code == 0, (res.output, res.exception)
    (d1, md), (d2, _) = receipt(tmp_path / "r1"), receipt(tmp_path / "r2")
    assert [r["variant"] for r in d1["runs"]] == ["second", "first"]
    assert d1["identities"]["second"]["model"] == "m2"  # each request named the model its server serves
    assert "stats" not in d1 and "verdict |" not in md
    cold = d1["runs"][0]["cold"]
    assert cold["by"] == "cached_tokens" and cold["cached_tokens"] == 0 and cold["held"]
    assert "cached_tokens = 0" in md
    # no B of a later session is a prefix an earlier session left in the server's cache
    assert d1["runs"][0]["hashes"]["B"]["sha256"] != d2["runs"][0]["hashes"]["B"]["sha256"]


def test_text_chunks_count_by_chunks_and_hashes_are_unknown_never_differ(servers, tmp_path):
    res = invoke("sweep", "--url", servers["text"], "--url", f"again={servers['text']}", "--vocab", "1000",
                 "--levels", "1,2", "--tokens", "7", "--cells", "1", "--reps", "2", "--prompt-tokens", "16",
                 "--out", str(tmp_path))
    assert res.exit_code == 0, (res.output, res.exception)
    data, md = receipt(tmp_path, "sweep")
    h = data["hashes"]
    assert h["equal"] == 0 and h["unknown"] == h["replies"] == 12 and h["ok"] and not h["flagged"]
    assert all(r["counted_by"] == "chunks" for r in data["runs"])
    # every batch counted (7 tokens from usage, 3 chunks seen), none dropped
    assert all(b["tok_s"] and b["tokens"] == 7 * b["level"] for r in data["runs"] for b in r["batches"])
    assert "counted by chunks" in md and "12 unknown" in md and "differ" not in md.split("**Exactness.**")[1]
    assert "verdict |" not in md


def test_ids_route_is_asked_and_logprobs_only_when_asked(servers, tmp_path):
    res = invoke("run", "long-prompt", *SHORT, "--url", servers["vllm"], "--vocab", "1000",
                 "--token-ids", "logprobs", "--out", str(tmp_path))
    assert res.exit_code == 1, (res.output, res.exception)  # the stand-in refuses logprobs, as vLLM did
    data, _ = receipt(tmp_path)
    assert "skip_tokenizer_init" in data["runs"][0]["records"]["B"]["error"]
    assert not data["runs"][0]["figures"]["valid"]


def write_variants(path: Path, entries: str) -> Path:
    path.write_text(entries.replace("FOREIGN", foreignserver.CMD[1]).replace("RAWPY", sys.executable).replace("PY", json.dumps(sys.executable)))
    return path


def test_variants_launch_commands_as_process_groups(tmp_path):
    vf = write_variants(tmp_path / "v.yaml", """
- name: budget 256
  command: [PY, FOREIGN, serve, --port, "{port}", --model, "{model}",
            --max-model-len, "{max_model_len}"]
  flags: --prefill-rows 256
  health: /v1/models
  start_timeout: 60
- name: whole
  command: RAWPY FOREIGN serve --host {host} --port {port} --model {model}
  flags: [--prefill-mode, whole]
- name: not run
  flags: [--prefill-mode, stepped]
""")
    res = invoke("run", "long-prompt", *SHORT, "--variants", str(vf), "--model", "rq", "--vocab", "1000",
                 "--order", "budget 256,whole", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, (res.output, res.exception)
    data, md = receipt(tmp_path / "r")
    assert [r["variant"] for r in data["runs"]] == ["budget 256", "whole"]
    assert [v["name"] for v in data["variants"]] == ["budget 256", "whole"]  # --order picks the variants
    for r in data["runs"]:
        assert r["figures"]["valid"] and not group_alive(r["server"]["pgid"]), r["server"]
        assert Path(r["log"]).exists() and Path(r["log"]).parent == Path(data["settings"]["run_dir"])
        assert r["identity"]["launched"] and r["identity"]["model"] == "rq"
    cmd = data["identities"]["whole"]["command"]
    assert "--prefill-mode whole" in cmd and "--model rq" in cmd and "{port}" not in cmd
    assert f"launched as `{cmd}`" in md and "whole (a command, as launched below)" in md and f"--max-model-len {data['settings']['engine']['max_model_len']} " in data["identities"]["budget 256"]["command"]
    assert "Shared engine flags" not in md  # no tfengine variant ran


@pytest.mark.parametrize("command, timeout, why, last", [
    ('[PY, -c, "print(\'bad flag --frobnicate\'); raise SystemExit(3)", "{port}"]', 30,
     "exited with code 3", "bad flag --frobnicate"),
    ('[PY, -c, "import time; print(\'still loading\', flush=True); time.sleep(60)", "{port}"]', 2,
     "not healthy after 2 s", "still loading")])
def test_a_command_that_fails_is_a_failed_run_quoting_its_log(tmp_path, command, timeout, why, last):
    vf = write_variants(tmp_path / "v.yaml", f"- name: broken\n  command: {command}\n  start_timeout: {timeout}\n")
    res = invoke("sweep", "--variants", str(vf), "--vocab", "1000", "--levels", "1", "--tokens", "4",
                 "--cells", "1", "--reps", "1", "--prompt-tokens", "8", "--out", str(tmp_path / "r"))
    assert res.exit_code == 1, (res.output, res.exception)  # every run failed: 1, after the receipt
    data, md = receipt(tmp_path / "r", "sweep")
    run = data["runs"][0]
    assert why in run["failure"] and run["failure"].endswith(last), run["failure"]
    assert last in md and len(data["runs"]) == 2 and not survivors(last)


def survivors(marker: str) -> list[str]:
    """Processes whose command line carries `marker` (a failed server left behind)."""
    out = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in p.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                out.append(p.parent.name)
        except OSError:
            pass
    return out


def test_an_unreachable_url_exits_2_with_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tensorfold_bench", "run", "long-prompt", "--url",
                        "http://127.0.0.1:9/", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--url http://127.0.0.1:9" in lines[0] and "cannot reach" in lines[0], p.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, flag", [
    (["sweep", "--vocab", "0"], "--vocab"), (["gate", "--vocab", "-3"], "--vocab"),
    (["run", "long-prompt", "--vocab", "0"], "--vocab"),
    (["run", "long-prompt", "--token-ids", "bytes"], "--token-ids"),
    (["run", "long-prompt", "--tokenizer", "/nonexistent"], "--tokenizer"),
    (["sweep", "--url", "a=http://127.0.0.1:9", "--share", "0.5"], "--url")])
def test_bad_values_name_their_flag(argv, flag):
    res = invoke(*argv)
    assert isinstance(res.exception, FlagError) and res.exception.flag == flag, (res.output, res.exception)


def test_no_vocabulary_names_the_flags(servers, tmp_path):
    res = invoke("sweep", "--url", servers["vllm"], "--levels", "1", "--out", str(tmp_path))
    assert isinstance(res.exception, BenchError)
    assert "--vocab" in str(res.exception) and "--tokenizer" in str(res.exception)


def test_unknown_hashes_are_not_differences():
    batch = {"level": 1, "cell": 0, "rep": 0, "hashes": [None]}
    hc = exactness.sweep([("x", [batch]), ("y", [{**batch, "hashes": ["abc"]}])])
    assert hc.ok and hc.unknown == 1 and hc.equal == 1 and "1 unknown" in hc.summary()


@pytest.mark.parametrize("name", ["vllm-cpu.yaml", "vllm-cuda.yaml"])
def test_the_example_variants_files_read(name, monkeypatch):
    from tensorfold_bench.session.defaults import EngineSetup
    from tensorfold_bench.session.targets import command_argv
    from tensorfold_bench.session.variants import read_variants
    vs = read_variants(Path(__file__).resolve().parents[2] / "examples" / "variants" / name)
    assert [v.command is not None for v in vs] == [True, True, False, False]
    monkeypatch.setenv("VLLM_PYTHON", "/venv/bin/python")
    monkeypatch.setenv("VLLM", "/venv/bin/vllm")
    argv = command_argv(vs[1], EngineSetup(model="/m", dtype="bfloat16", max_model_len=4352))
    assert argv[0].startswith("/venv/bin/") and "/m" in argv and "4352" in argv and "{port}" in argv
    assert "--max-num-batched-tokens" in vs[1].args
