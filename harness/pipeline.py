"""One scenario through one pipeline, the same on every device.

build model and pools (seeded) -> eager ground truth with all loads complete ->
capture the runner -> for each replay: poison the target slots, start the
load-back with the fault, apply the fence, replay, collect probes and final
state, compare with ground truth -> tally -> verdict.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.analysis import Finding, find_races
from harness.devices.base import Device
from harness.errors import HarnessError
from harness.fences import FENCES, FenceContext
from harness.loadback import LayerDoneCounter, plan_copies, start_loading
from harness.model import HybridModel
from harness.oracle import Oracle, ReplayVerdict, Tally
from harness.pools import HostPool, HybridPool, KVPool, Layout, MambaPool, plan_layout, prefix_regions
from harness.runners import RUNNERS, EagerRunner, Runner
from harness.scenario import Expect, Scenario
from harness.trace import Trace


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
        self.forward = self.dev.Stream("forward")
        self.load = self.dev.Stream("load")
        # Built once: the replay loop only enqueues (host time there shifts the race window).
        self.copies = plan_copies(self.layout, self.host, self.pool)
        self.targets = [r for lid in range(self.layout.shape.num_layers)
                        for r in prefix_regions(self.layout, lid)]

    @classmethod
    def build(cls, scenario: Scenario, dev: Device) -> "Bench":
        torch.manual_seed(scenario.seed)
        layout = plan_layout(scenario.model, scenario.batch)
        pool = HybridPool(KVPool(dev, layout), MambaPool(dev, layout))
        host = HostPool(dev, layout, scenario.seed)
        model = HybridModel(dev, layout, pool, scenario.seed)
        counter = LayerDoneCounter(dev, layout.shape.num_layers)
        return cls(scenario, dev, layout, pool, host, model, counter)

    # ---- the pieces of one replay ---------------------------------------------
    def poison(self) -> None:
        """Fill every slot the load-back will write, and the probe arena, with poison."""
        p = self.scenario.poison
        self.dev.access(writes=self.targets, what="poison")
        kv, mamba = self.pool.kv, self.pool.mamba
        for r in self.layout.requests:
            kv.k[:, r.prefix.start : r.prefix.stop].fill_(p)
            kv.v[:, r.prefix.start : r.prefix.stop].fill_(p)
        mamba.conv[:, self.model.mamba_slots].fill_(p)
        mamba.ssm[:, self.model.mamba_slots].fill_(p)
        self.model.probes.arena.fill_(p)

    def start_load(self, delay_before=lambda layer: 0.0) -> int:
        producer = start_loading(self.dev, self.counter, self.load, self.copies, delay_before)
        self.counter.set_consumer(producer)  # the batch carries the op's index
        return producer

    def observe(self, producer: int) -> None:
        """The harness's own wait for the load to land, then the post-prefill state.

        Enqueued after the forward, so it cannot hide a race in it; it makes a late
        Mamba-state copy (a clobber) visible in the collected final state.
        """
        self.counter.events[producer].finish_event.wait(self.forward)
        self.model.collect_final_state()

    def set_waits(self, on: bool) -> None:
        self.pool.set_counter(self.counter if on else None)


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

    @property
    def met(self) -> bool:
        return self.error is None and self.observed == self.scenario.expect

    @property
    def replays_per_s(self) -> float:
        return self.tally.replays / self.replay_s if self.replay_s else 0.0


ReplayHook = Callable[[int, ReplayVerdict], None]


def ground_truth(b: Bench, timeout_s: float) -> Oracle:
    """Eager forward with every load complete (host-synced) before it starts."""
    b.set_waits(True)
    with b.dev.stream(b.forward):
        b.poison()
        producer = b.start_load()
        b.dev.synchronize(timeout_s)
        EagerRunner(b.dev, b.model, b.counter).run()
        b.observe(producer)
        truth = b.model.probes.arena.clone()
        b.dev.synchronize(timeout_s)  # the oracle reads truth on whatever stream builds it
    b.counter.set_consumer(-1)
    return Oracle(b.layout, truth, b.scenario.tolerance)


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
    try:
        b = Bench.build(scenario, dev)
        oracle = ground_truth(b, timeout_s)
        b.set_waits(scenario.waits)
        runner: Runner = RUNNERS[scenario.backend](dev, b.model, b.counter)
        with dev.stream(b.forward):
            runner.prepare()
        dev.synchronize(timeout_s)
        fence = FENCES[scenario.fence]
        ctx = FenceContext(dev, b.forward, b.load, b.counter)
        host_mask = torch.zeros(len(oracle.units), dtype=torch.bool)
        if dev.torch_device.type == "cuda":
            host_mask = host_mask.pin_memory()
        n = replays or scenario.replays

        def replay() -> torch.Tensor:
            with dev.stream(b.forward):
                b.poison()
                producer = b.start_load(scenario.fault.delay_before)
                fence(ctx)
                runner.run()
                b.observe(producer)
                host_mask.copy_(oracle.stale_mask(b.model.probes.arena), non_blocking=True)
            dev.synchronize(timeout_s)  # the one host sync of a replay
            b.counter.set_consumer(-1)  # the host saw the final event: the load's slots are released
            return host_mask

        # One extra replay, traced and not counted: tracing costs host time, and host
        # time before the replay launch shifts the race window of the counted ones.
        with dev.tracing() as trace:
            replay()
        result.trace = trace
        result.findings = find_races(trace)  # structural: shows whether or not timing did
        gc_was_on = gc.isenabled()
        gc.disable()  # a collector pause mid-replay is host jitter the race test need not see
        try:
            t1 = time.perf_counter()
            for i in range(n):
                verdict = oracle.verdict(replay())
                result.tally.add(verdict)
                if on_replay:
                    on_replay(i, verdict)
        finally:
            if gc_was_on:
                gc.enable()
        result.replay_s = time.perf_counter() - t1
        result.observed = Expect.RACE if result.tally.stale_replays else Expect.CLEAN
    except HarnessError as e:
        result.error = str(e)
    except torch.OutOfMemoryError as e:  # one scenario's OOM must not end the run
        result.error = f"out of device memory: {str(e).splitlines()[0]}"
    result.wall_s = time.perf_counter() - t0
    return result
