"""The one replay loop: every front end that replays (run, repro, mutants, fences, bench,
soak, the pytest plugin) runs these steps, and ground truth runs them with the host
waiting in between.

One replay, on the forward stream:

1. the hazard prepares the slots the load op writes (poison, or resident data), and
   the probe arena is poisoned;
2. the load op starts (`start_loading`: the start event here, the schedule on the
   load stream, with the fault's delays or the gate);
3. the fence runs (it may enqueue waits, block the host, or pick another runner);
4. the forward (a graph replay, graph segments, or eager steps);
5. the hazard's work after the forward (write-after-read: the next batch's load;
   the write-back hazards: the write-back, and the next batch's reuse or refill);
6. the gate opens (once the forward has run, or after `hold_us` when a correct fence
   keeps it waiting);
7. the harness's observation: the forward stream first waits for every stream the
   harness made (`Device.join`: the whole device's work so far, so a copy that no event
   covers cannot hide), then collects the post-prefill state and compares the arena with
   ground truth into this replay's row of a batch, all on the device.

Replays are checked in batches: the host enqueues replay after replay while the device
runs them (as an engine's scheduler runs ahead of a busy GPU), and synchronises once per
batch to read every row; each verdict is still its own replay's. So a replay's load op and
forward start together on the device, once the previous replay's observation is done
(`pace = "queued"`, the default). With `pace = "idle"` every replay starts on a quiet device,
and the load gets a head start of the host's own enqueue time; a gate needs the host once
per replay too. Those run one replay per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from harness.devices.base import Device, Event, Gate, Stream
from harness.model.runners import EagerRunner, Runner
from harness.protocol.accessors import per_layer
from harness.protocol.fences import FenceContext
from harness.protocol.hazards import Racing
from harness.protocol.schedules import LoadOp, layerwise
from harness.records.errors import (
    GateTimeout,
    GateUnavailable,
    PluginError,
    ReplayTimeout,
)
from harness.records.faults import FaultPlan, gate_fallback
from harness.records.scenario import Fault, FaultKind, Pace
from harness.run.oracle import Oracle, ReplayVerdict
from harness.run.testbed import Testbed


class Marks:
    """Timing markers one replay leaves on the forward stream (read them once it has finished)."""

    def __init__(self) -> None:
        self.start: Any = None  # before the load op starts
        self.launch: Any = None  # where the forward could start: after the fence
        self.end: Any = None  # after the forward

    def take(self, dev: Device, stream: Stream, at: str) -> None:
        setattr(self, at, dev.mark(stream))


class _Unmarked(Marks):
    def take(self, dev: Device, stream: Stream, at: str) -> None:
        pass


UNMARKED = _Unmarked()  # a replay that is not timed


def ground_truth(tb: Testbed, timeout_s: float) -> Oracle:
    """The replay's steps with every load landed (host-synced) before the eager forward.

    Always the engine's own load op and accessor waits: the truth must not depend on
    the variant under test.
    """
    dev = tb.dev
    tb.set_waits(per_layer)
    arena = tb.model.probes.arena
    truth = torch.empty_like(arena)
    plan = FaultPlan(Fault())
    with dev.stream(tb.forward):
        tb.hazard.prepare(tb.bed)
        tb.start_load(plan, schedule=layerwise)
        dev.synchronize(timeout_s)
        EagerRunner(dev, tb.model, tb.counter).run()
        tb.hazard.after_forward(tb.bed, plan, tb.other_load(layerwise), truth=True)
        dev.synchronize(timeout_s)
        tb.model.collect_final_state()
        dev.launch(lambda: truth.copy_(arena), what="ground truth")
    dev.synchronize(timeout_s)
    tb.counter.set_consumer(-1)
    return Oracle(tb.model.probes.layout, truth, tb.scenario.tolerance)


def open_gate(tb: Testbed, timeout_s: float) -> tuple[Gate | None, Fault, str | None]:
    """The gate a gate fault needs, or the long delay that stands in for it, and which."""
    fault = tb.scenario.fault
    if fault.kind is not FaultKind.GATE:
        return None, fault, None
    try:
        # The watchdog fires well inside the replay timeout, so a stuck gate is
        # reported as itself and not as a hung replay.
        gate = tb.dev.gate(timeout_s / 2)
    except GateUnavailable as e:
        stand_in = gate_fallback()
        return None, stand_in, f"{stand_in.describe()} (gate fallback: {e})"
    return gate, fault, f"gate ({gate.mode})"


class _Gating:
    """What a gate fault does around one replay: it holds the load stream, or (write-after-read)
    the forward; the harness opens it once the racing side has landed, or after `hold_us` when a
    correct fence keeps that from happening."""

    def __init__(self, tb: Testbed, gate: Gate):
        self.tb, self.gate = tb, gate
        self.on_forward = tb.hazard.holds_forward
        self.on_hazard = tb.hazard.holds_own
        self.hold_s = tb.scenario.fault.hold_us * 1e-6

    @property
    def on_load(self) -> Gate | None:
        """The gate a load op's schedule holds (`LoadOp.hold`), or None."""
        return None if self.on_forward or self.on_hazard else self.gate

    @property
    def for_hazard(self) -> Gate | None:
        """The gate a hazard holds on a stream of its own (the write-back's), or None."""
        return self.gate if self.on_hazard else None

    def before_forward(self) -> None:
        if self.on_forward:
            self.gate.hold()

    def after_forward(self) -> None:
        self.tb.ran.record()

    def open(self, op: LoadOp | None, racing: Racing | None) -> None:
        # Held where the harness knows (a schedule that holds it unseen is the watchdog's).
        if self.on_forward or self.on_hazard or (op is not None and op.held):
            self.tb.dev.host_wait(racing.finish_event if racing is not None else self.tb.ran, self.hold_s)
            self.gate.release()

    def release(self) -> None:
        self.gate.release()

    def check(self, i: int) -> None:
        if self.gate.timed_out:
            raise GateTimeout(
                f"gate-timeout in replay {i}: a gate was never opened; "
                f"its watchdog opened it after {self.gate.timeout_s:g}s"
            )


class _NoGate(_Gating):
    def __init__(self) -> None:
        self.on_forward = self.on_hazard = False

    @property
    def on_load(self) -> Gate | None:
        return None

    def before_forward(self) -> None:
        pass

    def after_forward(self) -> None:
        pass

    def open(self, op: LoadOp | None, racing: Racing | None) -> None:
        pass

    def release(self) -> None:
        pass

    def check(self, i: int) -> None:
        pass


class _Observer:
    """The harness's own look at a replay: poison the probes first; at the end, once the forward
    stream has joined every stream (every copy enqueued so far has landed before it looks),
    collect and compare on the device into the replay's row of the batch."""

    # Device memory for a batch's unit masks: a batch is as many replays as fit, at most MAX_BATCH.
    MASK_BYTES = 64 << 20
    MAX_BATCH = 64

    def __init__(self, tb: Testbed, oracle: Oracle, batch: int):
        self.tb, self.oracle = tb, oracle
        units = max(1, len(oracle.units))
        self.batch = max(1, min(batch, self.MAX_BATCH, self.MASK_BYTES // units))
        device = oracle.truth.device
        self.masks = torch.zeros((self.batch, units), dtype=torch.bool, device=device)
        self.counts = torch.zeros((self.batch, len(oracle.groups)), dtype=torch.int32, device=device)

    def before(self) -> None:
        tb = self.tb
        with tb.dev.harness_work():
            tb.hazard.prepare(tb.bed)
            arena, value = tb.model.probes.arena, tb.scenario.poison
            tb.dev.launch(lambda: arena.fill_(value), what="poison probes")

    def after(self, row: int) -> None:
        tb, oracle = self.tb, self.oracle
        mask, counts = self.masks[row], self.counts[row]
        with tb.dev.stream(tb.forward), tb.dev.harness_work():
            tb.dev.join(tb.forward)
            tb.model.collect_final_state()
            arena = tb.model.probes.arena
            tb.dev.launch(lambda: oracle.compare(arena, mask, counts), what="compare")

    def read(self, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The first `rows` rows (group counts, and the unit masks when a replay was stale), on the
        host; after a synchronize."""
        counts = self.counts[:rows].cpu()
        return counts, self.masks[:rows].cpu() if counts.any() else None


class _Unobserved(_Observer):
    """Timing only (the benchmark): nothing is prepared, poisoned or compared."""

    def __init__(self, tb: Testbed):
        self.tb = tb
        self.batch = 1

    def before(self) -> None:
        pass

    def after(self, row: int) -> None:
        pass


class Replayer:
    """One scenario's replay loop on a built testbed: everything per replay, nothing more.

    The steps are the same for every scenario; what differs is in the strategies the testbed
    resolved (hazard, fence, schedule), the gate, and whether the replay is observed.
    Without an oracle it only times (the benchmark).
    """

    def __init__(self, tb: Testbed, runner: Runner, timeout_s: float, gate: Gate | None = None,
                 oracle: Oracle | None = None, batch: int = _Observer.MAX_BATCH):
        self.tb, self.runner, self.timeout_s = tb, runner, timeout_s
        self.gating = _Gating(tb, gate) if gate is not None else _NoGate()
        # A gate is opened by the host after each replay's forward, and an idle pace starts each
        # replay on a quiet device: one replay per batch.
        if gate is not None or tb.scenario.pace is Pace.IDLE:
            batch = 1
        self.observer = _Observer(tb, oracle, batch) if oracle is not None else _Unobserved(tb)
        self.oracle = oracle
        self.other_load = tb.other_load()

    def __call__(self, i: int, fault: Fault) -> ReplayVerdict:
        """One observed replay (index i; -1 is the traced one) and its verdict."""
        return next(self.replays([i], fault))

    def replays(self, indices: Iterable[int], fault: Fault) -> Iterator[ReplayVerdict]:
        """Observed replays, in order, a verdict each; enqueued a batch at a time, read with one
        host synchronisation per batch."""
        assert self.oracle is not None
        pending: list[int] = []
        for i in indices:
            self.enqueue(i, fault, row=len(pending))
            pending.append(i)
            if len(pending) == self.observer.batch:
                yield from self._drain(pending)
                pending = []
        if pending:
            yield from self._drain(pending)

    def _drain(self, pending: list[int]) -> Iterator[ReplayVerdict]:
        self.tb.dev.synchronize(self.timeout_s)  # bounded: a hung replay is an error, not a hang
        self.gating.check(pending[0])  # a gated batch is that one replay
        counts, masks = self.observer.read(len(pending))
        assert self.oracle is not None
        for row in range(len(pending)):
            yield self.oracle.verdict(counts[row], None if masks is None else masks[row])

    def run(self, i: int, fault: Fault, marks: Marks = UNMARKED, *, load: bool = True) -> None:
        """One replay, synchronized (the benchmark; `load=False`: the forward with no load
        pending, its compute bound)."""
        self.enqueue(i, fault, marks, load=load)
        self.tb.dev.synchronize(self.timeout_s)
        self.gating.check(i)

    def enqueue(self, i: int, fault: Fault, marks: Marks = UNMARKED, *, load: bool = True, row: int = 0) -> None:
        """One replay, from the slots' preparation to its observation, enqueued."""
        tb, dev, gating = self.tb, self.tb.dev, self.gating
        plan = FaultPlan(fault, i)
        with dev.stream(tb.forward):
            self.observer.before()
            marks.take(dev, tb.forward, "start")
            op = tb.start_load(plan, gate=gating.on_load) if load else None
            runner = self._fenced(i, op)
            marks.take(dev, tb.forward, "launch")
            gating.before_forward()
            runner.run()
            marks.take(dev, tb.forward, "end")
            gating.after_forward()
            racing = tb.hazard.after_forward(tb.bed, plan, self.other_load, gating.for_hazard)
        gating.open(op, racing)
        self.observer.after(row)
        tb.counter.set_consumer(-1)  # the batch has run: the load's slots are the scheduler's again

    def _fenced(self, i: int, op: LoadOp | None) -> Runner:
        tb = self.tb
        ctx = FenceContext(tb.dev, tb.forward, tb.load, tb.counter, op, self.runner, i, self._host_wait)
        chosen = tb.fence(ctx)
        if chosen is None:
            return self.runner
        if not callable(getattr(chosen, "run", None)):
            raise PluginError(f"fence {tb.scenario.fence!r} returned {type(chosen).__name__}; "
                              "a fence returns None or a runner (FenceSetup.runner(backend))")
        return chosen

    def _host_wait(self, event: Event) -> None:
        """A fence that blocks the host: open the gate first (nothing else could), then wait."""
        self.gating.release()
        if not self.tb.dev.host_wait(event, self.timeout_s):
            raise ReplayTimeout(f"a fence's host wait did not finish within {self.timeout_s:g}s")
