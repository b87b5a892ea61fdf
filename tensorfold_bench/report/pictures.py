"""The receipts' pictures: the long-prompt timeline and frontier, and the sweep's tok/s by streams."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from tensorfold_bench.analysis import figures  # noqa: E402
from tensorfold_bench.analysis.figures import LongPromptFigures, at, token_gaps  # noqa: E402
from tensorfold_bench.analysis.stats import FigureStats  # noqa: E402
from tensorfold_bench.receipt import Receipt, Record, Run, as_receipt  # noqa: E402
from tensorfold_bench.report.fmt import num  # noqa: E402
from tensorfold_bench.report.script import script_of  # noqa: E402

GAP_FLOOR = 0.005  # two tokens read together (one TCP read) have a gap of ~0: drawn here


def representative(runs: list[Run]) -> Run | None:
    """The valid run whose B first token is the median (the lower middle of an even count)."""
    figs = [(LongPromptFigures.from_dict(r.figures), r) for r in runs]
    ok = [(f, r) for f, r in figs if f.valid and f.b_first_token is not None] or figs
    if not ok:
        return None
    ok = sorted(ok, key=lambda fr: fr[0].b_first_token or 0.0)
    return ok[(len(ok) - 1) // 2][1]


def _axes(fig, n: int, has_trace: bool) -> tuple[list, list]:
    outer = fig.add_gridspec(n, 1, hspace=0.32)
    axes, strips = [], []
    for k in range(n):
        share = {"sharex": axes[0]} if axes else {}
        if has_trace:
            inner = outer[k].subgridspec(2, 1, height_ratios=[4, 1], hspace=0.06)
            axes.append(fig.add_subplot(inner[0], **share))
            strips.append(fig.add_subplot(inner[1], sharex=axes[0]))
            axes[-1].tick_params(labelbottom=False)
        else:
            axes.append(fig.add_subplot(outer[k], **share))
    return axes, strips


def _gaps_panel(ax, name: str, run: Run) -> None:
    recs = run.records
    t0 = recs["A"].sent
    gaps = token_gaps(recs["A"].token_times)
    gaps_x = [t - t0 for t, _ in gaps]
    gaps_y = [max(g, GAP_FLOOR) for _, g in gaps]
    ax.plot(gaps_x, gaps_y, ".", ms=2.5, color="0.25",
            label=f"A: gap before each token (below {GAP_FLOOR * 1000:g} ms: at the floor)")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("A gap (s)")
    f = LongPromptFigures.from_dict(run.figures)
    b, c = recs["B"], recs["C"]
    marks = [(b.sent, "tab:blue", "--", "B send"),
             (b.token_times[0] if b.token_times else None, "tab:blue", "-", "B first token"),
             (c.sent, "tab:orange", "--", "C send"),
             (c.token_times[0] if c.token_times else None, "tab:orange", "-", "C first token")]
    for t, col, ls, lab in marks:
        if t is not None:
            ax.axvline(t - t0, color=col, ls=ls, lw=1.2, label=lab)
    if b.sent is not None and b.token_times:
        ax.axvspan(b.sent - t0, b.token_times[0] - t0, color="tab:blue", alpha=0.07)
    s, r = (lambda v: f"{num(v, 2)} s"), (lambda v: f"{num(v, 1)} tok/s")
    title = (f"{name} (run {run.index}): B first token {s(f.b_first_token)}, C {s(f.c_first_token)}, "
             f"A longest pause {s(f.a_longest_pause)}, A {r(f.a_rate_during)} during B "
             f"({r(f.a_rate_before)} before)")
    ax.set_title(title + ("" if f.valid else "  [INVALID]"), fontsize=9, loc="left")
    ax.grid(True, which="major", alpha=0.3)
    ax.set_ylim(GAP_FLOOR * 0.8, max(gaps_y + [1.0]) * 2)


def _trace_strip(sx, run: Run) -> None:
    t0 = run.records["A"].sent
    steps = run.trace or []
    # a mixed forward (the engine's --prefill-mode mixed) carries both: it shows on both strips
    pre = [(s.t - t0, s.dur) for s in steps if s.kind in ("prefill", "mixed") and s.t + s.dur >= t0]
    dec = [(s.t - t0, s.dur) for s in steps if s.kind != "prefill" and s.t + s.dur >= t0]
    sx.broken_barh(dec, (0, 1), color="0.6")
    sx.broken_barh(pre, (1.1, 1), color="tab:red")
    sx.set_yticks([0.5, 1.6], ["decode", "prompt"], fontsize=7)
    sx.set_ylim(0, 2.2)
    sx.tick_params(axis="y", length=0)
    if not steps:
        sx.text(0.5, 0.5, "no trace", transform=sx.transAxes, ha="center", va="center", fontsize=7)


def timeline(data: Receipt | dict, path: Path) -> Path | None:
    """Per variant (its representative run), A's inter-token gaps over time with B's and C's send
    and first token marked; under it, when the engine kept a trace, its prompt steps and decode
    rounds as a strip."""
    rcpt, panels = as_receipt(data), []
    for v in rcpt.variants:
        rep = representative([r for r in rcpt.runs if r.variant == v.name and r.records])
        if rep is not None:
            panels.append((v.name, rep))
    if not panels:
        return None
    has_trace = any(r.trace for _, r in panels)
    fig = plt.figure(figsize=(11, 3.1 * len(panels) + 0.4))
    axes, strips = _axes(fig, len(panels), has_trace)
    for k, (name, run) in enumerate(panels):
        _gaps_panel(axes[k], name, run)
        if k == 0:
            fig.legend(*axes[k].get_legend_handles_labels(), loc="upper center", fontsize=8, ncol=5, frameon=False,
                       bbox_to_anchor=(0.5, 0.955))
        if has_trace:
            _trace_strip(strips[k], run)
    end = max((r.records["A"].ended or 0) - r.records["A"].sent for _, r in panels)
    last = strips[-1] if strips else axes[-1]
    last.set_xlim(0, end * 1.02 if end > 0 else None)
    for a in axes + strips:
        if a is not last:
            a.tick_params(labelbottom=False)
    last.set_xlabel("seconds since A's send")
    fig.suptitle("A's inter-token gaps while B's cold prompt fills"
                 + ("; strips: the engine's prompt steps and decode rounds" if has_trace else ""), fontsize=11)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def frontier(data: Receipt | dict, path: Path,
             summary: dict[str, figures.VariantSummary] | None = None) -> Path | None:
    """B's slowdown against A's kept rate, a labelled marker per variant (figures.frontier), the
    stepped (share), mixed and split variants each joined in order of slowdown, and the line 1 - 1/x that
    alternating whole steps sits on, dashed; the targets (figures.FRONTIER_TARGETS) as stars at the
    corner of the region that meets each, gold where a variant is in it; None when the frontier has
    fewer than two variants. `summary`: figures.long_prompt_summary's, where the caller has it."""
    rows = figures.frontier(data, summary)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=90)
    xs = [r["slowdown"] for r in rows]
    # room on the right for the last label and the targets
    lo, hi = min(min(xs), 1.0), max(max(xs) * 1.3, max(x for x, _ in figures.FRONTIER_TARGETS) * 1.1)
    line_x = [lo * (hi / lo) ** (i / 99) for i in range(100)]
    ax.plot(line_x, [100 * (1 - 1 / x) for x in line_x], "--", color="0.5", lw=1,
            label="alternating whole steps: 1 - 1/x")
    colors = {"stepped": "tab:blue", "mixed": "tab:red", "split": "tab:green"}
    for mode, label in (("stepped", "stepped (prefill share)"), ("mixed", "mixed"), ("split", "split (SMs)")):
        mine = [r for r in rows if r["mode"] == mode]  # in order of slowdown, as figures.frontier gives them
        if mine:
            ax.plot([r["slowdown"] for r in mine], [r["kept"] for r in mine], "-o", color=colors[mode], lw=1.2, ms=5,
                    label=label)
    for k, (x, kept, met) in enumerate(figures.targets_met(rows)):
        # a target is the corner of the region that meets it: up and left of the star
        ax.plot([x], [kept], "*", color="goldenrod" if met else "0.55", ms=11, zorder=3,
                label="targets (met: gold)" if k == 0 else None)
        ax.plot([lo / 1.05, x, x], [kept, kept, 105], ":", color="goldenrod" if met else "0.6", lw=0.9)
    others = [r for r in rows if r["mode"] not in colors]
    if others:
        ax.plot([r["slowdown"] for r in others], [r["kept"] for r in others], "o", color="0.2", ms=5,
                label="other variants")
    for k, r in enumerate(rows):
        # neighbours in slowdown are labelled above and below in turn, so close points stay readable
        ax.annotate(r["variant"], (r["slowdown"], r["kept"]), textcoords="offset points",
                    xytext=(5, 4 if k % 2 == 0 else -10), fontsize=7)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo / 1.05, hi)
    ax.set_ylim(min(0.0, *(r["kept"] for r in rows)) - 2, max(100.0, *(r["kept"] for r in rows)))
    ax.set_xlabel("B's slowdown (its first token against alone)")
    ax.set_ylabel("A kept while B fills (% of its rate before)")
    ax.set_title("frontier: up and left is better", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    _save_small(fig, path)
    plt.close(fig)
    return path


def sweep(data: Receipt | dict, path: Path) -> Path | None:
    """Aggregate tok/s against streams: each run a dot, each variant's medians a line."""
    r = as_receipt(data)
    levels = r.settings.script["levels"]
    stats = {lv: FigureStats.from_dict(r.stats[at("tok_s", lv)]) for lv in levels}
    if not any(m is not None for lv in levels for m in stats[lv].medians.values()):
        return None  # every run failed: nothing to draw
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for k, v in enumerate(r.variants):
        name = v.name
        med = [stats[lv].medians.get(name) for lv in levels]
        if all(m is None for m in med):
            continue
        color = f"C{k}"
        ax.plot(levels, [m if m is not None else float("nan") for m in med], "-", color=color, label=name)
        for lv in levels:
            ys = stats[lv].runs.get(name, [])
            ax.plot([lv * (1 + 0.03 * (k - 0.5))] * len(ys), ys, "o", color=color, alpha=0.6, ms=4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(lv) for lv in levels])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate tok/s")
    ax.set_title("sweep: median per variant, dots = runs")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _script_run(runs: list[Run], key: str | None) -> Run | None:
    """The valid run whose first figure is the median (the lower middle), else the first run."""
    ok = [r for r in runs if r.figures["valid"] and key and r.figures["values"].get(key) is not None]
    if not ok:
        return runs[0] if runs else None
    ok = sorted(ok, key=lambda r: r.figures["values"][key])
    return ok[(len(ok) - 1) // 2]


def _event_t(rec: Record, kind: str) -> float | None:
    if kind == "sent":
        return rec.sent
    if kind == "first_token":
        return rec.token_times[0] if rec.token_times else None
    if kind == "cancelled":
        return rec.ended if rec.cancelled else None
    return rec.ended if rec.ended is not None and not rec.cancelled and not rec.error else None


def script(data: Receipt | dict, path: Path) -> Path | None:
    """Per variant (its representative run), every stream as a lane over time: from its send to
    its end, a tick per token, its first token and its cancel marked; each window figure's
    window shaded on its stream's lane."""
    rcpt = as_receipt(data)
    keys, sc = rcpt.settings.figure_keys or [], script_of(rcpt)
    panels = []
    for v in rcpt.variants:
        rep = _script_run([r for r in rcpt.runs if r.variant == v.name and r.records], keys[0] if keys else None)
        if rep is not None:
            panels.append((v.name, rep))
    if not panels:
        return None
    names = [s.name for s in sc.streams]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 0.45 * len(names) * len(panels) + 1.2 * len(panels) + 0.4),
                             squeeze=False, sharex=True)
    for ax, (name, run) in zip(axes[:, 0], panels):
        recs, t0 = run.records, run.t0
        for y, n in enumerate(names):
            r = recs[n]
            if r.sent is None:
                ax.text(0, y, "  not sent", va="center", fontsize=7, color="0.4")
                continue
            end = r.ended if r.ended is not None else (r.token_times[-1] if r.token_times else r.sent)
            ax.broken_barh([(r.sent - t0, max(end - r.sent, 1e-3))], (y - 0.3, 0.6), color="0.9")
            if r.token_times:
                ax.plot([t - t0 for t in r.token_times], [y] * len(r.token_times), "|", ms=7, color="0.3",
                        mew=0.6)
                ax.plot([r.token_times[0] - t0], [y], "o", ms=4, color="tab:blue")
            if r.cancelled:
                ax.plot([end - t0], [y], "x", ms=6, color="tab:red")
        for f in sc.figures:
            if not f.window:
                continue
            ts = []
            for p in f.window:
                t = t0 if p.event is None else _event_t(recs[p.event.stream], p.event.kind)
                ts.append(None if t is None else t + p.plus - t0)
            if None not in ts:
                y = names.index(f.stream)
                ax.broken_barh([(ts[0], ts[1] - ts[0])], (y - 0.45, 0.9), color="tab:orange", alpha=0.15)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_title(f"{name} (run {run.index})" + ("" if run.figures["valid"] else "  [INVALID]"), fontsize=9,
                     loc="left")
    axes[-1, 0].set_xlabel("seconds since the run's start")
    fig.suptitle(f"script {sc.name}: each stream from its send to its end; ticks: tokens, "
                 "dot: first token, x: cancelled; shaded: a figure's window", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load(data: Receipt | dict, path: Path) -> Path | None:
    """tfbench load: latency percentiles (TTFT p50 and p99, TPOT p99, from each variant's medians)
    against the level, and goodput (or output tok/s without an SLO) against the level."""
    r = as_receipt(data)
    levels = r.settings.levels
    if len(levels) < 2:
        return None  # one level (a trace, one rate) is a point, not a curve: the tables say it all
    xs = [float(lv.value) if isinstance(lv.value, (int, float)) else float(i) for i, lv in enumerate(levels)]
    stats_ = r.stats or {}

    def series(fam: str, name: str) -> list[float]:
        return [(stats_.get(f"{fam}@{lv.label}") or {}).get("medians", {}).get(name) for lv in levels]

    names = [v.name for v in r.variants]
    if not any(m is not None for n in names for m in series("ttft_p99", n)):
        return None  # no valid run: nothing to draw
    good = "goodput" if any(v is not None for n in names for v in series("goodput", n)) else "out_tok_s"
    fig, (ax, gx) = plt.subplots(1, 2, figsize=(9.6, 3.6), dpi=72)  # small: a receipt's picture is committed
    for k, name in enumerate(names):
        color = f"C{k}"
        for fam, style in (("ttft_p50", ":"), ("ttft_p99", "-"), ("tpot_p99", "--")):
            ys = series(fam, name)
            if any(y is not None for y in ys):
                ax.plot(xs, [y if y is not None else float("nan") for y in ys], style, marker="o", ms=3, color=color,
                        label=f"{name} {fam.replace('_', ' ')}")
        ys = series(good, name)
        gx.plot(xs, [y if y is not None else float("nan") for y in ys], "-", marker="o", ms=4, color=color, label=name)
        for lv, x in zip(levels, xs):  # each run a dot
            runs = (stats_.get(f"{good}@{lv.label}") or {}).get("runs", {}).get(name, [])
            gx.plot([x] * len(runs), runs, ".", color=color, alpha=0.5)
    kind = levels[0].kind if levels else "rate"
    xlabel = {"rate": "offered load (requests/s)", "concurrency": "concurrent requests"}.get(kind, "level")
    if kind == "trace":
        for a in (ax, gx):
            a.set_xticks(xs, [lv.label for lv in levels])
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.set_title("latency: median over runs")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    gx.set_xlabel(xlabel)
    gx.set_ylabel("goodput (requests/s meeting the SLO)" if good == "goodput" else "output tok/s")
    gx.set_title(("goodput" if good == "goodput" else "output tok/s") + ": median, dots = runs")
    gx.grid(alpha=0.3)
    gx.legend(fontsize=8)
    fig.tight_layout()
    _save_small(fig, path)
    plt.close(fig)
    return path


def _save_small(fig, path: Path) -> None:
    """Saved with a 24-colour palette: lines and text on white need no more, and the file is a
    third of the full-colour one (receipts are committed)."""
    import io

    from PIL import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=24).save(path, optimize=True)
