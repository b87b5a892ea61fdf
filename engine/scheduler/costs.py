"""A cost profile: what each kind of forward the lane host asks for costs on one device and model,
measured once, and the fits the simulator (engine/scheduler/simulated.py) charges from (no torch).

A profile is one JSON file (`schema: tfbench.profile/2`) of raw samples, one row a measured call:
    prefill       [rows, start, s]        one cut of `rows` rows whose first row is at `start`
    decode        [n, keys, longest, s]   one round; keys: the keys its streams attend to, summed;
                                          longest: its longest stream's
    decode_ahead  [n, keys, longest, s]   a round the host asked to run ahead (optional: else decode's)
    prefill_many  [prompts, rows, s]      short prompts filled together in one forward
    mixed         [rows, start, n, keys, longest, s]
    split         [decode_sms, rows, start, n, keys, longest, cut_s, round_s]
    split_round   [decode_sms, n, keys, longest, s]
    fill          [rows, start, since, s] the longest prompt cut by cut, back to back (optional);
                                          since: seconds from the fill's first cut to this one's
A round's `n` is what `rounds` says: "rows", the rows it ran at (a round's forward runs at its
runner's fixed row counts, the padded shape of its graphs or tiles, however few streams it carries:
backend.Capabilities.round_sizes), or "streams", how many streams it held (profiles fitted from
receipt traces, whose rounds say only that). A `tfbench.profile/1` file (no `longest`, `n` its
streams) is read with `longest` from keys and streams, as if the streams' contexts were equal.
    host          [["turn", s] | ["token", s] | ["prompt_token", s], ...]
                  prompt_token (optional): the server reading a request before the host sees it
Fitting happens here, at load time, so the file keeps what was measured and a better fit needs no
new measurement. Each fit weighs errors relative to the sample (a 16-row cut and a 1,024-row cut
count alike), drops the samples a call's outside work disturbed (one pass: beyond four times the
median relative residual, and beyond 20 %), and keeps the spread of what is left: the 90th
percentile of |relative residual|, the width a prediction's range takes.

- prefill: t = a + b rows + c rows (start + rows / 2) (a row attends to the keys before it), times
  a factor per measured row count (the median of its samples over the smooth fit), interpolated in
  log rows between measured counts: kernels change at some counts (flash below 1,024 rows, cuDNN at
  it on the H100), which no three terms follow.
- decode (and decode_ahead): t = a[n] + b keys + c longest: an intercept per count measured, a
  slope over all keys (the products and the attention of many streams spread over the SMs), and
  one over the longest stream's (one stream's attention occupies few SMs, so a lone long stream
  costs more per key than many short ones). A count between two measured ones: the line between
  them where n is the rows run at; counted by streams on CUDA, the next one up (the round ran at a
  graph's size); past the largest, the line through the two largest.
- prefill_many: t = a + b rows + c prompts.
- mixed: t = decode(n, keys, longest) + a + u rows + k rows (start + rows / 2), as the host's own
  cost model (engine/scheduler/forward_cost.py) has it.
- split: per decode_sms, the cut as prefill's terms, and the round beside it as decode's;
  split_round (a round on the decode partition, no cut running) as decode's.
- host: the median of each.
- fill: a device under a sustained fill slows (its clocks follow its power draw): a cut costs
  prefill's fit times 1 + k h, where h, the device's heat, rises toward 1 while cuts run back to
  back and falls toward 0 otherwise, with time constant tau: in a fill from cold, h = 1 - exp(-since
  / tau). k and tau are fitted to the fill's cuts over prefill's fit (tau from a grid, k by least
  squares, nothing dropped: the fill is two sequences, not repeats); a profile without fill
  samples has k = 0. Rounds between cuts count as cooling (a round draws a fraction of a cut's power).
"""
from __future__ import annotations

import json
import math
import statistics
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from engine.scheduler.backend import Capabilities
from engine.scheduler.forward_cost import solve

SCHEMA = "tfbench.profile/2"
SCHEMA_V1 = "tfbench.profile/1"
ROUNDS = ("rows", "streams")  # what a round's `n` counts
KINDS = ("prefill", "decode", "decode_ahead", "prefill_many", "mixed", "split", "split_round", "host", "fill")
HOST = ("turn", "token", "prompt_token")
WIDTHS = {"prefill": 3, "decode": 4, "decode_ahead": 4, "prefill_many": 3, "mixed": 6, "split": 8, "split_round": 5,
          "host": 2, "fill": 4}
TAUS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)  # the heat's time constants tried, seconds
# where a /1 row's round is (its streams' column; keys follow it), for `widened`
_V1_ROUND = {"decode": 0, "decode_ahead": 0, "mixed": 2, "split": 3, "split_round": 1}
WIDTHS_V1 = {k: w - (k in _V1_ROUND) for k, w in WIDTHS.items()}


def widened(kind: str, row: list) -> list:
    """A /1 row (a round's streams and keys, no longest) as /2 has it: the longest stream's keys as if
    the streams' contexts were equal and a position apart, as the profiler placed them."""
    if kind not in _V1_ROUND:
        return row
    i = _V1_ROUND[kind]
    streams, keys = max(1, row[i]), row[i + 1]
    return [*row[:i + 2], keys / streams + (streams - 1) / 2, *row[i + 2:]]
TRIM = 4.0  # a sample beyond this many times the median relative residual (and beyond 20 %) is dropped
TRIM_FLOOR = 0.20


class ProfileError(ValueError):
    """A profile that cannot be read, or lacks a kind a scenario needs: one line naming the file."""


@dataclass
class Profile:
    name: str  # the file's name, for messages
    created: str
    source: str
    device: dict
    model: dict
    engine: dict
    samples: dict[str, list]
    rounds: str = "streams"  # what a round's n counts (ROUNDS): the rows it ran at, or its streams

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "created": self.created, "source": self.source, "rounds": self.rounds,
                "device": self.device, "model": self.model, "engine": self.engine,
                "samples": {k: self.samples.get(k, []) for k in KINDS}}

    def write(self, path: Path) -> Path:
        """Indented JSON, one sample a line (a profile is read by people and diffed in review)."""
        d = self.to_dict()
        samples = d.pop("samples")
        head = json.dumps(d, indent=1)[:-2]
        kinds = [f'  "{k}": [' + ",".join("\n   " + json.dumps(r) for r in rows) + ("\n  ]" if rows else "]")
                 for k, rows in samples.items()]
        path = Path(path)
        path.write_text(head + ',\n "samples": {\n' + ",\n".join(kinds) + "\n }\n}\n", encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, d: object, name: str = "profile") -> "Profile":
        if not isinstance(d, dict):
            raise ProfileError(f"{name}: a profile is a JSON object, not {type(d).__name__}")
        if d.get("schema") not in (SCHEMA, SCHEMA_V1):
            raise ProfileError(f"{name}: schema is {d.get('schema')!r}, not {SCHEMA!r} (or {SCHEMA_V1!r})")
        v1 = d["schema"] == SCHEMA_V1
        rounds = "streams" if v1 else d.get("rounds", "rows")
        if rounds not in ROUNDS:
            raise ProfileError(f"{name}: rounds is {rounds!r}, not one of {', '.join(ROUNDS)}")
        for key in ("device", "model", "engine", "samples"):
            if not isinstance(d.get(key), dict):
                raise ProfileError(f"{name}: field {key!r} must be an object")
        samples = d["samples"]
        unknown = set(samples) - set(KINDS)
        if unknown:
            raise ProfileError(f"{name}: samples has unknown kinds {sorted(unknown)} (known: {', '.join(KINDS)})")
        out = {}
        for kind in KINDS:
            rows = samples.get(kind, [])
            if not isinstance(rows, list):
                raise ProfileError(f"{name}: samples.{kind} must be a list")
            for i, row in enumerate(rows):
                _check_row(name, kind, i, row, WIDTHS_V1 if v1 else WIDTHS)
            out[kind] = [widened(kind, r) for r in rows] if v1 else rows
        return cls(name, str(d.get("created", "")), str(d.get("source", "")), d["device"], d["model"],
                   d["engine"], out, rounds)

    @classmethod
    def load(cls, path: Path) -> "Profile":
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ProfileError(f"cannot read profile {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(raw, str(path))


def _check_row(name: str, kind: str, i: int, row: object, widths: dict = WIDTHS) -> None:
    where = f"{name}: samples.{kind}[{i}]"
    if not isinstance(row, list) or len(row) != widths[kind]:
        raise ProfileError(f"{where} must be a list of {widths[kind]} values, not {row!r}")
    values = row[1:] if kind == "host" else row
    if kind == "host" and row[0] not in HOST:
        raise ProfileError(f"{where}: the host's sample is one of {', '.join(HOST)}, not {row[0]!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ProfileError(f"{where}: {v!r} is not a finite number >= 0")
    if kind != "host" and values[-1] <= 0:
        raise ProfileError(f"{where}: a measured time must be > 0, not {values[-1]!r}")


# ---- least squares on a few columns ------------------------------------------------------------

def least_squares(xs: list[list[float]], ys: list[float], free: frozenset[int] = frozenset(),
                  scale: list[float] | None = None) -> list[float]:
    """Coefficients minimising the squared error relative to `scale` (each sample's size; None: 1),
    every one >= 0 except the columns in `free` (always in the fit): each subset of the other columns
    solved exactly, the feasible one of least error kept (a few columns, so every subset is cheap)."""
    n = len(xs[0])
    w = [1.0 / (y * y) for y in scale] if scale else [1.0] * len(ys)
    sc = [max(abs(x[i]) for x in xs) or 1.0 for i in range(n)]  # columns of one scale
    rows = [[x[i] / sc[i] for i in range(n)] for x in xs]
    gram = [[sum(wi * r[i] * r[j] for wi, r in zip(w, rows)) for j in range(n)] for i in range(n)]
    xty = [sum(wi * r[i] * y for wi, r, y in zip(w, rows, ys)) for i in range(n)]
    yty = sum(wi * y * y for wi, y in zip(w, ys))
    bound = [i for i in range(n) if i not in free]
    best: tuple[float, list[float]] | None = None
    for mask in range(1 << len(bound)):
        terms = sorted({*free, *(bound[i] for i in range(len(bound)) if mask >> i & 1)})
        if not terms:
            continue
        c = solve([[gram[i][j] for j in terms] for i in terms], [xty[i] for i in terms])
        if c is None or any(v < 0 for t, v in zip(terms, c) if t not in free):
            continue
        full = [0.0] * n
        for t, v in zip(terms, c):
            full[t] = v
        err = yty - 2 * sum(full[i] * xty[i] for i in terms) + sum(
            full[i] * gram[i][j] * full[j] for i in terms for j in terms)
        if best is None or err < best[0] - 1e-12 * yty:
            best = (err, full)
    if best is None:
        return [0.0] * n
    return [c / s for c, s in zip(best[1], sc)]


@dataclass
class Fit:
    """Coefficients of one kind's terms, with how well they fit what was measured."""
    coef: list[float]
    spread: float  # 90th percentile of |relative residual| over the samples kept
    kept: int
    dropped: int


def fitted(xs: list[list[float]], ys: list[float], free: frozenset[int] = frozenset()) -> Fit:
    """A fit of errors relative to each sample's size: first in plain seconds, then relative to the
    larger of the sample and that fit (a call that returned early must not weigh as a thousand), then
    once more relative to the fit without the samples far off it."""
    def dot(c, x):
        return sum(a * b for a, b in zip(c, x))
    coef = least_squares(xs, ys, free)
    coef = least_squares(xs, ys, free, [max(y, dot(coef, x), 1e-12) for x, y in zip(xs, ys)])
    pred = [max(dot(coef, x), 1e-12) for x in xs]
    res = [abs(y - p) / p for y, p in zip(ys, pred)]
    cut = max(TRIM_FLOOR, TRIM * statistics.median(res))
    keep = [i for i, r in enumerate(res) if r <= cut]
    if len(keep) < len(xs[0]):
        keep = list(range(len(xs)))
    coef = least_squares([xs[i] for i in keep], [ys[i] for i in keep], free, [pred[i] for i in keep])
    res = [abs(ys[i] - dot(coef, xs[i])) / max(dot(coef, xs[i]), 1e-12) for i in keep]
    return Fit(coef, quantile(res, 0.9), len(keep), len(xs) - len(keep))


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)] if q > 0 else s[0]


def cut_terms(rows: float, start: float) -> list[float]:
    """A cut's terms: fixed, per row, per key its rows read."""
    return [1.0, rows, rows * (start + rows / 2)]


# ---- the kinds' fits ---------------------------------------------------------------------------

@dataclass
class CutFit:
    """A cut's time over (rows, start): three smooth terms times a factor per measured row count."""
    fit: Fit
    counts: list[int]  # measured row counts, ascending
    factors: list[float]

    @classmethod
    def of(cls, samples: list[tuple[float, float, float]]) -> "CutFit":
        xs = [cut_terms(r, s) for r, s, _ in samples]
        ys = [t for _, _, t in samples]
        fit = fitted(xs, ys)
        smooth = [sum(a * b for a, b in zip(fit.coef, x)) for x in xs]
        by: dict[int, list[float]] = {}
        for (r, _, t), p in zip(samples, smooth):
            if p > 0:
                by.setdefault(int(r), []).append(t / p)
        counts = sorted(by)
        factors = [statistics.median(by[c]) for c in counts]
        out = cls(fit, counts, factors)
        res = [abs(t - out(r, s)) / max(out(r, s), 1e-12) for r, s, t in samples]
        out.fit.spread = quantile(sorted(res)[: max(1, out.fit.kept)], 0.9)
        return out

    def factor(self, rows: int) -> float:
        if not self.counts:
            return 1.0
        i = bisect_left(self.counts, rows)
        if i < len(self.counts) and self.counts[i] == rows:
            return self.factors[i]
        if i == 0:
            return self.factors[0]
        if i == len(self.counts):
            return self.factors[-1]
        lo, hi = self.counts[i - 1], self.counts[i]
        w = (math.log(rows) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return self.factors[i - 1] * (1 - w) + self.factors[i] * w

    def __call__(self, rows: int, start: int) -> float:
        a, b, c = self.fit.coef
        return max(0.0, a + b * rows + c * rows * (start + rows / 2)) * self.factor(rows)


@dataclass
class RoundFit:
    """A round's time over (n, keys, longest): an intercept per measured count, two slopes."""
    fit: Fit
    counts: list[int]
    base: list[float]
    slope: float  # per key, all streams'
    slope_longest: float  # per key of the longest stream
    next_up: bool  # a count between two measured ones costs the next (CUDA graphs); else interpolated

    @classmethod
    def of(cls, samples: list[tuple[float, float, float, float]], next_up: bool) -> "RoundFit":
        counts = sorted({int(n) for n, *_ in samples})
        col = {n: i for i, n in enumerate(counts)}
        k = len(counts)
        xs = [[1.0 if col[int(n)] == i else 0.0 for i in range(k)] + [keys, longest] for n, keys, longest, _ in samples]
        ys = [t for *_, t in samples]
        fit = fitted(xs, ys, free=frozenset(range(k)))
        return cls(fit, counts, fit.coef[:k], fit.coef[k], fit.coef[k + 1], next_up)

    def intercept(self, n: int) -> float:
        c, b = self.counts, self.base
        i = bisect_left(c, n)
        if i < len(c) and c[i] == n:
            return b[i]
        if i == len(c):  # past the largest measured: the line through the two largest
            if len(c) == 1:
                return b[0] * n / c[0]
            return max(b[-1], b[-1] + (b[-1] - b[-2]) / (c[-1] - c[-2]) * (n - c[-1]))
        if self.next_up or i == 0:
            return b[i]
        w = (n - c[i - 1]) / (c[i] - c[i - 1])
        return b[i - 1] * (1 - w) + b[i] * w

    def __call__(self, n: int, keys: int, longest: int) -> float:
        return max(0.0, self.intercept(n) + self.slope * keys + self.slope_longest * longest)


@dataclass
class Costs:
    """The fitted costs of one profile; each kind is fitted when first asked for."""
    profile: Profile
    _fits: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: Path) -> "Costs":
        return cls(Profile.load(path))

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def rows_run_at(self) -> bool:
        """Whether a round's n is the rows it ran at (else its streams)."""
        return self.profile.rounds == "rows"

    @property
    def next_up(self) -> bool:
        """A count between two measured ones costs the next: rounds counted by streams on CUDA (each
        ran at a graph's size). Counted by the rows they ran at, the line between is the guess."""
        return not self.rows_run_at and self.profile.device.get("type") == "cuda"

    def round_sizes(self, parallel: int) -> tuple[int, ...] | None:
        """The row counts an engine of `parallel` lanes runs rounds at (None: rounds counted by
        streams): a profiled runner's of the same lanes; else `parallel` rounded up to the tile the
        runners padded to (the CPU's round multiplies whole tiles of rows: 4 lanes run at 8), after
        the smaller counts some runner ran below its own padded shape."""
        if not self.rows_run_at:
            return None
        runners = [r for r in self.profile.engine.get("runners") or [] if r.get("decode_rows")]
        same = [r for r in runners if int(r.get("parallel") or 0) == parallel]
        if same:
            return tuple(sorted(int(n) for n in same[0]["decode_rows"]))
        tops = [max(int(n) for n in r["decode_rows"]) for r in runners]
        padded = [t for t, r in zip(tops, runners) if t != int(r.get("parallel") or 0)]
        tile = math.gcd(*padded) if padded else 1
        shape = -(-parallel // tile) * tile
        below = {int(n) for t, r in zip(tops, runners) for n in r["decode_rows"] if int(n) < min(t, shape)}
        return (*sorted(below), shape)

    def has(self, kind: str) -> bool:
        return bool(self.profile.samples.get(kind))

    def capabilities(self, mode: str, parallel: int | None = None) -> Capabilities:
        """What the profiled runner of this prefill mode declared (`engine.runners[].capabilities`:
        the cut sizes its graphs take, whether its cuts are free, ...), so the simulated backend offers
        the host what the real one did. A profile without declarations (fitted from receipt traces)
        gets what its samples show: short prompts together where prefill_many was measured, rounds
        ahead where decode_ahead was, free cuts in mixed mode. `parallel`: the simulated engine's
        lanes, whose padded shape its rounds run at (round_sizes)."""
        sizes = self.round_sizes(parallel) if parallel else None
        runners = [r for r in self.profile.engine.get("runners") or [] if isinstance(r.get("capabilities"), dict)]
        declared = [r["capabilities"] for r in runners if r.get("prefill_mode") == mode] or \
                   [r["capabilities"] for r in runners if r.get("prefill_mode") == "stepped"]
        if declared:
            d = {k: v for k, v in declared[0].items() if k in Capabilities.__dataclass_fields__}
            if d.get("cut_sizes") is not None:
                d["cut_sizes"] = tuple(d["cut_sizes"])
            d["round_sizes"] = sizes
            return Capabilities(**d)
        return Capabilities(batch_cuts=self.has("prefill_many"), runs_ahead=self.has("decode_ahead"),
                            mixed=mode == "mixed", cut_free=mode == "mixed", split=mode == "split",
                            round_sizes=sizes)

    def _rows(self, kind: str) -> list:
        rows = self.profile.samples.get(kind) or []
        if not rows:
            raise ProfileError(f"profile {self.name} has no {kind!r} samples: the "
                               f"{self.profile.device.get('type', '?')} engine measured there ran none, "
                               f"so a scenario that needs {kind} forwards cannot be simulated on it")
        return rows

    def _fit(self, kind: str):
        if kind not in self._fits:
            rows = self._rows(kind if not kind.startswith("split") else kind.split(":")[0])
            self._fits[kind] = self._make(kind, rows)
        return self._fits[kind]

    def _make(self, kind: str, rows: list):
        if kind == "prefill":
            return CutFit.of([(r, s, t) for r, s, t in rows])
        if kind in ("decode", "decode_ahead"):
            return RoundFit.of(rows, self.next_up)
        if kind == "prefill_many":
            return fitted([[1.0, r, p] for p, r, _ in rows], [t for *_, t in rows])
        if kind == "mixed":
            xs, ys = [], []
            for r, s, n, k, longest, t in rows:
                above = t - self.decode(int(n), k, longest)
                if above > 0:
                    xs.append(cut_terms(r, s))
                    ys.append(above)
            if not xs:
                raise ProfileError(f"profile {self.name}: no mixed sample costs more than its round alone")
            return fitted(xs, ys)
        if kind.startswith("split:"):  # split:SMS:cut | split:SMS:round | split:SMS:alone
            _, sms, part = kind.split(":")
            if part == "alone":
                src = [(n, k, lg, t) for d, n, k, lg, t in self._rows("split_round") if int(d) == int(sms)]
                if not src:
                    raise ProfileError(f"profile {self.name} has no split_round samples at decode_sms={sms} "
                                       f"(it has {sorted({int(r[0]) for r in self._rows('split_round')})})")
                return RoundFit.of(src, self.next_up)
            mine = [r for r in rows if int(r[0]) == int(sms)]
            if not mine:
                raise ProfileError(f"profile {self.name} has no split samples at decode_sms={sms} "
                                   f"(it has {sorted({int(r[0]) for r in rows})})")
            if part == "cut":
                return CutFit.of([(r, s, c) for _, r, s, _, _, _, c, _ in mine])
            return RoundFit.of([(n, k, lg, rt) for _, _, _, n, k, lg, _, rt in mine], self.next_up)
        raise KeyError(kind)

    @property
    def heat(self) -> tuple[float, float]:
        """(k, tau): a cut under heat h costs 1 + k h times prefill's fit (k = 0: no fill measured)."""
        if "heat" not in self._fits:
            self._fits["heat"] = self._heat_fit()
        return self._fits["heat"]

    def _heat_fit(self) -> tuple[float, float]:
        rows = self.profile.samples.get("fill") or []
        if not rows or not self.has("prefill"):
            return 0.0, 1.0
        over = [(since, t / p - 1.0) for r, s, since, t in rows if (p := self.prefill(int(r), int(s))) > 0]
        best = (math.inf, 0.0, 1.0)
        for tau in TAUS:
            xs = [1.0 - math.exp(-since / tau) for since, _ in over]
            sxx = sum(x * x for x in xs)
            k = max(0.0, sum(x * y for x, (_, y) in zip(xs, over)) / sxx) if sxx else 0.0
            err = sum((y - k * x) ** 2 for x, (_, y) in zip(xs, over))
            if err < best[0]:
                best = (err, k, tau)
        return best[1], best[2]

    # ---- what the simulated backend asks --------------------------------------------------------
    def prefill(self, rows: int, start: int) -> float:
        return self._fit("prefill")(rows, start)

    def decode(self, n: int, keys: int, longest: int, ahead: bool = False) -> float:
        """A round (n: Profile.rounds); `ahead`: one the host asked to run ahead. Each kind stands for the other where the
        profile measured only one (a trace of whole prompts has no round beside a waiting one)."""
        want, other = ("decode_ahead", "decode") if ahead else ("decode", "decode_ahead")
        return self._fit(want if self.has(want) or not self.has(other) else other)(n, keys, longest)

    def prefill_many(self, prompts: int, rows: int) -> float:
        a, b, c = self._fit("prefill_many").coef
        return max(0.0, a + b * rows + c * prompts)

    def mixed(self, rows: int, start: int, n: int, keys: int, longest: int) -> float:
        a, u, k = self._fit("mixed").coef
        return self.decode(n, keys, longest) + max(0.0, a + u * rows + k * rows * (start + rows / 2))

    def split(self, decode_sms: int, rows: int, start: int) -> float:
        """A cut on the prompt partition, beside rounds on `decode_sms` SMs."""
        return self._fit(f"split:{decode_sms}:cut")(rows, start)

    def split_round(self, decode_sms: int, n: int, keys: int, longest: int, beside_cut: bool) -> float:
        """A round on the decode partition: beside a running cut, or alone (split_round's samples,
        or where the profile has none, the round beside a cut: the partition is the same)."""
        if not beside_cut and self.has("split_round"):
            return self._fit(f"split_round:{decode_sms}:alone")(n, keys, longest)
        return self._fit(f"split:{decode_sms}:round")(n, keys, longest)

    def _host(self, what: str) -> float:
        xs = [s for k, s in self.profile.samples.get("host") or [] if k == what]
        return statistics.median(xs) if xs else 0.0

    @property
    def host_turn(self) -> float:
        """The host's own time a turn (0 where the profile did not measure it)."""
        if "host_turn" not in self._fits:
            self._fits["host_turn"] = self._host("turn")
        return self._fits["host_turn"]

    @property
    def host_token(self) -> float:
        if "host_token" not in self._fits:
            self._fits["host_token"] = self._host("token")
        return self._fits["host_token"]

    @property
    def host_prompt_token(self) -> float:
        """The server's reading of a request, per prompt token, before the host sees it (0: not measured)."""
        if "host_prompt_token" not in self._fits:
            self._fits["host_prompt_token"] = self._host("prompt_token")
        return self._fits["host_prompt_token"]

    def spread(self, kind: str) -> float:
        """A fit's 90th percentile of |relative residual|: how far one call lands from the fit."""
        f = self._fit(kind)
        return (f.fit if isinstance(f, (CutFit, RoundFit)) else f).spread

    def summary(self) -> dict[str, dict]:
        """Each kind the profile holds: its samples, kept, and spread (for receipts and the CLI)."""
        out = {}
        for kind in ("prefill", "decode", "decode_ahead", "prefill_many", "mixed"):
            if self.has(kind):
                f = self._fit(kind)
                fit = f.fit if isinstance(f, (CutFit, RoundFit)) else f
                out[kind] = {"samples": len(self.profile.samples[kind]), "dropped": fit.dropped,
                             "spread": round(fit.spread, 4)}
        for sms in sorted({int(r[0]) for r in self.profile.samples.get("split") or []}):
            for part in ("cut", "round"):
                f = self._fit(f"split:{sms}:{part}").fit
                out[f"split sms={sms} {part}"] = {"samples": f.kept + f.dropped, "dropped": f.dropped,
                                                  "spread": round(f.spread, 4)}
        return out
