"""The `gate` fault: the load stream held by a host-released gate until the replay has run.

The replay loop (`harness.run.replay`) builds the gate and opens it; where the device cannot build
one (cuda.bindings missing), a long delay before layer 0 stands in for it.
"""

from __future__ import annotations

import random

from harness.faults.keys import HOLD_US
from harness.faults.strategy import FaultStrategy
from harness.records.scenario import DelayWhere, Fault, FaultKind

# Where the CUDA gate cannot be built, a delay this long before layer 0 stands in for it: far
# longer than any small replay.
GATE_FALLBACK_US = 20_000.0


class Gate(FaultStrategy):
    """The load stream held by a host-released gate until the replay has run on the device: every read
    not ordered after its copy comes first, in every replay."""

    name = FaultKind.GATE
    keys = (HOLD_US,)
    gates = True
    deterministic = True
    soaks = True

    def describe(self, fault: Fault) -> str:
        return f"gate (hold {fault.hold_us:g}us)"

    def stand_in(self, fault: Fault) -> Fault:
        return Fault(FaultKind.DELAY, GATE_FALLBACK_US, DelayWhere.FIRST)

    def draw(self, rng: random.Random) -> Fault:
        return Fault(self.name)


__all__ = ["GATE_FALLBACK_US", "Gate"]
