import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sweep.core.stats import Z95, interval_se, median_interval_coverage, median_interval_ranks, throughput_summary


@pytest.mark.parametrize("n, expected", [(1, (0, 0)), (2, (0, 1)), (5, (0, 4)), (6, (0, 5)), (9, (1, 7)), (20, (5, 14))])
def test_order_statistic_interval_ranks(n, expected):
    assert median_interval_ranks(n) == expected


def _exact_tail(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= k) in exact integers: the oracle scipy's binomial is held to."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 8, 9, 12, 17, 20, 32, 50, 99, 200])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_ranks_are_the_widest_exact_order_statistic_interval(n, level):
    lo, hi = median_interval_ranks(n, level)
    assert hi == n - 1 - lo and lo <= hi
    if lo:  # it reaches the level, and one rank further in would not
        assert 1 - 2 * _exact_tail(lo, n) >= level
    if lo + 1 < n - 2 - lo:
        assert 1 - 2 * _exact_tail(lo + 1, n) < level
    assert median_interval_coverage(n, lo) == pytest.approx(1 - 2 * _exact_tail(lo, n), abs=1e-12)


@pytest.mark.parametrize("n, lo, coverage", [(5, 0, 0.9375), (6, 0, 0.96875), (9, 1, 0.9609375), (20, 5, 0.9586105346679688)])
def test_median_interval_coverage(n, lo, coverage):
    assert median_interval_coverage(n, lo) == pytest.approx(coverage, abs=1e-12)


def test_throughput_summary_is_samples_over_wall_time_with_a_t_interval():
    """Issue 50: the figure is the speed training runs at, slow steps included; its interval a t-interval on the mean
    step time (scipy.stats' t, the oracle), on the log scale, below 16 steps."""
    from scipy import stats as scipy_stats

    times = [0.5, 0.52, 0.48, 0.51, 0.6, 0.49]  # one slow step (under 1.25x: no stall): counted, not shrugged off
    mid, lo, hi = throughput_summary(times, samples_per_step=32)
    assert mid == pytest.approx(32 * len(times) / sum(times)) and mid < 32 / statistics.median(times)
    half = scipy_stats.t.ppf(0.975, len(times) - 1) * statistics.stdev(times) / math.sqrt(len(times)) / statistics.mean(times)
    assert lo == pytest.approx(mid * math.exp(-half)) and hi == pytest.approx(mid * math.exp(half))
    assert throughput_summary([0.5], 32) == (64.0, 64.0, 64.0)  # one step: no interval (interval_se says None)


def test_a_slow_spell_widens_the_interval_beyond_the_steps_taken_as_independent():
    """Batch means: ten slower steps in a row (the machine got busier for a while) are one spell, not ten independent
    draws; the interval says so."""
    spell = [0.05] * 30 + [0.057] * 10 + [0.05] * 24
    shuffled = [0.057 if i % 6 == 3 and i < 60 else 0.05 for i in range(64)]  # the same ten slower steps, spread out
    assert sorted(spell) == sorted(shuffled)  # the same steps, in another order
    _, lo_spell, hi_spell = throughput_summary(spell, 1)
    _, lo_spread, hi_spread = throughput_summary(shuffled, 1)
    assert math.log(hi_spell / lo_spell) > 2 * math.log(hi_spread / lo_spread)


@given(st.lists(st.floats(min_value=1e-3, max_value=100), min_size=1, max_size=50))
def test_interval_always_contains_the_wall_time_figure(times):
    mid, lo, hi = throughput_summary(times, 8)
    assert lo <= mid * (1 + 1e-9) and mid <= hi * (1 + 1e-9)
    assert mid == pytest.approx(8 * len(times) / math.fsum(times))  # the wall time, not the median step


@pytest.mark.parametrize(
    "low, high, se",
    [
        (100 * math.exp(-Z95 * 0.04), 100 * math.exp(Z95 * 0.04), 0.04),  # the se the interval was built from
        (None, 60.0, None),  # no interval
        (40.0, None, None),
        (50.0, 50.0, None),  # zero width states nothing
        (60.0, 40.0, None),  # inverted
        (0.0, 40.0, None),  # not a throughput
    ],
)
def test_interval_se_reads_a_95_interval_or_says_none(low, high, se):
    got = interval_se(low, high)
    assert got == (None if se is None else pytest.approx(se))
