"""The sweep receipt's Markdown and picture, from its JSON alone."""
from __future__ import annotations

from tensorfold_bench.analysis.exactness import other_kernels_line
from tensorfold_bench.analysis.figures import LATENCY, at, spec
from tensorfold_bench.analysis.predictions import Predictions
from tensorfold_bench.analysis.sweep import sweep_latency
from tensorfold_bench.receipt import Receipt, SweepHashes, as_receipt
from tensorfold_bench.report.fmt import client_lines, header_lines, margin_pct, not_run_lines, num, stats_table

DASH = "–"  # a sweep table marks a missing value with an en dash, so each receipt re-renders as written


def lanes_text(r: Receipt) -> str | None:
    """The lanes the runs' servers had, as their /v1/engine said ("64", or "32–64" if they
    differ); None where no run says (older receipts, servers that do not say)."""
    got = sorted({run.lanes for run in r.runs if run.lanes})
    if not got:
        return None
    return str(got[0]) if len(got) == 1 else f"{got[0]}{DASH}{got[-1]}"


def level_label(r: Receipt, level: int | str) -> str:
    """A level's row label: its stream count, and at a level above the servers' lanes, that its
    streams beyond them waited in the server's queue."""
    lanes = [run.lanes for run in r.runs if run.lanes]
    if lanes and int(level) > min(lanes):
        return f"{level} (queued behind {lanes_text(r)} lanes)"
    return str(level)


def tok_s_table(data: Receipt | dict) -> list[str]:
    r = as_receipt(data)
    return stats_table(r.stats, r.settings.base, label="streams", runs_header="runs (tok/s, in run order)",
                       digits=2, none=DASH, span_sep="–",
                       key=lambda n: level_label(r, n.split("@", 1)[1]) if "@" in n else n,
                       verdicts=not r.settings.url)


def latency_table(r: Receipt) -> list[str]:
    """Per level and variant, the median over runs of each latency figure (receipts that kept
    every token's time)."""
    med = sweep_latency(r.to_dict())
    if not med:
        return []
    names = [v.name for v in r.variants]
    heads = [f"{spec(f).label} ({spec(f).unit})" for f in LATENCY]
    lines = ["| streams | variant | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(LATENCY)]
    for lv in r.settings.script["levels"]:
        for v in names:
            if v in med.get(at(LATENCY[0], lv), {}):
                cells = [num(med.get(at(f, lv), {}).get(v), spec(f).digits, DASH) for f in LATENCY]
                lines.append(f"| {level_label(r, lv)} | {v} | " + " | ".join(cells) + " |")
    return lines


def exactness_line(data: Receipt | dict) -> str:
    r = as_receipt(data)
    if r.simulated:
        return "Token hashes: not judged (simulated: token identities come from the simulated backend)."
    h = r.hashes
    other = other_kernels_line(r.variants, r.settings.base)
    return (f"Token hashes: {h.equal} of {h.replies} replies equal ({h.prompts} prompts)"
            + unknown_part(h) + ("." if h.ok else f"; {len(h.flagged)} differ (see the receipt).")
            + (f" {other[2:]}" if other else ""))


def unknown_part(h: SweepHashes) -> str:
    return f", {h.unknown} unknown (the server sent no token ids)" if h.unknown else ""


def test_paragraph(r: Receipt) -> str:
    s = r.settings.script  # the sweep's own settings
    return (f"**The test.** At each level ({', '.join(map(str, s['levels']))} streams), that many streams start "
            f"together, each sending a {s['prompt_tokens']}-token prompt (seeded token ids) and generating "
            f"{s['tokens']} tokens with ignore_eos; {s['cells']} distinct prompt sets (cells), {s['reps']} reps "
            f"each. Aggregate tok/s = all tokens / (last token time - first send time); the median over reps is "
            f"a cell's figure, the median over cells the run's. " + runs_sentence(r))


def queued_sentence(r: Receipt) -> str:
    """What a level above the lanes means, where the receipt has one."""
    lanes = [run.lanes for run in r.runs if run.lanes]
    over = [lv for lv in r.settings.script["levels"] if lanes and lv > min(lanes)]
    if not over:
        return ""
    return (f" The servers had {lanes_text(r)} lanes: at {', '.join(map(str, over))} streams all were open at "
            "once, those beyond the lanes waiting in the server's queue, so first-token times there include "
            "the wait (the client self-check gives the server's running and waiting streams).")


def runs_sentence(r: Receipt) -> str:
    st, order = r.settings, "/".join(r.settings.order)
    if st.url:
        return f"Servers tfbench did not launch, in the order {order}; no verdicts."
    return (f"A fresh server per run, in the order {order}. Verdicts pair each run with its adjacent base runs "
            f"(a bootstrap interval of the median log-ratio, margin {margin_pct(r)} %).")


def markdown(data: Receipt | dict, png_name: str | None = None) -> str:
    r = as_receipt(data)
    st = r.settings
    lines = header_lines(r, "sweep")
    lines += ["", test_paragraph(r) + queued_sentence(r), ""]
    if r.predictions:
        p = r.predictions
        first = r.runs[0].started if r.runs else DASH
        lines += [f"Predictions read {p.read_at} (sha256 `{p.sha256[:16]}`); the first run started {first}.", ""]
    if png_name:
        lines += [f"![aggregate tok/s by streams]({png_name})", ""]
    lines += ["**Aggregate tok/s.**", "", *tok_s_table(r), ""]
    lat = latency_table(r)
    if lat:
        lines += ["**Latency** (every stream's tokens pooled per level; the median over a variant's runs).", "",
                  *lat, ""]
    h = r.hashes
    lines += ["**Exactness.** Each prompt's reply is compared across reps, levels and runs with "
              + f"its first reply in a {st.base} run."
              + f" {h.equal} of {h.replies} replies equal ({h.prompts} prompts)" + unknown_part(h)
              + ("." if h.ok else "; these differ:")]
    lines += [f"- {f}" for f in h.flagged[:20]]
    if len(h.flagged) > 20:
        lines.append(f"- … and {len(h.flagged) - 20} more (see the JSON)")
    lines.append("")
    lines += client_lines([(f"Run {run.index} ({run.variant})", run.client) for run in r.runs])
    if r.predictions:
        lines += Predictions.from_dict(r.predictions.to_dict()).markdown() + [""]
    lines += not_run_lines(r.not_run)
    return "\n".join(lines) + "\n"
