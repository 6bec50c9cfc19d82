"""The keys several faults' tables share, each with its value check: `us`, `where`, `seed`,
`chunks`, `points`, `hold_us`. A strategy names the ones it takes (`FaultStrategy.keys`); a key of
one fault alone lives in its own module (the pressure fault's)."""

from __future__ import annotations

from typing import Any

from harness.faults.strategy import FaultKey
from harness.records.scenario import DelayWhere
from harness.records.values import Invalid, describe_value, enum, integer, number

MAX_DELAY_US = 10_000_000.0  # 10 s: past that a delay is a typo, and a replay would time out
POINTS_HINT = "an array of delays in microseconds, like [0, 5, 20, 50, 200, 1000]"


def delay_us(value: Any, key: str, allow_zero: bool = False) -> float:
    us = number(value, key)
    if us == 0 and not allow_zero:
        raise Invalid(key, "must be > 0 microseconds, got 0")
    if us > MAX_DELAY_US:
        raise Invalid(key, f"at most {MAX_DELAY_US:g} microseconds (10 s), got {us:g}")
    return us


def points(value: Any, key: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise Invalid(key, f"expected {POINTS_HINT}, got {describe_value(value)}")
    if not value:
        raise Invalid(key, f"an empty array; give at least one delay: {POINTS_HINT}")
    found = tuple(delay_us(v, f"{key}[{i}]", allow_zero=True) for i, v in enumerate(value))
    if len(set(found)) != len(found):
        raise Invalid(key, "the same delay appears twice")
    return found


US = FaultKey("us", delay_us, hint="microseconds > 0")
WHERE = FaultKey("where", enum(DelayWhere))
SEED = FaultKey("seed", integer(0))
CHUNKS = FaultKey("chunks", integer(2, 64), hint="an integer >= 2 (copies per layer)")
POINTS = FaultKey("points", points, hint=POINTS_HINT)
HOLD_US = FaultKey("hold_us", delay_us)

# The order the scenario file's messages list the keys in ("valid keys: kind, us, where, ...").
SHARED = (US, WHERE, SEED, CHUNKS, POINTS, HOLD_US)
