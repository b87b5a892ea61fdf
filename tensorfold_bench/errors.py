"""The errors tfbench expects: `cli.main` turns each into one red line and exit code 2."""
from __future__ import annotations

PASS, FAIL = 0, 1  # the gate's exit codes: pass, regression (2: a BenchError, usage or infrastructure)


class BenchError(Exception):
    """A known failure (bad flag value, server that would not start, ...): one line, no traceback."""


class FlagError(BenchError):
    """A bad value for a command-line flag; the message names the flag."""

    def __init__(self, flag: str, message: str):
        super().__init__(f"{flag}: {message}")
        self.flag = flag


class ServerError(BenchError):
    """The engine server died or never became healthy; the message carries its log's tail."""

    def __init__(self, what: str, log: str = "", tail: str = ""):
        super().__init__(f"{what} (log {log})" + (f":\n{tail}" if tail else "") if log else what)
        self.what, self.log, self.tail = what, log, tail
        self.variant: str | None = None  # the variant whose run failed, set by the session

    @property
    def last_line(self) -> str:
        lines = [ln for ln in self.tail.splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""


class WorkloadError(BenchError):
    """A malformed workload file; the message starts FILE:LINE: and says what is wrong there."""
