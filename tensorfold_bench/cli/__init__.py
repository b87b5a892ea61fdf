"""The `tfbench` command line: commands (flags -> a library call -> a receipt), the progress
display, a command's life (checkpoints, signals, exit codes) and `--dry-run`."""
from tensorfold_bench.cli.commands import app, main

__all__ = ["app", "main"]
