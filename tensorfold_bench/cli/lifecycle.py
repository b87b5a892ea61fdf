"""A command's life: its receipt written after every finished run, and how it ends.

- `ReceiptWriter.save(data, summary)` writes the receipt so far (JSON and Markdown, no picture)
  after each run, marked partial (`data["partial"]`: how many runs are done, which are missing)
  until the last; `final(data, summary)` writes the whole receipt. The summary is the session's
  analysis of that receipt (driver.Scenario.summarise), rendered as it is, not computed again. A crash or a signal therefore keeps every
  finished run on disk.
- `install_signals()` turns SIGTERM and SIGHUP into `Interrupted` (a KeyboardInterrupt, so asyncio
  and the launchers' `finally` clean up as for Ctrl-C); `stopped(why)` marks the last saved
  receipt interrupted (or stopped by an error) and says so in one line.
- Exit codes: 0 ok, 1 every run failed or was invalid (or the gate's regression), 2 usage or
  infrastructure error, 128 + the signal when interrupted (130 SIGINT, 143 SIGTERM, 129 SIGHUP).
"""
from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Callable

from tensorfold_bench import report



class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT's KeyboardInterrupt carries no number; this does)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signum_of(e: BaseException | None) -> int:
    """The signal behind an interrupt (click turns one into Abort; the cause keeps it)."""
    while e is not None:
        if isinstance(e, Interrupted):
            return e.signum
        e = e.__cause__ or e.__context__
    return signal.SIGINT


def exit_code(signum: int) -> int:
    return 128 + int(signum)


def _raise(signum, _frame):
    for s in (signal.SIGTERM, signal.SIGHUP):  # a second one ends at once (the lifeline still stops engines)
        signal.signal(s, signal.SIG_DFL)
    raise Interrupted(signum)


def install_signals() -> None:
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _raise)


def missing_line(partial: dict) -> str:
    """'2 of 4 runs finished; missing: run 3 (new), run 4 (base)'."""
    miss = ", ".join(partial.get("missing") or []) or "nothing"
    return f"{partial['done']} of {partial['total']} runs finished; missing: {miss}"


class ReceiptWriter:
    """Writes one command's receipt under `out_dir` as its runs finish; remembers the last one."""

    def __init__(self, out_dir: Path, say: Callable[[str], None] = print):
        self.out_dir, self.say = Path(out_dir), say
        self.last: dict | None = None  # a copy of the last data saved
        self.paths: dict[str, Path] = {}

    def _stem(self, data: dict) -> str:
        return Path(data["settings"]["run_dir"]).name

    def save(self, data: dict, summary: object = None) -> None:
        """The receipt so far (partial while data["partial"] is set): JSON and Markdown."""
        self.last = json.loads(json.dumps(report.store.plain(data)))
        self.paths = report.write(self.last, self.out_dir, self._stem(self.last), png=False, summary=summary)

    def final(self, data: dict, summary: object = None) -> dict[str, Path]:
        data["partial"] = None
        self.last = data
        self.paths = report.write(data, self.out_dir, self._stem(data), summary=summary)
        return self.paths

    def stopped(self, why: str) -> str:
        """Mark the last saved receipt as stopped (`why`: 'interrupted by SIGTERM', ...), rewrite
        it, and return the one line that says so."""
        if self.last is None:
            return f"{why} before the first run finished: no receipt written"
        partial = self.last.get("partial") or {"done": len(self.last.get("runs") or []),
                                              "total": len(self.last["settings"].get("order") or []), "missing": []}
        partial["why"] = why
        self.last["partial"] = partial
        self.paths = report.write(self.last, self.out_dir, self._stem(self.last), png=False)
        return f"{why}: partial receipt ({missing_line(partial)}): {self.paths['md']}"
