"""The gate receipt's Markdown, from its JSON alone."""
from __future__ import annotations

import json

from tensorfold_bench.errors import FAIL, PASS
from tensorfold_bench.receipt import Receipt, Variant, as_receipt
from tensorfold_bench.report.fmt import client_lines, environment_lines, source_label, stats_table


def _side(v: Variant) -> str:
    return source_label(v) + (f" {json.dumps(v.env)}" if v.env else "")


def _detectable(d: dict | None) -> list[str]:
    if not d:
        return []
    return ["", "**What the wall-clock layer could see.** The smallest slowdown each figure could have failed on "
            "(its margin plus half its paired interval); a smaller one passes unseen: "
            + ", ".join(f"{k} {v:.1f} %" for k, v in d.items()) + "."]


def schedule_lines(sc: dict | None) -> list[str]:
    """The schedule layer: simulated figures, base against new."""
    if sc is None:
        return ["**Schedule layer.** Skipped (--no-schedule).", ""]
    head = (f"**Schedule layer (simulated, in virtual time on the profile `{sc['profile'].rsplit('/', 1)[-1]}`).** "
            f"Base's and new's scheduler code on the same costs; deterministic, so any figure worse by "
            f"{sc['threshold'] * 100:g} % or more fails.")
    if sc["status"] != "run":
        return [head, "", f"Not run: {sc['why']}.", ""]
    lines = [head, "", "| scenario | figure | base | new | change |", "|---|---|---|---|---|"]
    for r in sc["rows"]:
        w = r["worse_by"]
        ch = "–" if w is None else ("same" if w == 0 else f"{abs(w) * 100:.2f} % {'worse' if w > 0 else 'better'}")
        lines.append(f"| {r['scenario']} | {r['figure']} | {_num(r['base'])} | {_num(r['new'])} | {ch} |")
    return lines + [""]


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def markdown(data: Receipt | dict, png_name: str | None = None) -> str:
    r = as_receipt(data)
    st, p = r.settings, r.settings.preset_values
    base, new = r.variants
    order = [run.variant for run in r.runs] or st.order
    verdict = "PARTIAL" if r.partial else "PASS" if r.passed else "FAIL"
    lines = [f"## tfbench gate: {verdict}", "",
             f"base = {_side(base)}; new = {_side(new)}; order {'/'.join(order)}, preset `{st.preset}`, margins "
             f"{st.margin * 100:g} % (throughput) and {st.long_margin * 100:g} % (long-prompt figures).", ""]
    if r.reasons:
        lines += ["**Why it failed.**", *[f"- {why}" for why in r.reasons], ""]
    lines += ["**Environment.**", *environment_lines(r), "",
              f"**The test.** Each run starts a fresh server and plays a sweep (levels "
              f"{', '.join(map(str, p['levels']))}, {p['tokens']} tokens a stream, {p['prompt_tokens']}-token "
              f"prompts, {p['reps']} reps) and then a long-prompt run (B: {p['b_tokens']} tokens sent "
              f"{p['b_at']:g} s into A's decoding; C {p['c_after']:g} s later)"
              + (f", then {p['load_s']:g} s of Poisson load at {st.load_rate:g} requests/s ({p['load_input']}-token "
                 f"prompts, {p['load_output']}-token replies)" if st.load_rate else "") + ".", "",
              *stats_table(r.stats, "base", base_mark=""), *_detectable(r.detectable), "",
              *(schedule_lines(r.schedule) if r.holds("schedule") else []), "**Exactness.**"]
    ex = r.exactness
    for label, hc in ex.sweep.items():
        lines.append(f"- Sweep replies ({label}): {hc.equal} of {hc.replies} equal.")
    lines.append("- Long-prompt replies: " + ", ".join(f"{k} {v.equal} of {v.of}"
                                                       for k, v in ex.long_prompt.items()) + ".")
    for label, v in (ex.load or {}).items():
        lines.append(f"- Load replies ({label}): {v.equal} of {v.of} equal.")
    checks = client_lines([(f"Run {run.index} ({run.variant}) {part}", getattr(run, part).get("client"))
                           for run in r.runs for part in ("sweep", "long_prompt")])
    if checks:
        lines += ["", *checks[:-1]]
    if r.notes:
        lines += ["", "**Notes.**", *[f"- {n}" for n in r.notes]]
    lines += ["", f"Exit code {PASS if r.passed else FAIL} (0 pass, 1 regression, 2 usage or infrastructure error)."]
    return "\n".join(lines) + "\n"
