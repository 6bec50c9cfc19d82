"""The fault injector's pure logic: how long the load stream is held, and where.

A `Fault` (from the scenario) becomes, for one replay, a `FaultPlan`: the
microseconds to spin before each (layer, chunk) copy, and whether the load
stream is held by a gate. The device enqueues what the plan says; nothing here
touches a device, so all of it is tested on the CPU.

- delay:   `us` before layer copies (every layer, or layer 0 only).
- jitter:  a fresh random delay in [0, us] per layer and replay, a function of
           (seed, replay, layer) only, so a failing replay can be reproduced.
- chunked: each layer's copies split into `chunks` parts, `us` before every
           part after the first: a read can find a layer partly loaded.
- gate:    the load stream waits on a host-released gate before its copies; the
           pipeline releases it after the replay ran (see `harness.run.pipeline`).
- sweep:   one delay plan per point of `points` (detection against delay).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from harness.records.scenario import DelayWhere, Fault, FaultKind

# Where the CUDA gate cannot be built (cuda.bindings missing), a delay this long
# before layer 0 stands in for it: far longer than any small replay.
GATE_FALLBACK_US = 20_000.0


@dataclass(frozen=True)
class FaultPlan:
    """What one load op does on the load stream."""

    fault: Fault
    replay: int = 0

    def pause_us(self, layer: int, chunk: int = 0) -> float:
        """Microseconds to hold the load stream before copy `chunk` of `layer`."""
        f = self.fault
        if f.kind is FaultKind.CHUNKED:
            return f.us if chunk > 0 else 0.0
        if chunk > 0 or (f.where is DelayWhere.FIRST and layer != 0):
            return 0.0
        if f.kind is FaultKind.DELAY:
            return f.us
        if f.kind is FaultKind.JITTER:
            return jitter_us(f.seed, self.replay, layer, f.us)
        return 0.0


def jitter_us(seed: int, replay: int, layer: int, most: float) -> float:
    # A string seed hashes the same in every process (unlike hash() of a tuple).
    return random.Random(f"{seed}:{replay}:{layer}").uniform(0.0, most)


def sweep_points(fault: Fault) -> list[tuple[float, Fault]]:
    """(delay, the plain fault run at it) for each point; one point for other kinds."""
    if fault.kind is not FaultKind.SWEEP:
        return [(fault.us, fault)]
    return [
        (us, Fault(FaultKind.DELAY, us, fault.where) if us > 0 else Fault())
        for us in fault.points
    ]


def gate_fallback() -> Fault:
    """The long delay that stands in for a gate where no gate can be built."""
    return Fault(FaultKind.DELAY, GATE_FALLBACK_US, DelayWhere.FIRST)
