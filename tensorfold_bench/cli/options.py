"""The options every scenario command shares (engine, variants, target, receipt), declared once as
a dataclass whose fields carry their typer options. `shared(...)` expands the fields into a
command's signature, so `--help` lists each as if written there, and hands the command one
`RunOptions` object. Typer has no documented way to expand a dataclass; it builds a command from
`inspect.signature`, which honours `__signature__`, and that is the hook used here."""
from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from tensorfold_bench.analysis import stats

Model = Annotated[Optional[str], typer.Option("--model", help="Engine preset (tiny, cpu, qwen3-8b, ...) or a model directory. Default: cpu, or qwen3-8b with --device cuda.")]
Device = Annotated[str, typer.Option("--device", help="cpu or cuda: picks the preset's default timings.")]
Dtype = Annotated[Optional[str], typer.Option("--dtype", help="float32 or bfloat16 (default: the engine's; bfloat16 on cuda).")]
Share = Annotated[Optional[str], typer.Option("--share", help="Prefill shares for the new side: each value is a variant 'stepped p=V' against the base 'whole'.")]
Split = Annotated[Optional[str], typer.Option("--split", help="Split SMs for the new side (CUDA): each value a variant 'split sms=N' (tfengine --prefill-mode split --decode-sms N: a long prompt's cuts on the GPU's other SMs beside the decode rounds on N) against the base 'whole', after any --share and --mixed variants.")]
Mixed = Annotated[Optional[str], typer.Option("--mixed", help="Mixed-forward budgets (ms) for the new side: each value a variant 'mixed budget=V' (tfengine --prefill-mode mixed --mixed-budget V) against the base 'whole', after any --share variants.")]
Order = Annotated[Optional[str], typer.Option("--order", help="Comma sequence of variant names ('base'/'new' alias them). Default: base, news..., reversed news..., base.")]
Url = Annotated[Optional[list[str]], typer.Option("--url", help="Measure a running OpenAI-compatible server (tfengine, vLLM, SGLang): nothing is launched, no verdicts. URL, or NAME=URL repeated to compare several, in the order given.")]
TokenIds = Annotated[str, typer.Option("--token-ids", help="How replies' token ids are asked for: ids (return_token_ids), logprobs (a server started with --return-tokens-as-token-ids), or chunks (none: count text chunks; hashes unknown).")]
Tokenizer = Annotated[Optional[Path], typer.Option("--tokenizer", help="A tokenizer or model directory (config.json / tokenizer.json) to read the vocabulary from, when the server reports none.")]
OutDir = Annotated[Path, typer.Option("--out", help="Directory for the receipt (STEM.md, its data STEM.json.gz, STEM.png) and the run's logs.")]
PlainCheck = Annotated[bool, typer.Option("--plain-check", help="Also run the plain reference (each request alone, whole prompt, no cache, no drafts, 1 stream) and count equal replies.")]
Parallel = Annotated[Optional[int], typer.Option("--parallel", help="Engine lanes (default 4).")]
TensorParallel = Annotated[int, typer.Option("--tensor-parallel", help="Engine ranks: tfengine --tensor-parallel N (one GPU each; 1: not passed).")]
PrefillRows = Annotated[Optional[int], typer.Option("--prefill-rows", help="Rows per prompt cut (default 256 on cpu, 1024 on cuda).")]
MaxModelLen = Annotated[Optional[int], typer.Option("--max-model-len", help="Engine context length (default: B's prompt plus a margin).")]
Seed = Annotated[int, typer.Option("--seed", help="Seeds the engine's dummy weights and the prompts; with --temperature, each request's sampling seed is derived from it and the request's role.")]
Temperature = Annotated[float, typer.Option("--temperature", help="Sampling temperature of every request (0: greedy). Above 0, each request also sends a seed derived from --seed and its role, so replies still compare across runs and with the plain reference.")]
Trace = Annotated[bool, typer.Option("--trace/--no-trace", help="Run the engine with --trace and draw its steps under the timeline.")]
Vocab = Annotated[Optional[int], typer.Option("--vocab", help="Vocabulary size for random prompt ids (default: the server's vocab_size, else --tokenizer DIR, else the --model directory).")]
VariantsFile = Annotated[Optional[Path], typer.Option("--variants", help="YAML file of variants (name, ref, flags, env); the first is the base. Replaces --share/--base/--new.")]
BaseRef = Annotated[Optional[str], typer.Option("--base", help="Git ref of this repository the base runs (checked out in .worktrees/<sha>). Without --share: 'base' at REF vs 'new', both with the engine's default flags.")]
NewRef = Annotated[Optional[str], typer.Option("--new", help="Git ref the new side runs (default: the working tree).")]
AA = Annotated[bool, typer.Option("--aa", help="Also run the base against a copy of itself ('<base> A/A', two runs before a last base run): the noise floor.")]
Predict = Annotated[Optional[Path], typer.Option("--predict", help="YAML ranges per variant and figure, read, hashed and stamped into the receipt before the first run; each result is marked in or out. sim:PROFILE computes the file first: the same scenario and variants simulated on that cost profile, ranges from its spread (written next to the receipt).")]
Margin = Annotated[float, typer.Option("--margin", help="Verdict margin: a change must clear the paired interval and this fraction (0.02 = 2 %).")]
EngineArg = Annotated[Optional[list[str]], typer.Option("--engine-arg", help="Extra engine flag for every variant (repeatable), e.g. --engine-arg=--no-drafts.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Also print a line per sweep cell and rep.")]
Sim = Annotated[Optional[Path], typer.Option("--sim", help="Play every run in virtual time on this cost profile (receipts/profiles/*.json, `tfbench profile`): the engine's real lane host on the profile's costs, no server, a receipt marked simulated, in seconds. The profile's device and model stand for --device and --model (ignored); --token-ids, --tokenizer and --trace are ignored (no server to ask; the host's trace is always kept); --url, --plain-check, --base, --new, --aa and --tensor-parallel are refused.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the variants, the run order, the engine command lines and the estimated time; launch nothing.")]


@dataclass(frozen=True)
class RunOptions:
    """What a scenario command is told besides its own workload: the engine, the variants, the
    target, the receipt and how the run is shown. Field order is the order `--help` lists them."""
    model: Model = None
    device: Device = "cpu"
    dtype: Dtype = None
    share: Share = None
    mixed: Mixed = None
    split: Split = None
    order: Order = None
    url: Url = None
    out_dir: OutDir = Path("receipts")
    plain_check: PlainCheck = False
    variants_file: VariantsFile = None
    base_ref: BaseRef = None
    new_ref: NewRef = None
    aa: AA = False
    predict: Predict = None
    margin: Margin = stats.DEFAULT_MARGIN
    parallel: Parallel = None
    tensor_parallel: TensorParallel = 1
    prefill_rows: PrefillRows = None
    max_model_len: MaxModelLen = None
    seed: Seed = 0
    temperature: Temperature = 0.0
    trace: Trace = True
    engine_arg: EngineArg = None
    vocab: Vocab = None
    tokenizer: Tokenizer = None
    token_ids: TokenIds = "ids"
    sim: Sim = None
    verbose: Verbose = False
    dry_run: DryRun = False

    def settings_kwargs(self, build: Callable) -> dict:
        """The keyword arguments of a scenario's `settings_from_flags` these options answer: a
        command that does not offer an option leaves it to the builder's own default."""
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
              if f.name not in ("sim", "verbose", "dry_run", "engine_arg", "tokenizer")}
        kw["engine_args"] = self.engine_arg
        kw["tokenizer"] = str(self.tokenizer) if self.tokenizer else None
        accepted = inspect.signature(build).parameters
        return {k: v for k, v in kw.items() if k in accepted}


def shared(*, omit: tuple[str, ...] = (), help: dict[str, str] | None = None) -> Callable:
    """Decorates a command `f(opts: RunOptions, *, own options...)`: its CLI signature becomes its
    own options followed by RunOptions' fields, less `omit` (which keep their defaults), with
    `help` replacing a field's help text where this command means something narrower."""
    help = help or {}
    fields = [f for f in dataclasses.fields(RunOptions) if f.name not in omit]
    hints = typing.get_type_hints(RunOptions, include_extras=True)
    unknown = (set(omit) | set(help)) - {f.name for f in dataclasses.fields(RunOptions)}
    if unknown:
        raise TypeError(f"not RunOptions fields: {sorted(unknown)}")

    def option(f: dataclasses.Field) -> inspect.Parameter:
        annotation = hints[f.name]
        if f.name in help:
            base, info = typing.get_args(annotation)
            info = copy.copy(info)
            info.help = help[f.name]
            annotation = Annotated[base, info]
        return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=annotation)

    def wrap(command: Callable) -> Callable:
        own = list(inspect.signature(command, eval_str=True).parameters.values())[1:]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + [option(f) for f in fields]

        @functools.wraps(command)
        def run(**kw):
            opts = RunOptions(**{f.name: kw.pop(f.name) for f in fields})
            return command(opts, **kw)

        run.__signature__ = inspect.Signature(params)
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap
