"""What each correct fence costs: load-back plus prefill, end to end, per strategy.

For each point of the sweep (model kind x layers x prefix length) one bench is
built and every strategy gets its own runner on it (the same memory, the same
copies). One iteration of an arm, timed with device events on the forward
stream (virtual time on the simulator):

    mark -> start the load op -> fence -> forward -> mark -> synchronize

`load` (the load op alone, the forward stream waiting on its final event) and
`compute` (the forward with no load pending) are timed the same way; no
strategy can beat max(load, compute). Arms run round-robin, warm-up first, so
drift hits them alike; each reports median and p10 / p90 over the repeats.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from harness.protocol.accessors import per_layer
from harness.devices.base import Device
from harness.records.faults import FaultPlan
from harness.protocol.fences import (
    STRATEGIES,
    EagerFallbackFence,
    FenceContext,
    FenceSetup,
    LayerwiseGraphFence,
    final_event_fence,
    host_sync_fence,
    no_fence,
)
from harness.run.pipeline import Bench
from harness.model.runners import FullGraphRunner, Runner
from harness.records.scenario import Backend, Expect, Fault, ModelShape, Request, Scenario

BASELINES = ("load", "compute")
ARMS = ("none", *STRATEGIES)


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
    def of(cls, samples_us: list[float]) -> "Stats":
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


class _Arms:
    """Every arm of one point. The layerwise graph gets a bench of its own: its pool
    accessors wait on graph events and its load ops re-record them, for good (the
    simulator re-runs a graph's Python on replay, so that state must not change
    after capture); every other arm shares the plain bench and its one full graph."""

    def __init__(self, dev: Device, point: Point, timeout_s: float):
        self.dev, self.timeout_s = dev, timeout_s
        b = self.b = Bench.build(point.scenario(), dev)
        lb = self.lb = Bench.build(point.scenario(), dev)
        for bench in (b, lb):
            bench.set_waits(per_layer)
        with dev.stream(b.forward):
            self.full = FullGraphRunner(dev, b.model, b.counter)
            self.full.prepare()
            fallback = EagerFallbackFence()
            fallback.setup(FenceSetup(dev, b.counter, b.pool, b.model))
        with dev.stream(lb.forward):
            LayerwiseGraphFence().setup(FenceSetup(dev, lb.counter, lb.pool, lb.model))
            layerwise_full = FullGraphRunner(dev, lb.model, lb.counter)
            layerwise_full.prepare()  # the accessors' graph-event waits become wait nodes
        dev.synchronize(timeout_s)
        self.gaps: dict[str, list[float]] = {}
        self.arms: dict[str, tuple[Bench, Runner, Callable]] = {
            "none": (b, self.full, no_fence),
            "final_event": (b, self.full, final_event_fence),
            "layerwise_graph": (lb, layerwise_full, no_fence),
            "host_sync": (b, self.full, host_sync_fence),
            "eager_fallback": (b, self.full, fallback),
        }

    def time(self, arm: str) -> float:
        """One iteration of `arm`, in microseconds of device (or virtual) time."""
        b, dev = (self.arms[arm][0] if arm in self.arms else self.b), self.dev
        with dev.stream(b.forward):
            start = dev.mark(b.forward, end=False)
            if arm == "compute":  # no load pending: the plain graph alone
                self.full.run()
            elif arm == "load":
                op = b.start_load(FaultPlan(Fault()))
                op.events.finish_event.wait(b.forward)
            else:
                _, runner, fence = self.arms[arm]
                op = b.start_load(FaultPlan(Fault()))
                ctx = FenceContext(dev, b.forward, b.load, b.counter, op.events, runner)
                chosen = fence(ctx) or runner
                launch = dev.mark(b.forward, end=False)  # where the forward could start
                chosen.run()
            end = dev.mark(b.forward)
        dev.synchronize(self.timeout_s)
        b.counter.set_consumer(-1)
        if arm in self.arms:
            # From the start of the load op to where the forward could start: the host's
            # enqueue of the load op (paid by every strategy, and not part of
            # max(load, compute)) plus whatever the fence made the forward wait.
            self.gaps.setdefault(arm, []).append(dev.marker_us(launch) - dev.marker_us(start))
        return dev.marker_us(end) - dev.marker_us(start)


def bench_point(dev: Device, point: Point, repeats: int, warmup: int, timeout_s: float = 30.0) -> PointResult:
    arms = _Arms(dev, point, timeout_s)
    names = [*BASELINES, *ARMS]
    samples: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(warmup + repeats):
        if rep == warmup:
            arms.gaps.clear()
        for name in names:  # round-robin: drift and clock changes hit every arm alike
            t = arms.time(name)
            if rep >= warmup:
                samples[name].append(t)
    gaps = {n: Stats.of(xs) for n, xs in arms.gaps.items()}
    return PointResult(point, {n: Stats.of(xs) for n, xs in samples.items()}, gaps)
