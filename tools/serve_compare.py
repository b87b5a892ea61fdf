"""tfengine against vLLM for CPU, served side by side on the same weights, one client for both.

    python -m tools.serve_compare --vllm .venvs/vllm/bin/python --model-dir DIR

Both servers load DIR (a Hugging Face Qwen3 directory, bf16 safetensors: `python -m tools.random_qwen3 DIR` writes one)
and stay up; the client then measures them in turns (A B B A ...), so a burst of load from other
processes on a shared machine lands on both, the server not being measured paused (SIGSTOP:
an idle vLLM keeps polling threads busy), and reports medians:
- sweep: 1, 2, 4, 8 streams at once, each a 64-token token-id prompt and 256 greedy tokens with
  ignore_eos; the aggregate is all completion tokens over the wall time from sending to the last
  token; a stream's rate is its tokens after the first over the time after its first token.
- long: one cold 4,096-token prompt alone (fresh random ids each time, so no prefix cache hit),
  max_tokens 1: the time to its first token.
tfengine runs with its defaults (only --max-model-len 8192 so a 4,096-token prompt fits);
vLLM with the flags a token-id client needs and its defaults otherwise (`--skip-tokenizer-init`, `--max-model-len 16384`,
caches in VENV/../cache, VLLM_CPU_KVCACHE_SPACE=2). Without --vllm, or when that python
is missing, only tfengine is measured and the vLLM column says why. `--baseline TREE` adds a
second tfengine served from another checkout (e.g. main's, `PYTHONPATH=TREE`), measured in the same
turns: a change's before and after beside vLLM, from one run.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Optional

import httpx
import typer

STREAMS = (1, 2, 4, 8)
TOKENS = 256
SHORT_PROMPT = 64
LONG_PROMPT = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    cmd: list[str]
    env: dict
    port: int
    log: Path
    proc: subprocess.Popen | None = None
    model: str = ""
    cwd: Path | None = None  # a baseline runs in its own tree: `python -m` puts the cwd before PYTHONPATH

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 900.0) -> None:
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.cwd)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) while starting; see {self.log}")
            try:
                r = httpx.get(self.url + "/v1/models", timeout=2)
                if r.status_code == 200:
                    self.model = r.json()["data"][0]["id"]
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} not up after {timeout:.0f} s; see {self.log}")

    def pause(self, on: bool) -> None:
        """SIGSTOP / SIGCONT the server's whole process group: a server that is not being
        measured takes no CPU at all (an idle vLLM keeps its busy-polling threads running)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP if on else signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


def tfengine_server(model_dir: Path, logs: Path, tree: Optional[Path] = None, cpu_isa: str = "native") -> Server:
    """tfengine with its defaults; from the checkout `tree` (its own name) when given."""
    port = free_port()
    model = model_dir if tree is None else model_dir.absolute()  # (the baseline runs in its tree)
    cmd = [sys.executable, "-m", "engine", "serve", "--model", str(model), "--load-format", "safetensors",
           "--max-model-len", str(2 * LONG_PROMPT), "--port", str(port)]
    if cpu_isa != "native":
        cmd += ["--cpu-isa", cpu_isa]
    if tree is None:
        return Server("tfengine", cmd, dict(os.environ), port, logs / "tfengine.log")
    name = f"tfengine {tree.absolute().name}"
    return Server(name, cmd, dict(os.environ, PYTHONPATH=str(tree.absolute())), port,
                  (logs / f"{name}.log".replace(" ", "-")).absolute(), cwd=tree.absolute())


# vLLM picks its C++ kernels (and bf16) by torch.cpu's probes, which read the CPU's flags, not
# torch's capability: under a cap it is told there is no AVX-512, as an AVX2-only machine tells it.
AVX2_SITE = """import torch.cpu
for probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
    setattr(torch.cpu, probe, lambda: False)
"""


def vllm_server(python: Path, model_dir: Path, logs: Path, cpu_isa: str = "native") -> Server:
    port = free_port()
    cache = python.absolute().parent.parent.parent / "cache"  # VENV/../cache (a venv's python is a symlink: no resolve)
    env = dict(os.environ, VLLM_CACHE_ROOT=str(cache / "vllm"), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               XDG_CACHE_HOME=str(cache / "xdg"), HF_HOME=str(cache / "hf"), TMPDIR=str(cache / "tmp"),
               VLLM_CPU_KVCACHE_SPACE="2", VLLM_NO_USAGE_STATS="1")
    env.pop("PYTHONPATH", None)
    if cpu_isa != "native":
        from engine.cpu.isa import cap_env
        site = logs.absolute() / f"vllm-{cpu_isa}-site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(AVX2_SITE)
        env.update(cap_env(cpu_isa), PYTHONPATH=str(site))
    (cache / "tmp").mkdir(parents=True, exist_ok=True)
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "16384", "--skip-tokenizer-init"]
    return Server("vLLM", cmd, env, port, logs / "vllm.log")


@dataclass
class Stream:
    sent: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0


async def one_stream(client: httpx.AsyncClient, srv: Server, prompt: list[int], max_tokens: int) -> Stream:
    body = {"model": srv.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    rec = Stream(sent=time.perf_counter())
    async with client.stream("POST", srv.url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{srv.name}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            n = sum(len(c.get("token_ids") or []) or (1 if c.get("text") else 0) for c in choices)
            if n:
                now = time.perf_counter()
                rec.first = rec.first or now
                rec.last, rec.tokens = now, rec.tokens + n
    return rec


def prompt_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(2, vocab) for _ in range(n)]


async def _sweep(srv: Server, k: int, rng: random.Random, vocab: int) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        recs = await asyncio.gather(*(one_stream(client, srv, prompt_ids(rng, SHORT_PROMPT, vocab), TOKENS)
                                      for _ in range(k)))
    end = max(r.last for r in recs)
    rates = [(r.tokens - 1) / (r.last - r.first) for r in recs if r.tokens > 1 and r.last > r.first]
    return {"agg_tok_s": sum(r.tokens for r in recs) / (end - t0), "stream_tok_s": statistics.median(rates),
            "first_token_s": max(r.first - t0 for r in recs), "tokens": [r.tokens for r in recs]}


async def _long(srv: Server, rng: random.Random, vocab: int) -> float:
    async with httpx.AsyncClient(timeout=600) as client:
        r = await one_stream(client, srv, prompt_ids(rng, LONG_PROMPT, vocab), 1)
    return r.first - r.sent


@dataclass
class Figures:
    sweep: dict = field(default_factory=dict)  # streams -> list of results
    long: list = field(default_factory=list)

    def median(self) -> dict:
        out = {k: {m: statistics.median(r[m] for r in v) for m in ("agg_tok_s", "stream_tok_s", "first_token_s")}
               for k, v in self.sweep.items()}
        return {"sweep": out, "long_first_token_s": statistics.median(self.long) if self.long else None,
                "runs": len(self.long)}


def alone(servers: list[Server], s: Server, coro):
    """Run one measurement of `s` with every other server paused."""
    others = [o for o in servers if o is not s]
    for o in others:
        o.pause(True)
    try:
        return asyncio.run(coro)
    finally:
        for o in others:
            o.pause(False)


def measure(servers: list[Server], reps: int, vocab: int, seed: int = 0, say=print) -> dict[str, Figures]:
    """Every figure `reps` times per server, servers in turns (A B, then B A, ...), each
    measurement with the other server paused."""
    rng = random.Random(seed)
    figs = {s.name: Figures() for s in servers}
    for s in servers:  # warm-up: first requests pay one-time costs (allocations, compiled graphs)
        alone(servers, s, _sweep(s, 2, rng, vocab))
        alone(servers, s, _long(s, rng, vocab))
    for rep in range(reps):
        order = servers if rep % 2 == 0 else servers[::-1]
        for k in STREAMS:
            for s in order:
                figs[s.name].sweep.setdefault(k, []).append(alone(servers, s, _sweep(s, k, rng, vocab)))
        for s in order:
            figs[s.name].long.append(alone(servers, s, _long(s, rng, vocab)))
        say(f"  rep {rep + 1}/{reps} done; load average {os.getloadavg()[0]:.1f}")
    return figs


def ratio_names(names) -> list[str]:
    """Each tfengine over vLLM, where vLLM ran."""
    return [f"{n} / vLLM" for n in names if n != "vLLM"] if "vLLM" in names and len(names) > 1 else []


def table_rows(med: dict[str, dict]) -> list[list[str]]:
    """Rows: what, then one column per engine, then each tfengine / vLLM where vLLM ran."""
    names = list(med)
    med = {n: {**med[n], "sweep": {int(k): v for k, v in med[n]["sweep"].items()}} for n in names}  # JSON keys
    rows = []
    for k in STREAMS:
        vals = [med[n]["sweep"].get(k, {}).get("agg_tok_s") for n in names]
        rows.append([f"aggregate tok/s, {k} stream{'s' if k > 1 else ''}", *_fmt(vals, "{:.0f}", names)])
    vals = [med[n]["sweep"].get(1, {}).get("stream_tok_s") for n in names]
    rows.append(["one stream's rate after its first token", *_fmt(vals, "{:.0f}", names)])
    vals = [med[n]["long_first_token_s"] for n in names]
    rows.append([f"{LONG_PROMPT}-token cold prompt alone: first token (s)", *_fmt(vals, "{:.2f}", names)])
    return rows


def _fmt(vals, f, names) -> list[str]:
    out = [f.format(v) if v is not None else "-" for v in vals]
    if ratio_names(names):
        ref = vals[names.index("vLLM")]
        out += [f"{v / ref:.2f}x" if v is not None and ref else "" for n, v in zip(names, vals) if n != "vLLM"]
    return out


def build_cpu_round(say=print) -> None:
    """Build tfengine's C++ decode round before its server starts (a first start on a machine
    would build it in the background, while the figures are taken)."""
    import os

    from engine.config import Toolchain
    from engine.cpu import round as cpu_round
    tc = Toolchain.from_env(os.environ)  # as the server's CLI reads it
    if cpu_round.library(tc).is_file():
        return
    say("building tfengine's C++ decode round once (engine/cpu/round.py) ...")
    try:
        cpu_round.build(tc)
    except RuntimeError as e:
        say(f"  not built ({e}): tfengine runs its Python round")


def compare(model_dir: Path, vllm: Optional[Path], reps: int, logs: Path, say=print,
            baseline: Optional[Path] = None, cpu_isa: str = "native") -> dict:
    """Start the servers, measure in turns, stop them. Returns {"engines": ..., "vllm_skipped": why}."""
    logs.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    servers = [tfengine_server(model_dir, logs, cpu_isa=cpu_isa)]
    servers += [tfengine_server(model_dir, logs, baseline, cpu_isa)] if baseline else []
    skipped = None
    if vllm is None:
        skipped = "no --vllm python given (scripts/vllm_cpu_compare.sh installs vLLM for CPU)"
    elif not Path(vllm).exists():
        skipped = f"{vllm} does not exist (scripts/vllm_cpu_compare.sh installs vLLM for CPU)"
    else:
        servers.append(vllm_server(Path(vllm), model_dir, logs, cpu_isa))
    build_cpu_round(say)
    try:
        for s in servers:
            say(f"starting {s.name} (log {s.log}) ...")
            s.start()
        engine = httpx.get(servers[0].url + "/v1/engine", timeout=10).json()
        figs = measure(servers, reps, vocab, say=say)
    finally:
        for s in servers:
            s.stop()
    return {"engines": {n: f.median() for n, f in figs.items()}, "vllm_skipped": skipped,
            "tfengine": engine, "loadavg": os.getloadavg()}


app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    model_dir: Annotated[Path, typer.Option(help="HF Qwen3 directory both engines load")],
    vllm: Annotated[Optional[Path], typer.Option(envvar="TFENGINE_VLLM_PYTHON", help="python of a vLLM-for-CPU venv")] = None,
    reps: Annotated[int, typer.Option(help="measurements per figure per engine (median reported)")] = 3,
    logs: Annotated[Path, typer.Option(help="server logs go here")] = Path("runs/serve_compare"),
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the figures here")] = None,
    md: Annotated[Optional[Path], typer.Option(help="write the table as a Markdown receipt here")] = None,
    baseline: Annotated[Optional[Path], typer.Option(help="also serve tfengine from this checkout (e.g. main's)")] = None,
    cpu_isa: Annotated[str, typer.Option(help="native, or avx2: both engines at AVX2 on an AVX-512 machine (tfengine --cpu-isa; vLLM with torch's probes saying no AVX-512)")] = "native",
):
    out = compare(model_dir, vllm, reps, logs, baseline=baseline, cpu_isa=cpu_isa)
    out["cpu_isa"] = cpu_isa
    out["command"] = " ".join(["python -m tools.serve_compare", *sys.argv[1:]])
    print_table(out)
    if json_path:
        json_path.write_text(json.dumps(out, indent=2, default=str))
    if md:
        md.write_text(markdown(out))


def markdown(out: dict) -> str:
    med = out["engines"]
    head = ["what", *med, *ratio_names(list(med))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(med)]
    e = (out.get("tfengine") or {}).get("engine", {})
    return "\n".join([
        "# tfengine against vLLM for CPU, same weights, served side by side", "",
        f"Command: `{out.get('command', '')}`; medians of {next(iter(med.values()))['runs']} runs per figure, "
        f"engines in turns, the other paused; load average at the end {out['loadavg'][0]:.1f}; "
        f"ISA {out.get('cpu_isa', 'native')} ({(out.get('tfengine') or {}).get('engine', {}).get('cpu', {}).get('isa', '?')}).",
        f"tfengine {e.get('dtype')} (its default here), parallel {e.get('parallel')}, threads {e.get('threads')}, "
        f"decode round {e.get('cpu_round')}, "
        f"{e.get('device_name')}, torch {e.get('torch')}, commit {(out.get('tfengine') or {}).get('commit')}.", "",
        *lines, "", f"vLLM skipped: {out['vllm_skipped']}" if out["vllm_skipped"] else "", ""])


def print_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    med = out["engines"]
    t = Table(title=f"served side by side, same weights (load average at the end {out['loadavg'][0]:.1f})")
    t.add_column("what")
    for n in med:
        t.add_column(n, justify="right")
    for n in ratio_names(list(med)):
        t.add_column(n, justify="right")
    for row in table_rows(med):
        t.add_row(*row)
    c = Console()
    c.print(t)
    e = (out.get("tfengine") or {}).get("engine", {})
    c.print(f"tfengine defaults: dtype {e.get('dtype')} (bf16-native CPU: {e.get('cpu_bf16_native')}), "
            f"parallel {e.get('parallel')}, threads {e.get('threads')}, matmuls {e.get('cpu_matmuls')}, "
            f"decode round {e.get('cpu_round')}")
    if out["vllm_skipped"]:
        c.print(f"vLLM column skipped: {out['vllm_skipped']}")


if __name__ == "__main__":
    app()
