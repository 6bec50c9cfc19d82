"""What each fence costs: load-back plus prefill, end to end, per strategy.

For each point of a sweep (model kind x layers x prefix length x hidden size) every arm, a
fence of the registry (or a plugin, named like any fence), optionally with a load-back
schedule (`FENCE+SCHEDULE`, e.g. `layerwise_value+captured_load`), gets a testbed of its own,
set up as a scenario with that fence is, and runs the replay loop of `harness.run.replay` with
nothing observed. One iteration is timed with markers on the forward stream (device events;
virtual time on the simulator):

    mark -> start the load op -> fence -> mark -> forward -> mark -> synchronize

`load` (the load op alone: the fence `load_bound` runs no forward, only a wait on the final
event) and `compute` (the forward with no load pending) are timed the same way; no strategy
can beat max(load, compute), the bound. Arms run round-robin, warm-up first, so drift hits
them alike; each reports its median and quartiles over the repeats, its ratio to the bound
and, paired repeat by repeat, to the unfenced graph (`none`) of the same round.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness.devices.base import Device, Memory
from harness.protocol.fences import STRATEGIES, FenceContext
from harness.records.errors import TooLarge
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
UNFENCED = "none"
# The default arms: the unfenced graph, every correct strategy, and the value waits and the
# unfenced graph again with the load op enqueued as one captured graph. Any fence name (or
# plugin), with or without `+SCHEDULE`, can be one.
ARMS = (UNFENCED, *STRATEGIES, "layerwise_value+captured_load", "none+captured_load")


def arm_parts(arm: str) -> tuple[str, str | None]:
    """An arm's fence and its schedule (None: the scenario's default, `layerwise`)."""
    fence, plus, schedule = arm.partition("+")
    return fence, (schedule if plus else None)


HEAD_DIM = 128


@dataclass(frozen=True)
class Point:
    kind: str  # attention | hybrid
    layers: int
    prefix: int
    new: int = 32
    hidden: int = 1024  # MHA, heads of 128

    @property
    def label(self) -> str:
        return f"{self.kind} {self.layers} layers, prefix {self.prefix}, hidden {self.hidden}"

    def scenario(self) -> Scenario:
        pattern = "A" * self.layers if self.kind == "attention" else "AM" * (self.layers // 2)
        # Sized so that load and compute are close at the default point (8 layers, 2,048
        # cached tokens, 32 new, hidden 1,024): the case where keeping the overlap matters most.
        # On an H200: load 1.34 ms, compute 1.56 ms (docs/results.md).
        heads = self.hidden // HEAD_DIM
        shape = ModelShape(layers=pattern, hidden=self.hidden, heads=heads, kv_heads=heads, head_dim=HEAD_DIM,
                           state=16)
        return Scenario(f"bench-{self.kind}-{self.layers}L-{self.prefix}-h{self.hidden}", shape,
                        (Request(self.prefix, self.new),), Backend.FULL, Expect.CLEAN)


DEFAULT_POINT = Point("attention", 8, 2048)


def sweep(kinds=("attention", "hybrid"), prefixes=(512, 2048, 8192, 16384),
          layers=(4, 8, 16, 32), hidden: int = 1024) -> list[Point]:
    """Prefix lengths at 8 layers and layer counts at 2,048 tokens, for each model kind."""
    points = []
    for kind in kinds:
        for p in prefixes:
            points.append(Point(kind, 8, p, hidden=hidden))
        for n in layers:
            if n != 8:
                points.append(Point(kind, n, 2048, hidden=hidden))
    return points


# Named sets of points (`fence-harness bench --points NAME[,NAME...]`): serving depth is 8 to 80
# layers, 2,048 to 32,768 cached tokens, attention and hybrid models, hidden 1,024 and 4,096.
POINT_SETS: dict[str, Callable[[], list[Point]]] = {
    "default": lambda: [DEFAULT_POINT],
    "sweep": sweep,  # the original sweep: 512-16,384 tokens at 8 layers, 4-32 layers at 2,048
    "layers": lambda: [Point("attention", n, 2048) for n in (8, 32, 80)],
    "prefix": lambda: [Point("attention", 8, p) for p in (2048, 8192, 32768)],
    "deep": lambda: [Point("attention", 80, 2048)],
    "hybrid": lambda: [*(Point("hybrid", n, 2048) for n in (8, 32, 80)),
                       *(Point("hybrid", 8, p) for p in (8192, 32768))],
    "hidden": lambda: [Point(kind, 8, 2048, hidden=4096) for kind in ("attention", "hybrid")],
    "serving": lambda: [*sweep(prefixes=(2048, 8192, 32768), layers=(8, 32, 80)),
                        *sweep(prefixes=(2048, 8192), layers=(8, 32), hidden=4096)],
}


def points_named(names: Sequence[str]) -> list[Point]:
    """The points of the named sets, each once, in order (KeyError for an unknown name)."""
    return list(dict.fromkeys(p for name in names for p in POINT_SETS[name]()))


@dataclass(frozen=True)
class Stats:
    """Median, quartiles (the IQR) and deciles of a set of samples (given in microseconds, kept in ms)."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int
    p25_ms: float = 0.0
    p75_ms: float = 0.0

    @classmethod
    def of(cls, samples_us: list[float]) -> Stats:
        r = Spread.of(samples_us)
        return cls(r.median / 1e3, r.p10 / 1e3, r.p90 / 1e3, r.n, r.p25 / 1e3, r.p75 / 1e3)


@dataclass(frozen=True)
class Spread:
    """Median, quartiles and deciles of plain numbers (ratios)."""

    median: float
    p25: float
    p75: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, xs: Sequence[float]) -> Spread:
        xs = sorted(xs)
        if not xs:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0)
        if len(xs) < 2:
            return cls(xs[0], xs[0], xs[0], xs[0], xs[0], len(xs))
        q4 = statistics.quantiles(xs, n=4)
        q10 = statistics.quantiles(xs, n=10)
        return cls(statistics.median(xs), q4[0], q4[2], q10[0], q10[-1], len(xs))


@dataclass(frozen=True)
class PointResult:
    point: Point
    stats: dict[str, Stats]  # arm or baseline -> its timing
    forward_starts: dict[str, Stats]  # arm -> from the load op's start to where the forward could start
    unfenced: dict[str, Spread] = field(default_factory=dict)  # arm -> its time over `none`'s, round by round

    @property
    def bound_ms(self) -> float:
        return max(self.stats["load"].median_ms, self.stats["compute"].median_ms)

    def ratio(self, arm: str) -> float:
        return self.stats[arm].median_ms / self.bound_ms

    def rows(self) -> list[dict]:
        """One row per strategy, in the results.json `bench.points` shape."""
        p, bound = self.point, self.bound_ms
        rows = []
        for arm, s in self.stats.items():
            if arm in BASELINES:
                continue
            fs = self.forward_starts[arm]
            row = {"model": p.kind, "layers": p.layers, "prefix": p.prefix, "new": p.new, "hidden": p.hidden,
                   "strategy": arm, "median_ms": round(s.median_ms, 4), "p25_ms": round(s.p25_ms, 4),
                   "p75_ms": round(s.p75_ms, 4), "p10_ms": round(s.p10_ms, 4), "p90_ms": round(s.p90_ms, 4),
                   "repeats": s.n, "ratio_to_bound": round(self.ratio(arm), 3),
                   "ratio_to_bound_p25": round(s.p25_ms / bound, 3), "ratio_to_bound_p75": round(s.p75_ms / bound, 3),
                   "load_ms": round(self.stats["load"].median_ms, 4),
                   "compute_ms": round(self.stats["compute"].median_ms, 4),
                   "forward_start_ms": round(fs.median_ms, 4), "forward_start_p25_ms": round(fs.p25_ms, 4),
                   "forward_start_p75_ms": round(fs.p75_ms, 4)}
            u = self.unfenced.get(arm)
            if u is not None:
                row.update(ratio_to_unfenced=round(u.median, 3), ratio_to_unfenced_p25=round(u.p25, 3),
                           ratio_to_unfenced_p75=round(u.p75, 3))
            rows.append(row)
        return rows


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
        tb = Testbed(scenario, dev, timeout_s)
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


# The share of the device's available memory a point's testbeds may take: the rest is left for the
# forward's temporaries and for what the reading cannot see (fragmentation, other processes).
MEMORY_SHARE = 0.9


def bench_point(dev: Device, point: Point, repeats: int, warmup: int, timeout_s: float = 30.0,
                arms: Sequence[str] = ARMS) -> PointResult:
    # What one testbed takes, read around the second one built (the first holds what later ones
    # share, such as the CPU's weights), each run once first: the simulator's memory is only the
    # process's once written, and the load and the forward write all of it.
    compute = Arm(dev, point.scenario(), timeout_s)
    compute.time()
    before = dev.memory()
    first = Arm(dev, arm_scenario(point, arms[0]), timeout_s)
    first.time()
    check_room(point, len(arms), before, dev.memory())  # the load bound's and the other arms'
    load = Arm(dev, point.scenario().with_overrides(fence=LOAD_BOUND), timeout_s)
    runs = {arms[0]: first, **{name: Arm(dev, arm_scenario(point, name), timeout_s) for name in arms[1:]}}
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
    unfenced = {}
    if UNFENCED in samples:  # paired round by round: drift between rounds cancels
        base = samples[UNFENCED]
        unfenced = {n: Spread.of([a / b for a, b in zip(samples[n], base, strict=True) if b > 0]) for n in arms}
    return PointResult(point, {n: Stats.of(xs) for n, xs in samples.items()},
                       {n: Stats.of(xs) for n, xs in gaps.items()}, unfenced)


def check_room(point: Point, testbeds: int, before: Memory | None, after: Memory | None) -> None:
    """Refuse, before they are built, `testbeds` more testbeds of a point that would not fit: each
    takes what the one built between the two readings took."""
    if before is None or after is None:
        return  # this platform does not say: build and see
    each = max(after.in_use - before.in_use, 0)
    if each * testbeds > after.available * MEMORY_SHARE:
        gib = 2**30
        raise TooLarge(f"bench point {point.label}: the {testbeds} testbeds left to build need about "
                       f"{each * testbeds / gib:.1f} GiB more {after.where} ({each / gib:.2f} GiB a testbed, "
                       f"measured), and {after.available / gib:.1f} GiB is available; choose smaller --points "
                       "or fewer --arm")


def arm_scenario(point: Point, arm: str) -> Scenario:
    """The point's scenario with the arm's fence (and schedule, for `FENCE+SCHEDULE`)."""
    fence, schedule = arm_parts(arm)
    s = point.scenario().with_overrides(fence=fence)
    return s.with_overrides(schedule=schedule) if schedule else s
