"""The one number formatter, the one statistics table and the environment lines every receipt
shares."""
from __future__ import annotations

from typing import Callable

from tensorfold_bench import stats
from tensorfold_bench.figures import spec


def num(v: float | None, digits: int = 2, none: str = "-") -> str:
    """`1,234.57`; `none` for a missing value (receipts made before this module used "-" in
    long-prompt tables and "–" in sweep tables: each keeps its own)."""
    if v is None or v != v:
        return none
    return f"{v:,.{digits}f}"


def short_commit(c: str | None) -> str:
    if not c:
        return "unknown"
    sha, _, rest = c.partition("+")
    return sha[:10] + (f"+{rest}" if rest else "")


def stats_table(figs: dict, base: str, *, label: str = "figure", runs_header: str = "runs (in run order)",
                digits: int | None = None, none: str = "-", span_sep: str = " to ",
                key: Callable[[str], str] = str, base_mark: str = " (base)") -> list[str]:
    """One row per (figure, variant): every run's value in run order, the median (base: with its
    span), new vs base, the paired 95 % interval and the verdict. `digits` None: the registry's."""
    lines = [f"| {label} | variant | {runs_header} | median | vs {base} | paired 95 % interval | verdict |",
             "|---|---|---|---|---|---|---|"]
    for name, d in figs.items():
        fs = stats.FigureStats.from_dict(d)
        n = spec(name).digits if digits is None else digits
        for v in [base] + [x for x in fs.runs if x != base]:
            vals = " / ".join(num(x, n, none) for x in fs.runs.get(v, [])) or none
            if v == base:
                span = f" (span {num(fs.base_span[0], n, none)}{span_sep}{num(fs.base_span[1], n, none)})" \
                    if fs.base_span else ""
                lines.append(f"| {key(name)} | {v}{base_mark} | {vals} | **{num(fs.medians.get(v), n, none)}**{span} | | | |")
                continue
            c = fs.comparisons[v]
            iv = none if c.interval_pct is None else f"{c.interval_pct[0]:+.1f} % to {c.interval_pct[1]:+.1f} %"
            lines.append(f"| {key(name)} | {v} | {vals} | **{num(c.median, n, none)}** | {stats.fmt_pct(c.pct)} | "
                         f"{iv} | {c.verdict} |")
    return lines


def environment_lines(data: dict) -> list[str]:
    """Device, model, server, variants and host, from the receipt's header."""
    env = data.get("environment") or {}
    eng = env.get("engine") or {}
    desc = eng.get("engine") or {}
    cfg = eng.get("config") or {}
    host = data.get("host") or {}
    dev = desc.get("device_name") or desc.get("device") or "unknown device"
    bits = [f"{dev}"]
    if desc.get("compute_capability"):
        bits.append(f"sm {desc['compute_capability']}")
    bits.append(f"CUDA {desc.get('cuda_version') or desc.get('cuda') or '-'}")
    bits.append(f"driver {desc.get('driver') or '-'}")
    bits.append(f"torch {desc.get('torch') or '-'}")
    bits.append(f"engine commit {short_commit(eng.get('commit'))}")
    lines = ["- Device: " + ", ".join(bits) + "."]
    shape = desc.get("shape") or {}
    shape_s = ", ".join(f"{k} {v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k} {v}"
                        for k, v in shape.items())
    params = desc.get("parameters")
    lines.append(f"- Model: `{desc.get('model') or cfg.get('model') or '?'}` ({desc.get('dtype') or cfg.get('dtype') or '?'}"
                 + (f", {params:,} parameters" if isinstance(params, int) else "") + ")"
                 + (f"; shape: {shape_s}." if shape_s else "."))
    st = data["settings"]
    if st.get("url"):
        lines.append(f"- Server: {st['url']} (not launched by tfbench).")
    else:
        lines.append(f"- Shared engine flags: `{' '.join(st['engine_flags'])}`; a fresh server per run.")
    if st.get("sampling"):  # receipts from before sampling have none
        lines.append(sampling_line(st["sampling"]))
    lines.append("- Variants: " + "; ".join(f"{v['name']} `{' '.join(v['args']) or '(no flags)'}`"
                                            + (f" env {v['env']}" if v.get("env") else "")
                                            + (f" @ {v['ref']}" if v.get("ref") else "") for v in data["variants"]) + ".")
    lines.append(f"- Host: Python {host.get('python')}, {host.get('platform')}; tfbench {host.get('tfbench')}"
                 + f" @ {short_commit(host.get('harness_commit'))}; {data.get('created')}.")
    return lines


def sampling_line(d: dict) -> str:
    """`--temperature` and `--seed` as the receipt stored them (tensorfold_bench.sampling)."""
    if not d["temperature"]:
        return "- Sampling: greedy (temperature 0)."
    return (f"- Sampling: temperature {d['temperature']:g}, seed {d['seed']}; each request's seed is derived from "
            f"it and the request's role ({d['request_seed']}), so a prompt gets the same seed on every server, "
            "run and variant and in the plain reference.")


def not_run_lines(notes: list[str]) -> list[str]:
    return ["**Not run, and why.**", *([f"- {n}" for n in notes] or ["- Nothing left out."])]
