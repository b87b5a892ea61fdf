"""The long-prompt scenario: `tfbench run long-prompt`'s flags as a script (`timeline`), which
the script scenario plays, measures by its figure definitions (`FIGURES`) and checks for
exactness; what is long-prompt's alone stays here (B and A alone, A outlasting B).

Stream A decodes a long reply (ignore_eos). `b_at` seconds after A's send, B sends a cold
prompt of `b_tokens` random token ids; `c_after` seconds later, C sends a short prompt of
`c_tokens` ids with a short reply. When B and C are done, A is cancelled (its stream closed).
Once per variant, B's first token is also measured alone (nothing else running, a prompt of its
own); with `plain_check`, a plain reference server (whole prompts, no cache, no drafts, one
stream) answers each request alone, for the exactness check. With `--temperature`, A, B and C
each sample with their role's seed (tensorfold_bench.client.sampling), in every run and the reference.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from tensorfold_bench.analysis import exactness, figures
from tensorfold_bench.analysis.figures import num
from tensorfold_bench.analysis.predictions import read as read_predictions
from tensorfold_bench.client.play import play_alone
from tensorfold_bench.client.sampling import GREEDY, Sampling
from tensorfold_bench.client.stream import Request, StreamRecord, fingerprint, weakest_count
from tensorfold_bench.errors import FlagError
from tensorfold_bench.client.virtual import SimRequest
from tensorfold_bench.client.virtual import play as play_virtual
from tensorfold_bench.scenarios import script as script_scenario
from tensorfold_bench.scenarios.script import ScriptScenario
from tensorfold_bench.servers.identity import fetch_trace, healthy, wait_idle
from tensorfold_bench.session import defaults, driver, targets
from tensorfold_bench.session.driver import Reporter, Run, Session
from tensorfold_bench.workload.script_file import Event, Expect, Figure, Point, Prompt, Script, Stream, check

A_PROMPT_TOKENS = 16
# A's reply must outlast B's send and C's: the context holds what one stream decodes in b_at +
# c_after + A_SLACK_S seconds at the fastest pace a launched preset has (tiny on one CPU core of an
# AVX-512 host: about 1,300 tokens/s), so the default never ends A before B arrives
A_TOKENS_PER_S = 1500
A_SLACK_S = 1.0


@dataclass(frozen=True)
class LongPromptScript:
    b_at: float
    c_after: float
    b_tokens: int
    c_tokens: int = 34
    a_prompt_tokens: int = A_PROMPT_TOKENS
    a_max_tokens: int = 4000  # large enough that A outlasts B; A is cancelled at the end
    b_max_tokens: int = 8
    c_max_tokens: int = 16
    seed: int = 0
    timeout_s: float = 900.0  # B and C must be done by then
    sampling: Sampling = GREEDY  # stored in the receipt's settings, not the script's

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["sampling"]
        return d


# W, B's fill: the window of A's figures
FILL = (Point(Event("B", "sent")), Point(Event("B", "first_token")))
# the long-prompt figures as the script's figure definitions (their receipt names:
# tensorfold_bench.analysis.figures.LONG_PROMPT_KEYS); examples/scripts/long-prompt.yaml ships the same
FIGURES = (Figure("first_token", "B"), Figure("first_token", "C"), Figure("longest_pause", "A", FILL),
           Figure("rate", "A", FILL, "before"))


def timeline(script: LongPromptScript) -> Script:
    """The A/B/C test as a script (tensorfold_bench.workload.script_file), played, measured and
    checked by the script scenario's machinery: `run long-prompt` is its short form. B must be
    cold (its cached tokens, where the server reports them); B and C must be done `timeout_s`
    after C's send."""
    sc = Script("long-prompt", (
        Stream("A", Point(None, 0.0), Prompt(random=script.a_prompt_tokens), script.a_max_tokens,
               until=(Event("B", "done"), Event("C", "done"))),
        Stream("B", Point(None, script.b_at), Prompt(random=script.b_tokens), script.b_max_tokens,
               expect=(Expect("cached_tokens", "==", 0),)),
        Stream("C", Point(None, script.b_at + script.c_after), Prompt(random=script.c_tokens), script.c_max_tokens)),
        FIGURES, seed=script.seed, timeout_s=script.b_at + script.c_after + script.timeout_s)
    check(sc)
    return sc


def make_prompts(script: LongPromptScript, vocab: int, key: str = "") -> dict[str, list[int]]:
    """A's, B's and C's prompts, as the script scenario draws them. `key` distinguishes runs that
    share one server (--url), so each run's B is cold; fresh servers use one key, so every run's
    replies compare."""
    return script_scenario.make_prompts(timeline(script), vocab, key)


def requests(script: LongPromptScript, prompts: dict[str, list[int]], token_ids: str = "ids") -> dict[str, Request]:
    """A, B and C as the script scenario sends them; `token_ids`: how reply ids are asked for
    (client.TOKEN_ID_ROUTES)."""
    return script_scenario.requests_for(timeline(script), script.sampling, prompts, token_ids, None)


async def play_script(url: str, script: LongPromptScript, vocab: int, model: str = "default",
                      token_ids: str = "ids") -> tuple[dict[str, StreamRecord], dict]:
    """Play A, B and C on the script's timeline; their raw records and the client's self-check.
    A is cancelled once B and C are done (or failed)."""
    reqs = requests(script, make_prompts(script, vocab), token_ids)
    recs, _, check = await script_scenario.play_timeline(url, timeline(script), reqs, model)
    return recs, check


# ---- a session of runs ---------------------------------------------------------------------

@dataclass
class LongPromptSettings:
    session: Session
    script: LongPromptScript
    plain_check: bool = False
    scaled: dict = field(default_factory=dict)  # settings.scaled_down: what the device's defaults cut


def settings_from_flags(*, model, device, dtype, share, order, url, out_dir, plain_check, parallel, prefill_rows,
                        max_model_len, seed, trace, engine_args, b_at, c_after, b_tokens, c_tokens, a_tokens,
                        vocab=None, stamp="", variants_file=None, base_ref=None, new_ref=None, aa=False,
                        predict=None, margin=0.02, tokenizer=None, token_ids="ids",
                        temperature=0.0, tensor_parallel=1, mixed=None, split=None) -> LongPromptSettings:
    """`tfbench run long-prompt`'s flags -> settings, with the device preset's defaults; every bad
    value names its flag; predictions are read (and stamped) here, before any run."""
    pre = defaults.device_preset(device)
    for flag, v in (("--b-at", b_at), ("--b-tokens", b_tokens), ("--c-tokens", c_tokens), ("--a-tokens", a_tokens)):
        defaults.positive(flag, v)  # --vocab is the session's to check
    if not (math.isfinite(c_after) and c_after >= 0):
        raise FlagError("--c-after", f"must be a finite number of seconds, at least 0, not {c_after}")
    variants, names, url = targets.select(url, share, variants_file, base_ref, new_ref, order, aa, mixed, split)
    b_tokens = b_tokens or pre.b_tokens
    script = LongPromptScript(b_at=b_at if b_at is not None else pre.b_at, c_after=c_after, b_tokens=b_tokens,
                              c_tokens=c_tokens, seed=seed, sampling=Sampling(temperature, seed))
    mml = max_model_len or context_for(script, a_tokens)
    if a_tokens and script.a_prompt_tokens + a_tokens > mml:
        raise FlagError("--a-tokens", f"A's {script.a_prompt_tokens} prompt + {a_tokens} reply tokens exceed "
                                      f"--max-model-len {mml}")
    script = replace(script, a_max_tokens=a_tokens or (mml - script.a_prompt_tokens - 1))
    engine = defaults.engine_setup(device=device, model=model, dtype=dtype, parallel=parallel, prefill_rows=prefill_rows,
                                  max_model_len=None if url else mml, seed=seed, trace=trace, engine_args=engine_args,
                                  tensor_parallel=tensor_parallel)
    preds = read_predictions(predict, [v.name for v in variants], figures.predictable_long_prompt()) if predict else None
    return LongPromptSettings(Session(engine, variants, names, Path(out_dir), "long-prompt", url=url, margin=margin,
                                      predictions=preds, stamp=stamp, vocab=vocab, tokenizer=tokenizer,
                                      token_ids=token_ids), script, plain_check,
                              defaults.scaled_note(device, []))  # the cpu B's size is said under "Not run"


def context_for(script: LongPromptScript, a_tokens: int | None = None) -> int:
    """A context that holds B's prompt and reply, and A's prompt and a reply that outlasts B's and
    C's sends (A_TOKENS_PER_S), rounded up to 256."""
    a_reply = a_tokens or math.ceil(A_TOKENS_PER_S * (script.b_at + script.c_after + A_SLACK_S))
    need = max(script.b_tokens + 64, script.a_prompt_tokens + a_reply + 1)
    return -(-need // 256) * 256


def check_a_outlasts(recs: dict[str, StreamRecord], script: LongPromptScript, mml: int | None) -> None:
    """A must still be decoding when B's first token comes: a run where A's reply reached its
    length before that measured no overlap, and every later run would too. Refused on the first
    such run, naming the flag and the size A's own pace asks for."""
    a, b = recs["A"], recs["B"]
    if a.cancelled or a.sent is None or not a.token_times or a.tokens < script.a_max_tokens:
        return  # still decoding when B and C were done (or failed: the figures say so)
    if b.token_times and a.token_times[-1] >= b.token_times[0]:
        return
    took = max(a.token_times[-1] - a.sent, 1e-6)
    pace = a.tokens / took
    horizon = (b.token_times[0] - a.sent if b.token_times else script.b_at + script.c_after) + A_SLACK_S
    need = -(-(script.a_prompt_tokens + math.ceil(2 * pace * horizon) + 1) // 256) * 256
    limit = f"the server's max_model_len {mml}" if mml else f"its max_tokens {script.a_max_tokens}"
    raise FlagError("--max-model-len", f"A decoded {pace:.0f} tokens/s and reached {limit} {took:.2f} s in, before "
                                       f"B's first token, so B could not overlap it: give --max-model-len {need} "
                                       "(or a larger --a-tokens, or a smaller --b-at)")


def check_script(script: LongPromptScript, mml: int | None) -> None:
    if mml is not None and script.b_tokens + script.b_max_tokens > mml:
        raise FlagError("--b-tokens", f"{script.b_tokens} + {script.b_max_tokens} reply tokens exceed the server's "
                                      f"max_model_len {mml}")


def a_alone_tokens(a: StreamRecord, b: StreamRecord, most: int) -> int:
    """How long A alone runs: past the token A had reached at B's first token, with a margin for
    the variant's later runs, at most A's own max_tokens."""
    if not b.token_times:
        return 0
    reached = figures.count_in(a.token_times, float("-inf"), b.token_times[0])
    return min(most, int(reached * 1.5) + 32)


def play_alone_pair(run: Run, s: LongPromptScript, b_prompt: list[int], traced: bool, a_prompt: list[int],
                    a_tokens: int) -> dict:
    """B's first token with nothing else running (checked on /metrics), on a prompt of its own;
    then A alone for `a_tokens` tokens of its own prompt: its pace at each context length, the
    yardstick for its rate while B fills (a stream slows as its context grows, B or no B)."""
    idle = wait_idle(run.url)
    req = s.sampling.apply(Request("B", b_prompt, max_tokens=s.b_max_tokens, token_ids=run.token_ids), "B")
    rec = asyncio.run(play_alone(run.url, req, run.model))
    tr = fetch_trace(run.url) if traced else None
    out = {"record": rec, "run": run.index, "idle": idle, "error": rec.error,
           "b_first_token": figures.first_token_latency(rec),
           "trace": [st for st in tr if st["t"] >= rec.sent] if tr else None}
    if a_tokens > 0:
        wait_idle(run.url)
        a = s.sampling.apply(Request("A", a_prompt, max_tokens=a_tokens, ignore_eos=True, token_ids=run.token_ids), "A")
        out["a_record"] = asyncio.run(play_alone(run.url, a, run.model))
    return out


def play_alone_simulated(run: Run, s: LongPromptScript, b_prompt: list[int], a_prompt: list[int],
                         a_tokens: int) -> dict:
    """B alone and A alone in virtual time (run.sim), as a real run measures them on its server."""
    sim = run.sim
    alone = play_virtual([SimRequest("B", b_prompt, s.b_max_tokens)], sim.cfg, sim.costs, sim.caps,
                         vocab_size=sim.vocab, trace=True)
    rec = alone.records["B"]
    out = {"record": rec, "run": run.index, "idle": None, "error": rec.error,
           "b_first_token": figures.first_token_latency(rec), "trace": alone.trace}
    if a_tokens > 0:
        a = play_virtual([SimRequest("A", a_prompt, a_tokens)], sim.cfg, sim.costs, sim.caps, vocab_size=sim.vocab)
        out["a_record"] = a.records["A"]
    return out


def alone_or_defer(settings: LongPromptSettings, data: dict, run: Run, measure: Callable[[], dict]) -> None:
    """B alone on this run's server, if it still serves. A server that died during the run is not
    measured: B alone waits for the variant's next run, or, with none left, is recorded as failed;
    either way data["alone_notes"] says which."""
    name = run.variant.name
    if healthy(run.url):
        run.status("B and A alone")
        data["alone"][name] = measure()
        return
    later = [j for j, n in enumerate(settings.session.order, 1) if n == name and j > run.index]
    why = f"{name}: the server stopped serving during run {run.index}, so B alone was not measured on it"
    if later and not settings.session.url:
        data.setdefault("alone_notes", []).append(f"{why}; it is measured on run {later[0]}, a fresh server.")
    else:
        data.setdefault("alone_notes", []).append(f"{why}; no later run of {name} to measure it on: B alone failed.")
        data["alone"][name] = {"record": None, "run": run.index, "idle": None, "trace": None, "b_first_token": None,
                               "error": f"the server stopped serving during run {run.index}"}


def cold_check(b: StreamRecord, shared: bool) -> dict:
    """Which check says B's prompt was cold: the server's cached_tokens where it reports them,
    else a fresh server (launched) or a fresh random prompt (--url)."""
    if b.cached_tokens is not None:
        return {"by": "cached_tokens", "cached_tokens": b.cached_tokens, "held": b.cached_tokens == 0}
    return {"by": "fresh random prompt" if shared else "fresh server", "cached_tokens": None, "held": True}


class LongPrompt(ScriptScenario):
    """The A/B/C test as a script (`timeline`) the script scenario plays, measures and checks;
    its own: the receipt's long-prompt names and fields, B and A alone once per variant, the
    refusal of a run where A ended before B overlapped it."""

    url_cache = "B's cold check: cached_tokens where reported, else a fresh random prompt per run"
    analysis = driver.Analysis(exactness.long_prompt, figures.long_prompt_stats, figures.long_prompt_predicted,
                               figures.long_prompt_summary)

    def __init__(self, settings: LongPromptSettings):
        driver.Scenario.__init__(self, settings)  # its script is built from the flags, not read from a file
        self.script, self.sampling, self.seed = timeline(settings.script), settings.script.sampling, 0

    def header(self) -> dict:
        s = self.settings
        return {"script": s.script.to_dict(), "plain_check": s.plain_check, "sampling": s.script.sampling.to_dict(),
                **s.scaled}

    def begin(self, data: dict) -> None:
        data.update(alone={}, plain=None, vocab=None)

    def play(self, data: dict, run: Run) -> dict:
        """A/B/C on the script, the engine's trace, and B alone once per variant; raw records only."""
        settings = self.settings
        check_script(settings.script, run.max_model_len)
        prompts = self.prompts(run, self.run_key(run))
        # A's reply as long as the server's context allows (it is cancelled anyway), as the script fits it
        s = replace(settings.script, a_max_tokens=script_scenario.fit(self.script, prompts, run.max_model_len)["A"])
        data["settings"]["script"] = s.to_dict()
        recs, _, check, sim_trace = self.play_streams(run, prompts, trace=True)
        if not run.sim:
            check_a_outlasts(recs, s, run.max_model_len)
        trace = sim_trace if run.sim else (fetch_trace(run.url) if settings.session.engine.trace or run.shared else None)
        if run.variant.name not in data["alone"]:
            a_tokens = a_alone_tokens(recs["A"], recs["B"], s.a_max_tokens)
            b_prompt = self.prompts(run, f"-alone{run.index}{run.salt}")["B"]
            if run.sim:
                data["alone"][run.variant.name] = play_alone_simulated(run, s, b_prompt, prompts["A"], a_tokens)
            else:
                alone_or_defer(settings, data, run, lambda: play_alone_pair(run, s, b_prompt, trace is not None,
                                                                            prompts["A"], a_tokens))
        return {"records": recs, "client": check, "hashes": exactness.reply_hashes(recs), "trace": trace,
                "cold": cold_check(recs["B"], run.shared), "counted_by": weakest_count(recs.values()),
                "system_fingerprint": None if run.sim else fingerprint(recs.values())}

    def run_figures(self, recs: dict[str, StreamRecord], entry: dict) -> figures.LongPromptFigures:
        return figures.long_prompt(self.script, recs)

    def failed(self, entry: dict) -> None:
        entry.update(records=None, hashes=None, trace=None,
                     figures=figures.failed_long_prompt(entry["failure"]).to_dict())

    def shown(self, f: dict) -> str:
        s = lambda v: "-" if v is None else f"{num(v)} s"  # noqa: E731
        return f"B first token {s(f['b_first_token'])}, C {s(f['c_first_token'])}, A pause {s(f['a_longest_pause'])}"

    def notes_before(self, data: dict) -> list[str]:
        out = [data["settings"]["scaled_down"]] if data["settings"].get("scaled_down") else []
        if self.session.engine.device == "cpu" and not self.session.url and not self.session.sim:
            out.append("CUDA: this receipt ran on the host's cores. The same command with "
                       "--device cuda runs qwen3-8b in bf16 with a 32,000-token B at 5 s.")
        return out

    def notes_after(self, data: dict) -> list[str]:
        return data.get("alone_notes") or []


def run(settings: LongPromptSettings, reporter: Reporter | None = None,
        save: driver.Save | None = None) -> tuple[dict, object]:
    """Every run in order, a fresh server each, then the plain reference (driver.run)."""
    return driver.run(LongPrompt(settings), reporter, save)
