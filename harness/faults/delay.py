"""The `delay` fault: a spin on the load stream before layer copies."""

from __future__ import annotations

from typing import ClassVar

from harness.faults.keys import US, WHERE
from harness.faults.strategy import FaultKey, FaultStrategy
from harness.records.scenario import DelayWhere, Fault, FaultKind


class Delay(FaultStrategy):
    """A spin of `us` on the load stream before every layer's copies (`where = "each"`) or before layer
    0's only."""

    name = FaultKind.DELAY
    keys: ClassVar[tuple[FaultKey, ...]] = (US.needed(), WHERE)

    def describe(self, fault: Fault) -> str:
        return f"delay {fault.us:g}us {fault.where.value}"

    def pause_us(self, fault: Fault, replay: int, layer: int, chunk: int) -> float:
        # Before a layer's first copy only; with where = first, before layer 0's only.
        if chunk > 0 or (fault.where is DelayWhere.FIRST and layer != 0):
            return 0.0
        return self.delay_us(fault, replay, layer)

    def delay_us(self, fault: Fault, replay: int, layer: int) -> float:
        """The spin before `layer`'s copies, where there is one."""
        return fault.us


__all__ = ["Delay"]
