"""`--dry-run`: what a command would do (variants, run order, each engine's command line) and
about how long it would take, without launching anything.

The estimate is a cost model per preset: server start, one decode round at L streams, one prompt
row; its figures were measured on the machines named beside them. Unknown models get none."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from tensorfold_bench.cli.progress import clock_text
from tensorfold_bench.servers.launcher import flag_value
from tensorfold_bench.session.driver import Session


@dataclass(frozen=True)
class Cost:
    start_s: float  # launch to healthy
    round_s: float  # one decode round at one stream
    round_per_stream_s: float  # added per extra stream in a round
    row_s: float  # one prompt row


# cpu: the project's shared 2-core machine at load average ~2 (30 Nov 2026: tok_s@1 20 to 39,
# tok_s@8 ~160, a 4,096-token B whole in 3.8 s; the sweep then took 3:01, long-prompt 0:58);
# tiny: a guess from its test runs; qwen3-8b: one H200 when its decode round took 4.79 ms (now
# ~4.2, so the estimate errs long) and a 32,000-token prompt 1.34 s; its start a guess for loading.
COSTS = {("cpu", "cpu"): Cost(4.0, 0.03, 0.003, 0.0009),
         ("tiny", "cpu"): Cost(3.0, 0.004, 0.0005, 0.00005),
         ("qwen3-8b", "cuda"): Cost(60.0, 0.0048, 0.00005, 0.000042)}


def cost(s: Session) -> Cost | None:
    return None if s.url else COSTS.get((s.engine.model, s.engine.device))


def engine_lines(s: Session) -> list[str]:
    if s.url:
        return [f"  nothing launched: every run goes to {s.url}"]
    out = []
    for v in s.variants:
        env = " ".join(f"{k}={shlex.quote(str(x))}" for k, x in v.env.items())
        argv = ["python", "-m", "engine", "serve", "--host", "127.0.0.1", "--port", "0", *s.engine.flags(), *v.args]
        where = f" (from {v.ref})" if v.ref else ""
        out.append(f"  {v.name}{where}: " + (env + " " if env else "") + shlex.join(argv))
    return out


def lines(s: Session, per_run: list[float] | None, extra: list[str]) -> str:
    out = ["Dry run: nothing launched.", "", "Variants (the first is the base):"]
    out += [f"  {v.name}: {shlex.join(v.args) or '(engine defaults)'}" for v in s.variants]
    out += ["", f"Run order ({len(s.order)} runs, a fresh server each): " + " / ".join(s.order), "",
            "Engine command lines (each also gets --port-file and --nonce):", *engine_lines(s), "", *extra]
    if per_run is None:
        out.append(f"Estimated time: none for --model {s.engine.model} on {s.engine.device} "
                   f"(known: {', '.join(m for m, _ in COSTS)}).")
    else:
        out.append(f"Estimated time: about {clock_text(sum(per_run))} "
                   f"({', '.join(clock_text(t) for t in per_run)} per run), on an idle machine.")
    return "\n".join(out)


def sweep(settings) -> str:
    s, sc = settings.session, settings.script
    c = cost(s)
    per_run = None
    if c:
        lanes = s.engine.parallel or sc.max_level
        # a level above the lanes decodes in waves of `lanes` streams, the rest queued
        one = sum(sc.cells * sc.reps * (sc.prompt_tokens * lv * c.row_s + -(-lv // lanes) * sc.tokens
                                        * (c.round_s + (min(lv, lanes) - 1) * c.round_per_stream_s))
                  for lv in sc.levels)
        per_run = [c.start_s + one for _ in s.order]
    return lines(s, per_run, [f"Each run: levels {', '.join(map(str, sc.levels))}, {sc.cells} cells x {sc.reps} reps, "
                              f"{sc.tokens} tokens a stream, {sc.prompt_tokens}-token prompts.", ""])


def long_prompt(settings) -> str:
    s, sc = settings.session, settings.script
    c = cost(s)
    per_run = None
    if c:
        fill = sc.b_tokens * c.row_s
        share = {v.name: _share(v.args) for v in s.variants}
        seen, per_run = set(), []
        for name in s.order:
            t = c.start_s + sc.b_at + fill / share[name] + 1.0
            if name not in seen:  # B alone, once per variant
                t, _ = t + fill, seen.add(name)
            per_run.append(t)
        if settings.plain_check:
            per_run.append(c.start_s + fill + 2.0)
    extra = [f"Each run: A decodes; B sends {sc.b_tokens} tokens at {sc.b_at:g} s; C {sc.c_after:g} s later."
             + (" Then the plain reference." if settings.plain_check else ""), ""]
    return lines(s, per_run, extra)


def _share(args: list[str]) -> float:
    """The prefill share a variant's flags set (whole prompts and the default: 1)."""
    try:
        return max(float(flag_value(args, "--prefill-share") or 1.0), 0.01)
    except ValueError:
        return 1.0


def script(settings) -> str:
    """A script's runs: each about its latest timed send, its prompts' rows and its longest reply."""
    s, sc = settings.session, settings.script
    c = cost(s)
    per_run = None
    if c:
        rows = sum(st.prompt.random or 0 for st in sc.streams) + sum(st.prompt.plus for st in sc.streams)
        longest = max(st.max_tokens for st in sc.streams if not st.cancellable) if any(
            not st.cancellable for st in sc.streams) else 0
        last = max([st.at.plus for st in sc.streams if st.at.event is None] + [0.0])
        one = c.start_s + last + rows * c.row_s + longest * (c.round_s + (len(sc.streams) - 1) * c.round_per_stream_s)
        per_run = [one for _ in s.order] + ([c.start_s + rows * c.row_s] if settings.plain_check else [])
    extra = [f"Each run: the script {sc.name} ({sc.path}): " + "; ".join(
        f"{st.name} at {st.at}" for st in sc.streams) + "." + (" Then the plain reference." if settings.plain_check
                                                             else ""), ""]
    return lines(s, per_run, extra)
