"""tfbench's client and `vllm bench serve`'s, side by side on one synthetic server, in one run.

    python -m tools.calibrate_vs_vllm --vllm-python $VLLM_VENV/bin/python [--levels 1,8,64,128,256]
                                      [--tokens 200] [--json FILE]

It starts tensorfold_bench.calibrate.synthetic (the schedule `tfbench calibrate` uses by default: first
token 20 ms after the request is read, one every 10 ms, every 16th stream stalling 100 ms once)
and at each level plays one burst with tfbench's client (as `tfbench calibrate` does) and one
with vLLM's (`vllm bench serve --max-concurrency N --num-prompts N --request-rate inf`, run by
vLLM's own Python through tools/vllm_bench_serve.py), in turns (tfbench first at the 1st, 3rd, ...
level, vLLM first at the others) so that a drift of the shared machine hits both. The server
logs every token's send on CLOCK_MONOTONIC; vLLM stamps with `time.perf_counter()`, the same
clock on Linux, and saves each request's start, first token, inter-token gaps and text
(`--save-detailed`); the first token's text names the stream's arrival in the server's log
(" sN"), which matches each vLLM request with its truth. Per level and client: first token p50
and inter-token p50/p99 as the client measured them, with the truth (the server's sends for the
same streams, the first token from the client's own send) beside each.

vLLM needs a tokenizer to make its random prompts: a byte-level one is written with
tools/byte_tokenizer_dir.py by vLLM's Python. Its caches go to a scratch folder that is removed
after. vLLM's Python starts once per level (about 30 s of imports on two cores, before its
clock starts). Not in the tests (no vLLM in CI) except `vllm_row`, the reading of its result.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import httpx
import numpy as np
import typer

from tensorfold_bench.calibrate import client_error as calibrate, synthetic
from tensorfold_bench.scenarios.sweep import parse_levels

ROOT = Path(__file__).resolve().parents[1]
LEVELS = "1,8,64,128,256"
PROMPT_TOKENS = 16
VLLM_TIMEOUT_S = 600
ARRIVAL = re.compile(r"\s*s(\d+)\b")


def vllm_args(url: str, level: int, tokens: int, tokenizer: Path, out: Path) -> list[str]:
    return ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", synthetic.MODEL,
            "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
            "--random-output-len", str(tokens), "--num-prompts", str(level), "--max-concurrency", str(level),
            "--request-rate", "inf", "--ignore-eos", "--temperature", "0", "--seed", str(level),
            "--ready-check-timeout-sec", "0",  # no test request before the burst: the log holds the burst alone
            "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name]


def vllm_env(scratch: Path) -> dict[str, str]:
    """vLLM's caches in the scratch folder, no usage reports."""
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", VLLM_CPU_KVCACHE_SPACE="1")
    for k, sub in (("VLLM_CACHE_ROOT", "vllm"), ("XDG_CACHE_HOME", "xdg"), ("HF_HOME", "hf"),
                   ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TMPDIR", "tmp")):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        env[k] = str(scratch / sub)
    return env


def run_vllm(python: Path, args: list[str], env: dict[str, str], out: Path) -> dict:
    p = subprocess.run([str(python), str(ROOT / "tools" / "vllm_bench_serve.py"), *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=VLLM_TIMEOUT_S)
    if p.returncode != 0 or not out.exists():
        tail = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()][-3:]
        raise RuntimeError(f"vllm bench serve exited {p.returncode}: " + " | ".join(tail))
    return json.loads(out.read_text())


def vllm_row(result: dict, log: dict, level: int) -> dict:
    """vLLM's figures for one burst (ms) beside the truth for the same streams: each request is
    matched with the log's stream by the arrival its first token's text names."""
    by_arrival = {s["arrival"]: s for s in log["streams"]}
    first_m, first_t, gaps_m, gaps_t, failed = [], [], [], [], 0
    for text, start, ttft, itl, err in zip(result["generated_texts"], result["start_times"], result["ttfts"],
                                           result["itls"], result.get("errors") or [""] * len(result["ttfts"])):
        m = ARRIVAL.match(text or "")
        s = by_arrival.get(int(m.group(1))) if m else None
        if err or s is None or not s["sends"]:
            failed += 1
            continue
        sends = np.asarray(s["sends"])
        first_m.append(ttft)
        first_t.append(sends[0] - start)
        gaps_m += list(itl)
        gaps_t += np.diff(sends).tolist()
    if not first_m:
        raise RuntimeError(f"vllm bench serve at {level} streams: no request matched the server's log")
    gm, gt = np.asarray(gaps_m) * 1000, np.asarray(gaps_t) * 1000
    out = {"client": "vllm bench serve", "level": level,
           "first_p50": float(np.median(first_m)) * 1000, "first_truth_p50": float(np.median(first_t)) * 1000,
           "itl_p50": float(np.percentile(gm, 50)), "itl_truth_p50": float(np.percentile(gt, 50)),
           "itl_p99": float(np.percentile(gm, 99)), "itl_truth_p99": float(np.percentile(gt, 99)),
           "server_peak_open": log["peak_open"], "failed": failed,
           "max_concurrent": result.get("max_concurrent_requests")}
    out["within"] = (abs(out["itl_p99"] - out["itl_truth_p99"]) <= calibrate.ITL_BOUND_MS
                     and abs(out["first_p50"] - out["first_truth_p50"]) <= calibrate.FIRST_BOUND_MS)
    return out


def play_vllm(python: Path, url: str, level: int, tokens: int, tokenizer: Path, scratch: Path) -> dict:
    httpx.post(url + "/v1/synthetic/reset")
    out = scratch / f"vllm-{level}.json"
    result = run_vllm(python, vllm_args(url, level, tokens, tokenizer, out), vllm_env(scratch), out)
    return vllm_row(result, httpx.get(url + "/v1/synthetic", timeout=60).json(), level)


def play_tfbench(url: str, level: int, tokens: int) -> dict:
    settings = calibrate.CalibrateSettings(levels=(level,), tokens=tokens)
    (row,) = asyncio.run(calibrate.play_client(url, "wire", settings, lambda text: None))
    return row


def side_by_side(python: Path, levels: tuple[int, ...], tokens: int, say=print) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="calibrate-vllm-") as tmp, \
            calibrate.synthetic_server(calibrate.CalibrateSettings().schedule) as srv:
        scratch, tok = Path(tmp), Path(tmp) / "tokenizer"
        subprocess.run([str(python), "-m", "tools.byte_tokenizer_dir", str(tok)], cwd=ROOT, check=True,
                       env=vllm_env(scratch), capture_output=True)
        for i, level in enumerate(levels):
            turns = ["tfbench", "vllm"] if i % 2 == 0 else ["vllm", "tfbench"]
            for who in turns:
                row = play_tfbench(srv.url, level, tokens) if who == "tfbench" else \
                    play_vllm(python, srv.url, level, tokens, tok, scratch)
                rows.append(row)
                say(f"{row['client']}: {level} streams: first token p50 {row['first_p50']:.1f} ms "
                    f"(truth {row['first_truth_p50']:.1f}), inter-token p99 {row['itl_p99']:.2f} "
                    f"(truth {row['itl_truth_p99']:.2f})")
    return {"levels": list(levels), "tokens": tokens, "cpus": os.cpu_count(), "load": os.getloadavg(), "rows": rows}


def table(data: dict) -> str:
    """One row per level: each figure as tfbench and vLLM measured it, the truth in brackets."""
    def cell(r, k, d):
        return "–" if r is None else f"{r[k]:.{d}f} ({r[k.replace('_', '_truth_', 1)]:.{d}f})"
    lines = [f"Synthetic server, first token 20 ms after the request is read, then one every 10 ms, {data['tokens']} "
             f"tokens; {data['cpus']} CPUs, load average " + " / ".join(f"{x:.2f}" for x in data["load"])
             + " at the end. Each cell: as the client measured it (the truth for the same streams), ms.", "",
             "| streams | first token p50: tfbench | vLLM | inter-token p50: tfbench | vLLM | inter-token p99: tfbench "
             "| vLLM | open at the server: tfbench / vLLM | within 1 ms / 5 ms: tfbench / vLLM |",
             "|---|---|---|---|---|---|---|---|---|"]
    for lv in data["levels"]:
        t = next((r for r in data["rows"] if r["level"] == lv and r["client"] == "wire"), None)
        v = next((r for r in data["rows"] if r["level"] == lv and r["client"] != "wire"), None)
        yes = lambda r: "–" if r is None else ("yes" if r["within"] else "no")  # noqa: E731
        lines.append(f"| {lv} | {cell(t, 'first_p50', 1)} | {cell(v, 'first_p50', 1)} | {cell(t, 'itl_p50', 2)} | "
                     f"{cell(v, 'itl_p50', 2)} | {cell(t, 'itl_p99', 2)} | {cell(v, 'itl_p99', 2)} | "
                     f"{t['server_peak_open'] if t else '–'} / {v['server_peak_open'] if v else '–'} | "
                     f"{yes(t)} / {yes(v)} |")
    return "\n".join(lines) + "\n"


def main(
    vllm_python: Annotated[Optional[Path], typer.Option("--vllm-python", envvar="VLLM_PYTHON", help="The python of a vLLM for CPU virtual environment.")] = None,
    levels: Annotated[str, typer.Option("--levels", help="Stream counts, one burst each per client.")] = LEVELS,
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens each stream reads.")] = 200,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the rows as JSON here.")] = None,
):
    if vllm_python is None or not vllm_python.exists():
        typer.secho(f"--vllm-python: {vllm_python or 'not given (nor VLLM_PYTHON)'}: no such python", fg="red",
                    err=True)
        raise typer.Exit(2)
    data = side_by_side(vllm_python, parse_levels(levels), tokens, lambda text: print(text, file=sys.stderr))
    if json_out:
        json_out.write_text(json.dumps(data, indent=1) + "\n")
    sys.stdout.write(table(data))


if __name__ == "__main__":
    typer.run(main)
