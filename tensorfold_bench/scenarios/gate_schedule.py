"""The gate's schedule layer: the gate's scenarios and the shapes the schedule is known to break
on, replayed in virtual time on a committed cost profile, once with the base's scheduler code and
once with the new side's.

Each side's replay runs in a subprocess whose `engine` package is that side's tree (a folder put
first on PYTHONPATH holds `engine` -> the side's `engine/` and `tensorfold_bench` -> this tree's),
so the scenarios, the virtual-time player and the figures are one code on both sides and only the
engine differs: its lane host, policy, cost fits and simulated backend. The replay is
deterministic, so there are no statistics: a figure worse by `THRESHOLD` (1 %) or more fails,
naming the scenario and the figure; a better one passes.

The shapes (`shapes`), on the gate preset's engine settings (stepped prompts, its cut rows):
- `sweep@N`: the gate's sweep levels, N streams sent together;
- `shorts`: eight short prompts arriving together while four streams decode (the shorts are
  filled back to back before the next round; one a round costs every short a round per short
  ahead of it);
- `long_prompt p=1`, `long_prompt p=0.5`: the gate's long-prompt run (A decodes, B's cold prompt,
  then C's chat) at share 1 and 0.5, and in mixed forwards where the profile prices them;
- `load+cold`: a seeded Poisson load of short requests with one cold long prompt injected.

What it cannot see: anything the profile does not price (a slowed kernel, a stall, the HTTP
thread) and token identities: those are the wall-clock layer's. A base whose engine has no
simulated backend is "not run", with the reason, not a failure.
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tensorfold_bench.errors import FlagError

THRESHOLD = 0.01  # a figure worse by this fraction or more fails
HIGHER_IS_BETTER = {"tok_s", "a_kept", "out_tok_s"}
PROFILES = Path(__file__).resolve().parents[2] / "receipts" / "profiles"
SIMULATOR = Path("engine") / "scheduler" / "simulated.py"
TIMEOUT_S = 300  # a side's replay; seconds on two cores normally
N_SHORTS, SHORT_TOKENS, SHORT_REPLY, DECODERS = 8, 200, 16, 4
MIXED_BUDGET_MS = 80.0  # the mixed scenario's forward budget (the CPU receipts' larger one)
LOAD_RATE, LOAD_S = 4.0, 6.0  # load+cold: requests/s and seconds of arrivals


@dataclass(frozen=True)
class Shape:
    """The gate preset's values the replay needs (GatePreset's, passed as plain data)."""
    levels: tuple[int, ...]
    tokens: int
    prompt_tokens: int
    b_at: float
    c_after: float
    b_tokens: int
    max_model_len: int
    load_input: int
    load_output: int
    prefill_rows: int = 256
    seed: int = 0


# ---- the replay (runs in a side's subprocess) ---------------------------------------------------

def _first_token(rec) -> float | None:
    return rec.token_times[0] - rec.sent if rec.token_times else None


def _tok_s(recs) -> float | None:
    times = [t for r in recs for t in r.token_times]
    sent = min(r.sent for r in recs)
    return len(times) / (max(times) - sent) if times and max(times) > sent else None


def _q(xs: list[float], q: float) -> float | None:
    """The q-quantile, linear between order statistics (deterministic, no resampling)."""
    if not xs:
        return None
    xs = sorted(xs)
    i = q * (len(xs) - 1)
    lo = math.floor(i)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (i - lo)


def replay(shape: Shape, profile: Path) -> dict[str, dict[str, float | None]]:
    """Every shape's figures, on the engine this process imports."""
    from engine.config import EngineConfig
    from engine.scheduler.backend import Capabilities
    from engine.scheduler.costs import Costs
    from tensorfold_bench.analysis.figures import long_prompt
    from tensorfold_bench.scenarios.long_prompt import LongPromptScript, timeline
    from tensorfold_bench.client.virtual import SimRequest, play
    from tensorfold_bench.workload.ids import prompt_ids

    costs = Costs.load(profile)
    vocab = int(costs.profile.model.get("vocab") or 512)
    caps = Capabilities(batch_cuts=costs.has("prefill_many"), mixed=costs.has("mixed"))
    s = shape

    def ids(key: str, n: int) -> list[int]:
        return prompt_ids(s.seed, key, n, vocab)

    def cfg(parallel: int, share: float = 1.0, mode: str = "stepped") -> EngineConfig:
        return EngineConfig(model="cpu", parallel=parallel, max_model_len=s.max_model_len,
                            prefill_rows=s.prefill_rows, prefill_mode=mode, prefill_share=share,
                            mixed_budget_ms=MIXED_BUDGET_MS, seed=s.seed)

    out: dict[str, dict[str, float | None]] = {}
    for n in s.levels:
        reqs = [SimRequest(f"s{i}", ids(f"sweep{i}", s.prompt_tokens), s.tokens) for i in range(n)]
        recs = list(play(reqs, cfg(n), costs, caps, vocab_size=vocab).records.values())
        out[f"sweep@{n}"] = {"tok_s": _tok_s(recs), "first_token_p50": _q([_first_token(r) for r in recs], 0.5)}

    decoders = [SimRequest(f"d{i}", ids(f"dec{i}", s.prompt_tokens), s.max_model_len - s.prompt_tokens - 1,
                           until=tuple(f"x{j}" for j in range(N_SHORTS))) for i in range(DECODERS)]
    shorts = [SimRequest(f"x{j}", ids(f"short{j}", SHORT_TOKENS), SHORT_REPLY, 0.5) for j in range(N_SHORTS)]
    recs = play(decoders + shorts, cfg(DECODERS + N_SHORTS), costs, caps, vocab_size=vocab).records
    firsts = [_first_token(recs[r.name]) for r in shorts]
    out["shorts"] = {"first_token_p50": _q(firsts, 0.5), "first_token_max": max(firsts),
                     "tok_s": _tok_s([recs[r.name] for r in shorts])}

    a_max = s.max_model_len - s.prompt_tokens - 1
    abc = timeline(LongPromptScript(b_at=s.b_at, c_after=s.c_after, b_tokens=s.b_tokens))  # its figure definitions
    modes = [(f"long_prompt p={share:g}", share, "stepped") for share in (1.0, 0.5)]
    modes += [(f"long_prompt mixed budget={MIXED_BUDGET_MS:g}", 1.0, "mixed")] if caps.mixed else []
    for name, share, mode in modes:
        reqs = [SimRequest("A", ids("A", s.prompt_tokens), a_max, until=("B", "C")),
                SimRequest("B", ids("B", s.b_tokens), 8, s.b_at),
                SimRequest("C", ids("C", 34), 16, s.b_at + s.c_after)]
        recs = play(reqs, cfg(4, share, mode), costs, caps, vocab_size=vocab).records
        f = long_prompt(abc, recs)
        kept = (f.a_rate_during / f.a_rate_before if f.a_rate_during is not None and f.a_rate_before else None)
        out[name] = {"b_first_token": f.b_first_token, "c_first_token": f.c_first_token,
                     "a_longest_pause": f.a_longest_pause, "a_kept": kept}

    rng = random.Random(s.seed)
    reqs, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(LOAD_RATE)
        if t >= LOAD_S:
            break
        reqs.append(SimRequest(f"q{i}", ids(f"load{i}", s.load_input), s.load_output, t))
        i += 1
    reqs.append(SimRequest("cold", ids("cold", s.b_tokens), 8, LOAD_S / 2))
    recs = play(reqs, cfg(max(s.levels)), costs, caps, vocab_size=vocab).records
    load = [recs[r.name] for r in reqs if r.name != "cold"]
    ttft = [_first_token(r) for r in load if r.token_times]
    out["load+cold"] = {"ttft_p50": _q(ttft, 0.5), "ttft_p99": _q(ttft, 0.99), "out_tok_s": _tok_s(load),
                        "cold_first_token": _first_token(recs["cold"])}
    return out


# ---- the comparison (runs in the gate) ----------------------------------------------------------

def default_profile(model: str, prefill_rows: int = 256, folder: Path = PROFILES) -> Path:
    """The committed profile whose shape matches the gate's engine: the CPU preset's model at its
    cut rows, a measured one before one fitted from traces, then the one pricing the most kinds of
    forward (short prompts filled together, mixed forwards: more of the host is replayed); else any
    CPU profile. Ties go to the last file name, so a folder always gives the same one."""
    found = []
    for p in sorted(folder.glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if (d.get("device") or {}).get("type") != "cpu":
            continue
        match = (d.get("model") or {}).get("name") == model, (d.get("engine") or {}).get("prefill_rows") == prefill_rows
        kinds = sum(bool(v) for v in (d.get("samples") or {}).values())
        found.append((match, d.get("source") == "measured", kinds, p.name, p))
    if not found:
        raise FlagError("--schedule-profile", f"no CPU profile in {folder}: name one, or pass --no-schedule")
    return max(found)[-1]


def _side_path(engine_root: Path, tmp: Path) -> Path:
    """A folder whose `engine` is the side's and whose `tensorfold_bench` is this tree's."""
    (tmp / "engine").symlink_to(engine_root.resolve() / "engine", target_is_directory=True)
    (tmp / "tensorfold_bench").symlink_to(Path(__file__).resolve().parents[1], target_is_directory=True)
    return tmp


def run_side(engine_root: Path, shape: Shape, profile: Path) -> dict:
    """One side's figures, from a subprocess on that side's engine. Raises ReplayError with the
    replay's last line when it fails."""
    with tempfile.TemporaryDirectory(prefix="tfbench-schedule-") as tmp:
        path = _side_path(Path(engine_root), Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(path), "PYTHONDONTWRITEBYTECODE": "1"}
        args = [sys.executable, "-m", "tensorfold_bench.scenarios.gate_schedule", str(profile),
                json.dumps(shape.__dict__)]
        try:
            p = subprocess.run(args, env=env, cwd=tmp, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ReplayError(f"the replay ran past {TIMEOUT_S} s") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReplayError(last)
    return json.loads(p.stdout)


class ReplayError(RuntimeError):
    """A side's replay failed: its last line."""


def change(figure: str, base: float | None, new: float | None) -> float | None:
    """New against base as a fraction, positive when new is worse (None: a side has no value)."""
    if base is None or new is None:
        return None
    worse = (base - new) if figure in HIGHER_IS_BETTER else (new - base)
    return worse / abs(base) if base else (math.inf if worse > 0 else 0.0)


def compare(base: dict, new: dict) -> tuple[list[dict], list[str]]:
    """(rows: scenario, figure, base, new, worse_by; reasons to fail). A figure one side lacks is
    worse when new lost it."""
    rows, reasons = [], []
    for scen, figs in base.items():
        for fig, b in figs.items():
            n = (new.get(scen) or {}).get(fig)
            w = change(fig, b, n)
            rows.append({"scenario": scen, "figure": fig, "base": b, "new": n, "worse_by": w})
            if (w is not None and w >= THRESHOLD) or (b is not None and n is None):
                what = "no value on new" if w is None else f"worse by {w * 100:.2f} %"
                reasons.append(f"schedule layer, {scen}: {fig} {what} (base {_fmt(b)}, new {_fmt(n)}; simulated)")
    return rows, reasons


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def layer(base_root: Path | None, new_root: Path, shape: Shape, profile: Path, accepted: bool = False) -> dict:
    """The schedule layer's section of the gate receipt: `status` run or not run (with `why`), each
    side's figures, the rows, and `reasons` to fail (none when `accepted`: then `acknowledged`)."""
    out = {"status": "not run", "why": None, "profile": str(profile), "threshold": THRESHOLD, "rows": [],
           "reasons": [], "acknowledged": [], "simulated": True}
    if base_root is None:
        out["why"] = "no base to compare with (the working tree against itself)"
        return out
    if not (Path(base_root) / SIMULATOR).exists():
        out["why"] = f"the base's engine predates the simulator (no {SIMULATOR})"
        return out
    with ThreadPoolExecutor(2) as pool:  # the two sides' subprocesses at once
        sides = [pool.submit(run_side, Path(root), shape, profile) for root in (base_root, new_root)]
    try:
        base = sides[0].result()
    except ReplayError as e:
        out["why"] = f"the base's engine does not run the replay: {e}"
        return out
    try:
        new = sides[1].result()
    except ReplayError as e:
        out.update(status="run", reasons=[f"schedule layer: the new side's replay failed: {e}"])
        return out
    rows, reasons = compare(base, new)
    out.update(status="run", rows=rows)
    out["acknowledged" if accepted else "reasons"] = reasons
    return out


def main(argv: list[str]) -> None:
    profile, shape = Path(argv[0]), json.loads(argv[1])
    shape["levels"] = tuple(shape["levels"])
    json.dump(replay(Shape(**shape), profile), sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
