"""A sweep's figures, as pure functions of its raw batches (no I/O, no clock); the names, units
and labels are the registry's in `figures`.

Per level L: `tok_s@L` = all tokens of a burst / (last token time - first send time), the median
over reps per cell, then over cells; `ttft_p50@L` (each stream's first token from its own send),
`itl_p50@L` and `itl_p99@L` (gaps between consecutive tokens, 0 inside a chunk), pooled over
every stream of the level, from the per-token times the sweep keeps.
"""
from __future__ import annotations

import numpy as np

from tensorfold_bench.analysis import stats
from tensorfold_bench.analysis.figures import LATENCY, at, median, spec, stats_for
from tensorfold_bench.client.stream import StreamRecord


def gaps_us(rec: StreamRecord) -> list[int]:
    """Every token's time, compactly: microseconds from the send to the first token, then from
    each token to the next (0 inside a chunk)."""
    if rec.sent is None:
        return []
    prev, out = rec.sent, []
    for t in rec.token_times:
        out.append(round((t - prev) * 1e6))
        prev = t
    return out


def sweep_batch(level: int, cell: int, rep: int, recs: list[StreamRecord], tokens: int, hashes: list) -> dict:
    """One burst of `level` streams: aggregate tok/s = all tokens / (last token time - first send
    time), None when a stream failed or came short; the raw times are kept beside it."""
    errors = []
    for i, r in enumerate(recs):  # r.tokens: the server's usage count where only chunks were seen
        if r.error:
            errors.append(f"stream {i}: {r.error}")
        elif r.tokens != tokens:
            errors.append(f"stream {i}: {r.tokens} of {tokens} tokens")
    n = sum(r.tokens for r in recs)
    sends = [r.sent for r in recs if r.sent is not None]
    lasts = [r.token_times[-1] for r in recs if r.token_times]
    wall = (max(lasts) - min(sends)) if sends and lasts else None
    tok_s = n / wall if wall and not errors else None
    return {"level": level, "cell": cell, "rep": rep, "tok_s": tok_s, "tokens": n, "wall_s": wall, "hashes": hashes,
            "errors": errors, "sent": [r.sent for r in recs], "send_spread_ms": send_spread_ms(sends),
            "last_token": [r.token_times[-1] if r.token_times else None for r in recs],
            "gaps_us": [gaps_us(r) for r in recs],
            "counted_by": sorted({r.counted_by for r in recs if r.counted_by}),
            "system_fingerprint": next((r.system_fingerprint for r in recs if r.system_fingerprint), None)}


def send_spread_ms(sends: list[float]) -> float | None:
    """How far apart a burst's sends were, first to last (ms): the streams "starting together"."""
    return round((max(sends) - min(sends)) * 1000, 3) if len(sends) > 1 else None


def sweep_counted_by(batches: list[dict]) -> str | None:
    """The weakest way any reply's tokens were counted in a run (ids, logprobs, chunks)."""
    ways = {w for b in batches for w in b.get("counted_by") or []}
    for w in ("chunks", "logprobs", "ids"):
        if w in ways:
            return w
    return None


def cell_tok_s(batches: list[dict], level: int, cell: int) -> float | None:
    return median([b["tok_s"] for b in batches if b["level"] == level and b["cell"] == cell])


def level_tok_s(batches: list[dict], level: int) -> float | None:
    cells = sorted({b["cell"] for b in batches if b["level"] == level})
    return median([cell_tok_s(batches, level, c) for c in cells])


def latency(batches: list[dict], level: int) -> dict[str, float | None]:
    """ttft_p50, itl_p50, itl_p99 in ms for one level, pooled over its streams; {} without times."""
    lv = [b for b in batches if b["level"] == level]
    if not lv or any(b.get("gaps_us") is None for b in lv):
        return {}
    ttft = [g[0] / 1000 for b in lv for g in b["gaps_us"] if g]
    itl = [x / 1000 for b in lv for g in b["gaps_us"] for x in g[1:]]
    return {at("ttft_p50", level): median(ttft),
            at("itl_p50", level): float(np.percentile(itl, 50)) if itl else None,
            at("itl_p99", level): float(np.percentile(itl, 99)) if itl else None}


def sweep_run(batches: list[dict]) -> dict[str, float | None]:
    """A run's figures: tok_s@L for each level, then (when the times were kept) its latencies."""
    levels = sorted({b["level"] for b in batches})
    out: dict[str, float | None] = {at("tok_s", lv): level_tok_s(batches, lv) for lv in levels}
    for lv in levels:
        out.update(latency(batches, lv))
    return out


def batch_errors(batches: list[dict]) -> list[str]:
    return [f"level {b['level']} cell {b['cell']} rep {b['rep']}: {e}" for b in batches for e in b["errors"]]


def counted_figures(run: dict) -> dict:
    """The run's figures, or none when its client self-check marked it invalid."""
    return {} if (run.get("client") or {}).get("invalid") else run["figures"]


def sweep_stats(data: dict) -> dict:
    """tok_s@L's statistics for every level."""
    st = data["settings"]
    names = [at("tok_s", lv) for lv in st["script"]["levels"]]
    return {k: fs.to_dict() for k, fs in stats_for(
        names, [r["variant"] for r in data["runs"]], [counted_figures(r) for r in data["runs"]], st["base"],
        st.get("margin", stats.DEFAULT_MARGIN)).items()}


def sweep_latency(data: dict) -> dict[str, dict[str, float | None]]:
    """figure -> variant -> median over runs, for the latency figures a sweep kept; {} if none."""
    out: dict[str, dict] = {}
    for r in data["runs"]:
        for name, v in counted_figures(r).items():
            if spec(name).name in LATENCY:
                out.setdefault(name, {}).setdefault(r["variant"], []).append(v)
    return {n: {v: median(xs) for v, xs in by.items()} for n, by in out.items()}


def sweep_predicted(data: dict) -> dict[str, dict[str, float | None]]:
    """variant -> figure -> median for a sweep's predictions: tok/s from the statistics, the
    latencies as the receipt's latency table gives them."""
    out: dict[str, dict] = {}
    for name, by in ({n: fs["medians"] for n, fs in data["stats"].items()} | sweep_latency(data)).items():
        for v, m in by.items():
            out.setdefault(v, {})[name] = m
    return out
