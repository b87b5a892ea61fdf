"""Predictions: ranges written before the runs, checked after them.

`--predict FILE` is YAML, one mapping per variant name, each a mapping of keys to a range
`[lo, hi]` (either end may be null: open). A key is

- a figure of the receipt (`c_first_token_s`, `tok_s@8`, ...): the variant's median;
- `FIGURE vs OTHER` (or `FIGURE_vs_OTHER`), the ratio of two medians, where OTHER is another
  variant's name (`tok_s@8 vs whole: [0.98, 1.02]`: this variant's median over whole's), or
  another figure of the same variant (`b_first_token_s vs b_alone_s: [1.7, 2.4]`);
- `FIGURE pct OTHER`: this variant's median vs OTHER's in percent (`tok_s@8 pct whole: [-2, 2]`).

```yaml
stepped p=0.5:
  a_rate_during_b_pct: [40, 60]
  c_first_token_s: [0, 0.5]
  tok_s@8 vs whole: [0.97, 1.03]
```

The file is read, validated (an error names the file and the key), hashed (sha256 of its bytes)
and stamped with the time it was read, before the first run starts: a receipt shows the stamp
beside the first run's start. After the runs each prediction is marked in or out of its range
(or "not measured" when its figure never came), and the receipt ends with the count of hits.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Collection, Mapping

import yaml

from tensorfold_bench.errors import BenchError

IN, OUT, UNMEASURED = "in", "out", "not measured"


class PredictionError(BenchError):
    """A predictions file that cannot be used: the message names the file and the key."""


@dataclass
class Prediction:
    variant: str
    key: str
    lo: float | None
    hi: float | None
    value: float | None = None
    status: str | None = None  # in | out | not measured, once checked

    def range_text(self) -> str:
        f = lambda x: "…" if x is None else f"{x:g}"
        return f"[{f(self.lo)}, {f(self.hi)}]"


@dataclass
class Predictions:
    path: str
    sha256: str
    read_at: str  # UTC, ISO 8601: when the file was read, before the first run
    items: list[Prediction] = field(default_factory=list)

    @property
    def hits(self) -> int:
        return sum(p.status == IN for p in self.items)

    @property
    def checked(self) -> int:
        return sum(p.status in (IN, OUT) for p in self.items)

    def summary(self) -> str:
        miss = sum(p.status == UNMEASURED for p in self.items)
        tail = f" ({miss} not measured)" if miss else ""
        return f"{self.hits} of {self.checked} predictions in range{tail}"

    def to_dict(self) -> dict:
        return {**asdict(self), "hits": self.hits, "checked": self.checked}

    @classmethod
    def from_dict(cls, d: dict) -> "Predictions":
        return cls(d["path"], d["sha256"], d["read_at"], [Prediction(**p) for p in d["items"]])

    def check(self, medians: Mapping[str, Mapping[str, float | None]]) -> "Predictions":
        """Mark each prediction against `medians[variant][figure]`; returns self."""
        for p in self.items:
            p.value = resolve(p.variant, p.key, medians)
            if p.value is None:
                p.status = UNMEASURED
            else:
                ok = (p.lo is None or p.value >= p.lo) and (p.hi is None or p.value <= p.hi)
                p.status = IN if ok else OUT
        return self

    def markdown(self) -> list[str]:
        lines = [f"Predictions: `{self.path}` (sha256 `{self.sha256[:16]}`), read {self.read_at}, "
                 "before the first run.", "",
                 "| variant | figure | predicted | result | |", "|---|---|---|---|---|"]
        for p in self.items:
            v = "–" if p.value is None else f"{p.value:.4g}"
            lines.append(f"| {p.variant} | {p.key} | {p.range_text()} | {v} | {p.status or ''} |")
        lines += ["", f"**{self.summary()}.**"]
        return lines


def _number(path: str, where: str, x) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x):
        raise PredictionError(f"{path}: {where}: {x!r} is not a number")
    return float(x)


def parse(text: str, path: str = "<predictions>") -> list[Prediction]:
    """Validate the YAML text into predictions; errors name the file and the key."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        msg = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip() and ln.strip() != "^")
        raise PredictionError(f"{path}: not valid YAML: {msg}") from None
    if not isinstance(doc, dict) or not doc:
        raise PredictionError(f"{path}: expected a mapping of variant name to figure ranges")
    out = []
    for variant, ranges in doc.items():
        if not isinstance(ranges, dict) or not ranges:
            raise PredictionError(f"{path}: {variant}: expected a mapping of figure to [lo, hi]")
        for key, rng in ranges.items():
            where = f"{variant}: {key}"
            if isinstance(rng, dict):
                rng = [rng.get("min"), rng.get("max")]
            if not isinstance(rng, (list, tuple)) or len(rng) != 2:
                raise PredictionError(f"{path}: {where}: expected [lo, hi], got {rng!r}")
            lo, hi = (_number(path, where, x) for x in rng)
            if lo is None and hi is None:
                raise PredictionError(f"{path}: {where}: both ends open")
            if lo is not None and hi is not None and lo > hi:
                raise PredictionError(f"{path}: {where}: lo {lo:g} > hi {hi:g}")
            out.append(Prediction(str(variant), str(key), lo, hi))
    return out


def check_key(path: str, item: Prediction, known: Collection[str], variants: Collection[str]) -> None:
    """A key must name a figure this command measures (or a ratio of two): an error now, before
    the runs, not a "not measured" after them."""
    m = _SPLIT.match(item.key)
    parts = [item.key] if item.key in known or not m else [m["left"]]
    if m and item.key not in known and m["right"] not in variants:
        parts.append(m["right"])
    bad = [x for x in parts if x not in known]
    if bad:
        raise PredictionError(f"{path}: {item.variant}: {item.key}: {bad[0]!r} is no figure of this command "
                              f"(figures: {', '.join(sorted(known))})")


def read(path: str | Path, variants: list[str] | None = None, figures: Collection[str] | None = None) -> Predictions:
    """Read, validate, hash and stamp a predictions file. With `variants`, a variant name the
    runs will not have is an error now, not a silent miss later; with `figures`, so is a key
    that names no figure the command measures."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise PredictionError(f"{path}: cannot read: {e.strerror}") from None
    items = parse(data.decode("utf-8", errors="replace"), str(path))
    if variants is not None:
        for it in items:
            if it.variant not in variants:
                raise PredictionError(f"{path}: {it.variant}: no such variant in this run "
                                      f"(variants: {', '.join(variants)})")
    if figures is not None:
        for it in items:
            check_key(str(path), it, figures, variants or [])
    return Predictions(shown_path(p), hashlib.sha256(data).hexdigest(),
                       datetime.now(timezone.utc).isoformat(timespec="milliseconds"), items)


def shown_path(p: Path) -> str:
    """The path a receipt names: relative to the working directory when the file is under it,
    else the file's name alone (the receipt travels without the machine's folders; the sha256
    identifies the file)."""
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return p.name


_SPLIT = re.compile(r"^(?P<left>.+?)(?:\s+(?P<op>vs|pct)\s+|_(?P<op2>vs)_)(?P<right>.+)$")


def resolve(variant: str, key: str, medians: Mapping[str, Mapping[str, float | None]]) -> float | None:
    """The value a key names (see the module docstring), or None when it was not measured."""
    mine = medians.get(variant, {})
    if key in mine:
        return mine[key]
    m = _SPLIT.match(key)
    if not m:
        return None
    left, right, op = m["left"], m["right"], m["op"] or m["op2"]
    a = mine.get(left)
    b = medians.get(right, {}).get(left) if right in medians else mine.get(right)
    if a is None or b is None or b == 0:
        return None
    return a / b if op == "vs" else (a / b - 1) * 100
