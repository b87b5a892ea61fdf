"""`tfbench load`'s receipt Markdown, from its JSON alone: per level the paired verdicts, the latency
percentiles, goodput and lateness per variant, the interference table, exactness."""
from __future__ import annotations

from tensorfold_bench.analysis.exactness import other_kernels_line
from tensorfold_bench.analysis.figures import median
from tensorfold_bench.analysis.load import JUDGED, LABELS
from tensorfold_bench.analysis.predictions import Predictions
from tensorfold_bench.receipt import Exactness, Receipt, as_receipt
from tensorfold_bench.report.fmt import client_lines, header_lines, margin_pct, not_run_lines, num, stats_table

DASH = "–"


def _slo_text(slo: dict) -> str:
    parts = [f"{k} ≤ {v * 1000:g} ms" if v < 1 else f"{k} ≤ {v:g} s" for k, v in slo.items() if v is not None]
    return ", ".join(parts)


def level_runs(r: Receipt, label: str, variant: str) -> list[dict]:
    """The figures of one level in each valid run of a variant (analysis.load's, by name)."""
    out = []
    for run in r.runs:
        if run.variant != variant or not run.valid:
            continue
        out += [lv.figures for lv in run.levels if lv.label == label and lv.figures]
    return out


def med(figs: list[dict], path: tuple) -> float | None:
    vals = []
    for f in figs:
        v = f
        for k in path:
            v = (v or {}).get(k) if isinstance(v, dict) else None
        vals.append(v)
    return median(vals)


def verdict_table(r: Receipt, label: str) -> list[str]:
    figs = {f"{k}@{label}": r.stats[f"{k}@{label}"] for k in JUDGED if f"{k}@{label}" in r.stats}
    if not figs:
        return []
    return stats_table(figs, r.settings.base, label="figure", none=DASH,
                       key=lambda n: n.split("@", 1)[0], verdicts=not r.settings.url)


def latency_table(r: Receipt, label: str) -> list[str]:
    """Per variant: the median over its valid runs of each percentile."""
    names = [v.name for v in r.variants]
    lines = ["| variant | latency (ms) | p50 | p90 | p99 | max |", "|---|---|---|---|---|---|"]
    for v in names:
        figs = level_runs(r, label, v)
        if not figs:
            continue
        for k, lab in LABELS.items():
            cells = [num(med(figs, ("latency", k, q)), 1, DASH) for q in ("p50", "p90", "p99", "max")]
            lines.append(f"| {v} | {lab} | " + " | ".join(cells) + " |")
        cells = [num(med(figs, ("late_ms", q)), 2, DASH) for q in ("p50", "p90", "p99", "max")]
        lines.append(f"| {v} | send lateness | " + " | ".join(cells) + " |")
        if any(f.get("queued_ms") for f in figs):
            cells = [num(med(figs, ("queued_ms", q)), 1, DASH) for q in ("p50", "p90", "p99", "max")]
            lines.append(f"| {v} | queued (--max-concurrency) | " + " | ".join(cells) + " |")
    return lines


def throughput_table(r: Receipt, label: str) -> list[str]:
    lines = ["| variant | requests (completed) | req/s | output tok/s | goodput (req/s) | SLO attainment | "
             "cached prompt tokens (requests hit) |", "|---|---|---|---|---|---|---|"]
    for v in [x.name for x in r.variants]:
        figs = level_runs(r, label, v)
        if not figs:
            continue
        cached = med(figs, ("cached_tokens",))
        hits = med(figs, ("cache_hits",))
        cache = "not reported" if cached is None else f"{num(cached, 0)} ({num(hits, 0)})"
        att = med(figs, ("attainment_pct",))
        lines.append(f"| {v} | {num(med(figs, ('requests',)), 0)} ({num(med(figs, ('completed',)), 0)}) | "
                     f"{num(med(figs, ('req_s',)), 2)} | {num(med(figs, ('out_tok_s',)), 1)} | "
                     f"{num(med(figs, ('goodput',)), 2, DASH)} | {DASH if att is None else num(att, 1) + ' %'} | "
                     f"{cache} |")
    return lines


def interference_table(r: Receipt, label: str) -> list[str]:
    rows = []
    for v in [x.name for x in r.variants]:
        figs = [f["interference"] for f in level_runs(r, label, v) if f.get("interference")]
        if not figs:
            continue
        alone = median([(run.alone or {}).get("ttft_ms") for run in r.runs if run.variant == v and run.valid])
        m = lambda k, d=1: num(median([f.get(k) for f in figs]), d, DASH)  # noqa: E731
        rows.append(f"| {v} | {m('injected', 0)} ({m('filled', 0)}) | {m('inject_ttft_p50_ms')} | {num(alone, 1, DASH)} | "
                    f"{m('pause_in_ms')} / {m('pause_out_ms')} | {m('itl_p99_in_ms')} / {m('itl_p99_out_ms')} | "
                    f"{m('ttft_p99_in_ms')} / {m('ttft_p99_out_ms')} |")
    if not rows:
        return []
    return ["| variant | injected (filled) | injected first token (ms) | alone (ms) | background longest pause, "
            "in / out of fills (ms) | background inter-token p99, in / out (ms) | TTFT p99 sent in / out (ms) |",
            "|---|---|---|---|---|---|---|", *rows]


def exactness_lines(r: Receipt) -> list[str]:
    e = r.exactness or Exactness()
    if e.not_judged:
        return [f"- Not judged: {e.not_judged}."]
    if not e.across_runs:
        return []
    parts = []
    for v, x in e.across_runs.items():
        s = f"{v}: {x.equal} of {x.of} replies equal across runs"
        if x.unknown:
            s += f", {x.unknown} unknown (no token ids)"
        p = (e.vs_plain or {}).get(v)
        if p:
            s += f"; {p.equal} of {p.of} equal to the plain reference"
            if p.no_reference:
                s += f" ({p.no_reference} later turns whose history differs, not compared)"
        parts.append(s)
    lines = ["**Exactness.** Each reply's token hash (per level and request id) against its reply in the first "
             "base run, and with the plain reference against the plain reply to the same prompt.", ""]
    lines += [f"- {p}." for p in parts]
    if (other := other_kernels_line(r.variants, r.settings.base)) is not None:
        lines.append(other)
    lines += [f"- differs: {f}" for f in e.flagged or []]
    return lines + [""]


def markdown(data: Receipt | dict, png_name: str | None = None) -> str:
    r = as_receipt(data)
    st = r.settings
    lines = header_lines(r, "load")
    order = "/".join(st.order)
    slo = _slo_text(st.slo)
    lines += ["", f"**The test.** {st.workload}. Levels: {', '.join(lv.label for lv in st.levels)}, played "
              "one after another on each run's server"
              + (f", at most {st.max_concurrency} requests in flight (a wait for a slot is queueing)"
                 if st.max_concurrency else "")
              + ". Latencies from each request's send, and from its scheduled send (coordinated omission); "
              "TPOT per request, inter-token gaps pooled; warm-up and injected requests left out. "
              + (f"Goodput: requests meeting every bound of the SLO ({slo}; TTFT and end-to-end from the scheduled "
                 "send) per second. " if slo else "No SLO given: no goodput. ")
              + f"A run whose send lateness p99 passes {st.late_p99_ms:g} ms is invalid. "
              + (f"Servers tfbench did not launch, in the order {order}; no verdicts." if st.url else
                 f"A fresh server per run, in the order {order}; verdicts pair each run with its adjacent base runs "
                 f"(margin {margin_pct(r)} %)."), ""]
    if r.predictions:
        p = r.predictions
        first = r.runs[0].started if r.runs else DASH
        lines += [f"Predictions read {p.read_at} (sha256 `{p.sha256[:16]}`); the first run started {first}.", ""]
    if png_name:
        lines += [f"![latency and goodput by level]({png_name})", ""]
    for lv in st.levels:
        label = lv.label
        lines += [f"### {label}", ""]
        vt = verdict_table(r, label)
        if vt:
            lines += [*vt, ""]
        tt = throughput_table(r, label)
        if len(tt) > 2:
            lines += [*tt, "", *latency_table(r, label), ""]
        it = interference_table(r, label)
        if it:
            lines += ["**Interference** (windows: each injected prompt's send to its first token; in / out: "
                      "background gaps overlapping a window, or requests sent inside one, against the rest).", "",
                      *it, ""]
    lines += exactness_lines(r)
    lines += client_lines([(f"Run {run.index} ({run.variant}) {lv.label}", lv.client)
                           for run in r.runs for lv in run.levels or []])
    if r.predictions:
        lines += Predictions.from_dict(r.predictions.to_dict()).markdown() + [""]
    lines += not_run_lines(r.not_run)
    return "\n".join(lines) + "\n"


def summary_markdown(data: Receipt | dict) -> str:
    """What the command prints: each level's goodput and TTFT p99 rows, and exactness."""
    r = as_receipt(data)
    lines = []
    for lv in r.settings.levels:
        lines += [f"**{lv.label}**", "", *throughput_table(r, lv.label), ""]
    return "\n".join(lines + exactness_lines(r))
