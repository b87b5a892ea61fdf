"""The one statistics table and the environment lines every receipt shares; numbers are written
by the one formatter, `num` (tensorfold_bench.analysis.figures)."""
from __future__ import annotations

from typing import Callable

from tensorfold_bench.analysis import stats
from tensorfold_bench.client import selfcheck
from tensorfold_bench.analysis.figures import margin_of, num, spec  # noqa: F401 (num: every renderer formats with it)
from tensorfold_bench.receipt import EngineInfo, Host, Identity, Receipt, Sampling, Simulated, Variant, as_receipt
from tensorfold_bench.servers.worktree import Source


def short_commit(c: str | None) -> str:
    if not c:
        return "unknown"
    sha, _, rest = c.partition("+")
    return sha[:10] + (f"+{rest}" if rest else "")


def stats_table(figs: dict, base: str, *, label: str = "figure", runs_header: str = "runs (in run order)",
                digits: int | None = None, none: str = "-", span_sep: str = " to ",
                key: Callable[[str], str] = str, base_mark: str = " (base)", verdicts: bool = True) -> list[str]:
    """One row per (figure, variant): every run's value in run order, the median (base: with its
    span), new vs base, the paired 95 % interval and the verdict. `digits` None: the registry's.
    `verdicts` False (servers tfbench did not launch): runs and medians only."""
    if not verdicts:
        return medians_table(figs, base, label=label, runs_header=runs_header, digits=digits, none=none, key=key)
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


def medians_table(figs: dict, base: str, *, label: str, runs_header: str, digits: int | None, none: str,
                  key: Callable[[str], str]) -> list[str]:
    lines = [f"| {label} | variant | {runs_header} | median |", "|---|---|---|---|"]
    for name, d in figs.items():
        fs = stats.FigureStats.from_dict(d)
        n = spec(name).digits if digits is None else digits
        for v in [base] + [x for x in fs.runs if x != base]:
            vals = " / ".join(num(x, n, none) for x in fs.runs.get(v, [])) or none
            lines.append(f"| {key(name)} | {v} | {vals} | **{num(fs.medians.get(v), n, none)}** |")
    return lines


def margin_pct(r: Receipt) -> str:
    """The verdicts' margin in percent, as the statistics paragraph states it (the default where the
    receipt stored none)."""
    return f"{margin_of(r) * 100:g}"


def environment_lines(data: Receipt | dict) -> list[str]:
    """Device, model, server, variants and host, from the receipt's header."""
    r = as_receipt(data)
    if r.simulated:
        return [*simulated_lines(r.simulated), host_line(r)]
    eng = (r.environment.engine if r.environment else None) or EngineInfo()
    desc, cfg = eng.engine or {}, eng.config or {}
    if not eng and r.identities is not None:  # no tfengine ran: the servers' own accounts, below
        return [*server_lines(r), host_line(r)]
    dev = desc.get("device_name") or desc.get("device") or "unknown device"
    devices, tp = desc.get("devices") or [], desc.get("tensor_parallel") or 1
    if tp > 1 and devices:  # every rank's device, by name
        names = sorted(set(devices), key=devices.index)
        dev = (f"{len(devices)} x {names[0]}" if len(names) == 1 else " + ".join(devices)) + f" (tensor parallel {tp})"
    cpu = desc.get("cpu")
    if cpu and desc.get("device") == "cpu":  # the CPU by what sets its speed and its bits
        # the decode products the ISA chose and the weights they read (engines that report cpu_weights;
        # older receipts re-render as they were)
        products = (f"; decode products: {desc['cpu_matmuls']}, weights {desc['cpu_weights']}"
                    if desc.get("cpu_matmuls") and desc.get("cpu_weights") else "")
        lines = [f"- Device: CPU, {cpu['model']} ({cpu['arch']}), {cpu['cores']} cores for the engine, "
                 f"{cpu['threads']} compute threads, {cpu['isa']}{products}; torch {desc.get('torch') or '-'}, "
                 f"engine commit {short_commit(eng.commit)}."]
        return [*lines, *_model_lines(desc, cfg), *server_lines(r), host_line(r)]
    bits = [f"{dev}"]
    if desc.get("compute_capability"):
        bits.append(f"sm {desc['compute_capability']}")
    bits.append(f"CUDA {desc.get('cuda_version') or desc.get('cuda') or '-'}")
    bits.append(f"driver {desc.get('driver') or '-'}")
    bits.append(f"torch {desc.get('torch') or '-'}")
    bits.append(f"engine commit {short_commit(eng.commit)}")
    lines = ["- Device: " + ", ".join(bits) + "."]
    return [*lines, *_model_lines(desc, cfg), *server_lines(r), host_line(r)]


def header_lines(r: Receipt, scenario: str) -> list[str]:
    """The title naming the variants, the environment, and where each variant's engine came from."""
    lines = [f"## tfbench {scenario}: {' vs '.join(v.name for v in r.variants)}", "", "**Environment.**",
             *environment_lines(r)]
    srcs = [f"{v.name}: {source_label(v)}" for v in r.variants if v.source]
    if srcs:
        lines.append("- Engine sources: " + "; ".join(srcs) + ".")
    return lines


def source_label(v: Variant) -> str:
    """The engine source a variant ran (a worktree of this repository at a commit)."""
    return Source(**v.source.to_dict()).label


def simulated_lines(sim: Simulated) -> list[str]:
    """A simulated receipt says so first: the profile it ran on, and what it cannot know."""
    return [f"- **Simulated, not measured**: every run played in virtual time on the engine's lane host over the "
            f"cost profile {sim.profile} ({sim.device}, {sim.model}, engine commit "
            f"{short_commit(sim.engine_commit)}; {sim.source or 'measured'}). No server ran.",
            "- What a simulation cannot know: " + " ".join(sim.cannot_know or [])]


def _model_lines(desc: dict, cfg: dict) -> list[str]:
    """From the engine's own description of itself and its config (free-form dicts: the engine's keys)."""
    shape = desc.get("shape") or {}
    shape_s = ", ".join(f"{k} {v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k} {v}"
                        for k, v in shape.items())
    params = desc.get("parameters")
    return [f"- Model: `{desc.get('model') or cfg.get('model') or '?'}` ({desc.get('dtype') or cfg.get('dtype') or '?'}"
            + (f", {params:,} parameters" if isinstance(params, int) else "") + ")"
            + (f"; shape: {shape_s}." if shape_s else ".")]


def server_lines(r: Receipt) -> list[str]:
    """Where the servers came from, each variant, and each server's account of itself."""
    lines, st = [], r.settings
    if r.identities is not None and not (r.environment and r.environment.engine):
        lines.append("- Device: not reported (only tfengine's /v1/engine reports it; this session ran none).")
    if st.url:
        lines.append(f"- Servers: {st.url}: not launched by tfbench, so a fresh server per run and a cold "
                     "cache are not guaranteed.")
    if any(v.url is None and v.command is None for v in r.variants):
        lines.append(f"- Shared engine flags: `{' '.join(st.engine_flags)}`; a fresh server per run.")
    idents = r.identities or {}
    if st.sampling:  # receipts from before sampling have none
        lines.append(sampling_line(st.sampling))
    lines.append("- Variants: " + "; ".join(variant_label(v, idents.get(v.name)) for v in r.variants) + ".")
    lines += [f"- {name}: {identity_line(i)}." for name, i in idents.items()]
    counted = sorted({run.counted_by for run in r.runs if run.counted_by not in (None, "ids")})
    if counted:
        lines.append(f"- Tokens counted by {' and '.join(counted)}: the server sent no token ids "
                     "(`--token-ids`), so replies' hashes are unknown, never \"differ\"; counts use the "
                     "server's usage.completion_tokens where given.")
    return lines


def sampling_line(s: Sampling) -> str:
    """`--temperature` and `--seed` as the receipt stored them (tensorfold_bench.client.sampling)."""
    if not s.temperature:
        return "- Sampling: greedy (temperature 0)."
    return (f"- Sampling: temperature {s.temperature:g}, seed {s.seed}; each request's seed is derived from "
            f"it and the request's role ({s.request_seed}), so a prompt gets the same seed on every server, "
            "run and variant and in the plain reference.")


def host_line(r: Receipt) -> str:
    host = r.host or Host()
    return (f"- Host: Python {host.python}, {host.platform}; tfbench {host.tfbench}"
            + f" @ {short_commit(host.harness_commit)}; {r.created}.")


def variant_label(v: Variant, ident: Identity | None) -> str:
    """What a variant ran: a --url server, a command as launched, or tfengine's flags applied."""
    if v.url:
        return f"{v.name} = {v.url} (not launched by tfbench)"
    env = f" env {v.env}" if v.env else ""
    if v.command is not None:
        if ident and ident.command:
            return f"{v.name} (a command, as launched below){env}"
        return f"{v.name} `{' '.join(v.command + v.args)}` (never launched){env}"
    return (f"{v.name} `{' '.join(v.args) or '(no flags)'}`" + env + (f" @ {v.ref}" if v.ref else ""))


def identity_line(i: Identity) -> str:
    """The server's own account of itself: /v1/models, /version, system_fingerprint, how launched."""
    bits = [i.name or "unknown"]
    if i.version:
        bits[0] += f" {i.version}"
    facts = [f"{k} {getattr(i, k)}" for k in ("owned_by", "root", "max_model_len") if getattr(i, k) is not None]
    bits.append(f"model `{i.model or '?'}`" + (f" ({', '.join(facts)})" if facts else ""))
    if i.system_fingerprint:
        bits.append(f"system_fingerprint `{i.system_fingerprint}`")
    bits.append(f"launched as `{i.command}`" if i.launched and i.command
                else "not launched by tfbench" if not i.launched else "launched by tfbench")
    return ", ".join(bits)


def not_run_lines(notes: list[str]) -> list[str]:
    return ["**Not run, and why.**", *([f"- {n}" for n in notes] or ["- Nothing left out."])]


def client_lines(runs: list[tuple[str, dict | None]]) -> list[str]:
    """The client's self-check, one line per (label, check); none for receipts from before it."""
    have = [(label, c) for label, c in runs if c]
    if not have:
        return []
    b = have[0][1]["bounds"]
    rel = (f"; with a send lateness p99 past {b['share']:g} of the median figure it reports or a loop lag p99 "
           f"past {b['share']:g} of the tail one, its event loop busy over {100 * b['busy']:g} % of the time "
           f"streams were open, or an open loop's send gaps a Kolmogorov-Smirnov distance over {b['ks']:g} from the "
           "schedule's") if "share" in b else ""
    out = [f"**Client self-check** (was the client what got measured? invalid past a loop lag p99 of "
           f"{b['lag_p99_ms']:g} ms or a send {b['late_ms']:g} ms late, or at a level whose streams were never all "
           f"open at once{rel}).", ""]
    out += [f"- {label}: {selfcheck.line(c)}" for label, c in have]
    if (h := selfcheck.held([c for _, c in have])) and "share" in b:
        out += ["", h]
    return out + [""]


def equal_counts(r: Receipt, key: str, by_variant: bool = False) -> list[str]:
    """One line: how many replies were equal, unknown and different (and where) in the exactness
    comparison `key` (across_runs, vs_plain), per stream, or per variant (a variant's replies all
    counted together)."""
    ex = (getattr(r.exactness, key) if r.exactness else None) or {}
    if not ex:
        return []
    per: dict[str, list[int]] = {}
    diffs: list[str] = []
    for run in r.runs:
        for c in ex.get(str(run.index)) or []:
            k = per.setdefault(run.variant if by_variant else c.stream, [0, 0, 0])
            k[1] += 1
            if c.equal:
                k[0] += 1
            elif c.equal is None:
                k[2] += 1
            else:
                diffs.append(f"run {run.index} {c.stream}"
                             + (f" (from token {c.diverge_at})" if c.diverge_at is not None else ""))
    if not per and not by_variant:
        return []
    parts = [f"{n} {k} of {t} equal" + (f" ({u} unknown)" if u else "") for n, (k, t, u) in per.items()]
    return ["; ".join(parts) + "." + (f" Differ: {', '.join(diffs)}." if diffs else "")]
