"""`tfbench compare`: two saved receipts side by side, figure by figure."""
from __future__ import annotations

from tensorfold_bench.analysis.figures import across_sessions, figure_runs
from tensorfold_bench.receipt import Receipt, as_receipt
from tensorfold_bench.report.fmt import num


def _label(r: Receipt, name: str, side: str) -> str:
    commit = (r.environment and r.environment.engine and r.environment.engine.commit) or "unknown"
    return f"- {side}: `{name}` ({r.scenario}, {r.created}, engine commit {commit})"


def markdown(a: dict, b: dict, name_a: str, name_b: str) -> str:
    """Different sessions are not drift-paired, so the call is only whether B's median lies
    inside A's span of runs."""
    ra, rb = figure_runs(a), figure_runs(b)
    lines = ["## tfbench compare", "", _label(as_receipt(a), name_a, "A"), _label(as_receipt(b), name_b, "B"), "",
             "Two sessions, so no drift pairing: B's median is called within A's span or outside it.", "",
             "| figure | variant | A runs | A median (span) | B runs | B median | B vs A | |",
             "|---|---|---|---|---|---|---|---|"]
    for fig in [f for f in ra if f in rb] + [f for f in rb if f not in ra]:
        va, vb = ra.get(fig, {}), rb.get(fig, {})
        for v in [n for n in va if n in vb] + [n for n in vb if n not in va] + [n for n in va if n not in vb]:
            xa, xb = va.get(v, []), vb.get(v, [])
            c = across_sessions(xa, xb)
            pct = "-" if c["pct"] is None else f"{c['pct']:+.1f} %"
            call = {None: "-", True: "within A's span", False: "outside A's span"}[c["within"]]
            span = f" ({num(min(xa))} to {num(max(xa))})" if xa else ""
            lines.append(f"| {fig} | {v} | {' / '.join(num(x) for x in xa) or '-'} | {num(c['a'])}{span} | "
                         f"{' / '.join(num(x) for x in xb) or '-'} | {num(c['b'])} | {pct} | {call} |")
    return "\n".join(lines) + "\n"
