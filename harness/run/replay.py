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
5. the hazard's work after the forward (write-after-read: the next batch's load);
6. the harness's observation: the forward stream waits for every stream (so a copy
   that no event covers cannot hide), then collects the post-prefill state and
   compares the arena with ground truth on the device;
7. the gate opens (once the forward has run, or after `hold_us` when a correct fence
   keeps it waiting), and one host synchronize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.devices.base import Event, Gate
from harness.model.runners import EagerRunner, Runner
from harness.protocol.accessors import per_layer
from harness.protocol.fences import FenceContext
from harness.protocol.schedules import LoadOp, layerwise
from harness.records.errors import (
    GateTimeout,
    GateUnavailable,
    PluginError,
    ReplayTimeout,
)
from harness.records.faults import FaultPlan, gate_fallback
from harness.records.scenario import Fault, FaultKind
from harness.run.oracle import Oracle, ReplayVerdict
from harness.run.testbed import Testbed


@dataclass
class Marks:
    """Timing markers one replay leaves on the forward stream (read them after it finished)."""

    start: Any = None  # before the load op starts
    launch: Any = None  # where the forward could start: after the fence
    end: Any = None  # after the forward


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
        tb.hazard.after_forward(tb.bed, plan, tb.other_load(layerwise))
        dev.join_all(tb.forward)
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


class Replayer:
    """One scenario's replay loop on a built testbed: everything per replay, nothing more.

    Without an oracle it only times (the benchmark): nothing is poisoned or compared.
    """

    def __init__(self, tb: Testbed, runner: Runner, timeout_s: float, gate: Gate | None = None,
                 oracle: Oracle | None = None):
        self.tb, self.runner, self.timeout_s, self.gate, self.oracle = tb, runner, timeout_s, gate, oracle
        self.hold_s = tb.scenario.fault.hold_us * 1e-6
        self.other_load = tb.other_load()
        self.mask: torch.Tensor | None = None
        if oracle is not None:
            self.mask = torch.zeros(len(oracle.units), dtype=torch.bool)
            if tb.dev.torch_device.type == "cuda":
                self.mask = self.mask.pin_memory()

    def __call__(self, i: int, fault: Fault) -> ReplayVerdict:
        """One observed replay (index i; -1 is the traced one) and its verdict."""
        assert self.oracle is not None and self.mask is not None
        self.run(i, fault)
        return self.oracle.verdict(self.mask)

    def run(self, i: int, fault: Fault, marks: Marks | None = None, *, load: bool = True,
            forward: bool = True) -> None:
        """One replay, from the slots' preparation to the host synchronize.

        `load=False` runs the forward with no load pending, `forward=False` the load op
        alone with the forward stream waiting on its final event (the benchmark's bounds).
        """
        tb, dev, gate, hazard = self.tb, self.tb.dev, self.gate, self.tb.hazard
        plan = FaultPlan(fault, i)
        observe = self.oracle is not None
        op: LoadOp | None = None
        racing: LoadOp | None = None
        with dev.stream(tb.forward):
            if observe:
                hazard.prepare(tb.bed)
                self._poison_probes()
            if marks:
                marks.start = dev.mark(tb.forward)
            if load:
                op = tb.start_load(plan, gate=None if hazard.holds_forward else gate)
            runner = self._fenced(i, op)
            if marks:
                marks.launch = dev.mark(tb.forward)
            if gate is not None and hazard.holds_forward:
                gate.hold()
            if forward:
                runner.run()
            elif op is not None:
                tb.forward.wait_event(op.finish_event)
            if marks:
                marks.end = dev.mark(tb.forward)
            if gate is not None:
                tb.ran.record()
            racing = hazard.after_forward(tb.bed, plan, self.other_load)
            if observe:
                self._observe()
        if gate is not None and (hazard.holds_forward or (op is not None and op.held)):
            # Held where the harness knows, so it opens it: once the racing side has landed
            # (the forward has run; the next batch's load has landed), or after hold_us.
            dev.host_wait(racing.finish_event if racing is not None else tb.ran, self.hold_s)
            gate.release()
        dev.synchronize(self.timeout_s)  # the one host synchronize of a replay
        if gate is not None and gate.timed_out:
            raise GateTimeout(
                f"gate-timeout in replay {i}: a gate was never opened; "
                f"its watchdog opened it after {gate.timeout_s:g}s"
            )
        tb.counter.set_consumer(-1)  # the host saw everything land: the load's slots are released

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
        if self.gate is not None:
            self.gate.release()
        if not self.tb.dev.host_wait(event, self.timeout_s):
            raise ReplayTimeout(f"a fence's host wait did not finish within {self.timeout_s:g}s")

    def _poison_probes(self) -> None:
        arena, value = self.tb.model.probes.arena, self.tb.scenario.poison
        self.tb.dev.launch(lambda: arena.fill_(value), what="poison probes")

    def _observe(self) -> None:
        """The harness's own look, once every stream's work has landed: it hides no copy."""
        tb, oracle, mask = self.tb, self.oracle, self.mask
        assert oracle is not None and mask is not None
        tb.dev.join_all(tb.forward)
        tb.model.collect_final_state()
        arena = tb.model.probes.arena
        tb.dev.launch(lambda: mask.copy_(oracle.stale_mask(arena), non_blocking=True), what="compare")
