"""--inject: cold long prompts sent into the background load, at fixed times.

    LEN@EVERY          LEN random ids every EVERY seconds, from EVERY on (EVERY, 2 EVERY, ...)
    LEN@T1,T2,...      at the listed seconds (a single time: LEN@T1, with the comma)
    LEN:OUT@...        each generating OUT tokens (default 1: the figure is the fill, not the reply)

Every inject's ids are drawn fresh (their own key), so no cache holds any part of them."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tensorfold_bench.errors import FlagError

FORM = "LEN@EVERY, LEN@T1,T2,... or LEN:OUT@... (e.g. 8192@10 or 8192:16@5,20,)"


@dataclass(frozen=True)
class Inject:
    length: int
    output_len: int = 1
    every: float | None = None  # seconds between injects, the first at `every`
    times: tuple[float, ...] = ()  # or these offsets

    def offsets(self, end: float | None) -> list[float]:
        """The injects' send offsets; `every` runs while the offset is before `end` (the run's
        duration, or its last load arrival)."""
        if self.every is None:
            return list(self.times)
        if end is None:
            raise ValueError("an inject every EVERY seconds needs an end")
        return [k * self.every for k in range(1, int(end / self.every) + 2) if k * self.every < end]

    def __str__(self) -> str:
        at = ", ".join(f"{t:g}" for t in self.times)
        when = f"every {self.every:g} s" if self.every is not None else f"at {at} s"
        return f"inject {self.length:,} ids (output {self.output_len}) {when}"


def parse(text: str) -> Inject:
    t = str(text).replace(" ", "")
    m = re.fullmatch(r"(\d+)(?::(\d+))?@(.+)", t)
    if not m:
        raise FlagError("--inject", f"{text!r}: expected {FORM}")
    length, out = int(m[1]), int(m[2]) if m[2] is not None else 1
    if length < 1 or out < 1:
        raise FlagError("--inject", f"{text!r}: the prompt length and the output length must be at least 1")
    parts = m[3].split(",")
    try:
        nums = [float(x) for x in parts if x != ""]
    except ValueError:
        raise FlagError("--inject", f"{text!r}: the times must be seconds; expected {FORM}") from None
    if not nums or any(not math.isfinite(x) or x < 0 for x in nums) or (len(parts) > 1 and "" in parts[:-1]):
        raise FlagError("--inject", f"{text!r}: the times must be seconds, at least 0; expected {FORM}")
    if len(parts) == 1:
        if nums[0] <= 0:
            raise FlagError("--inject", f"{text!r}: EVERY must be more than 0 seconds")
        return Inject(length, out, every=nums[0])
    return Inject(length, out, times=tuple(sorted(nums)))
