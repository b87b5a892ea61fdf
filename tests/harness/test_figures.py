"""Figures on hand-made timestamp traces: long-prompt, the sweep's batches and levels, latencies."""
import pytest

from tensorfold_bench.analysis import figures, sweep as sweep_figures
from tensorfold_bench.analysis.figures import count_in, longest_pause, medians, rate_before
from tensorfold_bench.client.stream import StreamRecord, _apply_event, event_tokens
from tensorfold_bench.scenarios.long_prompt import LongPromptScript, timeline

ABC = timeline(LongPromptScript(b_at=3.0, c_after=0.5, b_tokens=64))


def long_prompt_figures(a, b, c):
    """The long-prompt figures of one A/B/C run, by the A/B/C script's figure definitions."""
    return figures.long_prompt(ABC, {"A": a, "B": b, "C": c})


def rec(name, sent, times, scheduled=None, cancelled=False, ended=None, ids=None, **kw):
    r = StreamRecord(name, "/v1/completions", 10, 100, scheduled=sent if scheduled is None else scheduled, sent=sent,
                     token_times=list(times), token_ids=list(ids if ids is not None else range(len(times))),
                     cancelled=cancelled, ended=ended if ended is not None else (times[-1] if times else sent), **kw)
    return r


def abc(a_times, b_sent=3.0, b_first=5.0, c_sent=3.5, c_first=3.8, a_cancelled=True, a_ended=None):
    a = rec("A", 0.0, a_times, cancelled=a_cancelled, ended=a_ended if a_ended is not None else max(a_times[-1], b_first) + 0.1)
    b = rec("B", b_sent, [b_first, b_first + 0.1])
    c = rec("C", c_sent, [c_first, c_first + 0.1])
    return a, b, c


def test_first_tokens_from_own_send():
    f = long_prompt_figures(*abc([0.1 * i for i in range(1, 80)]))
    assert f.b_first_token == pytest.approx(2.0)
    assert f.c_first_token == pytest.approx(0.3)
    assert f.window == pytest.approx(2.0)
    assert f.valid, f.invalid_reasons


def test_window_edges_half_open():
    # W = (3, 5]: a token exactly at B's send is "before", one exactly at B's first token is "during".
    assert count_in([3.0, 4.0, 5.0, 5.5], 3.0, 5.0) == 2
    # a gap ending exactly at B's send does not overlap W; one starting exactly at B's first token neither
    assert longest_pause([1.0, 3.0, 3.1, 3.2], 3.0, 5.0) == pytest.approx(0.1)
    assert longest_pause([4.9, 5.0, 9.0], 3.0, 5.0) == pytest.approx(0.1)


def test_pause_spanning_b_send_counts_whole():
    # A's tokens every 0.1 s until 2.9, then nothing until 4.5 (spans B's send at 3.0), then steady
    times = [0.1 * i for i in range(1, 30)] + [4.5 + 0.1 * i for i in range(20)]
    f = long_prompt_figures(*abc(times))
    assert f.a_longest_pause == pytest.approx(4.5 - 2.9)
    assert f.valid


def test_pause_spanning_b_first_token_counts():
    times = [0.1 * i for i in range(1, 45)] + [7.0, 7.1]
    f = long_prompt_figures(*abc(times))
    assert f.a_longest_pause == pytest.approx(7.0 - 4.4)


def test_no_a_token_in_window():
    # A stalls for the whole of B's fill: 0 tok/s during, the pause spans the window
    times = [0.1 * i for i in range(1, 30)] + [5.5, 5.6]
    f = long_prompt_figures(*abc(times))
    assert f.a_tokens_during == 0
    assert f.a_rate_during == 0.0
    assert f.a_longest_pause == pytest.approx(5.5 - 2.9)
    assert f.valid


def test_rates_during_and_before():
    # 10 tok/s before B, 2 tok/s during (window 2 s: 4 tokens)
    times = [0.1 * i for i in range(1, 31)] + [3.5, 4.0, 4.5, 5.0, 5.5]
    f = long_prompt_figures(*abc(times))
    assert f.a_tokens_during == 4
    assert f.a_rate_during == pytest.approx(2.0)
    assert f.a_rate_before == pytest.approx(10.0)  # window (1, 3]: 20 tokens in 2 s


def test_rate_before_starts_at_a_first_token():
    # B sends 1 s after A's first token with a 5 s window: the before-window is (A first, B send]
    assert rate_before([2.0, 2.25, 2.5, 2.75, 3.0], 3.0, 5.0) == pytest.approx(4 / 1.0)
    assert rate_before([3.5], 3.0, 1.0) is None


def test_multi_token_chunks_count_k_tokens():
    r = StreamRecord("A", "/v1/completions", 1, 10)
    _apply_event(r, {"choices": [{"token_ids": [5, 6, 7], "text": "abc"}]}, 1.0)
    _apply_event(r, {"choices": [{"token_ids": [8], "text": "d"}]}, 2.0)
    assert r.token_ids == [5, 6, 7, 8] and r.token_times == [1.0, 1.0, 1.0, 2.0]
    # a chunk of 3 inside the window counts 3; the zero gaps inside it are not pauses
    assert count_in(r.token_times, 0.5, 1.5) == 3
    assert longest_pause(r.token_times, 0.5, 1.5) == pytest.approx(1.0)


def test_event_tokens_other_servers():
    def chunk_tokens(event):
        return event_tokens(event)[0]

    assert chunk_tokens({"choices": [{"text": "hi", "logprobs": {"tokens": ["token_id:12", "token_id:13"]}}]}) == [12, 13]
    assert chunk_tokens({"choices": [{"delta": {"content": "hi"}}]}) == [None]
    assert chunk_tokens({"choices": [{"delta": {}}]}) == []
    assert chunk_tokens({"choices": []}) == []


def test_invalid_when_a_finished_before_b_first_token():
    times = [0.1 * i for i in range(1, 40)]  # A ends at 3.9, B's first token at 5
    f = long_prompt_figures(*abc(times, a_cancelled=False, a_ended=3.9))
    assert not f.valid
    assert any("A stopped decoding before B.first_token" in r for r in f.invalid_reasons)


def test_invalid_when_a_started_after_b():
    f = long_prompt_figures(*abc([3.2, 3.3, 5.5, 5.6]))
    assert not f.valid


def test_invalid_when_late_or_cached_or_failed():
    a, b, c = abc([0.1 * i for i in range(1, 80)])
    b.scheduled = b.sent - 0.5
    b.usage = {"prompt_tokens_details": {"cached_tokens": 256}}
    b.cached_tokens = 256  # as the client reads it off the usage
    c.error = "HTTP 500: boom"
    f = long_prompt_figures(a, b, c)
    assert f.lateness["B"] == pytest.approx(0.5)
    assert not f.valid
    text = " ".join(f.invalid_reasons)
    assert "late" in text and "cache" in text and "C failed" in text


def test_medians_skip_invalid_runs():
    good = long_prompt_figures(*abc([0.1 * i for i in range(1, 80)]))
    bad = long_prompt_figures(*abc([0.1 * i for i in range(1, 80)], b_first=9.0))
    bad.valid = False
    m = medians([good, bad, good])
    assert m["b_first_token"] == pytest.approx(2.0)


# ---- sweep ---------------------------------------------------------------------------------

def srec(sent, times, ids=None, error=None):
    return StreamRecord("s", "/v1/completions", 10, len(times), sent=sent, token_times=list(times),
                        token_ids=list(ids if ids is not None else range(len(times))), error=error)


def test_batch_figure_is_all_tokens_over_first_send_to_last_token():
    a = srec(10.0, [10.5, 11.0, 11.5, 12.0])
    b = srec(10.1, [10.6, 11.1, 11.6, 14.0])
    batch = sweep_figures.sweep_batch(2, 0, 0, [a, b], 4, ["h0", "h1"])
    assert batch["tokens"] == 8 and batch["wall_s"] == pytest.approx(4.0) and batch["tok_s"] == pytest.approx(2.0)
    assert not batch["errors"] and batch["hashes"] == ["h0", "h1"]
    # every token's time kept, compactly: from the send, then gap by gap, in microseconds
    assert batch["gaps_us"] == [[500000] * 4, [500000, 500000, 500000, 2400000]]


def test_a_short_or_failed_stream_voids_the_batch():
    batch = sweep_figures.sweep_batch(2, 0, 0, [srec(0.0, [1.0, 2.0]), srec(0.0, [1.0], error="HTTP 500: boom")], 2, [None, None])
    assert batch["tok_s"] is None and "stream 1: HTTP 500: boom" in batch["errors"]
    short = sweep_figures.sweep_batch(1, 0, 0, [srec(0.0, [1.0])], 2, [None])
    assert short["tok_s"] is None and "1 of 2 tokens" in short["errors"][0]


def batch(level, cell, rep, tok_s, gaps=None):
    return {"level": level, "cell": cell, "rep": rep, "tok_s": tok_s, "hashes": [], "errors": [], "gaps_us": gaps}


def test_cell_is_median_over_reps_and_level_median_over_cells():
    bs = [batch(1, 0, 0, 10), batch(1, 0, 1, 12), batch(1, 0, 2, 30),
          batch(1, 1, 0, 20), batch(1, 1, 1, 20), batch(1, 1, 2, None)]
    assert sweep_figures.cell_tok_s(bs, 1, 0) == 12 and sweep_figures.cell_tok_s(bs, 1, 1) == 20
    assert sweep_figures.sweep_run(bs) == {"tok_s@1": 16}  # no kept times (an older receipt): no latencies


def test_latencies_come_from_the_kept_token_times():
    # two streams: first tokens after 100 and 300 ms; then gaps of 10 ms, one 0 (a chunk of two), one 50 ms
    bs = [batch(2, 0, 0, 1.0, gaps=[[100000, 10000, 10000], [300000, 0, 50000]])]
    f = sweep_figures.sweep_run(bs)
    assert f["ttft_p50@2"] == pytest.approx(200.0)
    assert f["itl_p50@2"] == pytest.approx(10.0)
    assert f["itl_p99@2"] == pytest.approx(10 + 0.97 * 40)  # numpy's linear percentile over 0, 10, 10, 50


def test_the_registry_names_every_figure_a_receipt_shows():
    for name in (*figures.LONG_PROMPT, "b_alone", "tok_s@8", "ttft_p50@1", "itl_p99@4"):
        s = figures.spec(name)
        assert s.unit and s.label and s.digits >= 0
    assert figures.spec("tok_s@2").higher_is_better and not figures.spec("c_first_token").higher_is_better


def test_pace_alone_is_the_rate_over_the_same_tokens_alone():
    from tensorfold_bench.analysis.figures import pace_alone
    beside = [0.1 * i for i in range(1, 21)]  # 10 tok/s beside B
    alone = [0.05 * i for i in range(1, 31)]  # 20 tok/s alone
    # tokens 6..15 fell in (0.5, 1.5]: alone they took alone[14] - alone[4] = 0.5 s
    assert pace_alone(beside, 0.5, 1.5, alone) == pytest.approx(20)
    assert pace_alone(beside, 0.5, 1.5, alone[:14]) is None  # alone never reached token 15
    assert pace_alone(beside, 0.0, 1.5, alone) is None  # no token before the window: no start
