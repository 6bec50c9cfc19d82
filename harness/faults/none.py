"""The `none` fault: nothing injected."""

from __future__ import annotations

from harness.faults.strategy import FaultStrategy
from harness.records.scenario import FaultKind


class NoFault(FaultStrategy):
    """Nothing: the race depends on timing alone."""

    name = FaultKind.NONE


__all__ = ["NoFault"]
