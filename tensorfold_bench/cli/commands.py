"""`tfbench`: each command turns its flags into settings (the scenario's `settings_from_flags`,
which checks them), makes one library call under a progress display, writes the receipt
(`report.write`) and prints its tables. The scenario commands' shared options arrive as one
`RunOptions` (cli/options.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape

from typer import Abort, Exit

try:  # typer >= 0.29 vendors its own click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

from tensorfold_bench import report
from tensorfold_bench.analysis import predictions
from tensorfold_bench.cli import lifecycle, dry_run as plan, progress
from tensorfold_bench.cli.options import (OutDir, Parallel, PrefillRows, RunOptions, Seed, Temperature, Tokenizer,
                                          Verbose, Vocab, shared)
from tensorfold_bench.client.sampling import Sampling
from tensorfold_bench.errors import FAIL, PASS, BenchError, FlagError
from tensorfold_bench.scenarios import gate as gate_mod
from tensorfold_bench.scenarios import load as load_mod
from tensorfold_bench.scenarios import long_prompt as long_prompt_mod
from tensorfold_bench.scenarios import script as script_mod
from tensorfold_bench.scenarios import sweep as sweep_mod
from tensorfold_bench.analysis import figures as figures_mod
from tensorfold_bench.analysis import load as load_figures
from tensorfold_bench.session import driver, simulate

SCENARIOS = {"long-prompt": long_prompt_mod.LongPrompt, "script": script_mod.ScriptScenario, "sweep": sweep_mod.Sweep,
             "load": load_mod.Load}

console = Console(stderr=True)
out = Console()

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmarks and receipts for LLM inference schedulers.")
run_app = typer.Typer(no_args_is_help=True, help="Run a scenario and write a receipt.")
app.add_typer(run_app, name="run")


def execute(run: Callable[..., tuple[dict, object]], settings, out_dir: Path,
            verbose: bool) -> tuple[dict, dict[str, Path], object]:
    """`run(settings, reporter, save)` under one progress display, the receipt written after every
    run (partial until the last); (data, receipt paths, the receipt's summary as the session
    computed it, which the command prints from). A signal marks the last receipt interrupted and
    exits 128 + its number; an error marks it stopped and goes on up (exit 2)."""
    writer = lifecycle.ReceiptWriter(out_dir)
    try:
        with progress.display(console, verbose) as rep:
            data, summary = run(settings, rep, writer.save)
    except KeyboardInterrupt as e:
        sig = lifecycle.signum_of(e)
        console.print(f"[red]{writer.stopped('interrupted by ' + signal.Signals(sig).name)}[/red]", highlight=False,
                      soft_wrap=True)
        raise Exit(lifecycle.exit_code(sig)) from None
    except BenchError as e:
        if writer.last is not None:
            console.print(writer.stopped("stopped: " + str(e).splitlines()[0]), highlight=False, soft_wrap=True,
                          style="dim")
        raise
    return data, writer.final(data, summary), summary


def sim_target(opts: RunOptions) -> "simulate.SimTarget | None":
    """--sim's profile, read now; a flag a simulation refuses is one line naming it."""
    if opts.sim is None:
        return None
    simulate.refuse_flags({"--url": bool(opts.url), "--plain-check": opts.plain_check,
                           "--base": opts.base_ref is not None, "--new": opts.new_ref is not None, "--aa": opts.aa,
                           "--tensor-parallel": opts.tensor_parallel != 1})
    return simulate.SimTarget.load(opts.sim)


def computed_predictions(predict: Path | None, kw: dict, build: Callable, scenario: str,
                         known: Callable) -> tuple[Path | None, str]:
    """--predict sim:PROFILE: this command's scenario and variants simulated on the profile (its
    costs, and every cost its spread faster and slower), written as a predictions file next to
    the receipt, to be read and stamped before the first run like any other; (path, stamp)."""
    import datetime as dt
    import tempfile

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if predict is None or not str(predict).startswith("sim:"):
        return predict, ""
    try:
        target = simulate.SimTarget.load(str(predict)[4:])
    except FlagError as e:
        raise FlagError("--predict", str(e).removeprefix("--sim: ")) from None
    sim_kw = {**kw, "predict": None, "url": None, "model": target.model, "device": target.device,
              "vocab": kw.get("vocab") or target.vocab, "stamp": stamp}
    for flag in ("plain_check", "aa"):
        if flag in sim_kw:
            sim_kw[flag] = False
    holder = {}

    def run_sim(costs) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            settings = build(**{**sim_kw, "out_dir": tmp})
            settings.session.sim = simulate.SimTarget(target.path, costs)
            holder["settings"] = settings
            scen = SCENARIOS[scenario](settings)
            return scen.predicted(*driver.run(scen))

    run_sim(target.costs)  # the settings the known figures come from
    session = holder["settings"].session
    modes = {target.config(v, session.engine.flags()).cfg.prefill_mode for v in session.variants}
    table, spread = simulate.ranges(run_sim, target.costs, known(holder["settings"]), modes)
    path = simulate.write_predictions(Path(kw["out_dir"]) / f"{stamp}-{scenario}-predictions.yaml", table, target,
                                      spread)
    out.print(f"predictions computed on {target.path} (spread {spread:.1%}): {path}")
    return path, stamp


def plan_note(target: "simulate.SimTarget | None") -> str:
    """Under --sim, what a dry run's engine command lines stand for."""
    if target is None:
        return ""
    return (f"\n\nSimulated on {target.path}: no server is launched; each command line stands for the engine "
            "configuration its run plays in virtual time, in seconds.")


def print_paths(paths: dict[str, Path]) -> None:
    for kind, p in paths.items():
        out.print(f"receipt {kind}: {p}")


def no_valid_run(data: dict, paths: dict[str, Path], valid: Callable[[dict], bool]) -> None:
    """Exit 1, the receipt written, with one line, when every run failed or was invalid."""
    runs = data["runs"]
    if runs and not any(not r.get("error") and valid(r) for r in runs):
        why = next((r["failure"] for r in runs if r.get("failure")), None) or "see the receipt"
        console.print(f"every run failed or was invalid ({why}); receipt {paths['md']}", style="red",
                      highlight=False, soft_wrap=True, markup=False)
        raise Exit(FAIL)


def play_scenario(name: str, mod, opts: RunOptions, own: dict, known: Callable, plan_of: Callable | None = None,
                  sim_vocab: bool = False) -> tuple[dict, dict[str, Path], object] | None:
    """The scenario `mod` with these options and the command's own flags: --sim read, predictions
    computed or read, settings built (and checked) before anything runs, then played under one
    progress display; execute's (data, receipt paths, summary), or None after a dry run's plan is printed.
    `sim_vocab`: under --sim, the profile's vocabulary stands in for a missing --vocab."""
    target = sim_target(opts)
    if target:
        vocab = (opts.vocab or target.vocab) if sim_vocab else opts.vocab
        opts = dataclasses.replace(opts, model=target.model, device=target.device, vocab=vocab)
    kw = {**opts.settings_kwargs(mod.settings_from_flags), **own}
    kw["predict"], kw["stamp"] = computed_predictions(opts.predict, kw, mod.settings_from_flags, name, known)
    settings = mod.settings_from_flags(**kw)
    settings.session.sim = target
    if opts.dry_run:
        print(plan_of(settings) + plan_note(target))
        return None
    return execute(mod.run, settings, opts.out_dir, opts.verbose)


def print_predictions(data: dict) -> None:
    if data.get("predictions"):
        out.print(predictions.Predictions.from_dict(data["predictions"]).summary())


@run_app.command("long-prompt")
@shared(help={"max_model_len": "Engine context length (default: B's prompt plus a margin, or A's prompt and what one stream decodes in --b-at + --c-after + 1 s at 1,500 tokens/s, whichever is larger; rounded up to 256)."})
def long_prompt(
    opts: RunOptions,
    b_at: Annotated[Optional[float], typer.Option("--b-at", help="Seconds after A's send that B sends (default 3 on cpu, 5 on cuda).")] = None,
    c_after: Annotated[float, typer.Option("--c-after", help="Seconds after B's send that C sends.")] = 0.5,
    b_tokens: Annotated[Optional[int], typer.Option("--b-tokens", help="B's cold prompt length (default 4096 on cpu, 32000 on cuda).")] = None,
    c_tokens: Annotated[int, typer.Option("--c-tokens", help="C's prompt length.")] = 34,
    a_tokens: Annotated[Optional[int], typer.Option("--a-tokens", help="A's max_tokens (default: as long as the context allows; A is cancelled when B and C are done).")] = None,
):
    """A decodes; B sends a long cold prompt; C a short chat. Whole prompts vs stepped at each --share."""
    played = play_scenario("long-prompt", long_prompt_mod, opts,
                           dict(b_at=b_at, c_after=c_after, b_tokens=b_tokens, c_tokens=c_tokens, a_tokens=a_tokens),
                           lambda st: figures_mod.predictable_long_prompt(), plan.long_prompt)
    if played is None:
        return
    data, paths, summary = played
    out.print(Markdown(report.long_prompt.summary_markdown(data, summary)))
    print_paths(paths)
    no_valid_run(data, paths, lambda r: r["figures"]["valid"])


@run_app.command("script")
@shared(omit=("trace",), help={
    "predict": "YAML ranges per variant and figure (the script's, e.g. first_token:R), read, hashed and stamped into the receipt before the first run; sim:PROFILE computes them from the simulation first.",
    "max_model_len": "Engine context length (default: the longest stream's prompt and reply, rounded up to 256).",
    "seed": "Seeds the engine's dummy weights; added to the script's seed for its random prompts; with --temperature, each stream's sampling seed is derived from it and the stream's name.",
    "temperature": "Sampling temperature of every stream that sets none (0: greedy)."})
def script(
    opts: RunOptions,
    file: Annotated[Path, typer.Argument(help="The script: a YAML timeline of streams and figures (docs/scripts.md).")],
):
    """A scripted timeline of streams (sends at times or events, cancels, priorities) and its figures."""
    played = play_scenario("script", script_mod, opts, dict(file=file), lambda st: set(st.script.keys), plan.script)
    if played is None:
        return
    data, paths, _ = played
    out.print(Markdown(report.script.summary_markdown(data)))
    print_predictions(data)
    print_paths(paths)
    no_valid_run(data, paths, lambda r: r["figures"]["valid"])


@app.command("sweep")
@shared(omit=("plain_check", "trace"), help={
    "share": "Prefill shares: each value a variant 'stepped p=V' against the base 'whole' (default 0.5, none with --mixed alone).",
    "parallel": "Engine lanes (default: the largest level). Fewer queue a level's streams beyond them in the server."})
def sweep(
    opts: RunOptions,
    levels: Annotated[str, typer.Option("--levels", help="Stream counts, each a level: that many streams start together.")] = "1,2,4,8",
    tokens: Annotated[Optional[int], typer.Option("--tokens", help="Tokens each stream generates (ignore_eos). Default 256; 64 on cpu.")] = None,
    cells: Annotated[Optional[int], typer.Option("--cells", help="Distinct prompt sets per level. Default 4; 2 on cpu.")] = None,
    reps: Annotated[Optional[int], typer.Option("--reps", help="Repetitions of each cell; the median is the cell's figure. Default 3; 2 on cpu.")] = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Each stream's prompt length (seeded token ids).")] = 200,
    procs: Annotated[str, typer.Option("--procs", help="Client processes a level, each with its own event loop and connections, all started at one time. auto (the default): one per 256 streams, up to this host's cores (less one for a server on it), decided before any run so that every variant gets the same client.")] = "auto",
):
    """Concurrent decode: aggregate tok/s at each level, per variant, with verdicts against the base."""
    played = play_scenario("sweep", sweep_mod, opts,
                           dict(levels=levels, tokens=tokens, cells=cells, reps=reps, prompt_tokens=prompt_tokens,
                                procs=procs),
                           lambda st: figures_mod.predictable_sweep(st.script.levels), plan.sweep, sim_vocab=True)
    if played is None:
        return
    data, paths, _ = played
    out.print(Markdown("\n".join(report.sweep.tok_s_table(data))))
    out.print(report.sweep.exactness_line(data))
    print_predictions(data)
    print_paths(paths)
    no_valid_run(data, paths, lambda r: any(v is not None for v in r["figures"].values()))


@app.command("load")
@shared(omit=("mixed", "split", "trace", "dry_run"), help={
    "predict": "YAML ranges per variant and figure (e.g. goodput@LEVEL, ttft_p99@LEVEL), read, hashed and stamped into the receipt before the first run; sim:PROFILE computes them from the simulation first.",
    "max_model_len": "Engine context length (default: the longest request's prompt and reply, a session's whole history, rounded up to 256).",
    "seed": "Seeds the workload (prompts, lengths, arrivals) and the engine's dummy weights; with --temperature, each request's sampling seed is derived from it and the request's id."})
def load(
    opts: RunOptions,
    rate: Annotated[Optional[str], typer.Option("--rate", help="Requests per second, each a level (open loop: requests go at their scheduled times whatever is in flight), e.g. 1,2,4.")] = None,
    arrival: Annotated[str, typer.Option("--arrival", help="Arrival process at each --rate: poisson, gamma (with --burstiness) or constant.")] = "poisson",
    burstiness: Annotated[float, typer.Option("--burstiness", help="Gamma arrivals' shape (vLLM's meaning: 1 is Poisson, below 1 burstier, above 1 steadier).")] = 1.0,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", help="Closed loop instead of --rate: that many requests in flight, each level (e.g. 1,4,8).")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option("--max-concurrency", help="Open loop: at most this many in flight; a request past it waits for a slot, and the wait counts as queueing in the latency from its scheduled send.")] = None,
    procs: Annotated[str, typer.Option("--procs", help="Client processes for an open loop, each with its own event loop: the schedule's sessions dealt round robin, each sent at its own offset from one start, so the server still sees the arrival process asked for. auto (the default): as many as the level's rate needs at the client's CPU a request, measured on this host first, up to its cores.")] = "auto",
    requests: Annotated[Optional[int], typer.Option("--requests", help="Requests per level.")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration", help="Seconds of arrivals per level (instead of --requests).")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up requests first at each level, played and left out of the figures.")] = 0,
    dataset: Annotated[str, typer.Option("--dataset", help="synthetic (seeded random ids), or a file: JSONL prompts, ShareGPT JSON or a Mooncake trace (replayed on its timestamps).")] = "synthetic",
    fmt: Annotated[str, typer.Option("--format", help="The --dataset file's format: auto, jsonl, sharegpt or mooncake.")] = "auto",
    input_len: Annotated[Optional[str], typer.Option("--input-len", help="Synthetic prompt length (after a shared prefix): N, LO:HI, normal:MEAN,SD or lognormal:MEAN,SD. Default 256.")] = None,
    output_len: Annotated[Optional[str], typer.Option("--output-len", help="Reply length (max_tokens, ignore_eos): N, LO:HI, normal:MEAN,SD or lognormal:MEAN,SD. Default 64 (a file's own lengths where it gives them).")] = None,
    prefix_groups: Annotated[int, typer.Option("--prefix-groups", help="Synthetic prompts in this many groups, each group's prompts sharing a prefix of --prefix-len tokens.")] = 0,
    prefix_len: Annotated[int, typer.Option("--prefix-len", help="The shared prefix's length in tokens (with --prefix-groups).")] = 0,
    turns: Annotated[int, typer.Option("--turns", help="Multi-turn sessions of this many turns: each turn's prompt is the history (earlier prompts and replies) plus a new part.")] = 1,
    think: Annotated[float, typer.Option("--think", help="Seconds between a turn's reply and the session's next turn.")] = 0.0,
    time_scale: Annotated[float, typer.Option("--time-scale", help="A trace's timestamps multiplied by this (0.5: twice as fast).")] = 1.0,
    inject: Annotated[Optional[str], typer.Option("--inject", help="Cold long prompts sent into the load: LEN@EVERY (seconds), LEN@T1,T2,... or LEN:OUT@...; the receipt gives the background's pauses and first tokens while they fill.")] = None,
    slo: Annotated[Optional[str], typer.Option("--slo", help="Service-level bounds for goodput, each with its unit: ttft=500ms,tpot=50ms,e2e=10s (DistServe: requests meeting every bound, per second).")] = None,
):
    """Traffic: open-loop arrivals or a closed loop, datasets and traces, goodput under an SLO; whole vs stepped at each --share."""
    if opts.sim is not None and max_concurrency:
        sim_target(opts)  # a flag --sim refuses outright is named first
        raise FlagError("--max-concurrency", "not with --sim: the simulated player sends open loop or closed "
                                             "loop (--concurrency) only")
    workload = dict(dataset=dataset, fmt=fmt, input_len=input_len, output_len=output_len, prefix_groups=prefix_groups,
                    prefix_len=prefix_len, turns=turns, think=think, time_scale=time_scale, rates=rate,
                    arrival=arrival, burstiness=burstiness, concurrency=concurrency, requests=requests,
                    duration=duration, warmup=warmup, inject=inject)
    data, paths, _ = play_scenario(
        "load", load_mod, opts, dict(workload=workload, slo=slo, max_concurrency=max_concurrency, procs=procs),
        lambda st: load_figures.predictable([lv.label for lv in st.spec.levels]), sim_vocab=True)
    out.print(Markdown(report.load.summary_markdown(data)))
    print_predictions(data)
    print_paths(paths)
    no_valid_run(data, paths, lambda r: bool(r.get("valid")))


@app.command("frontier")
def frontier(
    sim: Annotated[Path, typer.Option("--sim", help="The cost profile to simulate on (receipts/profiles/*.json).")],
    shares: Annotated[str, typer.Option("--shares", help="Prefill shares: each a variant 'stepped p=V'.")] = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1",
    mixed_budgets: Annotated[Optional[str], typer.Option("--mixed-budgets", help="Mixed-forward budgets (ms), each a variant 'mixed budget=V' (default: 10,25,50,100 where the profile has mixed samples; 'none' for none).")] = None,
    split: Annotated[Optional[str], typer.Option("--split", help="Decode SMs, each a variant 'split sms=N' (default: every partition the profile measured; 'none' for none).")] = None,
    b_at: Annotated[Optional[float], typer.Option("--b-at", help="Seconds after A's send that B sends (default: the device's).")] = None,
    b_tokens: Annotated[Optional[int], typer.Option("--b-tokens", help="B's cold prompt length (default: the device's).")] = None,
    c_after: Annotated[float, typer.Option("--c-after", help="Seconds after B's send that C sends.")] = 0.5,
    parallel: Parallel = None,
    prefill_rows: PrefillRows = None,
    out_dir: OutDir = Path("receipts"),
    verbose: Verbose = False,
):
    """The frontier in seconds: the long-prompt test in virtual time at every share, mixed budget
    and split count, each variant once (a simulation is deterministic), A kept against B's
    slowdown with the policies' lines side by side; a simulated long-prompt receipt."""
    target = simulate.SimTarget.load(sim)
    budgets = mixed_budgets if mixed_budgets is not None else ("10,25,50,100" if target.costs.has("mixed") else "none")
    sms = split if split is not None else (",".join(str(n) for n in target.split_sms()) or "none")
    budgets, sms = (None if v.strip().lower() == "none" else v for v in (budgets, sms))
    settings = long_prompt_mod.settings_from_flags(
        model=target.model, device=target.device, dtype=None, share=shares, mixed=budgets, split=sms, order=None,
        url=None, out_dir=out_dir, plain_check=False, parallel=parallel, prefill_rows=prefill_rows,
        max_model_len=None, seed=0, trace=True, engine_args=None, b_at=b_at, c_after=c_after, b_tokens=b_tokens,
        c_tokens=34, a_tokens=None, vocab=target.vocab)
    settings.session.order = [v.name for v in settings.session.variants]
    settings.session.sim = target
    data, paths, summary = execute(long_prompt_mod.run, settings, out_dir, verbose)
    rows = report.long_prompt.frontier_lines(data, summary=summary)
    out.print(Markdown("\n".join(rows or ["No frontier: fewer than two variants have both figures."])))
    print_paths(paths)


@app.command("gate")
def gate(
    base_ref: Annotated[str, typer.Option("--base", help="Git ref of the base (default: the previous commit).")] = "HEAD~1",
    preset: Annotated[str, typer.Option("--preset", help="cpu (CI) or tiny (seconds; long-prompt figures shown, not judged).")] = "cpu",
    margin: Annotated[float, typer.Option("--margin", help="Throughput margin beyond the noise (fraction).")] = 0.05,
    long_margin: Annotated[float, typer.Option("--long-margin", help="Margin for long-prompt figures (fraction).")] = 0.25,
    accept_new_outputs: Annotated[bool, typer.Option("--accept-new-outputs", help="A deliberate change of outputs: base's and new's replies may differ (each side must still agree with itself). Or commit .ci/accept-new-outputs naming the base commit.")] = False,
    new_env: Annotated[Optional[list[str]], typer.Option("--new-env", help="KEY=VALUE for the new side's engine environment (repeatable), e.g. TFENGINE_DECODE_SLEEP_MS=20 to see the gate fail.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for the gate's receipt and logs.")] = Path("runs/gate"),
    order: Annotated[str, typer.Option("--order", help="Run order, a comma sequence of base and new, e.g. base,new,new,base,new,base,base,new: a burst of load in the middle then cannot hit only one side.")] = "base,new,new,base",
    temperature: Temperature = 0.0,
    seed: Seed = 0,
    vocab: Vocab = None,
    tokenizer: Tokenizer = None,
    load_rate: Annotated[Optional[float], typer.Option("--load", help="Also play a short Poisson load at this many requests/s in every run (tfbench load's player): output tok/s and TTFT p99 judged, every reply compared.")] = None,
    schedule_profile: Annotated[Optional[Path], typer.Option("--schedule-profile", help="Cost profile for the schedule layer's replay in virtual time (default: the CPU preset's in receipts/profiles/).")] = None,
    no_schedule: Annotated[bool, typer.Option("--no-schedule", help="Skip the schedule layer (base's and new's scheduler replayed in virtual time).")] = False,
    accept_schedule: Annotated[bool, typer.Option("--accept-schedule", help="A deliberate change of the schedule: worse simulated figures are shown, not failed. Or commit .ci/accept-schedule naming the base commit.")] = False,
    verbose: Verbose = False,
):
    """CI regression gate: base (HEAD~1) vs the working tree, base/new/new/base. Exit 0 pass, 1 regression, 2 error."""
    settings = gate_mod.GateSettings(base_ref=base_ref, preset=preset, margin=margin, long_margin=long_margin,
                                     accept_new_outputs=accept_new_outputs, out_dir=out_dir,
                                     new_env=gate_mod.parse_env(new_env), order=[x.strip() for x in order.split(",")],
                                     vocab=vocab, tokenizer=str(tokenizer) if tokenizer else None,
                                     sampling=Sampling(temperature, seed), load_rate=load_rate,
                                     schedule=not no_schedule, schedule_profile=schedule_profile,
                                     accept_schedule=accept_schedule)
    data, paths, _ = execute(gate_mod.run_gate, settings, out_dir, verbose)
    sys.stdout.write(paths["md"].read_text())
    out.print(f"receipt md: {paths['md']}\nreceipt json: {paths['json']}")
    raise Exit(PASS if data["passed"] else FAIL)


@app.command("calibrate")
def calibrate(
    levels: Annotated[str, typer.Option("--levels", help="Stream counts, each a burst of that many streams at once.")] = "1,8,64,256",
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens each stream reads.")] = 200,
    first_ms: Annotated[float, typer.Option("--first-ms", help="The synthetic server's first token, ms after it read the request.")] = 20.0,
    every_ms: Annotated[float, typer.Option("--every-ms", help="Then one token every this many ms.")] = 10.0,
    stall_every: Annotated[int, typer.Option("--stall-every", help="Every this-th stream stalls once (0: none).")] = 16,
    stall_ms: Annotated[float, typer.Option("--stall-ms", help="The stall: this many ms more before the middle token.")] = 100.0,
    client: Annotated[str, typer.Option("--client", help="Clients to compare, comma-separated: wire (the default client), live (the same, decoding as bytes come), httpx (httpx's line iterator), httpx:N (with at most N connections: a pooled client, as many load tools use).")] = "wire,live",
    procs: Annotated[int, typer.Option("--procs", help="Worker processes for the wire client, each with its own event loop (1: the harness's own loop).")] = 1,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the table's data here.")] = None,
):
    """The client's error against a synthetic server with an exact schedule, at rising levels."""
    from tensorfold_bench.calibrate import client_error as calibrate_mod
    settings = calibrate_mod.parse_settings(levels, tokens, first_ms, every_ms, stall_every, stall_ms, client, procs)
    data = calibrate_mod.run(settings, lambda text: console.print(text, style="dim", highlight=False))
    if json_out:
        json_out.write_text(json.dumps(data, indent=1) + "\n")
    sys.stdout.write(calibrate_mod.table(data))


@app.command("profile", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                          "help_option_names": []})
def profile_command(ctx: typer.Context):
    """A cost profile for the simulator: the engine's forwards timed once on this device (`tfengine
    profile`'s flags, --help for them). Needs the engine extra: pip install "tfbench[engine]"."""
    try:
        import torch  # noqa: F401  (the profile times the engine's own forwards)
        from engine import cli as engine_cli
        from engine.config import ConfigError
    except ModuleNotFoundError as e:
        raise BenchError(f"tfbench profile times the engine, which needs {e.name}, not installed here: "
                         f'pip install "tfbench[engine]"') from None
    try:
        engine_cli.app(["profile", *ctx.args], prog_name="tfbench", standalone_mode=False)
    except ConfigError as e:
        raise BenchError(str(e)) from None


@app.command("compare")
def compare(a: Annotated[Path, typer.Argument(help="The earlier receipt's data, STEM.json.gz (or an older receipt's STEM.json): the reference.")],
            b: Annotated[Path, typer.Argument(help="The later receipt's data, STEM.json.gz or STEM.json.")]):
    """Compare two saved receipts figure by figure: medians, A's span, B vs A in percent."""
    for p in (a, b):
        if not p.exists():
            raise FlagError("RECEIPT", f"{p} does not exist")
    with incomplete_receipt(f"{a} or {b}"):
        sys.stdout.write(report.compare.markdown(report.read(a), report.read(b), str(a), str(b)))


@app.command("report")
def report_command(path: Annotated[Path, typer.Argument(help="A receipt's data: STEM.json.gz (or an older receipt's STEM.json).")],
                   png: Annotated[bool, typer.Option("--png/--no-png", help="Redraw the pictures beside it (STEM.png; a long-prompt's STEM-frontier.png too).")] = True):
    """Re-render a receipt's Markdown (STEM.md, and pictures) from its data alone; print the Markdown."""
    if not path.exists():
        raise FlagError("RECEIPT", f"{path} does not exist")
    with incomplete_receipt(str(path)):
        sys.stdout.write(report.rerender(path, png))
        partial = report.read(path).get("partial")
    if partial:
        console.print(f"partial receipt ({partial.get('why', 'in progress')}): {lifecycle.missing_line(partial)}",
                      highlight=False, soft_wrap=True)


@contextlib.contextmanager
def incomplete_receipt(what: str):
    """A receipt with the schema but a field missing or of the wrong kind: one line, no traceback."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        raise BenchError(f"{what}: not a complete tfbench receipt ({type(e).__name__}: {e})") from None


def main() -> None:
    lifecycle.install_signals()
    try:
        rv = app(standalone_mode=False)
    except BenchError as e:
        first, _, rest = str(e).partition("\n")
        # escaped: a message may quote brackets (`tfbench[engine]`), which are not markup
        console.print(f"[red]error: {escape(first)}[/red]", highlight=False, soft_wrap=True)
        if rest:
            console.print(rest, markup=False, highlight=False, style="dim", soft_wrap=True)
        sys.exit(2)
    except Exit as e:
        sys.exit(e.exit_code)
    except ClickException as e:
        msg = e.format_message()
        if msg:  # an empty message: the help was already shown (no arguments)
            ctx = getattr(e, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx else ""
            console.print(f"[red]error: {escape(msg)}{escape(hint)}[/red]", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, Abort) as e:  # before or after the runs: nothing to keep
        sig = lifecycle.signum_of(e)
        console.print(f"[red]interrupted by {signal.Signals(sig).name}[/red]")
        sys.exit(lifecycle.exit_code(sig))
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
