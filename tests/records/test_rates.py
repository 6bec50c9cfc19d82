"""Stale rates with their uncertainty, checked against values published or derived by hand."""

from __future__ import annotations

import math

import pytest

from harness.records.rates import Rate, Until, exact_test, replays_to_see


@pytest.mark.parametrize("k,n,low,high", [
    (0, 10, 0.0, 0.3085),       # 1 - 0.025**(1/10)
    (5, 10, 0.1871, 0.8129),    # the textbook Clopper-Pearson interval of 5/10
    (10, 10, 0.6915, 1.0),      # 0.025**(1/10)
    (0, 300, 0.0, 0.01222),     # about 3.7/n: the "rule of three" at 97.5% one-sided
    (1, 1, 0.025, 1.0),
])
def test_clopper_pearson_interval_matches_known_values(k, n, low, high):
    lo, hi = Rate(k, n).interval()
    assert lo == pytest.approx(low, abs=5e-5) and hi == pytest.approx(high, abs=5e-5)


def test_closed_forms_at_the_edges():
    # At k = 0 and k = n, Clopper-Pearson has a closed form: (0, 1 - (a/2)^(1/n)) and ((a/2)^(1/n), 1).
    for n in (1, 7, 50, 1000):
        assert Rate(0, n).interval()[1] == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-9)
        assert Rate(n, n).interval()[0] == pytest.approx(0.025 ** (1 / n), rel=1e-9)


def test_wilson_is_there_too_and_narrower_at_the_middle():
    lo, hi = Rate(5, 10).interval(method="wilson")
    assert (lo, hi) == (pytest.approx(0.2366, abs=5e-5), pytest.approx(0.7634, abs=5e-5))
    assert hi - lo < Rate(5, 10).width()


def test_no_replays_say_nothing():
    assert Rate(0, 0).interval() == (0.0, 1.0) and Rate(0, 0).value == 0.0


@pytest.mark.parametrize("k,n", [(-1, 5), (6, 5), (0, -1)])
def test_impossible_counts_are_refused(k, n):
    with pytest.raises(ValueError):
        Rate(k, n)


@pytest.mark.parametrize("p,n", [
    (0.5, 7),      # 0.5**7 = 0.0078 <= 0.01 < 0.5**6
    (0.05, 90),    # log(0.01)/log(0.95) = 89.78
    (0.01, 459),   # 458.21
    (0.9, 2),      # exactly 2: not 3 through float error
    (0.99, 1),
    (1.0, 1),
])
def test_replays_to_see_a_race_with_99_percent(p, n):
    assert replays_to_see(p) == n
    assert 1 - (1 - p) ** n >= 0.99 - 1e-12
    if n > 1:
        assert 1 - (1 - p) ** (n - 1) < 0.99


def test_a_race_never_seen_gives_no_replay_count():
    assert replays_to_see(0.0) is None and Rate(0, 300).replays_to_see is None
    assert Rate(261, 300).replays_to_see == math.ceil(math.log(0.01) / math.log(1 - 261 / 300))
    # The lower bound of the interval asks for more replays than the point estimate.
    assert Rate(2, 300).replays_to_see == 689 and Rate(2, 300).replays_to_see_low > 689


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_a_rate_out_of_range_is_refused(p):
    with pytest.raises(ValueError):
        replays_to_see(p)


def test_fisher_exact_test_matches_the_tea_tasting_table():
    # Fisher's lady tasting tea: 3 of 4 right each way; two-sided p = 17/35.
    t = exact_test(Rate(3, 4), Rate(1, 4))
    assert t.p_value == pytest.approx(17 / 35, rel=1e-9) and not t.significant


def test_fisher_exact_test_on_a_fenced_and_unfenced_pair():
    # The H200's 2,048-token case: 0/300 stale quiet, 261/300 under contention.
    t = exact_test(Rate(0, 300), Rate(261, 300))
    assert t.significant and t.p_value < 1e-100
    assert exact_test(Rate(0, 300), Rate(0, 300)).p_value == 1.0
    # Small differences are not significant: 0/20 against 2/20 (p = 0.487).
    assert exact_test(Rate(0, 20), Rate(2, 20)).p_value == pytest.approx(0.48718, abs=1e-5)


def test_until_stops_once_the_interval_is_narrow_enough():
    until = Until(width=0.1, cap=1000)
    # At k = n the interval is (0.025^(1/n), 1): narrower than 0.1 from n = 36 (35.01 exactly).
    assert until.more(Rate(35, 35), minimum=5) and not until.more(Rate(36, 36), minimum=5)
    assert until.more(Rate(0, 35), minimum=5) and not until.more(Rate(0, 36), minimum=5)
    # The scenario's own replays always run, however narrow the interval already is.
    assert until.more(Rate(36, 36), minimum=100)
    # The cap ends it whatever the width.
    assert not Until(width=0.01, cap=50).more(Rate(25, 50), minimum=5)


@pytest.mark.parametrize("width,cap", [(0.0, 10), (1.0, 10), (0.1, 0)])
def test_until_refuses_what_cannot_be_met(width, cap):
    with pytest.raises(ValueError):
        Until(width, cap)
