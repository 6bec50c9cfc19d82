"""Stale rates with their uncertainty: intervals, replays needed, exact tests (pure; scipy.stats).

A scenario's stale rate is k stale replays out of n. A rate alone hides how little n
replays can say: 0 of 300 is not "never", it is "below 1.2% with 95% confidence". So
every rate the harness reports carries

- its 95% interval, Clopper-Pearson ("exact": `scipy.stats.binomtest(k, n).proportion_ci`),
  which never undercovers, even at k = 0 or k = n where the normal approximation fails;
- the replays needed to see a race of that rate at least once with 99% confidence,
  n = ceil(log(0.01) / log(1 - p)) (none for p = 0: a race never seen gives no rate);

and two rates side by side (a fenced scenario and its unfenced twin, one scenario in two
runs) get Fisher's exact test (`scipy.stats.fisher_exact`, two-sided) of the 2x2 table
stale / clean by side. `Until` is `run --until-confidence`'s stopping rule.

scipy is imported when a number is asked for, not with this module: the command line's
parser imports the report modules, and must start fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEVEL = 0.95  # the intervals' confidence level
SEE_CONFIDENCE = 0.99  # "replays to see a race": the chance of at least one stale replay
METHOD = "exact"  # Clopper-Pearson; scipy also has "wilson" and "wilsoncc"
SIGNIFICANT = 0.05  # the p-value below which two rates are said to differ


@dataclass(frozen=True)
class Rate:
    """k stale replays out of n."""

    stale: int
    replays: int

    def __post_init__(self) -> None:
        if self.replays < 0 or not 0 <= self.stale <= max(self.replays, 0):
            raise ValueError(f"a rate needs 0 <= stale <= replays, got {self.stale}/{self.replays}")

    @property
    def value(self) -> float:
        return self.stale / self.replays if self.replays else 0.0

    def interval(self, level: float = LEVEL, method: str = METHOD) -> tuple[float, float]:
        """The two-sided `level` confidence interval of the rate; (0, 1) with no replays."""
        if not self.replays:
            return 0.0, 1.0
        from scipy import stats

        ci = stats.binomtest(self.stale, self.replays).proportion_ci(confidence_level=level, method=method)
        return float(ci.low), float(ci.high)

    def width(self, level: float = LEVEL) -> float:
        low, high = self.interval(level)
        return high - low

    @property
    def replays_to_see(self) -> int | None:
        """Replays to see a race of this rate at least once with 99% confidence (None at rate 0)."""
        return replays_to_see(self.value)

    @property
    def replays_to_see_low(self) -> int | None:
        """The same for the interval's lower bound: what the data supports at worst (None when it is 0)."""
        return replays_to_see(self.interval()[0])


def replays_to_see(p: float, confidence: float = SEE_CONFIDENCE) -> int | None:
    """The fewest replays n with P(at least one stale) = 1 - (1 - p)^n >= confidence.

    None for p = 0 (no number of replays is enough); 1 for p = 1.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a rate is between 0 and 1, got {p}")
    if p == 0.0:
        return None
    if p == 1.0:
        return 1
    n = math.log(1.0 - confidence) / math.log1p(-p)
    # Rounding: log(0.01)/log(0.9) is 43.709..., but an n that is a whole number in exact
    # arithmetic (p = 0.9, confidence 0.99: n = 2) must not become 3 through float error.
    return max(1, math.ceil(n - 1e-9))


@dataclass(frozen=True)
class ExactTest:
    """Fisher's exact test of two rates (two-sided)."""

    a: Rate
    b: Rate
    p_value: float

    @property
    def significant(self) -> bool:
        return self.p_value < SIGNIFICANT


def exact_test(a: Rate, b: Rate) -> ExactTest:
    """Fisher's exact test of the table [[stale_a, clean_a], [stale_b, clean_b]], two-sided."""
    from scipy import stats

    table = [[a.stale, a.replays - a.stale], [b.stale, b.replays - b.stale]]
    result = stats.fisher_exact(table, alternative="two-sided")
    return ExactTest(a, b, min(1.0, float(result.pvalue)))


@dataclass(frozen=True)
class Until:
    """`run --until-confidence`: replay on until the rate's 95% interval is narrower than
    `width`, and at most `cap` replays in all (a scenario's own replay count always runs)."""

    width: float
    cap: int

    def __post_init__(self) -> None:
        if not 0.0 < self.width < 1.0:
            raise ValueError(f"an interval width is between 0 and 1, got {self.width}")
        if self.cap < 1:
            raise ValueError(f"the cap is a positive number of replays, got {self.cap}")

    def narrow(self, rate: Rate) -> bool:
        return rate.replays > 0 and rate.width() < self.width

    @property
    def fewest(self) -> int:
        """The fewest replays whose interval can be narrower than `width`: at k = 0 (or k = n),
        where a Clopper-Pearson interval is narrowest, [0, 1 - (alpha / 2)^(1/n)]."""
        n = math.log((1.0 - LEVEL) / 2.0) / math.log1p(-self.width)
        return max(1, math.floor(n + 1e-9) + 1)

    def more(self, rate: Rate, minimum: int) -> bool:
        """Whether another replay is due after `rate`, with `minimum` replays asked for."""
        if rate.replays < minimum:
            return True
        return rate.replays < self.cap and not self.narrow(rate)
