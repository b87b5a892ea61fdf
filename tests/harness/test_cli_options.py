"""The scenario commands' shared options: declared once (RunOptions), expanded into each command's
signature, and handed to the command as one object."""
import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from typer.testing import CliRunner

from tensorfold_bench.cli.commands import app
from tensorfold_bench.cli.options import RunOptions, shared

FLAGS = {f.name for f in dataclasses.fields(RunOptions)}


def test_a_shared_command_gets_its_own_flags_and_one_options_object():
    toy = typer.Typer()
    seen = {}

    @toy.command()
    @shared(omit=("trace",), help={"seed": "The toy's seed."})
    def go(opts: RunOptions, file: Annotated[Path, typer.Argument()],
           levels: Annotated[str, typer.Option("--levels")] = "1"):
        seen.update(opts=opts, file=file, levels=levels)

    res = CliRunner().invoke(toy, ["f.yaml", "--levels", "2,4", "--seed", "7", "--engine-arg=--no-drafts",
                                   "--url", "a=http://x", "--url", "b=http://y", "--out", "o"])
    assert res.exit_code == 0, res.output
    assert seen["file"] == Path("f.yaml") and seen["levels"] == "2,4"
    opts = seen["opts"]
    assert (opts.seed, opts.engine_arg, opts.url, opts.out_dir) == (7, ["--no-drafts"], ["a=http://x", "b=http://y"],
                                                                    Path("o"))
    assert opts.trace is True and opts.device == "cpu"  # not offered, or not given: the field's default
    assert CliRunner().invoke(toy, ["f.yaml", "--no-trace"]).exit_code != 0
    assert "The toy's seed." in CliRunner().invoke(toy, ["--help"], terminal_width=200).output


def params(*path: str) -> dict:
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return {p.name: p for p in cmd.params}


def test_each_scenario_command_offers_the_shared_options_less_those_it_has_no_use_for():
    omitted = {("run", "long-prompt"): set(), ("run", "script"): {"trace"}, ("sweep",): {"plain_check", "trace"},
               ("load",): {"mixed", "split", "trace", "dry_run"}}
    for path, left_out in omitted.items():
        got = params(*path)
        assert FLAGS - left_out <= set(got), path
        assert not left_out & set(got), path
        assert got["out_dir"].opts == ["--out"] and got["out_dir"].default == Path("receipts")
    assert params("run", "script")["seed"].help != params("run", "long-prompt")["seed"].help


def test_settings_get_only_the_keywords_their_builder_takes():
    def build(*, model, engine_args, tokenizer, trace=False):
        pass

    kw = RunOptions(model="tiny", engine_arg=["--no-drafts"], tokenizer=Path("tok")).settings_kwargs(build)
    assert kw == {"model": "tiny", "engine_args": ["--no-drafts"], "tokenizer": "tok", "trace": True}
