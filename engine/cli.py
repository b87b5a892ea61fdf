"""`tfengine serve` (also `python -m engine serve`): load a model, start the lane host, serve HTTP."""
from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Mapping, Optional

import typer

from engine.config import ConfigError, EngineConfig, KernelConfig, Toolchain
from engine.scheduler.drafter import make_drafter
from engine.faults import Faults, with_faults

# Rows per prompt cut by device. On a GPU a cut is a few large products, and a small one spends
# its time outside them: a 24,000-token cold prompt of qwen3-8b on an H200 took 2.78 s to its first
# token in 256-row cuts and 0.94 s in 1,024-row cuts. On the CPU a cut's time grows with its rows,
# so 256 rows keep a decoding stream's longest wait to one short cut.
PREFILL_ROWS = {"cpu": 256, "cuda": 1024}
# --cut-attention: a CUDA prompt cut's attention (KernelConfig.cut_tiles). cudnn: prefix and diagonal
# halves merged (engine/cuda/prefill.py), the fastest at 1,024-row cuts; tiles: engine/cuda/cut_flash.py,
# whose rows' bits do not depend on where cuts fall (what mixed forwards need). The two give
# different bits, so a receipt's plain reference must run the same one as its variants.
CUT_ATTENTION = {"cudnn": False, "tiles": True}


def share_from_env(flag: float | None, env: Mapping[str, str]) -> float:
    """The prefill share: the flag wins over TENSORFOLD_PREFILL_SHARE; unset means 1."""
    if flag is not None:
        return flag
    raw = env.get("TENSORFOLD_PREFILL_SHARE")
    if raw is None or raw.strip() == "":
        return 1.0
    try:
        return float(raw)
    except ValueError:
        return math.nan  # the host's guard turns it into 1 with a warning


def cut_rows(device: str, prefill_rows: int | None) -> int:
    """--prefill-rows, or the device's default."""
    return PREFILL_ROWS["cpu" if device == "cpu" else "cuda"] if prefill_rows is None else prefill_rows


app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="tfengine: a Qwen3-family inference engine with lanes, stepped prompts and a lane host.")


def engine_commit() -> str | None:
    """The git commit of the engine's own source (a worktree of a variant reports its own).
    A copy without git history (a device machine's) can say it with TFENGINE_COMMIT."""
    if os.environ.get("TFENGINE_COMMIT"):
        return os.environ["TFENGINE_COMMIT"]
    root = Path(__file__).resolve().parent.parent

    def git(*args):
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5)
        return r.stdout.strip() if r.returncode == 0 else ""

    try:
        sha = git("rev-parse", "--verify", "-q", "HEAD^{commit}")
        dirty = git("status", "--porcelain", "--", "engine") if sha else ""
    except (OSError, subprocess.SubprocessError):
        return None
    if not re.fullmatch(r"[0-9a-f]{40}", sha):
        return None
    return sha + ("+dirty" if dirty else "")


def write_port(path: Path | None, port: int) -> None:
    """Atomically, so a reader never sees half a number."""
    if path is not None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(path)


def check_config(cfg: EngineConfig) -> str:
    """What serve would refuse before loading weights, as a ConfigError (a launcher asks once,
    before starting any server). The runner checks the same when it starts."""
    from engine.parallel.group import check_tensor_parallel
    from engine.models.presets import resolve_model

    mcfg, name, _ = resolve_model(cfg.model)
    if why := mixed_refused(cfg) or split_refused(cfg):  # a combination of flags: refused whatever the machine has
        raise ConfigError(why)
    if cfg.kernels.mixed_low_tiles and cfg.device == "cpu":
        raise ConfigError("--mixed-low-tiles is for --device cuda (the tiles of the mixed graphs' cut attention)")
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"--device {cfg.device} asked for, but torch {torch.__version__} sees no CUDA device")
    elif cfg.device != "cpu":
        raise ConfigError(f"--device must be cpu or cuda, not {cfg.device!r}")
    else:
        from engine.cpu.packed import bf16_refused
        if why := bf16_refused(cfg.dtype):
            raise ConfigError(why)
    check_tensor_parallel(mcfg, cfg.tensor_parallel, cfg.device)
    tp = f", tensor parallel {cfg.tensor_parallel}" if cfg.tensor_parallel > 1 else ""
    return f"ok: {name} on {cfg.device}, {cfg.dtype}, {cfg.prefill_rows}-row cuts{tp}"


def mixed_refused(cfg: EngineConfig) -> str | None:
    """Why --prefill-mode mixed cannot keep every row's bits under these flags, or None."""
    if cfg.prefill_mode != "mixed":
        return None
    if cfg.tensor_parallel > 1:
        return ("--prefill-mode mixed runs at one rank (a tensor-parallel forward carrying a cut and a round "
                "is not built): use stepped with --prefill-share there")
    if cfg.device != "cpu" and not (cfg.kernels.cut_tiles and cfg.dtype == "bfloat16"):
        return ("--prefill-mode mixed on cuda needs --cut-attention tiles (and bfloat16): a budget sizes its cuts "
                "off the 1,024-row grid, and only the tiles give a prompt row the same attention bits wherever "
                "its cut falls (the cudnn halves split each row's keys at its cut's start)")
    return None


def split_refused(cfg: EngineConfig) -> str | None:
    """Why --prefill-mode split cannot run under these flags, or None."""
    if cfg.prefill_mode != "split":
        return None
    if cfg.device == "cpu":
        return ("--prefill-mode split is for --device cuda (it gives a prompt's cuts and the decode rounds SMs of "
                "their own); on the cpu use stepped with --prefill-share, or mixed")
    if cfg.tensor_parallel > 1:
        return "--prefill-mode split runs at one rank: use stepped with --prefill-share with --tensor-parallel"
    if cfg.kernels.cuda_graph is False:
        return "--prefill-mode split needs the CUDA decode graph (its rounds are captured on their SMs)"
    return None


def cut_attention_knob(device: str, cut_attention: str) -> bool:
    """KernelConfig.cut_tiles for --cut-attention."""
    if cut_attention not in CUT_ATTENTION:
        raise ConfigError(f"--cut-attention must be {' or '.join(CUT_ATTENTION)}, not {cut_attention!r}")
    if CUT_ATTENTION[cut_attention] and device == "cpu":
        raise ConfigError("--cut-attention tiles is for --device cuda (the CPU's cut attention is its own)")
    return CUT_ATTENTION[cut_attention]


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="Preset (tiny, cpu, qwen3-0.6b, qwen3-8b, qwen3-32b) or a local Hugging Face layout directory.")] = "tiny",
    load_format: Annotated[str, typer.Option(help="dummy: seeded random weights (timings real, words not); safetensors: weights from the --model directory.")] = "dummy",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[Optional[str], typer.Option(help="float32 or bfloat16 (default: bfloat16 on cuda; on cpu bfloat16 where the CPU has AMX or avx512_bf16, else float32).")] = None,
    parallel: Annotated[Optional[int], typer.Option(help="Lanes: streams decoding at once, each with its own KV region (default: 8 on cpu, 4 on cuda).")] = None,
    tensor_parallel: Annotated[int, typer.Option(help="Split the model over N ranks, one process each (NCCL on cuda:0..N-1, gloo on cpu): Megatron-style attention heads and MLP, vocabulary-split lm_head. N must divide the key-value heads and the intermediate size.")] = 1,
    cpu_isa: Annotated[str, typer.Option(help="cpu: native, or avx2: run torch, MKL, oneDNN and the C kernels at AVX2 on an AVX-512 machine (the float32 path with widened bf16 weights that AVX2-only machines take), to test or measure that class here.")] = "native",
    threads: Annotated[Optional[int], typer.Option(help="cpu: compute threads (default: every core but one, at least 1, leaving a core to the HTTP thread).")] = None,
    max_model_len: Annotated[int, typer.Option(help="Tokens per lane (prompt + completion).")] = 4096,
    prefill_rows: Annotated[Optional[int], typer.Option(help="Rows per prompt cut R: cut boundaries are multiples of R (default: 256 on cpu, 1024 on cuda).")] = None,
    prefill_mode: Annotated[str, typer.Option(help="stepped: prompts run a cut at a time between decode rounds; whole: each admitted prompt runs whole before the next round (the baseline); mixed: each forward carries a prompt's cut and one row for every runnable stream, the cut sized by --mixed-budget (cpu; cuda with --cut-attention tiles); split (cuda): while streams decode, a long prompt's cuts run on the SMs that --decode-sms leaves, beside the rounds on theirs.")] = "stepped",
    cut_attention: Annotated[str, typer.Option(help="cuda: a prompt cut's attention. cudnn: prefix and diagonal halves through cuDNN, merged; tiles: Triton tiles at absolute positions, a row's bits the same wherever its cut falls (needed by --prefill-mode mixed). Each gives its own bits.")] = "cudnn",
    mixed_budget: Annotated[float, typer.Option(help="mixed: milliseconds a forward carrying a long prompt's cut and the decode rows should take; the cut is sized to it from measured forwards.")] = 50.0,
    decode_sms: Annotated[int, typer.Option(help="split: the SMs decode rounds keep while a long prompt's cut runs on the rest of the GPU (a multiple of 8; fewer: the prompt fills sooner, the streams slow more).")] = 32,
    mixed_low_tiles: Annotated[bool, typer.Option("--mixed-low-tiles", help="cuda, mixed: for cuts up to 256 rows, also check the cut attention in 64-row query tiles at start-up and run them where they keep every bit and time faster (other modes: nothing to do).")] = False,
    prefill_share: Annotated[Optional[float], typer.Option(help="Share p in (0, 1] of wall time for long prompt steps while streams decode; overrides TENSORFOLD_PREFILL_SHARE; default 1 (alternation).")] = None,
    no_prompt_cache: Annotated[bool, typer.Option("--no-prompt-cache", help="Do not reuse a lane's cached prompt prefix.")] = False,
    drafter: Annotated[Optional[str], typer.Option(help="Speculative drafter: ngram (prompt lookup). Drafts are checked in the round's padding rows; replies stay token-exact.")] = None,
    no_drafts: Annotated[bool, typer.Option("--no-drafts", help="No speculative drafts.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the dummy weights.")] = 0,
    trace: Annotated[bool, typer.Option("--trace", help="Keep a per-step trace, served at /v1/trace.")] = False,
    trace_len: Annotated[int, typer.Option(help="The trace keeps only the last this many steps (a ring).")] = 50_000,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on; 0: one the system picks (see --port-file).")] = 8000,
    port_file: Annotated[Optional[Path], typer.Option(help="Once serving, write the bound port here (a launcher's way to learn a --port 0 port).")] = None,
    nonce: Annotated[Optional[str], typer.Option(help="A launcher's token, echoed by GET /v1/engine, so it knows it measures the server it launched.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Only validate the flags (the model and device exist too), print one line and exit: nothing loaded or served.")] = False,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body accepted (MiB); larger is a 413.")] = 8.0,
    stall_timeout_s: Annotated[float, typer.Option(help="A stream whose client reads nothing this long is cancelled and its lane freed.")] = 30.0,
    idle_timeout_s: Annotated[float, typer.Option(help="A connection with no request in progress (or unfinished headers) this long is closed.")] = 30.0,
    body_timeout_s: Annotated[float, typer.Option(help="A request body must arrive within this (else 408).")] = 30.0,
):
    """Serve the OpenAI-compatible API (completions, chat, models, health, metrics) with streamed tokens."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from engine.cpu.isa import apply_cap
    try:
        apply_cap(cpu_isa, "torch" in sys.modules)  # before torch loads: it reads the cap then
    except (ValueError, RuntimeError) as e:
        raise typer.BadParameter(str(e), param_hint="--cpu-isa") from None
    draft = make_drafter(drafter)
    dtype, parallel, chose = device_defaults(device, dtype, parallel, threads)
    prefill_rows = cut_rows(device, prefill_rows)
    cfg = EngineConfig(model=model, load_format=load_format, device=device, dtype=dtype, parallel=parallel, tensor_parallel=tensor_parallel, max_model_len=max_model_len, prefill_rows=prefill_rows,
                       prefill_mode=prefill_mode, prefill_share=share_from_env(prefill_share, os.environ),
                       mixed_budget_ms=mixed_budget, decode_sms=decode_sms, prompt_cache=not no_prompt_cache, drafter=drafter, drafts=not no_drafts,
                       seed=seed, trace=trace, trace_len=trace_len,
                       kernels=KernelConfig(cut_tiles=cut_attention_knob(device, cut_attention), mixed_low_tiles=mixed_low_tiles,
                                            toolchain=Toolchain.from_env(os.environ)))
    # the environment is read here, once: below the CLI every setting is configuration
    faults = Faults.from_env(os.environ)  # test hooks
    from engine.server.http import HttpConfig, ServedModel, serve as serve_http

    http = HttpConfig(max_body_mb=max_body_mb, stall_timeout_s=stall_timeout_s, idle_timeout_s=idle_timeout_s,
                      body_timeout_s=body_timeout_s)
    if check:
        typer.echo(check_config(cfg))
        return
    from engine.scheduler.host import LaneHost
    from engine.runner.build import build_runner

    check_config(cfg)  # before any worker rank starts
    if cfg.tensor_parallel > 1:
        import torch

        from engine.parallel.launch import start_tensor_parallel
        if device == "cpu" and threads is None:  # the ranks share the cores: spinning threads would fight
            torch.set_num_threads(max(1, torch.get_num_threads() // cfg.tensor_parallel))
            chose += f"; {cfg.tensor_parallel} ranks share them, {torch.get_num_threads()} each"
        runner = start_tensor_parallel(cfg, torch.get_num_threads())
    else:
        runner = build_runner(cfg)
    if chose:  # once the model loaded: a failed start stays one line
        logging.getLogger("engine.cli").info(chose)
    await_warm_up(runner)
    lane_host = LaneHost(with_faults(runner, faults), cfg, drafter=draft)
    served = ServedModel(name=runner.model_name, vocab_size=runner.vocab_size,
                         max_model_len=runner.max_model_len, tokenizer=runner.tokenizer,
                         describe=runner.describe(), commit=engine_commit(), nonce=nonce,
                         defaults=runner.model_config.generation.sampling_defaults())
    sock = socket.create_server((host, port))  # bound here, so --port 0's port is known before serving
    port = sock.getsockname()[1]
    lane_host.start()
    try:
        asyncio.run(serve_http(lane_host, served, host, port, ready=lambda: write_port(port_file, port), sock=sock,
                               http=http))
    except KeyboardInterrupt:
        pass
    finally:
        lane_host.stop()
        if hasattr(runner, "close"):  # tensor parallel: the worker ranks
            runner.close()


def await_warm_up(runner) -> None:
    """Serve only once the runner's background warm-up (cuDNN's graphs for the prompt cuts, on the
    cut thread) is done: a request sent during it waited for all of it, and on an H200 a fresh
    server's first 16-token prompt got its first token 1-4 s late, which the harness measured as
    a slow stream."""
    warmed = getattr(runner, "cuts_warmed", None)
    if warmed is not None:
        t = time.perf_counter()
        shapes = warmed.result()
        logging.getLogger("engine.cli").info("prompt cuts warmed: %s cuDNN graphs, waited %.1f s", shapes,
                                             time.perf_counter() - t)


def device_defaults(device: str, dtype: str | None, parallel: int | None, threads: int | None) -> tuple[str, int, str]:
    """(dtype, parallel, what was chosen and why) with the device's defaults filled in; on the
    CPU also sets the compute threads."""
    if device != "cpu":
        if threads is not None:
            raise ConfigError("--threads is for --device cpu")
        return dtype or "bfloat16", 4 if parallel is None else parallel, ""
    from engine.cpu.packed import cpu_dtype, cpu_threads
    if threads is not None and threads < 1:
        raise ConfigError("--threads must be at least 1")
    auto, why = cpu_dtype()
    dtype, why = (dtype, "--dtype") if dtype else (auto, why)
    parallel = 8 if parallel is None else parallel  # an 8-stream sweep never queues
    import torch
    torch.set_num_threads(threads or cpu_threads())
    return dtype, parallel, (f"cpu: dtype {dtype} ({why}), parallel {parallel}, threads {torch.get_num_threads()}"
                             + ("" if threads else " (every core but one)"))


@app.command()
def profile(
    model: Annotated[str, typer.Option(help="Preset or a local Hugging Face layout directory (dummy weights are timed: timings real, words not).")] = "tiny",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[Optional[str], typer.Option(help="float32 or bfloat16 (default: as serve chooses).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="The profile's JSON (default: receipts/profiles/MODEL-DEVICE.json).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A smaller grid and fewer repeats (a GPU's in about three minutes).")] = False,
    longest: Annotated[Optional[int], typer.Option(help="The longest prompt the cuts are timed up to (default: 32768 on cuda, 4096 on cpu).")] = None,
    wide: Annotated[Optional[int], typer.Option(help="Lanes of the wide runner: rounds are timed up to this many streams (default: 64 on cuda, 8 on cpu).")] = None,
    wide_len: Annotated[Optional[int], typer.Option(help="The wide runner's tokens per lane (default: 4096 on cuda, 1024 on cpu).")] = None,
    prefill_rows: Annotated[Optional[int], typer.Option(help="Rows per prompt cut (default: serve's for the device).")] = None,
    split_sms: Annotated[Optional[str], typer.Option(help="cuda: the decode partitions split cuts are timed beside, e.g. 24,32,40,56 (default); 'none' for none.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed calls a point (default: 3 with --quick, else 5).")] = None,
    budget: Annotated[Optional[float], typer.Option(help="Seconds to spend; kinds not reached are left empty and the profile's notes say so.")] = None,
    cpu_isa: Annotated[str, typer.Option(help="cpu: native, or avx2 (the AVX2 path on an AVX-512 machine), as serve's.")] = "native",
    threads: Annotated[Optional[int], typer.Option(help="cpu: compute threads (default: serve's, every core but one).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the dummy weights and the timed token ids.")] = 0,
):
    """Time the engine's forwards once (prompt cuts, decode rounds, short prompts together, mixed and
    split forwards, the lane host's own time) and write the cost profile the simulator runs on."""
    from engine.cpu.isa import apply_cap
    try:
        apply_cap(cpu_isa, "torch" in sys.modules)
    except (ValueError, RuntimeError) as e:
        raise typer.BadParameter(str(e), param_hint="--cpu-isa") from None
    sms: tuple[int, ...] | None = None
    if split_sms is not None:
        try:
            sms = () if split_sms.strip().lower() == "none" else tuple(int(x) for x in split_sms.split(","))
        except ValueError:
            raise typer.BadParameter(f"a comma-separated list of SM counts, not {split_sms!r}", param_hint="--split-sms") from None
    from engine.runner.profile import ProfileConfig, profile as take, summary
    cfg = ProfileConfig(model=model, device=device, dtype=dtype or "bfloat16", quick=quick, longest=longest,
                        wide=wide, wide_len=wide_len, prefill_rows=prefill_rows, split_sms=sms, repeats=repeats,
                        budget_s=budget, seed=seed, cpu_isa=cpu_isa, threads=threads,
                        toolchain=Toolchain.from_env(os.environ))
    cfg.check()  # the flags first: a bad one is refused before torch loads
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, not {device!r}")
    from dataclasses import replace
    dtype, _, _ = device_defaults(device, dtype, None, threads)  # serve's dtype and threads for the device
    doc, path = take(replace(cfg, dtype=dtype), out, log=lambda m: typer.echo(m, err=True), commit=engine_commit())
    typer.echo(summary(doc))
    typer.echo(f"wrote {path}")


@app.callback()
def _root():
    """tfengine."""


# The engine extra's modules that the harness-only install lacks (typer and numpy it has).
ENGINE_NEEDS = ("torch", "triton", "aiohttp", "safetensors", "tokenizers", "jinja2")


def main() -> None:
    """Known errors become one line and exit code 2; no traceback."""
    try:
        rv = app(standalone_mode=False)  # typer answers Ctrl-C with 130 here, not an exception
    except (ConfigError, OSError) as exc:  # bad configuration, a taken port
        typer.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except ModuleNotFoundError as exc:  # `pip install tfbench` installs the harness alone
        if (exc.name or "").partition(".")[0] not in ENGINE_NEEDS:
            raise
        typer.secho(f'error: tfengine needs {exc.name}, which is not installed here: pip install "tfbench[engine]"',
                    fg="red", err=True)
        sys.exit(2)
    except Exception as exc:
        if not hasattr(exc, "format_message"):  # click/typer usage errors have one
            raise
        typer.secho(f"error: {exc.format_message()}", fg="red", err=True)  # a flag's value, an unknown flag
        sys.exit(2)
    if isinstance(rv, int) and rv:
        sys.exit(rv)


if __name__ == "__main__":
    main()
