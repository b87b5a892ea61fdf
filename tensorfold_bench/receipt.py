"""Receipts: the JSON behind a run (everything), and the Markdown a reviewer pastes into a pull
request, rendered from the JSON alone (`tfbench report FILE.json` re-renders it).
"""
from __future__ import annotations

import json
from pathlib import Path

from tensorfold_bench.metrics import LongPromptFigures, medians


def write(data: dict, out_dir: Path, stem: str) -> dict[str, Path]:
    """Write STEM.json, STEM.md and STEM.png under out_dir; return their paths. The scenario's
    renderers are chosen from the data (long-prompt, sweep; a gate receipt has no picture)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")
    png = render_png(data, paths["png"])
    if png is None:
        del paths["png"]
    paths["md"].write_text(render_markdown(data, png.name if png else None))
    return paths


def load(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not str(data.get("schema", "")).startswith("tfbench.receipt/"):
        from tensorfold_bench.errors import BenchError
        raise BenchError(f"{path} is not a tfbench receipt (no schema field)")
    return data


def render_png(data: dict, path: Path) -> Path | None:
    if data.get("scenario") == "sweep":
        from tensorfold_bench import sweep
        return sweep.render_png(data, path)
    if data.get("scenario") == "gate":
        return None
    from tensorfold_bench.timeline import draw

    return draw(data, path)


# ---- Markdown ---------------------------------------------------------------------------

def num(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def figures_of(run: dict) -> LongPromptFigures:
    return LongPromptFigures.from_dict(run["figures"])


def summary(data: dict) -> dict[str, dict]:
    """Per variant: its runs' figures (in order) and the medians over the valid ones."""
    out = {}
    for v in data["variants"]:
        runs = [r for r in data["runs"] if r["variant"] == v["name"]]
        if not runs:
            continue
        figs = [figures_of(r) for r in runs]
        out[v["name"]] = {"runs": runs, "figures": figs, "median": medians(figs),
                          "alone": (data.get("alone") or {}).get(v["name"], {}).get("b_first_token")}
    return out


def cell(figs: list[LongPromptFigures], key: str, med: float | None, unit: str, digits: int = 2) -> str:
    vals = [("" if f.valid else "†") + (num(getattr(f, key), digits) if f.window is not None or getattr(f, key) is not None
                                          else "failed") for f in figs]
    return f"{' / '.join(vals)} → **{num(med, digits)}{unit}**"


def short_commit(c: str | None) -> str:
    if not c:
        return "unknown"
    sha, _, rest = c.partition("+")
    return sha[:10] + (f"+{rest}" if rest else "")


def environment_lines(data: dict) -> list[str]:
    env = data.get("environment") or {}
    eng = (env.get("engine") or {})
    desc = eng.get("engine") or {}
    cfg = eng.get("config") or {}
    host = data.get("host") or {}
    lines = []
    dev = desc.get("device_name") or desc.get("device") or "unknown device"
    bits = [f"{dev}"]
    if desc.get("compute_capability"):
        bits.append(f"sm {desc['compute_capability']}")
    bits.append(f"CUDA {desc.get('cuda_version') or desc.get('cuda') or '-'}")
    bits.append(f"driver {desc.get('driver') or '-'}")
    bits.append(f"torch {desc.get('torch') or '-'}")
    bits.append(f"engine commit {short_commit(eng.get('commit'))}")
    lines.append("- Device: " + ", ".join(bits) + ".")
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
    lines.append(f"- Variants: " + "; ".join(f"{v['name']} `{' '.join(v['args']) or '(no flags)'}`"
                                             + (f" env {v['env']}" if v.get("env") else "")
                                             + (f" @ {v['ref']}" if v.get("ref") else "") for v in data["variants"]) + ".")
    lines.append(f"- Host: Python {host.get('python')}, {host.get('platform')}; tfbench {host.get('tfbench')}"
                 + f" @ {short_commit(host.get('harness_commit'))}; {data.get('created')}.")
    return lines


def test_paragraph(data: dict) -> str:
    s = data["settings"]["script"]
    order = "/".join(data["settings"]["order"])
    return (f"**The test.** Stream A is decoding a long reply (a {s['a_prompt_tokens']}-token prompt, ignore_eos). "
            f"{s['b_at']:g} s in, B sends a cold prompt of {s['b_tokens']:,} random token ids; "
            f"{s['c_after']:g} s later, C sends a {s['c_tokens']}-token prompt for a {s['c_max_tokens']}-token reply. "
            "When B and C are done, A is cancelled. Measured: B's and C's first token (each from its own send), "
            "A's longest pause (largest gap between two A tokens overlapping B's send to B's first token), and A's rate "
            "while B fills (before: the same length of time just before B's send). "
            f"Runs in the order {order}; each cell lists every run, then the median of the valid ones "
            "(† marks an invalid run, left out). \"alone\": B's first token with nothing else running, once per variant.")


def table(data: dict) -> list[str]:
    sm = summary(data)
    rows = ["| variant | B first token | C first token | A longest pause | A during B (before), tok/s |",
            "|---|---|---|---|---|"]
    for name, s in sm.items():
        figs, med = s["figures"], s["median"]
        b = cell(figs, "b_first_token", med["b_first_token"], " s")
        if s["alone"] and med["b_first_token"]:
            b += f" ({med['b_first_token'] / s['alone']:.1f}x alone: {num(s['alone'])} s)"
        during = cell(figs, "a_rate_during", med["a_rate_during"], "", 1)
        if med["a_rate_before"]:
            pct = 100 * (med["a_rate_during"] or 0) / med["a_rate_before"]
            during += f" ({pct:.0f} % of {num(med['a_rate_before'], 1)})"
        rows.append(f"| {name} | {b} | {cell(figs, 'c_first_token', med['c_first_token'], ' s')} | "
                    f"{cell(figs, 'a_longest_pause', med['a_longest_pause'], ' s')} | {during} |")
    return rows


def runs_table(data: dict) -> list[str]:
    rows = ["| run | variant | B first token | C first token | A longest pause | A during B | A before | "
            "late A / B / C (ms) | B cached | load | valid |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        f = figures_of(r)
        late = " / ".join("-" if f.lateness.get(k) is None else f"{1000 * f.lateness[k]:.0f}" for k in "ABC")
        b_usage = (r["records"]["B"].get("usage") if r.get("records") else None) or {}
        cached = (b_usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        load = (r.get("server") or {}).get("load_before")
        rows.append(f"| {r['index']} | {r['variant']} | {num(f.b_first_token)} s | {num(f.c_first_token)} s | "
                    f"{num(f.a_longest_pause)} s | {num(f.a_rate_during, 1)} | {num(f.a_rate_before, 1)} | {late} | "
                    f"{'-' if cached is None else cached} | {num(load, 1)} | "
                    f"{'yes' if f.valid else 'no: ' + '; '.join(f.invalid_reasons)} |")
    return rows


def count_equal(data: dict, key: str) -> list[str]:
    ex = (data.get("exactness") or {}).get(key) or {}
    if not ex:
        return []
    per: dict[str, list[int]] = {}
    diffs = []
    for r in data["runs"]:
        cmp = ex.get(str(r["index"]))
        if cmp is None:
            continue
        k_n = per.setdefault(r["variant"], [0, 0, 0])
        for c in cmp:
            k_n[1] += 1
            if c["equal"]:
                k_n[0] += 1
            elif c["equal"] is None:
                k_n[2] += 1
            else:
                diffs.append(f"run {r['index']} {c['stream']}")
    parts = [f"{name} {k} of {n} equal" + (f" ({u} unknown)" if u else "") for name, (k, n, u) in per.items()]
    return ["; ".join(parts) + "." + (f" Differ: {', '.join(diffs)}." if diffs else "")]


def exactness_lines(data: dict) -> list[str]:
    ex = data.get("exactness") or {}
    lines = []
    refs = ex.get("refs") or {}
    across = count_equal(data, "across_runs")
    if across and refs:
        lines.append(f"- Across runs (B and C against run {refs['BC']}; A against the longest A, run {refs['A']}, "
                     "on each A's own length), replies A, B and C per run: " + across[0])
    vs_plain = count_equal(data, "vs_plain")
    if vs_plain:
        lines.append("- Against the plain reference (each request alone, one stream, whole prompt, no prompt cache, "
                     "no drafts): " + vs_plain[0])
    ss = ex.get("server_sha") or {}
    if ss:
        lines.append(f"- The servers' token_sha against our sha256 of the ids received: {ss.get('match', 0)} match, "
                     f"{ss.get('mismatch', 0)} differ, {ss.get('absent', 0)} absent (A is cancelled, so it ends without one).")
    hashes = ex.get("hashes") or {}
    if hashes:
        distinct = {k: sorted({h[k] for h in hashes.values() if h.get(k)}) for k in "ABC"}
        lines.append(f"- Hashes (sha256 of the comma-joined ids, first 12 hex; A over its first {ex.get('a_prefix')} "
                     "tokens, the shortest A): " + "; ".join(f"{k} {', '.join('`' + h + '`' for h in v) or '-'}"
                                                  for k, v in distinct.items()) + ".")
    lens = [h.get("A_tokens") for h in hashes.values() if h.get("A_tokens") is not None]
    lines.append("- A is cancelled, so its length varies" + (f" ({min(lens)} to {max(lens)} tokens)" if lens else "")
                 + ": each run's A is compared on its own length with the reference's prefix"
                 + (" (the plain reference's A is generated as long as the longest A)." if data.get("plain") else "."))
    return lines


def render_markdown(data: dict, png_name: str | None = None) -> str:
    if data.get("scenario") == "sweep":
        from tensorfold_bench import sweep
        return sweep.render_markdown(data, png_name)
    if data.get("scenario") == "gate":
        from tensorfold_bench import gate
        return gate.render_markdown(data)
    out = ["# tfbench receipt: long-prompt", "", "**Environment.**", *environment_lines(data), "",
           test_paragraph(data), "", *table(data), "",
           "Every run (late: each send against its script time; load: the host's 1-minute load average as the run "
           "started):", "", *runs_table(data), "",
           "**Exactness.**", *exactness_lines(data), ""]
    if png_name:
        out += [f"![timeline: A's inter-token gaps, B and C marked]({png_name})", ""]
    if len(data["variants"]) > 1 and data["runs"]:
        out += ["**Statistics.** Each run paired with its adjacent base runs; a verdict needs the paired 95 % "
                f"interval beyond a {data['settings'].get('margin', 0.02) * 100:g} % margin (invalid runs left out).", "",
                *stats_lines(long_prompt_stats(data), data["variants"][0]["name"]), ""]
    if data.get("predictions"):
        from tensorfold_bench.predictions import Predictions
        out += [*Predictions.from_dict(data["predictions"]).markdown(), ""]
    out += ["**Not run, and why.**"]
    out += [f"- {line}" for line in data.get("not_run") or ["Nothing left out."]]
    return "\n".join(out) + "\n"


# ---- statistics, predictions and comparisons (issue 5) ------------------------------------

LONG_HIGHER_IS_BETTER = {"b_first_token": False, "c_first_token": False, "a_longest_pause": False,
                         "a_rate_during": True, "a_rate_before": True}


def long_prompt_stats(data: dict) -> dict:
    """Each long-prompt figure's statistics over the runs (invalid runs left out): every run's
    value, medians, base's span, each variant against the base with a verdict."""
    from tensorfold_bench import stats

    order = [r["variant"] for r in data["runs"]]
    base = data["variants"][0]["name"]
    margin = data["settings"].get("margin", stats.DEFAULT_MARGIN)
    out = {}
    for key, hib in LONG_HIGHER_IS_BETTER.items():
        vals = [r["figures"][key] if r["figures"]["valid"] else None for r in data["runs"]]
        out[key] = stats.figure_stats(key, order, vals, base, higher_is_better=hib, margin=margin).to_dict()
    return out


def stats_lines(figs: dict, base: str, digits: int = 2) -> list[str]:
    """The statistics table: runs in order, median, base's span, vs base, interval, verdict."""
    from tensorfold_bench import stats

    lines = [f"| figure | variant | runs (in run order) | median | vs {base} | paired 95 % interval | verdict |",
             "|---|---|---|---|---|---|---|"]
    for name, d in figs.items():
        fs = stats.FigureStats.from_dict(d)
        for v in [base] + [n for n in fs.runs if n != base]:
            vals = " / ".join(num(x, digits) for x in fs.runs.get(v, [])) or "-"
            if v == base:
                span = f" (span {num(fs.base_span[0], digits)} to {num(fs.base_span[1], digits)})" if fs.base_span else ""
                lines.append(f"| {name} | {v} (base) | {vals} | **{num(fs.medians.get(v), digits)}**{span} | | | |")
            else:
                c = fs.comparisons[v]
                iv = "-" if c.interval_pct is None else f"{c.interval_pct[0]:+.1f} % to {c.interval_pct[1]:+.1f} %"
                lines.append(f"| {name} | {v} | {vals} | **{num(c.median, digits)}** | {stats.fmt_pct(c.pct)} | {iv} | {c.verdict} |")
    return lines


def medians_by_variant(data: dict) -> dict[str, dict[str, float | None]]:
    """variant -> figure -> median, for predictions: the long-prompt figures (also as `_s` and
    `a_rate_during_pct` = during / before in percent) and `b_alone`."""
    out: dict[str, dict] = {}
    for name, s in summary(data).items():
        m = dict(s["median"])
        for k in ("b_first_token", "c_first_token", "a_longest_pause"):
            m[k + "_s"] = m.get(k)
        if m.get("a_rate_during") is not None and m.get("a_rate_before"):
            m["a_rate_during_b_pct"] = m["a_rate_during"] / m["a_rate_before"] * 100
        m["b_alone"] = m["b_alone_s"] = s.get("alone")
        out[name] = m
    return out


def figure_runs(data: dict) -> dict[str, dict[str, list[float]]]:
    """figure -> variant -> the valid runs' values, for any scenario's receipt."""
    if data.get("stats"):
        return {f: d["runs"] for f, d in data["stats"].items()}
    return {k: d["runs"] for k, d in long_prompt_stats(data).items()}


def compare_markdown(a: dict, b: dict, name_a: str, name_b: str) -> str:
    """Two saved receipts, figure by figure. Different sessions are not drift-paired, so the
    call is only whether B's median lies inside A's span of runs."""
    import statistics

    ra, rb = figure_runs(a), figure_runs(b)
    lines = ["## tfbench compare", "",
             f"- A: `{name_a}` ({a.get('scenario')}, {a.get('created')}, engine commit "
             f"{((a.get('environment') or {}).get('engine') or {}).get('commit') or 'unknown'})",
             f"- B: `{name_b}` ({b.get('scenario')}, {b.get('created')}, engine commit "
             f"{((b.get('environment') or {}).get('engine') or {}).get('commit') or 'unknown'})", "",
             "Two sessions, so no drift pairing: B's median is called within A's span or outside it.", "",
             "| figure | variant | A runs | A median (span) | B runs | B median | B vs A | |",
             "|---|---|---|---|---|---|---|---|"]
    for fig in [f for f in ra if f in rb] + [f for f in rb if f not in ra]:
        va, vb = ra.get(fig, {}), rb.get(fig, {})
        for v in [n for n in va if n in vb] + [n for n in vb if n not in va] + [n for n in va if n not in vb]:
            xa, xb = va.get(v, []), vb.get(v, [])
            ma = statistics.median(xa) if xa else None
            mb = statistics.median(xb) if xb else None
            pct = f"{(mb / ma - 1) * 100:+.1f} %" if ma and mb is not None else "-"
            call = "-" if not xa or mb is None else ("within A's span" if min(xa) <= mb <= max(xa) else "outside A's span")
            span = f" ({num(min(xa))} to {num(max(xa))})" if xa else ""
            lines.append(f"| {fig} | {v} | {' / '.join(num(x) for x in xa) or '-'} | {num(ma)}{span} | "
                         f"{' / '.join(num(x) for x in xb) or '-'} | {num(mb)} | {pct} | {call} |")
    return "\n".join(lines) + "\n"
