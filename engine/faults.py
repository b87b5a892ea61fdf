"""Fault and slow-down hooks for tests, as a wrapper around a backend.

`tfengine serve` reads these once at start-up and wraps its runner only when one is set, so a
plain server's loop never looks at the environment:
- TFENGINE_FAIL_STEP=k: the k-th prompt step (1-based) raises; that stream ends with an error
  event, the others run on.
- TFENGINE_FAIL_ROUND=k: the k-th decode round raises; every stream in that round ends with an
  error event, the server serves on and later replies keep their ids.
- TFENGINE_DECODE_SLEEP_MS=m: every decode round sleeps m ms first (a slower build: the CI gate's
  test that it notices one).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping

from engine.config import ConfigError


@dataclass(frozen=True)
class Faults:
    fail_step: int | None = None
    fail_round: int | None = None
    decode_sleep_s: float = 0.0

    @property
    def any(self) -> bool:
        return self.fail_step is not None or self.fail_round is not None or self.decode_sleep_s > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Faults":
        """Unset or empty means off; a malformed value is a ConfigError naming the variable."""
        def count(name):
            raw = env.get(name, "").strip()
            if not raw:
                return None
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigError(f"{name} must be a whole number >= 1, not {raw!r}")
            return int(raw)

        raw = env.get("TFENGINE_DECODE_SLEEP_MS", "").strip()
        try:
            sleep_ms = float(raw) if raw else 0.0
        except ValueError:
            sleep_ms = math.nan
        if not (0 <= sleep_ms < math.inf):
            raise ConfigError(f"TFENGINE_DECODE_SLEEP_MS must be a number of milliseconds >= 0, not {raw!r}")
        return cls(count("TFENGINE_FAIL_STEP"), count("TFENGINE_FAIL_ROUND"), sleep_ms / 1000.0)


class FaultyBackend:
    """The wrapped backend with the hooks of `faults`; everything else passes through."""

    def __init__(self, inner, faults: Faults):
        self.inner, self.faults = inner, faults
        self.steps = 0  # prompt steps asked for so far
        self.rounds = 0  # decode rounds asked for so far

    def __getattr__(self, name):
        return getattr(self.inner, name)  # parallel, max_model_len, vocab_size, eos_token_ids, ...

    def prefill_step(self, *args, **kwargs):
        self.steps += 1
        if self.steps == self.faults.fail_step:
            raise RuntimeError(f"injected failure at prefill step {self.steps}")
        return self.inner.prefill_step(*args, **kwargs)

    def decode(self, *args, **kwargs):
        self.rounds += 1
        if self.faults.decode_sleep_s:
            time.sleep(self.faults.decode_sleep_s)
        if self.rounds == self.faults.fail_round:
            raise RuntimeError(f"injected failure at decode round {self.rounds}")
        return self.inner.decode(*args, **kwargs)

    def mixed(self, cuts, *args, **kwargs):
        """A mixed forward is the cuts' steps and a round at once: each hook sees it as both."""
        self.steps += len(cuts)
        self.rounds += 1
        if self.faults.decode_sleep_s:
            time.sleep(self.faults.decode_sleep_s)
        if self.faults.fail_step is not None and self.steps - len(cuts) < self.faults.fail_step <= self.steps:
            raise RuntimeError(f"injected failure at prefill step {self.faults.fail_step}")
        if self.rounds == self.faults.fail_round:
            raise RuntimeError(f"injected failure at decode round {self.rounds}")
        return self.inner.mixed(cuts, *args, **kwargs)


def with_faults(backend, faults: Faults):
    """`backend` itself when no hook is set; otherwise the wrapper."""
    return FaultyBackend(backend, faults) if faults.any else backend
