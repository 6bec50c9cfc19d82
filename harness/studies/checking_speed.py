"""How fast the harness checks replays, against the device time of what it checks.

Per shape, one run of checked replays as `fence-harness run` runs them (the replay loop, the
poisoning, the comparison on the device, one host synchronisation per batch, the tally), each
replay marked on the device as it runs (`replay.Stopwatch`: events made before the run, recorded
as each replay runs, read after the run, outside its wall time):

- **device bound**: the load op and the replay, from the load op's start to the forward
  stream's join with every stream, mean over the run's replays: what is checked;
- **checked replays per second**: replays over the replay loop's wall time;
- **where the rest went**: the harness's own device work per replay (poisoning; the look:
  collecting and comparing) and the device's idle time between replays (a host that fell
  behind, each batch's synchronisation).

The overhead is `1 / rate` past the device bound, as a fraction of it; the target is 10%.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from harness.devices.base import Device, collector_paused
from harness.records.scenario import Backend, Expect, ModelShape, Request, Scenario
from harness.run.oracle import Tally
from harness.run.replay import Replayer, ReplayTimes, Stopwatch, armed
from harness.run.testbed import Testbed

TARGET = 0.10  # the harness's own work per replay, at most this fraction of the device bound


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
    device_ms: float  # the device bound: load + replay, mean per checked replay
    device_p10_ms: float
    device_p90_ms: float
    replays: int
    replays_per_s: float  # checked, over the replay loop's wall time
    stale_replays: int
    poison_ms: float = 0.0  # the harness's device work per replay: poisoning ...
    look_ms: float = 0.0  # ... and its look (collect, compare)
    idle_ms: float = 0.0  # the device idle between replays, per replay

    @property
    def per_replay_ms(self) -> float:
        return 1e3 / self.replays_per_s if self.replays_per_s else float("inf")

    @property
    def harness_ms(self) -> float:
        return self.poison_ms + self.look_ms

    @property
    def bound_replays_per_s(self) -> float:
        return 1e3 / self.device_ms if self.device_ms else float("inf")

    @property
    def overhead(self) -> float:
        """The harness's own work per replay, as a fraction of the device time it checks."""
        return self.per_replay_ms / self.device_ms - 1.0 if self.device_ms else float("inf")

    @property
    def within(self) -> bool:
        return self.overhead <= TARGET

    def row(self) -> dict:
        return {"shape": self.shape, "device_ms": round(self.device_ms, 4),
                "device_p10_ms": round(self.device_p10_ms, 4), "device_p90_ms": round(self.device_p90_ms, 4),
                "replays": self.replays, "replays_per_s": round(self.replays_per_s, 1),
                "per_replay_ms": round(self.per_replay_ms, 4), "overhead": round(self.overhead, 4),
                "within_target": self.within, "target": TARGET,
                "device_bound_replays_per_s": round(self.bound_replays_per_s, 1) if self.device_ms else None,
                "poison_ms": round(self.poison_ms, 4), "look_ms": round(self.look_ms, 4),
                "idle_ms": round(self.idle_ms, 4), "stale_replays": self.stale_replays}


def checked_replayer(dev: Device, scenario: Scenario, timeout_s: float = 30.0) -> Replayer:
    """The replay loop `run_scenario` builds for a scenario with no gate and no pressure: testbed,
    ground truth, the accessor's waits, the fence's set-up, the runner, then the loop."""
    tb = Testbed(scenario, dev, timeout_s)
    oracle, runner = armed(tb, timeout_s)
    return Replayer(tb, runner, timeout_s, None, oracle)


@dataclass(frozen=True)
class CheckedRun:
    replays_per_s: float
    tally: Tally
    times: ReplayTimes


def checked_run(replayer: Replayer, replays: int, warmup: int | None = None) -> CheckedRun:
    """`replays` checked replays (after a batch of warm-up ones), timed on the host and marked on
    the device."""
    fault = replayer.tb.scenario.fault
    for _ in replayer.replays(range(warmup if warmup is not None else replayer.observer.batch), fault):
        pass
    stopwatch, tally = Stopwatch(), Tally()
    stopwatch.ready(replayer.tb.dev, replayer.tb.forward, replays)  # its events made before the clock starts
    with collector_paused():  # as run_scenario does
        t0 = time.perf_counter()
        for verdict in replayer.replays(range(replays), fault, stopwatch):
            tally.add(verdict)
        wall = time.perf_counter() - t0
    return CheckedRun(replays / wall if wall else 0.0, tally, stopwatch.read(replayer.tb.dev))


def measure(dev: Device, shape: Shape, replays: int, runs: int = 2, timeout_s: float = 30.0) -> CheckingPoint:
    """The best of `runs` checked runs of `shape`, with its own device bound and breakdown."""
    replayer = checked_replayer(dev, shape.scenario, timeout_s)
    best = max((checked_run(replayer, replays) for _ in range(runs)), key=lambda r: r.replays_per_s)
    t, n = best.times, max(1, best.times.replays)
    each = t.load_replay_each_ms or [0.0]
    q = statistics.quantiles(each, n=10) if len(each) > 1 else [each[0]] * 9
    return CheckingPoint(shape.name, t.load_replay_ms / n, q[0], q[-1], replays, best.replays_per_s,
                         best.tally.stale_replays, t.poison_ms / n, t.look_ms / n, t.idle_ms / n)
