"""One scenario through one pipeline, the same on every device.

build model and pools (seeded) -> eager ground truth with all loads complete ->
capture the runner -> for each replay: poison the target slots, start the
load-back with the fault, apply the fence, replay, collect probes and final
state, compare with ground truth -> tally -> verdict.

Hazards change what a replay does around that core:
- raw: as above; a read before its copy lands shows as a stale probe.
- waw: the slots already hold the right data (no poison), and the load op
  re-copies it; a copy that lands after prefill wrote the Mamba state in place
  shows only in the post-prefill state.
- war: after the batch's replay, the next batch's load op writes different data
  into the same slots; if it is not ordered after the replay, the replay's
  reads (and outputs) show the next batch's data.
"""

from __future__ import annotations

import gc
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.protocol.accessors import per_layer
from harness.records.analysis import Finding, find_races
from harness.devices.base import Device, Gate, GateUnavailable
from harness.records.errors import HarnessError, ReplayTimeout
from harness.records.faults import FaultPlan, gate_fallback, sweep_points
from harness.protocol.fences import FenceContext, FenceSetup
from harness.protocol.loadback import LayerDoneCounter, plan_copies
from harness.model.stack import HybridModel
from harness.run.oracle import Oracle, ReplayVerdict, Tally
from harness.run.plugins import Kind, resolve
from harness.protocol.pools import (
    HostPool,
    HybridPool,
    KVPool,
    Layout,
    MambaPool,
    plan_layout,
    prefix_regions,
)
from harness.model.runners import RUNNERS, EagerRunner, Runner
from harness.records.scenario import Expect, Fault, FaultKind, Hazard, Scenario
from harness.protocol.schedules import LoadOp, layerwise, start_loading
from harness.records.trace import Span, Trace


class GateTimeout(HarnessError):
    """A gate stayed shut past its timeout; its watchdog opened it."""


@dataclass
class Bench:
    """Everything one scenario builds on a device."""

    scenario: Scenario
    dev: Device
    layout: Layout
    pool: HybridPool
    host: HostPool
    model: HybridModel
    counter: LayerDoneCounter

    def __post_init__(self) -> None:
        s = self.scenario
        self.forward = self.dev.Stream("forward")
        self.load = self.dev.Stream("load")
        fence = resolve(Kind.FENCE, s.fence, s.source, "fence")
        self.fence = fence() if inspect.isclass(fence) else fence  # a strategy with set-up
        self.accessor = resolve(Kind.ACCESSOR, s.accessor, s.source, "accessor")
        self.schedule = resolve(Kind.SCHEDULE, s.schedule, s.source, "schedule")
        chunks = s.fault.chunks if s.fault.kind is FaultKind.CHUNKED else 1
        # Built once: the replay loop only enqueues (host time there shifts the race window).
        self.copies = plan_copies(self.layout, self.host, self.pool, chunks)
        self.targets = [r for lid in range(self.layout.shape.num_layers)
                        for r in prefix_regions(self.layout, lid)]
        self.next_copies = None
        if s.hazard is Hazard.WAR:  # the next batch: other data for the same slots
            next_host = HostPool(self.dev, self.layout, s.seed + 1)
            self.next_copies = plan_copies(self.layout, next_host, self.pool, chunks)
        self.ran = self.dev.Event()  # recorded after the forward, for the gate's release

    @classmethod
    def build(cls, scenario: Scenario, dev: Device) -> "Bench":
        torch.manual_seed(scenario.seed)
        layout = plan_layout(scenario.model, scenario.batch)
        pool = HybridPool(KVPool(dev, layout), MambaPool(dev, layout))
        host = HostPool(dev, layout, scenario.seed)
        model = HybridModel(dev, layout, pool, scenario.seed)
        if scenario.engine == "sglang":
            from harness.engines.sglang import load

            counter = load(scenario.source).counter(dev, layout.shape.num_layers)
        else:
            counter = LayerDoneCounter(dev, layout.shape.num_layers)
        return cls(scenario, dev, layout, pool, host, model, counter)

    # ---- the pieces of one replay ---------------------------------------------
    def poison(self) -> None:
        """Fill every slot the load-back will write, and the probe arena, with poison.

        Under the write-after-write hazard the slots are filled with the right data
        instead (resident state that the load op re-copies), so that a late copy can
        only show by clobbering what the prefill wrote.
        """
        self.model.probes.arena.fill_(self.scenario.poison)
        if self.scenario.hazard is Hazard.WAW:
            for layer in self.copies:
                for chunk in layer:
                    for c in chunk:
                        self.dev.copy_async(c.dst, c.src, c.region)  # on the forward stream
            return
        p = self.scenario.poison
        self.dev.access(writes=self.targets, what="poison")
        kv, mamba = self.pool.kv, self.pool.mamba
        for r in self.layout.requests:
            kv.k[:, r.prefix.start : r.prefix.stop].fill_(p)
            kv.v[:, r.prefix.start : r.prefix.stop].fill_(p)
        mamba.conv[:, self.model.mamba_slots].fill_(p)
        mamba.ssm[:, self.model.mamba_slots].fill_(p)

    def start_load(self, plan: FaultPlan, gate: Gate | None = None, schedule=None, copies=None) -> LoadOp:
        op = start_loading(self.dev, self.counter, self.load, copies or self.copies, plan,
                           schedule or self.schedule, gate)
        self.counter.set_consumer(op.index)  # the batch carries the op's index
        return op

    def start_next_load(self, plan: FaultPlan) -> LoadOp:
        """The next batch's load op into the same slots (write-after-read hazard)."""
        consumer = self.counter.consumer_index
        op = self.start_load(FaultPlan(Fault(), plan.replay), copies=self.next_copies)
        self.counter.set_consumer(consumer)  # the next batch is never run here
        return op

    def observe(self, op: LoadOp) -> None:
        """The harness's own wait for the load to land, then the post-prefill state.

        Enqueued after the forward, so it cannot hide a race in it; it makes a late
        Mamba-state copy (a clobber) visible in the collected final state.
        """
        op.events.finish_event.wait(self.forward)
        self.model.collect_final_state()

    def set_waits(self, policy) -> None:
        self.pool.set_counter(self.counter, policy)

    def setup_fence(self) -> None:
        """A strategy's one-time set-up, before anything is captured (no load pending)."""
        setup = getattr(self.fence, "setup", None)
        if setup is not None:
            with self.dev.stream(self.forward):
                setup(FenceSetup(self.dev, self.counter, self.pool, self.model))


@dataclass
class SweepPoint:
    us: float  # injected delay
    tally: Tally


@dataclass
class ScenarioResult:
    scenario: Scenario
    tally: Tally = field(default_factory=Tally)
    observed: Expect | None = None
    error: str | None = None
    wall_s: float = 0.0
    replay_s: float = 0.0  # the replay loop alone
    trace: Trace | None = None
    findings: list[Finding] = field(default_factory=list)  # happens-before races in the trace
    fault_mode: str | None = None  # how a gate was built, or what stood in for it
    sweep: list[SweepPoint] = field(default_factory=list)  # per delay point (sweep faults)
    timeline: list[Span] = field(default_factory=list)  # the traced replay's streams in time
    timeline_stale_layers: tuple[int, ...] = ()  # layers the traced replay read stale
    clock: str = "device"  # the timeline's clock: device time, or the simulator's virtual time

    @property
    def met(self) -> bool:
        return self.error is None and self.observed == self.scenario.expect

    @property
    def replays_per_s(self) -> float:
        return self.tally.replays / self.replay_s if self.replay_s else 0.0


ReplayHook = Callable[[int, ReplayVerdict], None]


def ground_truth(b: Bench, timeout_s: float) -> Oracle:
    """Eager forward with every load complete (host-synced) before it starts.

    Always the engine's own load op and accessor waits: the truth must not
    depend on the variant under test.
    """
    b.set_waits(per_layer)
    with b.dev.stream(b.forward):
        b.poison()
        op = b.start_load(FaultPlan(Fault()), schedule=layerwise)
        b.dev.synchronize(timeout_s)
        EagerRunner(b.dev, b.model, b.counter).run()
        b.observe(op)
        truth = b.model.probes.arena.clone()
        b.dev.synchronize(timeout_s)  # the oracle reads truth on whatever stream builds it
    b.counter.set_consumer(-1)
    return Oracle(b.layout, truth, b.scenario.tolerance)


class _Replayer:
    """One scenario's replay loop on a built bench: everything per replay, nothing more."""

    def __init__(self, b: Bench, runner: Runner, oracle: Oracle, timeout_s: float, gate: Gate | None):
        self.b, self.runner, self.oracle, self.timeout_s, self.gate = b, runner, oracle, timeout_s, gate
        self.hold_s = b.scenario.fault.hold_us * 1e-6
        self.mask = torch.zeros(len(oracle.units), dtype=torch.bool)
        if b.dev.torch_device.type == "cuda":
            self.mask = self.mask.pin_memory()

    def _host_wait(self, event) -> None:
        """A fence that blocks the host: open the gate first (nothing else could), then wait."""
        if self.gate is not None:
            self.gate.release()
        if not self.b.dev.host_wait(event, self.timeout_s):
            raise ReplayTimeout(f"a fence's host wait did not finish within {self.timeout_s:g}s")

    def __call__(self, i: int, fault: Fault) -> torch.Tensor:
        b, dev, gate = self.b, self.b.dev, self.gate
        plan = FaultPlan(fault, i)
        # The gate holds what must come second for a race to show: the load stream (read-
        # and write-after-write), or, for write-after-read, the replay itself, so that the
        # next batch's load can land before it reads.
        war = b.next_copies is not None
        with dev.stream(b.forward):
            b.poison()
            op = b.start_load(plan, None if war else gate)
            runner = b.fence(FenceContext(dev, b.forward, b.load, b.counter, op.events, self.runner, i,
                                          self._host_wait)) or self.runner
            if war and gate is not None:
                gate.hold()
            runner.run()
            if gate is not None:
                b.ran.record()
            b.observe(op)
            # Open the gate when the replay has run (or the next batch's load has landed):
            # then every read it made came first. A correct fence keeps that from happening:
            # then after hold_us.
            opened_by = b.start_next_load(plan).events.finish_event if war else b.ran
            self.mask.copy_(self.oracle.stale_mask(b.model.probes.arena), non_blocking=True)
        if gate is not None and (war or op.held):  # held where the harness knows: it opens it
            dev.host_wait(opened_by, self.hold_s)
            gate.release()
        dev.synchronize(self.timeout_s)  # the one host sync of a replay
        if self.gate is not None and self.gate.timed_out:
            raise GateTimeout(
                f"gate-timeout in replay {i}: a gate was never opened; "
                f"its watchdog opened it after {self.gate.timeout_s:g}s"
            )
        b.counter.set_consumer(-1)  # the host saw the final event: the load's slots are released
        return self.mask


def _open_gate(b: Bench, timeout_s: float) -> tuple[Gate | None, Fault, str | None]:
    """The gate a gate fault needs, or the long delay that stands in for it, and which."""
    fault = b.scenario.fault
    if fault.kind is not FaultKind.GATE:
        return None, fault, None
    try:
        # The watchdog fires well inside the replay timeout, so a stuck gate is
        # reported as itself and not as a hung replay.
        gate = b.dev.gate(timeout_s / 2)
    except GateUnavailable as e:
        stand_in = gate_fallback(fault)
        return None, stand_in, f"{stand_in.describe()} (gate fallback: {e})"
    return gate, fault, f"gate ({gate.mode})"


def run_scenario(
    scenario: Scenario,
    dev: Device,
    *,
    replays: int | None = None,
    timeout_s: float = 30.0,
    on_replay: ReplayHook | None = None,
) -> ScenarioResult:
    result = ScenarioResult(scenario)
    t0 = time.perf_counter()
    gate = None
    try:
        b = Bench.build(scenario, dev)
        oracle = ground_truth(b, timeout_s)
        b.set_waits(b.accessor)
        b.setup_fence()
        runner: Runner = RUNNERS[scenario.backend](dev, b.model, b.counter)
        with dev.stream(b.forward):
            runner.prepare()
        dev.synchronize(timeout_s)
        gate, fault, result.fault_mode = _open_gate(b, timeout_s)
        replay = _Replayer(b, runner, oracle, timeout_s, gate)
        points = sweep_points(fault)
        n = replays or scenario.replays

        # One extra replay, traced and not counted: tracing costs host time, and host
        # time before the replay launch shifts the race window of the counted ones.
        with dev.tracing() as trace:
            traced = oracle.verdict(replay(-1, points[-1][1]))
        result.trace = trace
        result.findings = find_races(trace)  # structural: shows whether or not timing did
        result.timeline = dev.timeline(trace)
        result.clock = "virtual" if dev.name == "sim" else "device"
        result.timeline_stale_layers = tuple(sorted(traced.layers))
        gc_was_on = gc.isenabled()
        gc.disable()  # a collector pause mid-replay is host jitter the race test need not see
        t1 = time.perf_counter()
        try:
            for us, point_fault in points:
                point = SweepPoint(us, Tally())
                for i in range(n):
                    verdict = oracle.verdict(replay(i, point_fault))
                    result.tally.add(verdict)
                    point.tally.add(verdict)
                    if on_replay:
                        on_replay(i, verdict)
                if fault.kind is FaultKind.SWEEP:
                    result.sweep.append(point)
        finally:
            result.replay_s = time.perf_counter() - t1
            if gc_was_on:
                gc.enable()
        result.observed = Expect.RACE if result.tally.stale_replays else Expect.CLEAN
    except HarnessError as e:
        result.error = str(e)
    except torch.OutOfMemoryError as e:  # one scenario's OOM must not end the run
        result.error = f"out of device memory: {(str(e).strip().splitlines() or ['(no detail)'])[0]}"
    except AssertionError as e:
        if scenario.engine is None:
            raise  # the harness's own assertion: a bug to see whole
        # The engine's own checks assert (LayerDoneCounter: a ring slot reused too early).
        result.error = f"{scenario.engine} assertion failed: {e}"
    finally:
        if gate is not None:
            gate.close()  # nothing stays blocked behind a scenario that failed
        if result.observed is None:
            # It ended early (an error, an interrupt): give back what it built before the
            # next scenario allocates. Drop this frame's references first, so that the
            # collector can free the bench, and only then return the cached blocks.
            b = oracle = runner = replay = None  # noqa: F841
            gc.collect()
            if torch.cuda.is_initialized():
                try:
                    torch.cuda.empty_cache()
                except RuntimeError:
                    pass  # a device that is gone has nothing to give back
    result.wall_s = time.perf_counter() - t0
    return result
