"""The script model (tensorfold_bench.workload.script_file): what a script may say, every class of bad script
as one line naming the stream (or figure) and the field, and the figures of a run computed from
raw records by the registry's own functions."""
import subprocess
import sys
from pathlib import Path

import pytest

from tensorfold_bench.analysis import figures
from tensorfold_bench.client.stream import StreamRecord
from tensorfold_bench.workload.script_file import Event, Point, ScriptError, load, order_of, parse

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "scripts").glob("*.yaml"))

ISSUE = """
name: cancel-and-retry
streams:
  - name: A
    at: 0
    prompt: {random: 64}
    max_tokens: 4000
    until: [R.done]
  - name: X
    at: 3
    prompt: {random: 4096}
    max_tokens: 8
    cancel: {after: 1.0}
  - name: R
    at: X.cancelled + 0.2
    prompt: {same_as: X}
    max_tokens: 8
    expect: {cached_tokens: ">= 256"}
figures:
  - {first_token: R}
  - {longest_pause: A, window: [X.sent, R.first_token]}
  - {rate: A, window: [X.sent, R.first_token], versus: before}
"""


def test_the_issues_script_reads_as_written():
    s = parse(ISSUE, "issue.yaml")
    assert [x.name for x in s.streams] == ["A", "X", "R"]
    r = s.stream("R")
    assert r.at == Point(Event("X", "cancelled"), 0.2) and r.prompt.same_as == "X"
    assert r.expect[0].op == ">=" and r.expect[0].value == 256 and r.expect[0].holds(255) is False
    assert s.stream("A").until == (Event("R", "done"),) and s.stream("X").cancel.after == 1.0
    assert s.keys == ["first_token:R", "longest_pause:A", "rate:A", "rate_before:A"]
    # what every run's clock respects: R goes out at least 0.2 s after X's cancel, 1.0 s after X's send
    o = order_of(s)
    assert o.earliest[Event("R", "sent")] == pytest.approx(4.2)
    assert o.precedes(Point(Event("X", "sent")), Point(Event("R", "first_token")))
    assert not o.precedes(Point(Event("R", "first_token")), Point(Event("X", "sent")))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_shipped_script_reads(path):
    s = load(path)
    assert s.figures and s.name == path.stem


def test_repeat_makes_copies_each_spaced_after_the_one_before():
    s = parse("""
streams:
  - {name: F, at: 0, prompt: {random: 8}, max_tokens: 40, until: [G-3.done]}
  - {name: G, at: 1, prompt: {random: 8}, repeat: 3, every: 0.5}
""")
    assert [x.name for x in s.streams] == ["F", "G", "G-2", "G-3"]
    assert s.stream("G-3").at == Point(Event("G-2", "sent"), 0.5)
    assert order_of(s).earliest[Event("G-3", "sent")] == pytest.approx(2.0)


def _bad(text: str) -> str:
    with pytest.raises(ScriptError) as e:
        parse(text, "s.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("s.yaml: ")
    return msg


@pytest.mark.parametrize("old, new, says", [
    # an unknown event: of a stream that does not exist, or a kind that does not
    ("at: X.cancelled + 0.2", "at: X.finished + 0.2", "stream R: at: unknown event X.finished (events: sent,"),
    ("at: X.cancelled + 0.2", "at: Q.done", "stream R: at: unknown event Q.done: no stream Q"),
    ("until: [R.done]", "until: [R.ended]", "stream A: until: unknown event R.ended"),
    # a cycle in events: X waits for R, which waits for X
    ("at: 3\n", "at: R.done + 0.1\n", "stream R: at: a cycle in events: X.sent waits for R.done"),
    # a window whose end can precede its start
    ("window: [X.sent, R.first_token]}\n  - {rate", "window: [R.first_token, X.sent]}\n  - {rate",
     "figure 2 (longest_pause: A): window: its end X.sent can precede its start R.first_token"),
    ("window: [X.sent, R.first_token]}\n  - {rate", "window: [X.sent, 2.5]}\n  - {rate",
     "figure 2 (longest_pause: A): window: its end 2.5 can precede its start X.sent"),
    # a same_as of a stream not yet sent (R at 1 s, X at 3 s)
    ("at: X.cancelled + 0.2", "at: 1", "stream R: prompt.same_as: X may not be sent yet when R is sent"),
    ("prompt: {same_as: X}", "prompt: {prefix_of: A, plus: 4}\n    cancel: {tokens: 2}", None),
    # an event that never happens
    ("    cancel: {after: 1.0}\n", "", "stream R: at: X.cancelled never happens: X has neither cancel nor until"),
    # fields: unknown, missing, of the wrong kind
    ("max_tokens: 8\n    cancel", "max_tokens: 8\n    cancle: {after: 1}\n    cancel", "stream X: cancle: unknown field"),
    ("    prompt: {random: 4096}\n", "", "stream X: prompt: missing"),
    ("max_tokens: 8\n    cancel", "max_tokens: 0\n    cancel", "stream X: max_tokens: must be a whole number, at least 1"),
    ("at: 3\n", "at: -3\n", "stream X: at: must be a finite number of seconds, at least 0, not -3"),
    ("at: X.cancelled + 0.2", "at: X.cancelled - 0.2", "stream R: at: 'X.cancelled - 0.2': a time before an event"),
    ("{random: 4096}", "{random: 4096, same_as: A}", "stream X: prompt: give exactly one of random, same_as"),
    ('">= 256"', '"about 256"', "stream R: expect.cached_tokens: 'about 256' is not a comparison"),
    ("cancel: {after: 1.0}", "cancel: {after: 1.0}\n    priority: urgent", "stream X: priority: must be one of"),
    ("- name: X", "- name: A", "stream A: name: two streams"),
    ("{first_token: R}", "{first_token: R, window: [X.sent, R.done]}", "figure 1 (first_token: R): window: first_token"),
    ("{first_token: R}", "{first_token: Q}", "figure 1 (first_token: Q): first_token: no stream Q"),
    ("{first_token: R}", "{longest_pause: A, window: [X.sent, R.first_token]}",
     "figure 2 (longest_pause: A): name: longest_pause:A is measured twice"),
    ("versus: before", "versus: after", "figure 3 (rate: A): versus: must be before"),
])
def test_a_bad_script_is_one_line_naming_the_stream_and_the_field(old, new, says):
    assert old in ISSUE
    text = ISSUE.replace(old, new, 1)
    if says is None:  # the control: a prompt extending a stream sent before it is fine
        parse(text, "s.yaml")
        return
    assert says in _bad(text)


def test_not_yaml_or_not_a_script():
    assert "not valid YAML" in _bad("streams: [")
    assert "s.yaml: streams: expected a non-empty list" in _bad("name: x\n")
    assert "s.yaml: stream 1: name: must be letters" in _bad("streams:\n  - {name: 1x, at: 0, prompt: {random: 4}}\n")


def test_a_bad_script_exits_2_in_one_line_before_any_server_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(ISSUE.replace("at: 3\n", "at: R.done + 0.1\n"))
    p = subprocess.run([sys.executable, "-m", "tensorfold_bench", "run", "script", str(bad), "--model", "tiny",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [f"error: {bad}: stream R: at: a cycle in events: X.sent waits for "
                                             "R.done waits for R.first_token waits for R.sent waits for X.cancelled "
                                             "waits for X.sent"]
    assert not (tmp_path / "out").exists()  # no run folder: nothing was launched


def test_a_missing_script_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tensorfold_bench", "run", "script", str(tmp_path / "none.yaml")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "cannot read" in p.stderr


# ---- a run's figures from raw records ------------------------------------------------------

def rec(name, sent, times, scheduled=None, ended=None, cancelled=False, cached=None, error=None):
    return StreamRecord(name, "/v1/completions", 4, 8, scheduled=sent if scheduled is None else scheduled, sent=sent,
                        token_times=list(times), token_ids=list(range(len(times))), cancelled=cancelled,
                        ended=ended if ended is not None else (times[-1] if times else sent), cached_tokens=cached,
                        error=error)


def test_the_long_prompt_script_gives_long_prompts_figures():
    """The shipped long-prompt timeline, over the same records, gives the long-prompt figures."""
    a = rec("A", 100.0, [100.1 + 0.05 * i for i in range(200)], ended=110.2, cancelled=True)
    b = rec("B", 103.0, [105.0, 105.01], scheduled=103.0, cached=0)
    c = rec("C", 103.5, [105.2, 105.3], scheduled=103.5, cached=0)
    shipped = load(ROOT / "examples/scripts/long-prompt.yaml")
    lp = figures.long_prompt(shipped, {"A": a, "B": b, "C": c})
    s = figures.script_run(shipped, {"A": a, "B": b, "C": c}, t0=100.0)
    assert s.valid and lp.valid, (s.invalid_reasons, lp.invalid_reasons)
    assert s.values == {"first_token:B": lp.b_first_token, "first_token:C": lp.c_first_token,
                        "longest_pause:A": lp.a_longest_pause, "rate:A": lp.a_rate_during,
                        "rate_before:A": lp.a_rate_before}
    # a gap inside B's fill is A's longest pause
    a.token_times = [t if t < 103.2 else t + 1.0 for t in a.token_times]
    s = figures.script_run(load(ROOT / "examples/scripts/long-prompt.yaml"), {"A": a, "B": b, "C": c}, t0=100.0)
    assert s.values["longest_pause:A"] == pytest.approx(1.05)


def test_expectations_late_sends_and_streams_not_decoding_make_a_run_invalid():
    s = parse(ISSUE)
    a = rec("A", 0.0, [0.1 * i for i in range(1, 80)], ended=8.0, cancelled=True)
    x = rec("X", 3.0, [], ended=4.0, cancelled=True)
    r = rec("R", 4.2, [4.5, 4.6], scheduled=4.2, cached=512)
    ok = figures.script_run(s, {"A": a, "X": x, "R": r}, t0=0.0)
    assert ok.valid, ok.invalid_reasons
    assert ok.values["first_token:R"] == pytest.approx(0.3) and ok.expects[0]["held"] is True
    r.cached_tokens = 0
    missed = figures.script_run(s, {"A": a, "X": x, "R": r}, t0=0.0)
    assert missed.invalid_reasons == ["R's cached_tokens is 0, expected >= 256"]
    # a server that reports no cached tokens: unknown, never a failure
    r.cached_tokens = None
    unknown = figures.script_run(s, {"A": a, "X": x, "R": r}, t0=0.0)
    assert unknown.valid and unknown.expects[0]["held"] is None and unknown.expects[0]["unknown"]
    r.cached_tokens, r.sent = 512, 4.6
    assert "R was sent 0.400 s late (limit 0.25 s)" in figures.script_run(s, {"A": a, "X": x, "R": r}, 0.0).invalid_reasons
    r.sent = 4.2
    a.token_times, a.ended = [t for t in a.token_times if t < 3.5], 3.5  # A stopped before R's first token
    why = figures.script_run(s, {"A": a, "X": x, "R": r}, t0=0.0).invalid_reasons
    assert why == ["A stopped decoding before R.first_token: it was not decoding across the window"]


def test_a_stream_not_sent_says_why_and_its_windows_are_empty():
    s = parse(ISSUE)
    a = rec("A", 0.0, [0.1 * i for i in range(1, 80)], ended=8.0, cancelled=True)
    x = rec("X", 3.0, [3.5 + 0.01 * i for i in range(8)])  # finished before its cancel: no X.cancelled
    r = StreamRecord("R", "/v1/completions", 4096, 8, error="not sent: X.cancelled did not happen", ended=3.6)
    f = figures.script_run(s, {"A": a, "X": x, "R": r}, t0=0.0)
    assert not f.valid and f.values["first_token:R"] is None and f.values["rate:A"] is None
    assert f.invalid_reasons[0] == "R: not sent: X.cancelled did not happen"
    assert "longest_pause:A: R.first_token did not happen" in f.invalid_reasons
    assert f.expects[0]["held"] is None and not f.expects[0]["unknown"]


def test_the_long_prompt_script_sends_long_prompts_own_prompts_and_requests():
    """Streams A, B and C of the shipped timeline draw long-prompt's seeded ids (each role's own,
    as every long-prompt receipt drew them, so replies compare across receipts) and ask for what
    long-prompt's A, B and C ask for (with --temperature, the same per-role seeds too)."""
    from tensorfold_bench.client.sampling import Sampling
    from tensorfold_bench.scenarios import long_prompt as lp
    from tensorfold_bench.scenarios import script as sc
    from tensorfold_bench.workload.ids import prompt_ids

    script = load(ROOT / "examples/scripts/long-prompt.yaml")
    mine = sc.make_prompts(script, 512)
    theirs = lp.make_prompts(lp.LongPromptScript(b_at=3.0, c_after=0.5, b_tokens=4096), 512)
    assert mine == theirs
    assert theirs["B"] == prompt_ids(0, "B", 4096, 512) and theirs["C"] == prompt_ids(0, "C", 34, 512)
    sampling = Sampling(0.7, 3)
    ref = lp.requests(lp.LongPromptScript(b_at=3.0, c_after=0.5, b_tokens=4096, sampling=sampling), theirs)
    for r in ref.values():
        got = sc.request(script.stream(r.name), mine[r.name], "ids", sampling)
        assert (got.body("m") | {"max_tokens": 0}) == (r.body("m") | {"max_tokens": 0}), r.name
        assert r.seed == sampling.apply(r, r.name).seed


def test_run_long_prompt_is_the_short_form_of_the_shipped_timeline():
    """`run long-prompt`'s flags at the cpu defaults make the shipped long-prompt script: its
    streams (B's cold check included) and its figure definitions."""
    from tensorfold_bench.scenarios import long_prompt as lp

    flags = lp.timeline(lp.LongPromptScript(b_at=3.0, c_after=0.5, b_tokens=4096))
    shipped = load(ROOT / "examples/scripts/long-prompt.yaml")
    assert flags.streams == shipped.streams and flags.figures == shipped.figures
    assert [figures.LONG_PROMPT_KEYS[k] for k in figures.LONG_PROMPT] == flags.keys


def _without_diverge_at(ex: dict) -> dict:
    """Exactness as receipts kept it before the first differing token was recorded."""
    return {k: {i: [{f: x for f, x in c.items() if f != "diverge_at"} for c in cs] for i, cs in v.items()}
            if k in ("across_runs", "vs_plain") else v for k, v in ex.items()}


def test_committed_long_prompt_receipts_recompute_the_same_through_the_script():
    """Every committed long-prompt receipt: each run's figures and validity, by the A/B/C script's
    figure definitions, and the exactness, by the script plan, are what the receipt holds."""
    import dataclasses

    from tensorfold_bench import report
    from tensorfold_bench.analysis import exactness
    from tensorfold_bench.scenarios.long_prompt import LongPromptScript, timeline

    fields = {f.name for f in dataclasses.fields(LongPromptScript)} - {"sampling"}
    paths = sorted((ROOT / "receipts").glob("*-long-prompt.json.gz"))
    assert len(paths) > 10
    runs = 0
    for p in paths:
        d = report.read(p)
        abc = timeline(LongPromptScript(**{k: v for k, v in d["settings"]["script"].items() if k in fields}))
        for r in d["runs"]:
            if not r.get("records"):
                continue
            f = figures.long_prompt(abc, {k: StreamRecord.from_dict(v) for k, v in r["records"].items()})
            figures.client_bottleneck(f, r.get("client"))
            got, want = f.to_dict(), r["figures"]
            assert {k: v for k, v in got.items() if k != "invalid_reasons"} == \
                {k: want[k] for k in got if k != "invalid_reasons"}, (p.name, r["index"])
            runs += 1
        if (d.get("exactness") or {}).get("across_runs") is not None:
            for part in [*d["runs"], d.get("plain") or {}]:  # the records as the session keeps them
                if part.get("records"):
                    part["records"] = {k: StreamRecord.from_dict(v) for k, v in part["records"].items()}
            got, want = _without_diverge_at(exactness.long_prompt(d)), _without_diverge_at(d["exactness"])
            assert got == {k: want.get(k) for k in got}, p.name
    assert runs > 100


def test_a_streams_options_become_its_request():
    """priority and draft are sent only when the script sets them; a sampled stream sends its own
    seed, or one derived from --seed and its name."""
    from tensorfold_bench.client.sampling import Sampling, request_seed
    from tensorfold_bench.scenarios.script import request

    s = parse("""
streams:
  - {name: P, at: 0, prompt: {random: 4}}
  - {name: Q, at: 0, prompt: {text: hi}, priority: background, draft: false, temperature: 0.5, seed: 7,
     ignore_eos: false}
""")
    p = request(s.stream("P"), [300] * 4, "ids", Sampling(0.0, 1)).body("m")
    assert "priority" not in p and "draft" not in p and "seed" not in p and p["temperature"] == 0
    q = request(s.stream("Q"), "hi", "ids", Sampling(0.0, 1)).body("m")
    assert (q["priority"], q["draft"], q["temperature"], q["seed"], q["ignore_eos"], q["prompt"]) == (
        "background", False, 0.5, 7, False, "hi")
    sampled = request(s.stream("P"), [300] * 4, "ids", Sampling(0.8, 3)).body("m")
    assert sampled["seed"] == request_seed(3, "P") and sampled["temperature"] == 0.8
