"""One progress display for a whole command, on stderr: runs done of total, the current run's
variant (and, for a sweep, its level, cell and rep), elapsed time, the time left estimated from
the runs so far, and one line per finished run. Per-cell lines only with --verbose."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text


def clock_text(seconds: float) -> str:
    s = int(round(max(seconds, 0)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def time_left(done: int, total: int, finished_s: float, into_current_s: float) -> float | None:
    """Seconds left: the mean finished run's time for each run not done, less the time already
    spent in the current one; None before the first run finishes."""
    if done <= 0 or total <= done:
        return None if total > done else 0.0
    per_run = finished_s / done
    return max(per_run * (total - done) - into_current_s, 0.0)


class EtaColumn(ProgressColumn):
    """'~2:10 left' from the runs so far (rich's own estimate wants many small steps)."""

    def render(self, task: Task) -> Text:
        f = task.fields
        now = time.monotonic()
        left = time_left(int(task.completed), int(task.total or 0), f.get("finished_s", 0.0),
                         now - f.get("run_started", now))
        return Text("" if left is None else f"~{clock_text(left)} left", style="progress.remaining")


class RichReporter:
    """The driver's Reporter (tensorfold_bench.session.driver) on a rich Progress."""

    def __init__(self, progress: Progress, verbose: bool = False):
        self.p, self.verbose, self.task = progress, verbose, None
        self.current = ""
        self.t0 = self.run_t0 = time.monotonic()

    def start(self, total: int) -> None:
        self.t0 = self.run_t0 = time.monotonic()
        self.task = self.p.add_task("starting", total=total, finished_s=0.0, run_started=self.t0)

    def step(self, text: str) -> None:
        self.current, self.run_t0 = text, time.monotonic()
        self.p.update(self.task, description=text, run_started=self.run_t0)

    def status(self, text: str) -> None:
        self.p.update(self.task, description=f"{self.current} · {text}")
        if self.verbose:
            self.p.console.print(f"    {text}", highlight=False)

    def advance(self) -> None:
        self.p.update(self.task, advance=1, finished_s=time.monotonic() - self.t0)

    def note(self, text: str) -> None:
        took = clock_text(time.monotonic() - self.run_t0)
        self.p.console.print(f"  {text}  [dim]({took})[/dim]", highlight=False)


@contextmanager
def display(console: Console, verbose: bool = False) -> Iterator[RichReporter]:
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                  TextColumn("{task.completed}/{task.total} runs"), TimeElapsedColumn(), EtaColumn(),
                  console=console, transient=False) as progress:
        yield RichReporter(progress, verbose)
