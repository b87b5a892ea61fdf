"""The comparison rule of tensorfold_bench.analysis.stats on synthetic series."""
import numpy as np
import pytest

from tensorfold_bench.analysis import stats

BNNB = ["base", "new", "new", "base"]
BNNB3 = BNNB * 3


def series(order, base_level, new_factor, drift=0.0, noise=0.0, seed=1):
    """Each run's value: a machine level that drifts linearly over the runs, times new's factor
    on new runs, times a little seeded noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i, name in enumerate(order):
        v = base_level * (1 + drift * i) * (new_factor if name == "new" else 1.0)
        out.append(float(v * (1 + noise * rng.standard_normal())))
    return out


def test_pairs_are_adjacent_base_runs():
    assert stats.adjacent_pairs(BNNB, [1, 2, 3, 4], "new", "base") == [(1, 0), (1, 3), (2, 0), (2, 3)]
    order = ["main", "new", "new", "main", "old", "main"]
    assert stats.adjacent_pairs(order, [1] * 6, "old", "main") == [(4, 3), (4, 5)]
    # an invalid base run is skipped: the next valid one is adjacent
    assert stats.adjacent_pairs(BNNB, [1, 2, 3, None], "new", "base") == [(1, 0), (2, 0)]


def test_identical_runs_are_within_noise():
    c = stats.compare(BNNB, [10, 10, 10, 10], "new", "base")
    assert c.verdict == stats.WITHIN and c.pct == 0 and c.pairs == 4


@pytest.mark.parametrize("drift", [0.01, 0.03, -0.03])
def test_drift_hitting_both_sides_is_within_noise(drift):
    # 3 % a run is 9 % over base/new/new/base: far more than the margin, yet no effect
    v = series(BNNB, 100, 1.0, drift=drift, noise=0.003)
    c = stats.compare(BNNB, v, "new", "base")
    assert c.verdict == stats.WITHIN, stats.describe(c)


def test_step_drift_is_within_noise():
    # the machine slows by 10 % half way through
    c = stats.compare(BNNB, [100, 100, 90, 90], "new", "base")
    assert c.verdict == stats.WITHIN


@pytest.mark.parametrize("order", [BNNB, BNNB3])
def test_five_percent_loss_is_caught(order):
    v = series(order, 100, 0.95, drift=0.002, noise=0.004)
    c = stats.compare(order, v, "new", "base")
    assert c.verdict == stats.WORSE, stats.describe(c)
    assert -7 < c.pct < -3
    assert c.interval_pct[1] < -2


def test_five_percent_gain_is_better_and_direction_follows_the_figure():
    v = series(BNNB, 100, 1.05, noise=0.003)
    assert stats.compare(BNNB, v, "new", "base").verdict == stats.BETTER
    # a latency: lower is better, so 5 % more is worse
    assert stats.compare(BNNB, v, "new", "base", higher_is_better=False).verdict == stats.WORSE


def test_a_loss_inside_the_margin_is_within_noise():
    v = series(BNNB, 100, 0.99, noise=0.001)
    assert stats.compare(BNNB, v, "new", "base").verdict == stats.WITHIN
    assert stats.compare(BNNB, v, "new", "base", margin=0.005).verdict == stats.WORSE


@pytest.mark.parametrize("which", [0, 1, 2, 3])
@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_one_outlier_run_does_not_make_a_verdict(which, factor):
    """No effect, one run 30 % off: with 2 + 2 runs it only widens the interval."""
    v = series(BNNB, 100, 1.0, noise=0.003)
    v[which] *= factor
    assert stats.compare(BNNB, v, "new", "base").verdict == stats.WITHIN


@pytest.mark.parametrize("which", range(12))
def test_one_outlier_run_does_not_hide_a_loss_over_more_runs(which):
    """A 5 % loss over base/new/new/base three times stays "worse" whichever run goes wild."""
    v = series(BNNB3, 100, 0.95, noise=0.004, seed=3)
    v[which] *= 1.25
    c = stats.compare(BNNB3, v, "new", "base")
    assert c.verdict == stats.WORSE, (which, stats.describe(c))


def test_outlier_with_no_effect_over_more_runs():
    for which in range(12):
        v = series(BNNB3, 100, 1.0, noise=0.004, seed=4)
        v[which] *= 0.7
        assert stats.compare(BNNB3, v, "new", "base").verdict == stats.WITHIN


def test_seeded_and_deterministic():
    v = series(BNNB, 100, 0.97, noise=0.01)
    a = stats.compare(BNNB, v, "new", "base")
    b = stats.compare(BNNB, v, "new", "base")
    assert a == b


def test_too_few_pairs_is_na():
    assert stats.compare(["base", "new"], [1.0, 0.5], "new", "base").verdict == stats.NA
    assert stats.compare(["base", "base"], [1.0, 1.0], "new", "base").verdict == stats.NA


def test_zero_values_fall_back_to_differences():
    # A's rate during B is 0 tok/s on the baseline: no ratio, still a verdict
    c = stats.compare(BNNB, [0.0, 6.9, 7.0, 0.1], "new", "base")
    assert c.verdict == stats.BETTER
    assert c.pct is None or c.pct > 0


def test_invalid_runs_are_left_out():
    c = stats.compare(["base", "new", "new", "base", "new", "base"],
                      [100, 95, None, 100, 95, 100], "new", "base")
    assert c.pairs == 4 and c.verdict == stats.WORSE


def test_figure_stats_table_columns_and_round_trip():
    order = ["main", "new", "new", "main", "old", "main"]
    fs = stats.figure_stats("tok_s@8", order, [93.25, 93.5, 93.52, 94.35, 90.2, 93.6], "main")
    assert fs.runs["main"] == [93.25, 94.35, 93.6]
    assert fs.medians["main"] == 93.6 and fs.base_span == (93.25, 94.35)
    assert fs.comparisons["new"].verdict == stats.WITHIN
    assert fs.comparisons["old"].verdict == stats.WORSE
    back = stats.FigureStats.from_dict(fs.to_dict())
    assert back == fs


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        stats.by_variant(BNNB, [1, 2])
