"""The long-prompt receipt's Markdown, from its JSON alone."""
from __future__ import annotations

from tensorfold_bench.analysis.exactness import other_kernels_line
from tensorfold_bench.analysis.figures import LongPromptFigures, VariantSummary, frontier, long_prompt_summary, spec
from tensorfold_bench.analysis.predictions import Predictions
from tensorfold_bench.receipt import Exactness, Receipt, as_receipt
from tensorfold_bench.report.fmt import (client_lines, equal_counts, environment_lines, margin_pct, not_run_lines, num,
                                         stats_table)


def cell(figs: list[LongPromptFigures], key: str, med: float | None, digits: int | None = None) -> str:
    """Every run's value (invalid ones marked †, failed ones "failed"), then the median in bold."""
    n = spec(key).digits if digits is None else digits
    unit = "" if spec(key).unit == "tok/s" else f" {spec(key).unit}"
    vals = [("" if f.valid else "†") + (num(getattr(f, key), n) if f.window is not None or getattr(f, key) is not None
                                          else "failed") for f in figs]
    return f"{' / '.join(vals)} → **{num(med, n)}{unit}**"


def test_paragraph(r: Receipt) -> str:
    s = r.settings.script  # the scenario's own settings
    order = "/".join(r.settings.order)
    return (f"**The test.** Stream A is decoding a long reply (a {s['a_prompt_tokens']}-token prompt, ignore_eos). "
            f"{s['b_at']:g} s in, B sends a cold prompt of {s['b_tokens']:,} random token ids; "
            f"{s['c_after']:g} s later, C sends a {s['c_tokens']}-token prompt for a {s['c_max_tokens']}-token reply. "
            "When B and C are done, A is cancelled. Measured: B's and C's first token (each from its own send), "
            "A's longest pause (largest gap between two A tokens overlapping B's send to B's first token), and A's rate "
            "while B fills (before: the same length of time just before B's send). "
            f"Runs in the order {order}; each cell lists every run, then the median of the valid ones "
            "(† marks an invalid run, left out). \"alone\": B's first token with nothing else running, once per variant"
            + (alone_pace if any(a.a_record is not None for a in (r.alone or {}).values()) else "."))


alone_pace = ("; and A alone on the same server, for as many tokens: \"its pace alone\" is A's rate over the "
              "tokens it made while B filled, at the same token indices (the same context lengths) alone, the "
              "median of each run's percentage. A stream slows as its context grows, B or no B, which \"before\" "
              "does not see.")


def table(summary: dict[str, VariantSummary]) -> list[str]:
    """Per variant (long_prompt_summary's): each figure's runs and median; B against alone, A's rate
    during B against before."""
    rows = ["| variant | B first token | C first token | A longest pause | A during B (before), tok/s |",
            "|---|---|---|---|---|"]
    for name, s in summary.items():
        figs, med = s.figures, s.median
        b = cell(figs, "b_first_token", med["b_first_token"])
        if s.x_alone is not None:
            b += f" ({s.x_alone:.1f}x alone: {num(s.alone)} s)"
        during = cell(figs, "a_rate_during", med["a_rate_during"])
        if s.during_pct is not None:
            during += f" ({s.during_pct:.0f} % of {num(med['a_rate_before'], 1)}"
            during += f"; {s.pace_pct:.0f} % of its pace alone)" if s.pace_pct is not None else ")"
        rows.append(f"| {name} | {b} | {cell(figs, 'c_first_token', med['c_first_token'])} | "
                    f"{cell(figs, 'a_longest_pause', med['a_longest_pause'])} | {during} |")
    return rows


def frontier_lines(data: Receipt | dict, png_name: str | None = None,
                   summary: dict[str, VariantSummary] | None = None) -> list[str]:
    """The variants' trade of B's slowdown against A's kept rate, against plain time slicing; none
    when fewer than two variants have both figures."""
    rows = frontier(data, summary)
    if not rows:
        return []
    out = ["**Frontier.** Each variant's trade, ordered by B's slowdown (its first token against alone). A kept: A "
           "during B against before. vs the line: A kept minus 100 × (1 - 1/slowdown), in points; that line is what "
           "alternating whole steps between A and B keeps (B given a share f of the steps takes 1/f as long, A keeps "
           "1 - f), so above 0 beats plain time slicing. Dominated by: a variant no slower for B that keeps no less "
           "of A, better in one.", "",
           "| variant | B slowdown (x alone) | A kept (%) | vs the line (points) | dominated by |",
           "|---|---|---|---|---|"]
    for r in rows:
        # + 0.0: a figure that rounds to zero from below reads +0.0, not -0.0
        out.append(f"| {r['variant']} | {r['slowdown']:.2f}x | {r['kept']:.1f} | {round(r['vs_line'], 1) + 0.0:+.1f} | "
                   f"{', '.join(r['dominated_by']) or '—'} |")
    if any(r["slowdown"] < 1 for r in rows):
        out += ["", "Under 1x, B came sooner beside A than alone: there the slowdown is noise in B's timing, "
                "and so is the line."]
    if png_name:
        out += ["", f"![frontier: B's slowdown against A's kept rate, the line dashed]({png_name})"]
    return out + [""]


def runs_table(r: Receipt) -> list[str]:
    rows = ["| run | variant | B first token | C first token | A longest pause | A during B | A before | "
            "late A / B / C (ms) | B cached | load | valid |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in r.runs:
        f = LongPromptFigures.from_dict(run.figures)
        late = " / ".join("-" if f.lateness.get(k) is None else f"{1000 * f.lateness[k]:.0f}" for k in "ABC")
        b_usage = (run.records["B"].usage if run.records else None) or {}  # the server's own usage object
        cached = (b_usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        cached = "-" if cached is None else cached
        if cached == "-" and run.cold and run.cold.by == "fresh random prompt":
            cached = "- (fresh prompt)"
        load = run.server.load_before if run.server else None
        rows.append(f"| {run.index} | {run.variant} | {num(f.b_first_token)} s | {num(f.c_first_token)} s | "
                    f"{num(f.a_longest_pause)} s | {num(f.a_rate_during, 1)} | {num(f.a_rate_before, 1)} | {late} | "
                    f"{cached} | {num(load, 1)} | "
                    f"{'yes' if f.valid else 'no: ' + '; '.join(f.invalid_reasons)} |")
    return rows


def exactness_lines(r: Receipt) -> list[str]:
    ex = r.exactness or Exactness()
    if ex.not_judged:
        return [f"- Not judged: {ex.not_judged}."]
    lines = []
    refs = ex.refs or {}
    across = equal_counts(r, "across_runs", by_variant=True)
    if across and refs:
        lines.append(f"- Across runs (B and C against run {refs['BC']}; A against the longest A, run {refs['A']}, "
                     "on each A's own length), replies A, B and C per run: " + across[0])
    vs_plain = equal_counts(r, "vs_plain", by_variant=True)
    if vs_plain:
        lines.append("- Against the plain reference (each request alone, one stream, whole prompt, no prompt cache, "
                     "no drafts): " + vs_plain[0])
    if (other := other_kernels_line(r.variants, r.settings.base)) is not None:
        lines.append(other)
    ss = ex.server_sha
    if ss and not ss.match and not ss.mismatch and ss.absent:
        lines.append("- The server sends no token_sha: the hashes below are ours, of the ids received.")
    elif ss:
        none = ss.none_from_runs
        why = "A is cancelled, so it ends without one" + (
            f"; runs {', '.join(map(str, none))}: the server sends none" if none else "")
        lines.append(f"- The servers' token_sha against our sha256 of the ids received: {ss.match or 0} match, "
                     f"{ss.mismatch or 0} differ, {ss.absent or 0} absent ({why}).")
    hashes = ex.hashes or {}  # run -> stream -> its reply's hash (and A's length)
    if hashes:
        distinct = {k: sorted({h[k] for h in hashes.values() if h.get(k)}) for k in "ABC"}
        lines.append(f"- Hashes (sha256 of the comma-joined ids, first 12 hex; A over its first {ex.a_prefix} "
                     "tokens, the shortest A): " + "; ".join(f"{k} {', '.join('`' + h + '`' for h in v) or '-'}"
                                                  for k, v in distinct.items()) + ".")
    lens = [h.get("A_tokens") for h in hashes.values() if h.get("A_tokens") is not None]
    lines.append("- A is cancelled, so its length varies" + (f" ({min(lens)} to {max(lens)} tokens)" if lens else "")
                 + ": each run's A is compared on its own length with the reference's prefix"
                 + (" (the plain reference's A is generated as long as the longest A)." if r.plain else "."))
    return lines


def cold_lines(r: Receipt) -> list[str]:
    """Which check held that each run's B was cold (receipts from before it: none)."""
    by: dict[str, list[str]] = {}
    for run in r.runs:
        c = run.cold
        if c:
            what = c.by if c.cached_tokens is None else f"the server's cached_tokens = {c.cached_tokens}"
            by.setdefault(what + ("" if c.held else " (NOT cold)"), []).append(str(run.index))
    if not by:
        return []
    return ["B's cold prompt, checked by: " + "; ".join(f"{k} (run {', '.join(v)})" for k, v in by.items()) + ".", ""]


def summary_markdown(data: Receipt | dict, summary: dict[str, VariantSummary] | None = None) -> str:
    """What the command prints: the table and the exactness lines (`summary`: long_prompt_summary's,
    where the caller has it already)."""
    r = as_receipt(data)
    summary = long_prompt_summary(r) if summary is None else summary
    return "\n".join(table(summary) + ["", "**Exactness.**", *exactness_lines(r)])


def markdown(data: Receipt | dict, png_name: str | None = None, frontier_png: str | None = None,
             summary: dict[str, VariantSummary] | None = None) -> str:
    """The receipt's Markdown (`summary`: long_prompt_summary's, where the caller has it already)."""
    r = as_receipt(data)
    summary = long_prompt_summary(r) if summary is None else summary  # the table and the frontier read it
    out = ["# tfbench receipt: long-prompt", "", "**Environment.**", *environment_lines(r), "",
           test_paragraph(r), "", *table(summary), "", *frontier_lines(r, frontier_png, summary),
           "Every run (late: each send against its script time; load: the host's 1-minute load average as the run "
           "started):", "", *runs_table(r), "", *cold_lines(r),
           *client_lines([(f"Run {run.index} ({run.variant})", run.client) for run in r.runs]),
           "**Exactness.**", *exactness_lines(r), ""]
    if png_name:
        out += [f"![timeline: A's inter-token gaps, B and C marked]({png_name})", ""]
    if r.stats:  # receipts from before verdicts (no margin) have none
        out += ["**Statistics.** Each run paired with its adjacent base runs; a verdict needs the paired 95 % "
                f"interval beyond a {margin_pct(r)} % margin (invalid runs left out).", "",
                *stats_table(r.stats, r.variants[0].name, digits=2), ""]
    if r.predictions:
        out += [*Predictions.from_dict(r.predictions.to_dict()).markdown(), ""]
    out += not_run_lines(r.not_run or [])
    return "\n".join(out) + "\n"
