"""The fault injector's pure logic: how long the load stream is held, and where.

A `Fault` (from the scenario) becomes, for one replay, a `FaultPlan`: the
microseconds to spin before each (layer, chunk) copy, and whether the load
stream is held by a gate. The device enqueues what the plan says; nothing here
touches a device, so all of it is tested on the CPU.

What each kind does is its strategy's (`harness.faults.registry`, one module a fault):

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

from dataclasses import dataclass

from harness.faults.gate import GATE_FALLBACK_US
from harness.faults.jitter import jitter_us
from harness.faults.registry import fault_strategy
from harness.records.scenario import Fault, FaultKind


@dataclass(frozen=True)
class FaultPlan:
    """What one load op does on the load stream."""

    fault: Fault
    replay: int = 0

    def pause_us(self, layer: int, chunk: int = 0) -> float:
        """Microseconds to hold the load stream before copy `chunk` of `layer`."""
        return fault_strategy(self.fault).pause_us(self.fault, self.replay, layer, chunk)


def sweep_points(fault: Fault) -> list[tuple[float, Fault]]:
    """(delay, the plain fault run at it) for each point; one point for other kinds."""
    return fault_strategy(fault).points(fault)


def gate_fallback() -> Fault:
    """The long delay that stands in for a gate where no gate can be built."""
    return fault_strategy(FaultKind.GATE).stand_in(Fault(FaultKind.GATE))


__all__ = ["GATE_FALLBACK_US", "FaultPlan", "gate_fallback", "jitter_us", "sweep_points"]
