"""`tfbench`: each command is a thin adapter over a library call (bench.run_long_prompt,
receipt.write / receipt.render_markdown). Shared options are Annotated aliases defined once, so
later commands (sweep) reuse the variant and engine flags."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from typer import Abort, Exit

try:  # typer >= 0.29 vendors its own click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

from tensorfold_bench import bench, receipt
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.scenario import LongPromptScript
from tensorfold_bench.variants import Variant, default_order, parse_floats, parse_order, share_variants

console = Console(stderr=True)
out = Console()

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmarks and receipts for LLM inference schedulers.")
run_app = typer.Typer(no_args_is_help=True, help="Run a scenario and write a receipt.")
app.add_typer(run_app, name="run")

# ---- shared options (engine and variants) ----------------------------------------------
Model = Annotated[Optional[str], typer.Option("--model", help="Engine preset (tiny, cpu, qwen3-8b, ...) or a model directory. Default: cpu, or qwen3-8b with --device cuda.")]
Device = Annotated[str, typer.Option("--device", help="cpu or cuda: picks the preset's default timings.")]
Dtype = Annotated[Optional[str], typer.Option("--dtype", help="float32 or bfloat16 (default: the engine's; bfloat16 on cuda).")]
Share = Annotated[str, typer.Option("--share", help="Prefill shares for the new side: each value is a variant 'stepped p=V' against the base 'whole'.")]
Order = Annotated[Optional[str], typer.Option("--order", help="Comma sequence of variant names ('base'/'new' alias them). Default: base, news..., reversed news..., base.")]
Url = Annotated[Optional[str], typer.Option("--url", help="Target a running OpenAI-compatible server (tfengine, vLLM, SGLang): nothing is launched.")]
OutDir = Annotated[Path, typer.Option("--out", help="Directory for the receipt (Markdown, JSON, PNG) and the run's logs.")]
PlainCheck = Annotated[bool, typer.Option("--plain-check", help="Also run the plain reference (each request alone, whole prompt, no cache, no drafts, 1 stream) and count equal replies.")]
Parallel = Annotated[Optional[int], typer.Option("--parallel", help="Engine lanes (default 4).")]
PrefillRows = Annotated[Optional[int], typer.Option("--prefill-rows", help="Rows per prompt cut (default 256 on cpu, 1024 on cuda).")]
MaxModelLen = Annotated[Optional[int], typer.Option("--max-model-len", help="Engine context length (default: B's prompt plus a margin).")]
Seed = Annotated[int, typer.Option("--seed", help="Seeds the engine's dummy weights and the prompts.")]
Trace = Annotated[bool, typer.Option("--trace/--no-trace", help="Run the engine with --trace and draw its steps under the timeline.")]
Vocab = Annotated[Optional[int], typer.Option("--vocab", help="Vocabulary size for random prompt ids (default: what the server reports; needed for vLLM/SGLang).")]
EngineArg = Annotated[Optional[list[str]], typer.Option("--engine-arg", help="Extra engine flag for every variant (repeatable), e.g. --engine-arg=--no-drafts.")]


@dataclass(frozen=True)
class Preset:
    model: str
    b_at: float
    b_tokens: int
    prefill_rows: int
    dtype: str | None


PRESETS = {"cpu": Preset("cpu", 3.0, 4096, 256, None), "cuda": Preset("qwen3-8b", 5.0, 32000, 1024, "bfloat16")}


def positive(flag: str, v: float | int | None) -> None:
    if v is not None and not v > 0:
        raise FlagError(flag, f"must be positive, not {v}")


class RichReporter:
    def __init__(self, progress: Progress):
        self.p, self.task = progress, None

    def start(self, total):
        self.task = self.p.add_task("starting", total=total)

    def step(self, text):
        self.p.update(self.task, description=text)

    def advance(self):
        self.p.advance(self.task)

    def note(self, text):
        self.p.console.print(f"  {text}")


def variants_and_order(share: str, order: str | None) -> tuple[list[Variant], list[str]]:
    """--share and --order -> [base, news...] and the run order (shared by every scenario)."""
    base, news = share_variants(parse_floats("--share", share))
    variants = [base, *news]
    return variants, (parse_order(order, variants) if order else default_order(base, news))


def engine_setup(*, model, device, dtype, parallel, prefill_rows, max_model_len, seed, trace, engine_args,
                 url=None) -> bench.EngineSetup:
    """The shared engine flags, with the device preset's defaults."""
    pre = preset(device)
    for flag, v in (("--parallel", parallel), ("--prefill-rows", prefill_rows), ("--max-model-len", max_model_len)):
        positive(flag, v)
    return bench.EngineSetup(model=model or pre.model, device=device, dtype=dtype or pre.dtype,
                             parallel=parallel or 4, prefill_rows=prefill_rows or pre.prefill_rows,
                             max_model_len=None if url else max_model_len, seed=seed, trace=trace,
                             extra_args=list(engine_args or []))


def preset(device: str) -> Preset:
    if device not in PRESETS:
        raise FlagError("--device", f"must be cpu or cuda, not {device!r}")
    return PRESETS[device]


def long_prompt_settings(*, model, device, dtype, share, order, url, out_dir, plain_check, parallel, prefill_rows,
                         max_model_len, seed, trace, engine_args, b_at, c_after, b_tokens, c_tokens, a_tokens,
                         vocab=None, stamp="") -> bench.LongPromptSettings:
    """Flags -> settings, with the device preset's defaults; every bad value names its flag."""
    pre = preset(device)
    for flag, v in (("--b-at", b_at), ("--b-tokens", b_tokens), ("--c-tokens", c_tokens), ("--a-tokens", a_tokens),
                    ("--vocab", vocab)):
        positive(flag, v)
    if c_after < 0:
        raise FlagError("--c-after", f"must be at least 0, not {c_after}")
    variants, order_names = variants_and_order(share, order)
    b_tokens = b_tokens or pre.b_tokens
    mml = max_model_len or (-(-(b_tokens + 64) // 256) * 256)  # B's prompt and reply, rounded up
    script = LongPromptScript(b_at=b_at if b_at is not None else pre.b_at, c_after=c_after, b_tokens=b_tokens,
                              c_tokens=c_tokens, seed=seed)
    script = replace(script, a_max_tokens=a_tokens or (mml - script.a_prompt_tokens - 1))
    engine = engine_setup(model=model, device=device, dtype=dtype, parallel=parallel, prefill_rows=prefill_rows,
                          max_model_len=mml, seed=seed, trace=trace, engine_args=engine_args, url=url)
    return bench.LongPromptSettings(engine=engine, script=script, variants=variants, order=order_names,
                                    out_dir=out_dir, url=url, plain_check=plain_check, stamp=stamp, vocab=vocab)


def execute(settings: bench.LongPromptSettings) -> dict[str, Path]:
    """Run with a progress display, write the receipt, print the tables; return the paths."""
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        data = bench.run_long_prompt(settings, RichReporter(progress))
    paths = receipt.write(data, settings.out_dir, settings.run_dir.name)
    show(data)
    for kind, p in paths.items():
        out.print(f"receipt {kind}: {p}")
    if data["runs"] and all(r.get("error") for r in data["runs"]):
        raise BenchError(f"every run's server failed; see {paths['md']}\n{data['runs'][0]['error']}")
    return paths


def show(data: dict) -> None:
    md = "\n".join(receipt.table(data) + ["", "**Exactness.**", *receipt.exactness_lines(data)])
    out.print(Markdown(md))


@run_app.command("long-prompt")
def long_prompt(
    model: Model = None,
    device: Device = "cpu",
    dtype: Dtype = None,
    share: Share = "0.5",
    order: Order = None,
    url: Url = None,
    out_dir: OutDir = Path("receipts"),
    plain_check: PlainCheck = False,
    parallel: Parallel = None,
    prefill_rows: PrefillRows = None,
    max_model_len: MaxModelLen = None,
    seed: Seed = 0,
    trace: Trace = True,
    engine_arg: EngineArg = None,
    vocab: Vocab = None,
    b_at: Annotated[Optional[float], typer.Option("--b-at", help="Seconds after A's send that B sends (default 3 on cpu, 5 on cuda).")] = None,
    c_after: Annotated[float, typer.Option("--c-after", help="Seconds after B's send that C sends.")] = 0.5,
    b_tokens: Annotated[Optional[int], typer.Option("--b-tokens", help="B's cold prompt length (default 4096 on cpu, 32000 on cuda).")] = None,
    c_tokens: Annotated[int, typer.Option("--c-tokens", help="C's prompt length.")] = 34,
    a_tokens: Annotated[Optional[int], typer.Option("--a-tokens", help="A's max_tokens (default: as long as the context allows; A is cancelled when B and C are done).")] = None,
):
    """A decodes; B sends a long cold prompt; C a short chat. Whole prompts vs stepped at each --share."""
    settings = long_prompt_settings(model=model, device=device, dtype=dtype, share=share, order=order, url=url,
                                    out_dir=out_dir, plain_check=plain_check, parallel=parallel,
                                    prefill_rows=prefill_rows, max_model_len=max_model_len, seed=seed, trace=trace,
                                    engine_args=engine_arg, b_at=b_at, c_after=c_after, b_tokens=b_tokens,
                                    c_tokens=c_tokens, a_tokens=a_tokens, vocab=vocab)
    execute(settings)


@app.command("report")
def report(path: Annotated[Path, typer.Argument(help="A receipt's JSON.")],
           png: Annotated[bool, typer.Option("--png/--no-png", help="Redraw the timeline beside the JSON.")] = True):
    """Re-render a receipt's Markdown (and timeline) from its JSON alone; print the Markdown."""
    if not path.exists():
        raise FlagError("RECEIPT", f"{path} does not exist")
    data = receipt.load(path)
    png_path = receipt.render_png(data, path.with_suffix(".png")) if png else path.with_suffix(".png")
    png_path = png_path if png_path is not None and png_path.exists() else None
    md = receipt.render_markdown(data, png_path.name if png_path else None)
    path.with_suffix(".md").write_text(md)
    sys.stdout.write(md)


def main() -> None:
    try:
        rv = app(standalone_mode=False)
    except BenchError as e:
        first, _, rest = str(e).partition("\n")
        console.print(f"[red]error: {first}[/red]", highlight=False, soft_wrap=True)
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
            console.print(f"[red]error: {msg}{hint}[/red]", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, Abort):
        console.print("[red]interrupted[/red]")
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
