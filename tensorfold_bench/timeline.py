"""The timeline picture: per variant (one representative run: the valid run whose B first token
is the median), A's inter-token gaps over time with B's and C's send and first token marked;
under it, when the engine kept a trace, its prompt steps and decode rounds as a strip."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def representative(runs: list[dict]) -> dict | None:
    ok = [r for r in runs if r["figures"]["valid"] and r["figures"]["b_first_token"] is not None] or runs
    if not ok:
        return None
    ok = sorted(ok, key=lambda r: r["figures"]["b_first_token"] or 0.0)
    return ok[(len(ok) - 1) // 2]


def draw(data: dict, path: Path) -> Path | None:
    panels = []
    for v in data["variants"]:
        rep = representative([r for r in data["runs"] if r["variant"] == v["name"]])
        if rep is not None:
            panels.append((v["name"], rep))
    if not panels:
        return None
    has_trace = any(r.get("trace") for _, r in panels)
    ratios = []
    for _ in panels:
        ratios += [4, 1] if has_trace else [4]
    fig, axes = plt.subplots(len(ratios), 1, figsize=(11, 2.9 * len(panels) + 0.6), sharex=True,
                             gridspec_kw={"height_ratios": ratios, "hspace": 0.12 if has_trace else 0.3})
    axes = list(axes) if len(ratios) > 1 else [axes]
    step = 2 if has_trace else 1
    for k, (name, run) in enumerate(panels):
        ax = axes[k * step]
        recs = run["records"]
        t0 = recs["A"]["sent"]
        times = recs["A"]["token_times"]
        gaps_x = [b - t0 for a, b in zip(times, times[1:])]
        gaps_y = [max(b - a, 1e-4) for a, b in zip(times, times[1:])]
        ax.plot(gaps_x, gaps_y, ".", ms=2.5, color="0.25", label="A: gap before each token")
        ax.set_yscale("log")
        ax.set_ylabel("A gap (s)")
        f = run["figures"]
        b, c = recs["B"], recs["C"]
        marks = [(b["sent"], "tab:blue", "--", "B send"), (b["token_times"][0] if b["token_times"] else None, "tab:blue", "-", "B first token"),
                 (c["sent"], "tab:orange", "--", "C send"), (c["token_times"][0] if c["token_times"] else None, "tab:orange", "-", "C first token")]
        for t, col, ls, lab in marks:
            if t is not None:
                ax.axvline(t - t0, color=col, ls=ls, lw=1.2, label=lab)
        if b["sent"] is not None and b["token_times"]:
            ax.axvspan(b["sent"] - t0, b["token_times"][0] - t0, color="tab:blue", alpha=0.07)
        title = (f"{name} (run {run['index']}): B first token {_s(f['b_first_token'])}, C {_s(f['c_first_token'])}, "
                 f"A longest pause {_s(f['a_longest_pause'])}, A {_r(f['a_rate_during'])} during B ({_r(f['a_rate_before'])} before)")
        if not f["valid"]:
            title += "  [INVALID]"
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(True, which="major", alpha=0.3)
        if k == 0:
            ax.legend(loc="upper left", fontsize=7, ncol=5, framealpha=0.9)
        if has_trace:
            sx = axes[k * step + 1]
            steps = run.get("trace") or []
            pre = [(s["t"] - t0, s["dur"]) for s in steps if s["kind"] == "prefill" and s["t"] + s["dur"] >= t0]
            dec = [(s["t"] - t0, s["dur"]) for s in steps if s["kind"] != "prefill" and s["t"] + s["dur"] >= t0]
            sx.broken_barh(dec, (0, 1), color="0.6")
            sx.broken_barh(pre, (1.1, 1), color="tab:red")
            sx.set_yticks([0.5, 1.6], ["decode", "prompt"], fontsize=7)
            sx.set_ylim(0, 2.2)
            sx.tick_params(axis="y", length=0)
            if not steps:
                sx.text(0.5, 0.5, "no trace", transform=sx.transAxes, ha="center", va="center", fontsize=7)
    end = max((r["records"]["A"]["ended"] or 0) - r["records"]["A"]["sent"] for _, r in panels)
    axes[-1].set_xlim(0, end * 1.02 if end > 0 else None)
    axes[-1].set_xlabel("seconds since A's send")
    fig.suptitle("tfbench long-prompt: A's inter-token gaps while B's cold prompt fills", fontsize=11, y=0.995)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _s(v):
    return "-" if v is None else f"{v:.2f} s"


def _r(v):
    return "-" if v is None else f"{v:.1f} tok/s"
