"""The `sweep` fault: the same scenario at each of several delays, for detection against delay."""

from __future__ import annotations

from harness.faults.keys import POINTS, WHERE
from harness.faults.strategy import FaultStrategy
from harness.records.scenario import Fault, FaultKind


class Sweep(FaultStrategy):
    """The scenario at each delay of `points` (us), `replays` each: detection probability per point."""

    name = FaultKind.SWEEP
    keys = (POINTS.needed(), WHERE)
    sweeps = True

    def describe(self, fault: Fault) -> str:
        return f"sweep {','.join(f'{p:g}' for p in fault.points)}us {fault.where.value}"

    def points(self, fault: Fault) -> list[tuple[float, Fault]]:
        # Each point a plain delay (none at 0).
        return [(us, Fault(FaultKind.DELAY, us, fault.where) if us > 0 else Fault()) for us in fault.points]


__all__ = ["Sweep"]
