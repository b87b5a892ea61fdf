"""Token lengths for --input-len / --output-len: a fixed number, a range or a distribution.

    200              every request 200
    100:300          uniform over 100..300, both ends included
    normal:200,50    normal with mean 200 and standard deviation 50
    lognormal:200,80 log-normal whose lengths have mean 200 and standard deviation 80 (long-tailed)

Drawn lengths are rounded and clipped to at least 1."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from tensorfold_bench.errors import FlagError

FORMS = "N, LO:HI, normal:MEAN,SD or lognormal:MEAN,SD"
_NUM = r"\d+(?:\.\d*)?"


@dataclass(frozen=True)
class Lengths:
    kind: str  # "fixed", "range", "normal", "lognormal"
    a: float  # fixed: the length; range: lo; normal/lognormal: mean
    b: float = 0.0  # range: hi; normal/lognormal: standard deviation

    def draw(self, g: np.random.Generator, n: int) -> list[int]:
        if self.kind == "fixed":
            return [int(self.a)] * n
        if self.kind == "range":
            x = g.integers(int(self.a), int(self.b) + 1, size=n)
        elif self.kind == "normal":
            x = g.normal(self.a, self.b, size=n)
        else:  # the log-normal whose own mean and deviation are a and b
            s2 = math.log1p((self.b / self.a) ** 2)
            x = g.lognormal(math.log(self.a) - s2 / 2, math.sqrt(s2), size=n)
        return np.maximum(np.rint(x), 1).astype(np.int64).tolist()

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g}"
        if self.kind == "range":
            return f"{self.a:g}:{self.b:g}"
        return f"{self.kind}:{self.a:g},{self.b:g}"


def parse(flag: str, text: str) -> Lengths:
    """A length spec, or a FlagError naming `flag` and the forms it takes."""
    t = str(text).strip().replace(" ", "")
    if re.fullmatch(r"\d+", t):
        n = int(t)
        if n < 1:
            raise FlagError(flag, f"{text!r}: a length must be at least 1 token")
        return Lengths("fixed", n)
    if m := re.fullmatch(r"(\d+):(\d+)", t):
        lo, hi = int(m[1]), int(m[2])
        if lo < 1 or hi < lo:
            raise FlagError(flag, f"{text!r}: a range LO:HI needs 1 <= LO <= HI")
        return Lengths("range", lo, hi)
    if m := re.fullmatch(rf"(normal|lognormal):({_NUM}),({_NUM})", t):
        mean, sd = float(m[2]), float(m[3])
        if mean < 1:
            raise FlagError(flag, f"{text!r}: the mean must be at least 1 token")
        return Lengths(m[1], mean, sd)
    raise FlagError(flag, f"{text!r} is not a length: expected {FORMS} (e.g. 200, 100:300, normal:200,50)")
