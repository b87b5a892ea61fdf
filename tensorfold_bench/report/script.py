"""A script receipt's Markdown, from its JSON alone: the script itself, its streams, every figure
per variant (runs and median), every run, expectations, exactness per stream, statistics,
predictions and what was not run."""
from __future__ import annotations

from tensorfold_bench.analysis.exactness import other_kernels_line
from tensorfold_bench.analysis.figures import ScriptFigures, script_keys, script_medians, spec
from tensorfold_bench.analysis.predictions import Predictions
from tensorfold_bench.receipt import Exactness, Receipt, as_receipt
from tensorfold_bench.report.fmt import (client_lines, equal_counts, environment_lines, margin_pct, not_run_lines, num,
                                         stats_table)
from tensorfold_bench.workload.script_file import Point, Prompt, Script, Stream


def _point(p: Point) -> str:
    if p.event is None:
        return f"{p.plus:g} s"
    return str(p.event) + (f" + {p.plus:g} s" if p.plus else "")


def _prompt(p: Prompt) -> str:
    # a text prompt as the committed receipts word it; the others as Prompt says them
    return str(p) if p.random is not None or p.source else f"text, {len(p.text)} characters"


def _options(s: Stream) -> str:
    bits = []
    if s.priority != "foreground":
        bits.append(f"priority {s.priority}")
    if s.temperature is not None:
        bits.append(f"temperature {s.temperature:g}" + (f", seed {s.seed}" if s.seed is not None else ""))
    if not s.draft:
        bits.append("draft: false")
    if not s.ignore_eos:
        bits.append("stops at EOS")
    return ", ".join(bits) or "-"


def _cancel(s: Stream) -> str:
    bits = [str(s.cancel)] if s.cancel else []
    if s.until:
        bits.append("once " + " and ".join(map(str, s.until)) + " happened")
    return "; ".join(bits) or "-"


def script_of(r: Receipt) -> Script:
    """The script as the receipt keeps it: parsed, in settings.script, and its text beside it."""
    return Script.from_dict(r.settings.script, r.settings.script_text or "")


def streams_table(sc: Script) -> list[str]:
    rows = ["| stream | sent at | prompt | max tokens | options | cancelled | expects |", "|---|---|---|---|---|---|---|"]
    for s in sc.streams:
        exp = ", ".join(map(str, s.expect)) or "-"
        rows.append(f"| {s.name} | {_point(s.at)} | {_prompt(s.prompt)} | {s.max_tokens:,} | "
                    f"{_options(s)} | {_cancel(s)} | {exp} |")
    return rows


def figure_lines(sc: Script) -> list[str]:
    out = []
    for f in sc.figures:
        if f.kind == "first_token":
            what = f"{f.stream}'s first token, from its own send"
        elif f.kind == "cached_tokens":
            what = f"the prompt tokens the server reports cached for {f.stream}"
        else:
            w = f"[{_point(f.window[0])}, {_point(f.window[1])}]"
            before = f"; `rate_before:{f.label or f.stream}` the same length of time just before it" if f.versus else ""
            what = (f"{f.stream}'s longest gap between two tokens overlapping {w}" if f.kind == "longest_pause"
                    else f"{f.stream}'s tokens per second in {w}" + before)
        out.append(f"- `{f.key}`: {what}.")
    return out


def test_paragraph(r: Receipt, sc: Script) -> str:
    order = "/".join(r.settings.order)
    return (f"**The test.** The script `{sc.name}` (`{sc.path}`, sha256 `{sc.sha256[:16]}`, below): "
            f"{len(sc.streams)} streams on one timeline, each sent at its time (seconds from the run's start, or "
            "an event of another stream plus seconds) and cancelled (its stream closed) as the script says. "
            f"Runs in the order {order}; each cell lists every run, then the median of the valid ones († marks an "
            "invalid run, left out).")


def _cell(values: list[float | None], valid: list[bool], key: str, med: float | None) -> str:
    s = spec(key)
    unit = "" if s.unit in ("tok/s", "tokens") else f" {s.unit}"
    vals = [("" if ok else "†") + num(v, s.digits) for v, ok in zip(values, valid)]
    return f"{' / '.join(vals)} → **{num(med, s.digits)}{unit}**"


def table(r: Receipt) -> list[str]:
    keys = script_keys(r)
    if not keys:
        return ["The script asks for no figures."]
    meds = script_medians(r)
    head = [f"{k} ({spec(k).unit})" for k in keys]
    rows = ["| variant | " + " | ".join(head) + " |", "|---|" + "---|" * len(keys)]
    for v in r.variants:
        figs = [ScriptFigures.from_dict(run.figures) for run in r.runs if run.variant == v.name]
        if not figs:
            continue
        valid = [f.valid for f in figs]
        cells = [_cell([f.values.get(k) for f in figs], valid, k, meds.get(v.name, {}).get(k)) for k in keys]
        rows.append(f"| {v.name} | " + " | ".join(cells) + " |")
    return rows


def runs_table(r: Receipt) -> list[str]:
    keys = script_keys(r)
    rows = ["| run | variant | " + "".join(f"{k} | " for k in keys) + "latest send (ms) | expects | load | valid |",
            "|---|---|" + "---|" * len(keys) + "---|---|---|---|"]
    for run in r.runs:
        f = ScriptFigures.from_dict(run.figures)
        late = [(n, v) for n, v in f.lateness.items() if v is not None]
        worst = max(late, key=lambda x: x[1]) if late else None
        late_s = f"{1000 * worst[1]:.0f} ({worst[0]})" if worst else "-"
        exp = ", ".join(f"{e['stream']} " + (f"{e['got']:,}" if e["got"] is not None else
                                             "unknown" if e.get("unknown") else "no reply")
                        + {True: " ok", False: " MISSED", None: ""}[e["held"]] for e in f.expects) or "-"
        load = run.server.load_before if run.server else None
        rows.append(f"| {run.index} | {run.variant} | "
                    + "".join(f"{num(f.values.get(k), spec(k).digits)} | " for k in keys)
                    + f"{late_s} | {exp} | {num(load, 1)} | "
                    + ("yes" if f.valid else "no: " + "; ".join(f.invalid_reasons)) + " |")
    return rows


def exactness_lines(r: Receipt) -> list[str]:
    ex = r.exactness or Exactness()
    if ex.not_judged:
        return [f"- Not judged: {ex.not_judged}."]
    lines = []
    across = equal_counts(r, "across_runs")
    if across:
        refs = ", ".join(f"{n} run {i}" for n, i in (ex.refs or {}).items() if i is not None)
        lines.append(f"- Across runs (each stream against its reference: {refs}), per stream: {across[0]}")
    vs_plain = equal_counts(r, "vs_plain")
    if vs_plain:
        lines.append("- Against the plain reference (each stream alone, one stream, whole prompt, no prompt cache, "
                     "no drafts): " + vs_plain[0])
    if (other := other_kernels_line(r.variants, r.settings.base)) is not None:
        lines.append(other)
    lines.append("- A cancelled reply is compared on its own length with the reference's prefix.")
    none = ex.no_reply or {}
    if none:
        lines.append("- No reply to compare (no token before it was cancelled, or failed, or not sent): "
                     + "; ".join(f"{n} in run {', '.join(map(str, v))}" for n, v in none.items()) + ".")
    hashes = ex.hashes or {}  # run -> stream -> its reply's sha and whether it was cancelled
    if hashes:
        names = list(dict.fromkeys(n for h in hashes.values() for n in h))
        distinct = {n: sorted({h[n]["sha"] for h in hashes.values() if n in h and h[n]["sha"]
                               and not h[n]["cancelled"]}) for n in names}
        shown = "; ".join(f"{n} {', '.join('`' + x + '`' for x in v)}" for n, v in distinct.items() if v)
        if shown:
            lines.append("- Hashes of the replies that finished (sha256 of the comma-joined ids, first 12 hex): "
                         + shown + ".")
    return lines


def summary_markdown(data: Receipt | dict) -> str:
    """What the command prints: the table and the exactness lines."""
    r = as_receipt(data)
    return "\n".join(table(r) + ["", "**Exactness.**", *exactness_lines(r)])


def markdown(data: Receipt | dict, png_name: str | None = None) -> str:
    r = as_receipt(data)
    sc = script_of(r)
    out = [f"# tfbench receipt: script {sc.name}", "", "**Environment.**", *environment_lines(r), "",
           test_paragraph(r, sc), "", *streams_table(sc), "", "**Figures.**", *figure_lines(sc), "",
           *table(r), "",
           "Every run (latest send: the latest of the sends against their script times; load: the host's 1-minute "
           "load average as the run started):", "", *runs_table(r), "", "**Exactness.**", *exactness_lines(r), "",
           *client_lines([(f"Run {run.index} ({run.variant})", run.client) for run in r.runs])]
    if png_name:
        out += [f"![timeline]({png_name})", ""]
    if r.stats:
        out += ["**Statistics.** Each run paired with its adjacent base runs; a verdict needs the paired 95 % "
                f"interval beyond a {margin_pct(r)} % margin (invalid runs left out).", "",
                *stats_table(r.stats, r.variants[0].name), ""]
    if r.predictions:
        out += [*Predictions.from_dict(r.predictions.to_dict()).markdown(), ""]
    out += not_run_lines(r.not_run or []) + ["", "**The script.**", "", "```yaml",
                                             sc.text.rstrip("\n"), "```"]
    return "\n".join(out) + "\n"
