"""The sweep receipt's Markdown and picture, from its JSON alone."""
from __future__ import annotations

from tensorfold_bench.analysis import stats
from tensorfold_bench.analysis.figures import LATENCY, at, spec
from tensorfold_bench.analysis.predictions import Predictions
from tensorfold_bench.analysis.sweep import sweep_latency
from tensorfold_bench.report.fmt import client_lines, environment_lines, not_run_lines, num, stats_table
from tensorfold_bench.servers.worktree import Source

DASH = "–"  # a sweep table marks a missing value with an en dash, so each receipt re-renders as written


def lanes_text(data: dict) -> str | None:
    """The lanes the runs' servers had, as their /v1/engine said ("64", or "32–64" if they
    differ); None where no run says (older receipts, servers that do not say)."""
    got = sorted({r["lanes"] for r in data["runs"] if r.get("lanes")})
    if not got:
        return None
    return str(got[0]) if len(got) == 1 else f"{got[0]}{DASH}{got[-1]}"


def level_label(data: dict, level: int | str) -> str:
    """A level's row label: its stream count, and at a level above the servers' lanes, that its
    streams beyond them waited in the server's queue."""
    lanes = [r["lanes"] for r in data["runs"] if r.get("lanes")]
    if lanes and int(level) > min(lanes):
        return f"{level} (queued behind {lanes_text(data)} lanes)"
    return str(level)


def tok_s_table(data: dict) -> list[str]:
    return stats_table(data["stats"], data["settings"]["base"], label="streams", runs_header="runs (tok/s, in run order)",
                       digits=2, none=DASH, span_sep="–",
                       key=lambda n: level_label(data, n.split("@", 1)[1]) if "@" in n else n,
                       verdicts=not data["settings"].get("url"))


def latency_table(data: dict) -> list[str]:
    """Per level and variant, the median over runs of each latency figure (receipts that kept
    every token's time)."""
    med = sweep_latency(data)
    if not med:
        return []
    names = [v["name"] for v in data["variants"]]
    heads = [f"{spec(f).label} ({spec(f).unit})" for f in LATENCY]
    lines = ["| streams | variant | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(LATENCY)]
    for lv in data["settings"]["script"]["levels"]:
        for v in names:
            if v in med.get(at(LATENCY[0], lv), {}):
                cells = [num(med.get(at(f, lv), {}).get(v), spec(f).digits, DASH) for f in LATENCY]
                lines.append(f"| {level_label(data, lv)} | {v} | " + " | ".join(cells) + " |")
    return lines


def exactness_line(data: dict) -> str:
    if data.get("simulated"):
        return "Token hashes: not judged (simulated: token identities come from the simulated backend)."
    h = data["hashes"]
    return (f"Token hashes: {h['equal']} of {h['replies']} replies equal ({h['prompts']} prompts)"
            + unknown_part(h) + ("." if h["ok"] else f"; {len(h['flagged'])} differ (see the receipt)."))


def unknown_part(h: dict) -> str:
    return f", {h['unknown']} unknown (the server sent no token ids)" if h.get("unknown") else ""


def test_paragraph(data: dict) -> str:
    s = data["settings"]["script"]
    return (f"**The test.** At each level ({', '.join(map(str, s['levels']))} streams), that many streams start "
            f"together, each sending a {s['prompt_tokens']}-token prompt (seeded token ids) and generating "
            f"{s['tokens']} tokens with ignore_eos; {s['cells']} distinct prompt sets (cells), {s['reps']} reps "
            f"each. Aggregate tok/s = all tokens / (last token time - first send time); the median over reps is "
            f"a cell's figure, the median over cells the run's. " + runs_sentence(data))


def queued_sentence(data: dict) -> str:
    """What a level above the lanes means, where the receipt has one."""
    lanes = [r["lanes"] for r in data["runs"] if r.get("lanes")]
    over = [lv for lv in data["settings"]["script"]["levels"] if lanes and lv > min(lanes)]
    if not over:
        return ""
    return (f" The servers had {lanes_text(data)} lanes: at {', '.join(map(str, over))} streams all were open at "
            "once, those beyond the lanes waiting in the server's queue, so first-token times there include "
            "the wait (the client self-check gives the server's running and waiting streams).")


def runs_sentence(data: dict) -> str:
    st, order = data["settings"], "/".join(data["settings"]["order"])
    if st.get("url"):
        return f"Servers tfbench did not launch, in the order {order}; no verdicts."
    return (f"A fresh server per run, in the order {order}. Verdicts pair each run with its adjacent base runs "
            f"(a bootstrap interval of the median log-ratio, margin {st.get('margin', stats.DEFAULT_MARGIN) * 100:g} %).")


def markdown(data: dict, png_name: str | None = None) -> str:
    st = data["settings"]
    names = [v["name"] for v in data["variants"]]
    lines = [f"## tfbench sweep: {' vs '.join(names)}", "", "**Environment.**", *environment_lines(data)]
    srcs = [f"{v['name']}: {Source(**v['source']).label}" for v in data["variants"] if v.get("source")]
    if srcs:
        lines.append("- Engine sources: " + "; ".join(srcs) + ".")
    lines += ["", test_paragraph(data) + queued_sentence(data), ""]
    if data.get("predictions"):
        p = data["predictions"]
        first = data["runs"][0]["started"] if data["runs"] else DASH
        lines += [f"Predictions read {p['read_at']} (sha256 `{p['sha256'][:16]}`); the first run started {first}.", ""]
    if png_name:
        lines += [f"![aggregate tok/s by streams]({png_name})", ""]
    lines += ["**Aggregate tok/s.**", "", *tok_s_table(data), ""]
    lat = latency_table(data)
    if lat:
        lines += ["**Latency** (every stream's tokens pooled per level; the median over a variant's runs).", "",
                  *lat, ""]
    h = data["hashes"]
    lines += ["**Exactness.** Each prompt's reply is compared across reps, levels and runs with "
              + f"its first reply in a {st['base']} run."
              + f" {h['equal']} of {h['replies']} replies equal ({h['prompts']} prompts)" + unknown_part(h)
              + ("." if h["ok"] else "; these differ:")]
    lines += [f"- {f}" for f in h["flagged"][:20]]
    if len(h["flagged"]) > 20:
        lines.append(f"- … and {len(h['flagged']) - 20} more (see the JSON)")
    lines.append("")
    lines += client_lines([(f"Run {r['index']} ({r['variant']})", r.get("client")) for r in data["runs"]])
    if data.get("predictions"):
        lines += Predictions.from_dict(data["predictions"]).markdown() + [""]
    lines += not_run_lines(data["not_run"])
    return "\n".join(lines) + "\n"
