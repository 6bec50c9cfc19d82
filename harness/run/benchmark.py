"""What each fence costs: load-back plus prefill, end to end, per strategy.

For each point of the sweep (model kind x layers x prefix length) every arm, a
fence of the registry (or a plugin, named like any fence), gets a testbed of its
own, set up as a scenario with that fence is, and runs the replay loop of
`harness.run.replay` with nothing observed. One iteration is timed with markers on
the forward stream (device events; virtual time on the simulator):

    mark -> start the load op -> fence -> mark -> forward -> mark -> synchronize

`load` (the load op alone: the fence `load_bound` runs no forward, only a wait on
the final event) and `compute` (the forward with no load pending) are timed the same
way; no strategy can beat max(load, compute). Arms run round-robin, warm-up
first, so drift hits them alike; each reports median and p10 / p90 over the repeats.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.devices.base import Device
from harness.protocol.fences import STRATEGIES, FenceContext
from harness.records.scenario import (
    Backend,
    Expect,
    Fault,
    ModelShape,
    Request,
    Scenario,
)
from harness.run.replay import Marks, Replayer
from harness.run.testbed import Testbed

BASELINES = ("load", "compute")
ARMS = ("none", *STRATEGIES)  # the default arms; any fence name (or plugin) can be one


@dataclass(frozen=True)
class Point:
    kind: str  # attention | hybrid
    layers: int
    prefix: int
    new: int = 32

    def scenario(self) -> Scenario:
        pattern = "A" * self.layers if self.kind == "attention" else "AM" * (self.layers // 2)
        # Sized so that load and compute are close at the default point (8 layers, 2,048
        # cached tokens, 32 new): the case where keeping the overlap matters most. On an
        # H200: load 1.34 ms, compute 1.56 ms (README, "Fence strategies and what they cost").
        shape = ModelShape(layers=pattern, hidden=1024, heads=8, kv_heads=8, head_dim=128, state=16)
        return Scenario(f"bench-{self.kind}-{self.layers}L-{self.prefix}", shape,
                        (Request(self.prefix, self.new),), Backend.FULL, Expect.CLEAN)


DEFAULT_POINT = Point("attention", 8, 2048)


def sweep(kinds=("attention", "hybrid"), prefixes=(512, 2048, 8192, 16384),
          layers=(4, 8, 16, 32)) -> list[Point]:
    """Prefix lengths at 8 layers and layer counts at 2,048 tokens, for each model kind."""
    points = []
    for kind in kinds:
        for p in prefixes:
            points.append(Point(kind, 8, p))
        for n in layers:
            if n != 8:
                points.append(Point(kind, n, 2048))
    return points


@dataclass(frozen=True)
class Stats:
    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int

    @classmethod
    def of(cls, samples_us: list[float]) -> Stats:
        xs = sorted(samples_us)
        q = statistics.quantiles(xs, n=10) if len(xs) >= 2 else [xs[0]] * 9
        return cls(statistics.median(xs) / 1e3, q[0] / 1e3, q[-1] / 1e3, len(xs))


@dataclass(frozen=True)
class PointResult:
    point: Point
    stats: dict[str, Stats]  # arm or baseline -> its timing
    forward_starts: dict[str, Stats]  # arm -> from the load op's start to where the forward could start

    @property
    def bound_ms(self) -> float:
        return max(self.stats["load"].median_ms, self.stats["compute"].median_ms)

    def ratio(self, arm: str) -> float:
        return self.stats[arm].median_ms / self.bound_ms

    def rows(self) -> list[dict]:
        """One row per strategy, in the results.json `bench.points` shape."""
        p = self.point
        return [
            {"model": p.kind, "layers": p.layers, "prefix": p.prefix, "new": p.new, "strategy": arm,
             "median_ms": round(s.median_ms, 4), "p10_ms": round(s.p10_ms, 4),
             "p90_ms": round(s.p90_ms, 4), "repeats": s.n,
             "ratio_to_bound": round(self.ratio(arm), 3),
             "load_ms": round(self.stats["load"].median_ms, 4),
             "compute_ms": round(self.stats["compute"].median_ms, 4),
             "forward_start_ms": round(self.forward_starts[arm].median_ms, 4)}
            for arm, s in self.stats.items() if arm not in BASELINES
        ]


class _LoadOnly:
    """A runner that runs no forward: the forward stream only waits for the whole load op."""

    backend = Backend.FULL

    def __init__(self, ctx: FenceContext):
        self.ctx = ctx

    def run(self) -> None:
        if self.ctx.op is not None:
            self.ctx.forward.wait_event(self.ctx.op.finish_event)


def load_bound(ctx: FenceContext) -> _LoadOnly:
    """The `load` bound as a fence: the load op alone, timed like any arm."""
    return _LoadOnly(ctx)


LOAD_BOUND = f"{__name__}:load_bound"


class Arm:
    """One arm's testbed and replay loop; `time()` runs one iteration and reads its markers."""

    def __init__(self, dev: Device, scenario: Scenario, timeout_s: float):
        self.dev = dev
        tb = Testbed(scenario, dev)
        tb.set_waits(tb.accessor)
        tb.setup_fence()
        self.replay = Replayer(tb, tb.runner(scenario.backend), timeout_s)
        self.forward, self.load = tb.forward, tb.load

    def time(self, load: bool = True) -> tuple[float, float]:
        """(end to end, load op start to where the forward could start), in microseconds."""
        marks = Marks()
        self.replay.run(0, Fault(), marks, load=load)
        us = self.dev.marker_us
        start = us(marks.start)
        assert start is not None
        return (us(marks.end) or start) - start, (us(marks.launch) or start) - start


def bench_point(dev: Device, point: Point, repeats: int, warmup: int, timeout_s: float = 30.0,
                arms: Sequence[str] = ARMS) -> PointResult:
    compute = Arm(dev, point.scenario(), timeout_s)
    load = Arm(dev, point.scenario().with_overrides(fence=LOAD_BOUND), timeout_s)
    runs = {name: Arm(dev, point.scenario().with_overrides(fence=name), timeout_s) for name in arms}
    dev.synchronize(timeout_s)
    samples: dict[str, list[float]] = {n: [] for n in (*BASELINES, *arms)}
    gaps: dict[str, list[float]] = {n: [] for n in arms}
    for rep in range(warmup + repeats):
        timed = rep >= warmup
        # Round-robin: drift and clock changes hit every arm alike.
        load_us, _ = load.time()
        compute_us, _ = compute.time(load=False)
        if timed:
            samples["load"].append(load_us)
            samples["compute"].append(compute_us)
        for name, arm in runs.items():
            total, gap = arm.time()
            if timed:
                samples[name].append(total)
                # From the start of the load op to where the forward could start: the host's
                # enqueue of the load op (paid by every strategy, and not part of
                # max(load, compute)) plus whatever the fence made the forward wait.
                gaps[name].append(gap)
    return PointResult(point, {n: Stats.of(xs) for n, xs in samples.items()},
                       {n: Stats.of(xs) for n, xs in gaps.items()})
