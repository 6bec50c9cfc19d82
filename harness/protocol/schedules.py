"""Load-back schedules: how one load op enqueues its copies and events.

A schedule is a callable `schedule(op: LoadOp) -> None`, run with the load
stream current. The correct one, `layerwise`, is the engine's: wait on the
op's start event (recorded on the scheduling stream, so the copies are ordered
after everything enqueued there before, including a previous batch's replay),
then for each layer its copies and `load_events[layer]`.

Known-bad schedules (mutants) live here too, so the kill matrix can prove the
harness catches them. A user's own schedule is named in a scenario file as
`package.module:callable` and receives the same `LoadOp`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.devices.base import Device, Stream
from harness.records.faults import FaultPlan
from harness.protocol.loadback import CopyPlan, LayerCopy, LayerDoneCounter, LayerLoadingEvent


@dataclass
class LoadOp:
    """One load op, as a schedule sees it.

    dev       the device (`dev.delay`, `dev.copy_async`, `dev.Event` ...)
    stream    the load stream (also the current stream while the schedule runs)
    events    this op's `LayerLoadingEvent`: `start_event`, `load_events[i]`,
              `finish_event` (= `load_events[-1]`), `complete(i)` records event i
    plan      plan[layer][chunk]: the `LayerCopy`s (dst, src, region) to enqueue
    fault     the `FaultPlan` of this replay (`pause(layer, chunk)` applies it)
    gate      a device gate to hold the stream on, or None (`hold()` applies it)
    index     the op's slot in the counter's ring of 3 (the batch's consumer index)
    """

    dev: Device
    stream: Stream
    events: LayerLoadingEvent
    plan: CopyPlan
    fault: FaultPlan
    index: int
    gate: object | None = None
    held: bool = field(default=False, init=False)

    @property
    def num_layers(self) -> int:
        return len(self.plan)

    def wait_start(self) -> None:
        self.events.start_event.wait(self.stream)

    def hold(self) -> None:
        """Hold the stream on the gate (when the fault has one) until the host releases it."""
        if self.gate is not None and not self.held:
            self.gate.hold()
            self.held = True

    def pause(self, layer: int, chunk: int = 0) -> None:
        us = self.fault.pause_us(layer, chunk)
        if us > 0:
            self.dev.delay(us)

    def copy(self, c: LayerCopy) -> None:
        self.dev.copy_async(c.dst, c.src, c.region)

    def copy_layer(self, layer: int) -> None:
        """All chunks of one layer, with the fault's pauses before them."""
        for chunk, copies in enumerate(self.plan[layer]):
            self.pause(layer, chunk)
            for c in copies:
                self.copy(c)


Schedule = Callable[[LoadOp], None]


def layerwise(op: LoadOp) -> None:
    """The engine's load op: start wait, then per layer its copies and its event."""
    op.wait_start()
    op.hold()
    for layer in range(op.num_layers):
        op.copy_layer(layer)
        op.events.complete(layer)


def final_event_early(op: LoadOp) -> None:
    """Mutant: the final event is recorded before the last layer's copies.

    Under a gate fault the gate sits between that record and the copies, so a
    fence on the final event lets the replay run while the last layer is held.
    """
    op.wait_start()
    last = op.num_layers - 1
    for layer in range(last):
        op.copy_layer(layer)
        op.events.complete(layer)
    op.events.complete(last)
    op.hold()
    op.copy_layer(last)


def no_start_wait(op: LoadOp) -> None:
    """Mutant: the load stream never waits on the start event.

    Nothing then orders the copies after work the scheduling stream enqueued
    earlier: a previous batch's replay that still reads the reused slots.
    """
    op.hold()
    for layer in range(op.num_layers):
        op.copy_layer(layer)
        op.events.complete(layer)


SCHEDULES: dict[str, Schedule] = {
    "layerwise": layerwise,
    "final_event_early": final_event_early,
    "no_start_wait": no_start_wait,
}


def start_loading(
    dev: Device,
    counter: LayerDoneCounter,
    load_stream: Stream,
    plan: CopyPlan,
    fault: FaultPlan,
    schedule: Schedule = layerwise,
    gate: object | None = None,
) -> LoadOp:
    """Enqueue one load op; returns it (its `index` is the batch's consumer index).

    Called on the scheduling (forward) stream, as the engine's `start_loading` is:
    the start event is recorded there before the schedule runs on the load stream.
    """
    index = counter.update_producer()
    events = counter.events[index]
    events.start_event.record()  # on the scheduling stream
    op = LoadOp(dev, load_stream, events, plan, fault, index, gate)
    with dev.stream(load_stream):
        schedule(op)
    return op
