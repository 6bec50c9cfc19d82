"""Everything one scenario builds on a device: pools, model, load-back, strategies and streams."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from harness.devices.base import Device
from harness.devices.collective import current_group
from harness.engines import load_engine
from harness.engines.engine import EngineLoader
from harness.faults.plan import FaultPlan
from harness.faults.registry import fault_strategy
from harness.input.plugins import Kind, for_scenario, resolve
from harness.model.runners import Runner, make_runner
from harness.model.stack import HybridModel
from harness.model.tensor_parallel import TensorParallelModel, rank_shape
from harness.protocol.accessors import AccessorPolicy
from harness.protocol.counter import LoadCounter
from harness.protocol.fences import FenceSetup
from harness.protocol.hazards import HAZARDS, HazardBed, make_hazard
from harness.protocol.layout import plan_layout, prefix_regions
from harness.protocol.loadback import CopyPlan, LayerDoneCounter, plan_copies
from harness.protocol.pools import HostPool, HybridPool
from harness.protocol.schedules import LayerListener, LoadOp, LoadStarter, Schedule, layerwise, start_loading
from harness.protocol.writeback import HostBackup, WriteBack, transfer_policy
from harness.records.errors import EngineContractBroken, ReplayTimeout
from harness.records.scenario import Backend, Scenario
from harness.records.trace import Region


class Testbed:
    """One scenario's memory and protocol on a device, and its strategies, resolved once.

    The replay loop (`harness.run.replay`) drives it; a strategy reaches it only
    through the context objects it is given.
    """

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, scenario: Scenario, dev: Device, timeout_s: float = 30.0):
        torch.manual_seed(scenario.seed)
        s = scenario
        self.scenario, self.dev, self.timeout_s = s, dev, timeout_s
        # A tensor-parallel rank (`harness.run.tp`) holds its own heads' pools and its share of the model.
        self.group = current_group() if s.tp > 1 else None
        self.layout = layout = plan_layout(rank_shape(s.model, s.tp) if self.group else s.model, s.batch)
        engine = load_engine(s.engine) if s.engine else None
        self.pool = engine.pools(dev, layout) if engine else HybridPool(dev, layout)  # the engine's own pools
        self.host = HostPool(dev, layout, s.seed)
        # The write-back's host copy, for the hazards that back up: the model's probes observe it.
        backup = HostBackup(dev, layout) if HAZARDS[s.hazard].backs_up else None
        # A tensor-parallel model is attention-only (`split_problem`): no Mamba slot to copy on write.
        self.model = (TensorParallelModel(dev, layout, self.pool, s.seed, s.model, self.group, backup)
                      if self.group is not None
                      else HybridModel(dev, layout, self.pool, s.seed, backup, HAZARDS[s.hazard].copies_slots))
        n = layout.shape.num_layers
        # The engine's own load chain where it has one for this model: its counter and its load stream. A
        # hazard whose load is an offloaded prefix's takes the engine's offloading load where it has one.
        offload = getattr(engine, "offload_loader", None) if HAZARDS[s.hazard].loads_offloaded else None
        if s.transfer not in (None, "engine") and HAZARDS[s.hazard].loads_offloaded and offload is None:
            raise EngineContractBroken(f"transfer {s.transfer!r} of hazard {s.hazard.value!r} acts on an engine's "
                                       "offloading load; this scenario's engine has none")
        self.engine_load: EngineLoader | None = (
            offload(dev, layout, self.pool, self.host, transfer_policy(s.transfer)) if offload
            else engine.loader(dev, layout, self.pool, self.host) if engine else None)
        self.schedule: Schedule = for_scenario(resolve(Kind.SCHEDULE, s.schedule, s.source, "schedule"))
        # A loader thread's enqueue left to after the fence (`AsyncEnqueue.drain`), or None: decided once,
        # not on each replay.
        self._drain: Callable[[], None] | None = getattr(self.schedule, "drain", None)
        if self.engine_load is not None:
            self.counter: LoadCounter = self.engine_load.counter
        else:
            in_graph = getattr(self.schedule, "records_in_graph", False)  # a load op captured as a graph
            self.counter = engine.counter(dev, n) if engine else LayerDoneCounter(dev, n, external=in_graph)
        self.forward = dev.Stream("forward")
        self.load = self.engine_load.stream if self.engine_load is not None else dev.Stream("load")
        self.ran = dev.Event()  # recorded after the forward, when a gate waits for it
        self.engine_loaded = False  # whether the engine's own load chain ran the last load op
        chunks = fault_strategy(s.fault).chunks(s.fault)
        # Built once: the replay loop only enqueues (host time there shifts the race window).
        self.copies = plan_copies(layout, self.host, self.pool, chunks)
        self.listeners: list[LayerListener] = []  # called as each load op completes a layer
        self.starters: list[LoadStarter] = []  # called as each load op starts, on the scheduling stream
        self.fence = for_scenario(resolve(Kind.FENCE, s.fence, s.source, "fence"))
        self.accessor: AccessorPolicy = for_scenario(resolve(Kind.ACCESSOR, s.accessor, s.source, "accessor"))
        targets = tuple(r for lid in range(n) for r in prefix_regions(layout, lid))
        # The engine's own write-back where its adapter has one (vLLM's offloading worker), else the harness's.
        engine_writeback = getattr(engine, "writeback", None)
        # A scenario's `connector` (vLLM's) names which of the engine's workers stores.
        chosen = {"connector": s.connector} if s.connector else {}
        self.writeback = (None if backup is None
                          else engine_writeback(dev, layout, self.pool, self.forward, backup, **chosen)
                          if engine_writeback
                          else WriteBack(dev, layout, self.pool, self.forward, backup))
        self.bed = HazardBed(dev, layout, self.pool, self.copies, targets, s.poison, s.seed, chunks, self.host,
                             self.load, transfer_policy(s.transfer), self.writeback, timeout_s,
                             self.model.probes.cow or None)
        self.hazard = make_hazard(s.hazard, self.bed)

    def start_load(self, plan: FaultPlan, *, schedule: Schedule | None = None, gate: Any = None,
                   copies: CopyPlan | None = None) -> LoadOp:
        """Enqueue a load op (on the forward stream, as the engine does); the batch carries its index."""
        self._wait_for_free_slot()
        self.engine_loaded = self.engine_load is not None and self._by_engine(schedule, copies)
        if self.engine_load is not None and self.engine_loaded:
            op = self.engine_load.start(plan, gate, self.listeners)
            self.counter.set_consumer(op.index)
            return op
        op = start_loading(self.dev, self.counter, self.load, self.copies if copies is None else copies, plan,
                           self.layout, schedule or self.schedule, gate, self.listeners, self.starters)
        self.counter.set_consumer(op.index)
        return op

    def unrestored(self) -> tuple[Region, ...]:
        """Once the last load op has landed (the host waited for it): the slots it should have
        restored that do not hold their host data, each a copy of the harness's plan. Only an
        engine's load chain is asked (the harness's own load op is that plan); its answer says
        whether the chain restored the batch where the model reads it."""
        if not self.engine_loaded:
            return ()
        return tuple(c.region for layer in self.copies for chunk in layer for c in chunk
                     if not torch.equal(c.dst.cpu(), c.src.cpu()))

    def drain_load(self) -> None:
        """Enqueue now what the schedule left to a loader thread of its own (`AsyncEnqueue.drain`);
        nothing for any other schedule."""
        if self._drain is not None:
            self._drain()

    def _by_engine(self, schedule: Schedule | None, copies: CopyPlan | None) -> bool:
        """This batch's own load op, with the engine's schedule, one copy per layer and nothing
        listening per layer: the engine's load chain runs it (anything else is the harness's)."""
        return (self.engine_load is not None and copies is None and (schedule or self.schedule) is layerwise
                and not self.listeners and not self.starters
                and not fault_strategy(self.scenario.fault).splits_copies)

    def _wait_for_free_slot(self) -> None:
        """Block the host until the ring slot the next load op takes has finished its last load.

        The engine asserts it (`update_producer`): its scheduler reuses an event set only after
        the host has polled that set's final event. The replay loop runs ahead of the device by
        a batch of replays, so it waits here as the scheduler would.
        """
        c = self.counter
        events = c.events[(c.producer_index + 1) % len(c.events)]
        if not self.dev.host_wait(events.finish_event, self.timeout_s):
            raise ReplayTimeout(f"a load op's event set was still in use after {self.timeout_s:g}s "
                                "(a hung replay or a load stream that never ran)")

    def other_load(self, schedule: Schedule | None = None):
        """load(copies, plan) for a hazard: another batch's load op, this batch's index kept."""

        def load(copies: CopyPlan, plan: FaultPlan) -> LoadOp:
            consumer = self.counter.consumer_index
            op = self.start_load(plan, schedule=schedule, copies=copies)
            self.counter.set_consumer(consumer)  # that batch is never run here
            return op

        return load

    def set_waits(self, *policies: AccessorPolicy) -> None:
        self.pool.set_waits(self.counter, policies)

    def runner(self, backend: Backend) -> Runner:
        """A runner of `backend` on this model, its graphs captured (no load may be pending)."""
        with self.dev.stream(self.forward):
            return make_runner(backend, self.dev, self.model, self.counter)

    def setup_fence(self) -> None:
        """A strategy's one-time set-up, before anything is captured (no load pending)."""
        setup = getattr(self.fence, "setup", None)
        if setup is not None:
            with self.dev.stream(self.forward):
                setup(FenceSetup(self.dev, self.forward, self.load, self.counter, self.pool, self.runner,
                                 self.pool.add_wait, self.listeners.append, self.starters.append))
