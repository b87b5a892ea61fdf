"""tfbench load's workloads without files: arrival processes, lengths, synthetic prompts (shared
prefixes, multi-turn sessions), injects, the flag checks and seeded determinism. Pure: no server."""
import numpy as np
import pytest

from tensorfold_bench.errors import FlagError
from tensorfold_bench.workload.arrivals import Arrivals
from tensorfold_bench.workload.ids import PROMPT_ID_FLOOR
from tensorfold_bench.workload.inject import Inject, parse as parse_inject
from tensorfold_bench.workload.lengths import parse as parse_len
from tensorfold_bench.workload.spec import Level, from_flags

VOCAB = 5000


def gaps(kind: str, rate: float, burstiness: float = 1.0, n: int = 10_000, seed: int = 0) -> np.ndarray:
    return np.diff(Arrivals(kind, burstiness).offsets(rate, seed=seed, requests=n + 1))


# ---- arrivals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,b", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 2.0), ("constant", 1.0)])
def test_mean_gap_is_one_over_the_rate(kind, b):
    g = gaps(kind, 4.0, b)
    assert len(g) == 10_000
    assert g.mean() == pytest.approx(0.25, rel=0.03)


def test_poisson_gaps_are_exponential_and_gamma_burstiness_sets_their_spread():
    cv = {b: (g.std() / g.mean()) for b, g in ((1.0, gaps("poisson", 2.0)), (0.25, gaps("gamma", 2.0, 0.25)),
                                                (4.0, gaps("gamma", 2.0, 4.0)))}
    assert cv[1.0] == pytest.approx(1.0, abs=0.05)  # exponential gaps: coefficient of variation 1
    assert cv[0.25] > 1.5 * cv[1.0]  # burstier: cv = 1/sqrt(shape) = 2
    assert cv[4.0] < 0.7 * cv[1.0]  # steadier: 0.5
    assert set(np.round(gaps("constant", 2.0), 12)) == {0.5}


def test_arrivals_start_at_zero_and_stop_at_requests_or_duration():
    a = Arrivals("poisson")
    assert len(a.offsets(3.0, seed=1, requests=7)) == 7
    offs = a.offsets(3.0, seed=1, duration=20.0)
    assert offs[0] == 0.0 and all(o < 20.0 for o in offs) and 40 < len(offs) < 80
    assert a.offsets(3.0, seed=1, requests=5, duration=20.0) == offs[:5]  # whichever comes first
    assert Arrivals("constant").offsets(2.0, seed=0, duration=5.0) == [k / 2 for k in range(10)]


def test_every_rate_of_one_seed_replays_the_same_pattern_faster_or_slower():
    a = Arrivals("gamma", 0.5)
    slow, fast = a.offsets(1.0, seed=3, requests=50), a.offsets(4.0, seed=3, requests=50)
    assert np.allclose(np.array(slow) / 4, fast)
    assert a.offsets(1.0, seed=3, requests=50) == slow
    assert a.offsets(1.0, seed=4, requests=50) != slow


# ---- lengths and injects ----------------------------------------------------------------------

def test_length_forms():
    g = np.random.default_rng(0)
    assert parse_len("--input-len", "200").draw(g, 3) == [200, 200, 200]
    r = parse_len("--input-len", "100:300").draw(g, 5000)
    assert min(r) == 100 and max(r) == 300  # inclusive at both ends
    n = np.array(parse_len("--input-len", "normal:200,50").draw(g, 5000))
    assert n.mean() == pytest.approx(200, rel=0.03) and n.std() == pytest.approx(50, rel=0.05)
    assert min(parse_len("--input-len", "normal:2,50").draw(g, 1000)) == 1  # clipped to at least 1
    ln = np.array(parse_len("--output-len", "lognormal:200,80").draw(g, 20000))
    assert ln.mean() == pytest.approx(200, rel=0.03) and ln.std() == pytest.approx(80, rel=0.08)


@pytest.mark.parametrize("text", ["0", "abc", "300:100", "0:5", "normal:200", "uniform:1,2", "-5", "1.5"])
def test_a_bad_length_names_the_flag(text):
    with pytest.raises(FlagError, match=r"^--output-len: .*expected N, LO:HI|^--output-len: .*at least 1|LO <= HI"):
        parse_len("--output-len", text)


def test_inject_forms():
    assert parse_inject("4096@10") == Inject(4096, 1, every=10.0)
    assert parse_inject("4096:8@5,20") == Inject(4096, 8, times=(5.0, 20.0))
    assert parse_inject("100@12,") == Inject(100, 1, times=(12.0,))
    assert Inject(10, every=10.0).offsets(35.0) == [10.0, 20.0, 30.0]
    assert Inject(10, every=10.0).offsets(30.0) == [10.0, 20.0]
    for bad in ("4096", "@10", "0@10", "4096@0", "4096@x", "4096:0@5", "4096@5,,6"):
        with pytest.raises(FlagError, match="^--inject: "):
            parse_inject(bad)


# ---- synthetic workloads ----------------------------------------------------------------------

def build(level: int = 0, vocab: int = VOCAB, **flags):
    spec = from_flags(**flags)
    return spec.build(spec.levels[level], vocab)


def test_open_loop_items_carry_offsets_lengths_and_ids_clear_of_special_tokens():
    w = build(rates=[2.0], requests=40, input_len="100:300", output_len="16")
    assert len(w.items) == 40 and not w.timed
    assert [i.id for i in w.items] == [f"r{k}" for k in range(40)]
    offs = [i.offset for i in w.items]
    assert offs[0] == 0.0 and offs == sorted(offs)
    assert all(100 <= i.prompt_len <= 300 and i.output_len == 16 for i in w.items)
    assert len({i.prompt_len for i in w.items}) > 10
    ids = [t for i in w.items for t in i.prompt]
    assert min(ids) >= PROMPT_ID_FLOOR and max(ids) < VOCAB


def test_two_builds_are_equal_and_another_seed_differs():
    flags = dict(rates=[1.0, 3.0], duration=20.0, input_len="normal:64,16", output_len="4:12",
                 prefix_groups=3, prefix_len=32, turns=2, think=0.5, inject="500@5", warmup=2)
    a, b = from_flags(**flags), from_flags(**flags)
    for lv in a.levels:
        assert a.build(lv, VOCAB) == b.build(lv, VOCAB) == a.build(lv, VOCAB)
    other = from_flags(**{**flags, "seed": 1})
    assert other.build(other.levels[0], VOCAB).items != a.build(a.levels[0], VOCAB).items
    # levels differ in their prompts (no level hits another's cache on one server), and a salt
    # makes every prompt fresh again
    p0 = [i.prompt for i in a.build(a.levels[0], VOCAB).items]
    p1 = [i.prompt for i in a.build(a.levels[1], VOCAB).items]
    assert not set(p0) & set(p1)
    salted = [i.prompt for i in a.build(a.levels[0], VOCAB, salt="run2").items]
    assert not set(p0) & set(salted)


def test_prefix_groups_share_their_prefix_and_nothing_more():
    w = build(rates=[5.0], requests=12, prefix_groups=3, prefix_len=50, input_len="20")
    for i, it in enumerate(w.items):
        assert it.prompt_len == 70
        same = w.items[(i + 3) % 12]  # the same group
        assert it.prompt[:50] == same.prompt[:50] and it.prompt[50:] != same.prompt[50:]
        assert it.prompt[:50] != w.items[(i + 1) % 12].prompt[:50]


def test_sessions_turns_follow_in_order_with_think_and_only_turn_zero_timed():
    w = build(rates=[2.0], requests=5, turns=3, think=1.5, input_len="10", prefix_groups=2, prefix_len=8)
    assert len(w.items) == 15
    for s in range(5):
        turns = [i for i in w.items if i.session == f"s{s}"]
        assert [i.id for i in turns] == [f"s{s}.t{k}" for k in range(3)]
        assert [i.turn for i in turns] == [0, 1, 2]
        assert turns[0].offset is not None and turns[1].offset is turns[2].offset is None
        assert [i.think for i in turns] == [0.0, 1.5, 1.5]
        assert turns[0].prompt_len == 18 and turns[1].prompt_len == turns[2].prompt_len == 10  # new part only
        k = w.items.index(turns[0])
        assert list(w.items[k:k + 3]) == turns  # a session's later turns right behind its first


def test_closed_loop_has_no_offsets_and_warmup_marks_the_first():
    w = build(concurrency=[4], requests=10, warmup=3)
    assert all(i.offset is None for i in w.items)
    assert [i.warmup for i in w.items] == [True] * 3 + [False] * 7
    w = build(rates=[1.0], requests=4, turns=2, warmup=1)
    assert [i.warmup for i in w.items] == [True, True, False, False, False, False, False, False]


def test_injects_are_cold_timed_items_among_the_load():
    w = build(rates=[4.0], duration=10.0, inject="600:2@3", input_len="50")
    inj = [i for i in w.items if i.kind == "inject"]
    assert [(i.id, i.offset, i.output_len, i.prompt_len) for i in inj] == \
        [("i0", 3.0, 2, 600), ("i1", 6.0, 2, 600), ("i2", 9.0, 2, 600)]
    assert [i.offset for i in w.items] == sorted(i.offset for i in w.items)
    load = {t for i in w.items if i.kind == "load" for t in i.prompt[:8]}
    assert len({i.prompt[:8] for i in inj}) == 3
    assert not any(i.prompt[:8] == x.prompt[:8] for i in inj for x in w.items if x.kind == "load") and load
    # listed times, in a closed loop too (the injects keep their offsets)
    w = build(concurrency=[2], requests=6, inject="300@1.5,4")
    assert [(i.kind, i.offset) for i in w.items][-2:] == [("inject", 1.5), ("inject", 4.0)]
    assert all(i.offset is None for i in w.items if i.kind == "load")


def test_levels_in_the_order_given_and_describe_is_one_line():
    spec = from_flags(rates=[4.0, 1.0, 2.5], duration=30.0, arrival="gamma", burstiness=0.5)
    assert spec.levels == [Level("rate", 4.0, "rate 4/s"), Level("rate", 1.0, "rate 1/s"), Level("rate", 2.5, "rate 2.5/s")]
    assert [lv.label for lv in from_flags(concurrency=[8, 1], requests=4).levels] == ["concurrency 8", "concurrency 1"]
    d = spec.describe()
    assert "\n" not in d and "gamma arrivals (burstiness 0.5)" in d and "30 s" in d and "seed 0" in d


@pytest.mark.parametrize("flags,match", [
    (dict(rates=[0.0], requests=5), r"^--rate: "),
    (dict(rates=[-1.0], requests=5), r"^--rate: "),
    (dict(rates=[float("nan")], requests=5), r"^--rate: "),
    (dict(rates=[1.0], concurrency=[2], requests=5), r"^--rate: .*not both"),
    (dict(rates=[1.0]), r"^--requests: .*--duration"),
    (dict(concurrency=[2], duration=10.0), r"^--requests: .*closed loop"),
    (dict(requests=5), r"^--rate: .*--concurrency"),
    (dict(rates=[1.0], requests=5, output_len="0"), r"^--output-len: "),
    (dict(rates=[1.0], requests=5, input_len="1:"), r"^--input-len: "),
    (dict(rates=[1.0], requests=5, arrival="bursty"), r"^--arrival: .*poisson, gamma, constant"),
    (dict(rates=[1.0], requests=5, burstiness=0.5), r"^--burstiness: .*gamma"),
    (dict(rates=[1.0], requests=5, arrival="gamma", burstiness=0.0), r"^--burstiness: "),
    (dict(concurrency=[0], requests=5), r"^--concurrency: "),
    (dict(concurrency=[2], requests=5, arrival="gamma"), r"^--arrival: "),
    (dict(rates=[1.0], requests=5, warmup=5), r"^--warmup: "),
    (dict(rates=[1.0], requests=5, prefix_groups=2), r"^--prefix-groups: "),
    (dict(rates=[1.0], requests=5, think=1.0), r"^--think: "),
    (dict(rates=[1.0], requests=5, turns=0), r"^--turns: "),
    (dict(rates=[1.0], requests=5, fmt="csv"), r"^--format: "),
    (dict(rates=[1.0], requests=5, fmt="jsonl"), r"^--format: "),
    (dict(rates=[1.0], requests=5, time_scale=2.0), r"^--time-scale: "),
    (dict(rates=[1.0], requests=5, inject="big@5"), r"^--inject: "),
    (dict(concurrency=[2], requests=5, inject="100@5"), r"^--inject: .*--duration"),
    (dict(rates=[1.0], requests=0), r"^--requests: "),
    (dict(rates=[0.2, 5.0], duration=10.0, warmup=3, arrival="constant"), r"^--warmup: 3 warm-up requests leave none of the 2 measured at rate 0.2/s"),
    (dict(rates=[1.0], duration=10.0, inject="100@4,12"), r"^--inject: 12 s is past --duration 10"),
    (dict(rates=[1.0], duration=0.0), r"^--duration: "),
])
def test_bad_flags_are_one_line_naming_the_flag(flags, match):
    with pytest.raises(FlagError, match=match) as e:
        from_flags(**flags)
    assert "\n" not in str(e.value)


def test_a_block_is_a_function_of_seed_key_and_id_alone():
    from tensorfold_bench.workload.ids import block_ids
    a = block_ids(0, "k", [5, 9, 70000], 512, VOCAB)
    assert a[9] == block_ids(0, "k", [9], 512, VOCAB)[9] == block_ids(0, "k", list(range(5000)) + [9], 512, VOCAB)[9]
    assert a[5] != a[9] and a[9] != block_ids(1, "k", [9], 512, VOCAB)[9] != block_ids(0, "j", [9], 512, VOCAB)[9]
    ids = np.array([a[h] for h in a])
    assert ids.min() >= PROMPT_ID_FLOOR and ids.max() < VOCAB and len(np.unique(ids)) > 0.7 * ids.size
