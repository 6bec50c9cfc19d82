"""How fast the harness checks replays, against the device time of what it checks.

For each shape, two numbers from one run on one device:

- **device time alone**: one replay's load op, fence and forward, with the host far ahead
  (a spin holds the forward stream while all of it is enqueued), from the load op's start
  to the forward stream's join with the load stream; device events, median over repeats;
- **checked replays per second**: the scenario run as `fence-harness run` runs it (the
  replay loop, poisoning, comparison on the device, one host synchronisation per batch,
  the tally), over the replay loop's wall time.

The harness's own work per replay is then `1 / rate - device time`, reported as a fraction
of the device time: what checking adds to what is checked.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from harness.devices.base import Device
from harness.records.scenario import Backend, Expect, Fault, ModelShape, Request, Scenario
from harness.run.benchmark import Arm
from harness.run.pipeline import run_scenario

HOLD_US = 5000.0  # the spin that keeps the device busy while the host enqueues a timed replay


@dataclass(frozen=True)
class Shape:
    name: str
    scenario: Scenario


def attention(prefix: int, fence: str = "none", layers: int = 8) -> Shape:
    """The natural-race shape: bf16, hidden 1,024, MHA 8 x 128, one request of 32 new tokens."""
    model = ModelShape(layers="A" * layers, hidden=1024, heads=8, kv_heads=8, head_dim=128, state=16)
    name = f"attention-{layers}L-{prefix}-{fence}"
    expect = Expect.RACE if fence == "none" else Expect.CLEAN
    return Shape(name, Scenario(name, model, (Request(prefix, 32),), Backend.FULL, expect, fence=fence))


def tiny_hybrid(fence: str = "none") -> Shape:
    """The default set's hybrid model and batch, with no injected fault."""
    model = ModelShape(layers="AMAM", hidden=256, heads=4, kv_heads=2, head_dim=64, state=16)
    name = f"tiny-hybrid-{fence}"
    expect = Expect.RACE if fence == "none" else Expect.CLEAN
    return Shape(name, Scenario(name, model, (Request(256, 32), Request(128, 16)), Backend.FULL, expect,
                                fence=fence))


def default_shapes() -> list[Shape]:
    return [tiny_hybrid("none"), tiny_hybrid("final_event"),
            *(attention(p, f) for p in (2048, 8192, 32768) for f in ("none", "final_event"))]


@dataclass(frozen=True)
class CheckingPoint:
    shape: str
    device_ms: float  # median device time of load + fence + forward
    device_p10_ms: float
    device_p90_ms: float
    replays: int
    replays_per_s: float  # checked, the best of the runs
    stale_replays: int

    @property
    def per_replay_ms(self) -> float:
        return 1e3 / self.replays_per_s if self.replays_per_s else float("inf")

    @property
    def overhead(self) -> float:
        """The harness's own work per replay, as a fraction of the device time it checks."""
        return self.per_replay_ms / self.device_ms - 1.0 if self.device_ms else float("inf")

    def row(self) -> dict:
        return {"shape": self.shape, "device_ms": round(self.device_ms, 4),
                "device_p10_ms": round(self.device_p10_ms, 4), "device_p90_ms": round(self.device_p90_ms, 4),
                "replays": self.replays, "replays_per_s": round(self.replays_per_s, 1),
                "per_replay_ms": round(self.per_replay_ms, 4), "overhead": round(self.overhead, 4),
                "device_bound_replays_per_s": round(1e3 / self.device_ms, 1) if self.device_ms else None,
                "stale_replays": self.stale_replays}


def device_time_ms(dev: Device, scenario: Scenario, repeats: int, warmup: int = 3,
                   timeout_s: float = 30.0) -> list[float]:
    """Load + fence + forward of `scenario`, device time per repeat (ms), nothing observed."""
    arm = Arm(dev, scenario, timeout_s)  # the benchmark's testbed and unobserved replay loop
    out = []
    for i in range(warmup + repeats):
        dev.synchronize(timeout_s)
        with dev.stream(arm.forward):
            dev.delay(HOLD_US)
            start = dev.mark(arm.forward)
        arm.replay.enqueue(i, Fault())
        with dev.stream(arm.forward):
            arm.forward.wait_stream(arm.load)
            end = dev.mark(arm.forward)
        dev.synchronize(timeout_s)
        if i >= warmup:
            a, b = dev.marker_us(start), dev.marker_us(end)
            assert a is not None and b is not None
            out.append((b - a) / 1e3)
    return out


def measure(dev: Device, shape: Shape, replays: int, repeats: int = 30, runs: int = 2,
            timeout_s: float = 30.0) -> CheckingPoint:
    times = device_time_ms(dev, shape.scenario, repeats, timeout_s=timeout_s)
    q = statistics.quantiles(times, n=10)
    results = [run_scenario(shape.scenario, dev, replays=replays, timeout_s=timeout_s) for _ in range(runs)]
    best = max(results, key=lambda r: r.replays_per_s)
    return CheckingPoint(shape.name, statistics.median(times), q[0], q[-1], replays, best.replays_per_s,
                         best.tally.stale_replays)
